"""The partition scheme: experiments are a dimension Dagster knows, iterations another.

    experiments   one partition per experiment (its base policy is partitioned by it)
    iterations    experiment x iteration number: the key `default|0003` is experiment `default`'s
                  third iteration, and its runs carry the tags `dagster/partition/experiment` and
                  `dagster/partition/iteration`, which the UI filters by and the run queue limits by
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DynamicPartitionsDefinition,
    Failure,
    MultiPartitionKey,
    MultiPartitionsDefinition,
    RunsFilter,
)
from sqlalchemy.exc import IntegrityError

experiments = DynamicPartitionsDefinition(name="experiments")
# Not "iterations": instances from before experiments were a dimension hold `<experiment>-<NNNN>` keys there.
iteration_numbers = DynamicPartitionsDefinition(name="iteration_numbers")
iterations = MultiPartitionsDefinition({"experiment": experiments, "iteration": iteration_numbers})

_NUMBER = re.compile(r"^\d{4}$")


def iteration_key(experiment: str, iteration: int) -> MultiPartitionKey:
    return MultiPartitionKey({"experiment": experiment, "iteration": f"{iteration:04d}"})


def parse_iteration_key(key: str | MultiPartitionKey) -> tuple[str, int]:
    """(experiment, iteration number) of an `iterations` key; a ValueError names a malformed one."""
    dimensions = key.keys_by_dimension if isinstance(key, MultiPartitionKey) else dict(
        zip(("experiment", "iteration"), str(key).split("|")) if str(key).count("|") == 1 else {})
    number = dimensions.get("iteration", "")
    if not dimensions.get("experiment") or not _NUMBER.match(number) or int(number) < 1:
        raise ValueError(f"partition key {str(key)!r} is not '<experiment>|<iteration>' with a four-digit "
                         "iteration from 0001 (for example 'default|0001')")
    return dimensions["experiment"], int(number)


def experiment_of_run(tags: Mapping[str, str]) -> str | None:
    """The experiment a run's partition belongs to (an iteration or a base policy), from the tags
    Dagster gives partitioned runs; None for a run of no partition (the analytics)."""
    if "dagster/partition/experiment" in tags:
        return tags["dagster/partition/experiment"]
    partition = tags.get("dagster/partition")
    return partition if partition and "|" not in partition else None


def refuse_beside_other_writers(instance: DagsterInstance, run_id: str, experiment: str, number: int | None = None,
                                max_staleness: int = 0) -> None:
    """Fail when another run writes the experiment beside this one: a base-policy run (`number`
    None) beside any; iteration `number` beside its base policy's, another run of itself, or
    iterations more than `max_staleness` away or more than `max_staleness` of them. The queue's
    lanes keep to that (pipelines/run_lanes.py) but cannot order a run executed outside them
    (`materialize()`, `dagster asset materialize`): a base policy rebuilt under an iteration would
    change the model it samples or trains."""
    under_way = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
    others = [record.dagster_run for tags in ({"dagster/partition/experiment": experiment},
                                              {"dagster/partition": experiment})
              for record in instance.get_run_records(RunsFilter(tags=tags, statuses=under_way))
              if record.dagster_run.run_id != run_id]
    refusal = _not_beside(others, number, max_staleness)
    if refusal:
        other, why = refusal
        raise Failure(f"experiment {experiment!r} is being written by run {other.run_id} ({other.job_name}, "
                      f"{other.tags.get('dagster/partition')}){why}: launch this one again once that has ended",
                      allow_retries=False)


def _not_beside(others: list[DagsterRun], number: int | None, max_staleness: int) -> tuple[DagsterRun, str] | None:
    """The run this one may not run beside, and why (beyond its being there), if there is one."""
    for other in others:
        their = other.tags.get("dagster/partition/iteration")
        if number is None or their is None or not max_staleness:
            return other, ""
        distance = abs(int(their) - number)
        if distance == 0:
            return other, ", the same iteration"
        if distance > max_staleness:
            return other, f", more than max_staleness {max_staleness} iterations from {number}"
    if len(others) > max_staleness:
        return others[0], f" and {len(others) - 1} more, beyond the {max_staleness} max_staleness allows beside it"
    return None


IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
             DagsterRunStatus.CANCELING]


def in_flight(instance: DagsterInstance, tags: Mapping[str, str]) -> bool:
    """Whether a run with these tags is queued or under way."""
    return bool(instance.get_run_records(RunsFilter(tags=dict(tags), statuses=IN_FLIGHT), limit=1))


def runs_making(instance: DagsterInstance, experiment: str, iteration: int) -> list[DagsterRun]:
    """The runs of an iteration queued or under way, and those failed that Dagster's run retries
    are about to launch again (between the two, no run of it is in flight)."""
    records = instance.get_run_records(RunsFilter(tags={"dagster/partition": str(iteration_key(experiment, iteration))},
                                                  statuses=[*IN_FLIGHT, DagsterRunStatus.FAILURE]))
    return [record.dagster_run for record in records if record.dagster_run.status != DagsterRunStatus.FAILURE
            or record.dagster_run.is_complete_and_waiting_to_retry]


def add_experiment(instance: DagsterInstance, experiment: str) -> None:
    _add_key(instance, experiments.name, experiment)


def add_iteration(instance: DagsterInstance, experiment: str, iteration: int) -> MultiPartitionKey:
    """Make sure both dimensions hold the iteration's keys, and return its partition key."""
    add_experiment(instance, experiment)
    _add_key(instance, iteration_numbers.name, f"{iteration:04d}")
    return iteration_key(experiment, iteration)


def _add_key(instance: DagsterInstance, partitions: str, key: str) -> None:
    """Add a key unless it is there. Dagster's SQLite storage looks, then inserts: two commands
    adding one key at once (two `crucible run`s, a run and a sensor) collide on its unique index,
    and the one that lost finds the key added (its Postgres storage inserts or does nothing)."""
    if instance.has_dynamic_partition(partitions, key):
        return
    try:
        instance.add_dynamic_partitions(partitions, [key])
    except IntegrityError:
        if not instance.has_dynamic_partition(partitions, key):
            raise
