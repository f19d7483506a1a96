"""Automation: the next iteration of each experiment that asks for it, once its last one is
evaluated (with `max_staleness` k, while fewer than k+1 are queued or under way), until a stopping
rule (training/continuation.py) says no; reward_analytics kept current; and a periodic
re-evaluation of the latest checkpoints (off by default)."""

from __future__ import annotations

from collections.abc import Callable

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from assets.partitions import IN_FLIGHT, experiments, in_flight, iteration_key, iteration_numbers, parse_iteration_key
from assets.resources import CrucibleResource
from datastore import catalog, metrics
from pipelines.jobs import evaluation_job, iteration_job
from training.continuation import reason_to_stop
from training.experiment import ExperimentFileError


def latest_iterations(context: SensorEvaluationContext | ScheduleEvaluationContext,
                      partition_keys: set[str]) -> dict[str, int]:
    """Highest iteration of every experiment among the keys (of an asset's materialized
    partitions); a malformed key (added by hand in the UI) is reported in the tick's log and
    skipped, never failing every tick."""
    latest: dict[str, int] = {}
    for key in partition_keys:
        try:
            experiment, iteration = parse_iteration_key(key)
        except ValueError as error:
            context.log.warning(f"skipped: {error}")
            continue
        latest[experiment] = max(iteration, latest.get(experiment, 0))
    return latest


def _why_not(context: SensorEvaluationContext, crucible: CrucibleResource, name: str, last: int,
             held_out: Callable[[str], list[tuple[int, float]]]) -> tuple[int | None, str | None]:
    """The iteration experiment `name` gets next, after `last` (its latest evaluated), or None and
    why not. An experiment with `max_staleness` k has up to k+1 iterations queued or under way:
    the next follows the newest of them."""
    try:
        experiment = crucible.experiment(name)
    except ExperimentFileError as error:
        return None, f"its stored settings no longer validate: {error}"
    if not experiment.continuous:
        return None, "continuous training is off (`crucible continue NAME` switches it on)"
    instance = context.instance
    if in_flight(instance, {"dagster/partition": name}):
        return None, "a run of its base policy is queued or in progress"
    under_way = iterations_in_flight(instance, name)
    if len(under_way) > experiment.max_staleness:
        return None, ("a run of it is queued or in progress" if not experiment.max_staleness else
                      f"{len(under_way)} runs of it are queued or in progress, max_staleness "
                      f"{experiment.max_staleness} + 1")
    following = max([last, *under_way]) + 1
    for number in sorted(set(range(last + 1, following + 1)) - set(under_way)):  # one that failed holds up the rest
        key = iteration_key(name, number)
        failed = instance.get_run_records(RunsFilter(tags={"dagster/partition": str(key)},
                                                     statuses=[DagsterRunStatus.FAILURE]), limit=1)
        if failed:
            return None, (f"the last run of {key} failed (run {failed[0].dagster_run.run_id}): fix what it says and "
                          "launch it again by hand; the sensor never repeats a failed iteration")
    if following > experiment.iterations:
        return None, f"reached its limit of {experiment.iterations} iterations"
    if last == 0 and name not in instance.get_materialized_partitions(AssetKey("base_policy")):
        return None, "it has no base policy yet: materialize base_policy for it"
    store = crucible.store()
    blocked = last > 0 and store.has_partition("checkpoints", name, last) and bool(
        store.read_partition("checkpoints", name, last)["blocked"].to_pylist()[0])
    reason = reason_to_stop(experiment, last, blocked, held_out(name))
    return (None, reason) if reason else (following, None)


def iterations_in_flight(instance: DagsterInstance, experiment: str) -> list[int]:
    """The numbers of the experiment's iterations with a run queued or under way."""
    records = instance.get_run_records(RunsFilter(tags={"dagster/partition/experiment": experiment}, statuses=IN_FLIGHT))
    return sorted({parse_iteration_key(record.dagster_run.tags["dagster/partition"])[1] for record in records})


def held_out_curves(crucible: CrucibleResource) -> Callable[[str], list[tuple[int, float]]]:
    """(iteration, held-out pass rate) of an experiment, its base policy's first, from one DuckDB
    connection opened when first asked (once per tick)."""
    connection = None

    def curve(name: str) -> list[tuple[int, float]]:
        nonlocal connection
        connection = connection or catalog.connect(crucible.storage_root)
        rows = metrics.curve(connection, "held_out", name)
        return [(row["iteration"], row["pass_rate"]) for row in rows]

    return curve


# Stopped by default: `crucible run` drives iterations itself. Switched on in the UI, it continues
# the experiments stored with `continuous = true` (`crucible continue NAME`), and only those.
@sensor(job=iteration_job, minimum_interval_seconds=15, default_status=DefaultSensorStatus.STOPPED)
def advance_iterations(context: SensorEvaluationContext, crucible: CrucibleResource):
    evaluated = latest_iterations(context, context.instance.get_materialized_partitions(AssetKey("checkpoint_eval")))
    requests, reasons, held_out = [], [], held_out_curves(crucible)
    for name in crucible.experiment_names():
        following, reason = _why_not(context, crucible, name, evaluated.get(name, 0), held_out)
        if reason:
            reasons.append(f"{name}: {reason}")
            continue
        key = iteration_key(name, following)
        requests.append(RunRequest(run_key=str(key), partition_key=key))  # a run key is used once: no re-launch
    if not requests:
        return SkipReason("; ".join(reasons) or "no experiment is stored")
    for reason in reasons:
        context.log.info(f"not advanced: {reason}")
    numbers = sorted({parse_iteration_key(request.partition_key)[1] for request in requests})
    names = sorted({parse_iteration_key(request.partition_key)[0] for request in requests})
    return SensorResult(run_requests=requests, dynamic_partitions_requests=[
        experiments.build_add_request(names), iteration_numbers.build_add_request([f"{n:04d}" for n in numbers])])


# Running by default, in the daemon (`crucible ui` or `crucible run` starts one): reward_analytics
# follows every iteration, from the UI, a backfill, the sensor above or `crucible run`. Its runs
# yield to the iterations waiting in the queue beside them (a lower priority).
keep_analytics_current = AutomationConditionSensorDefinition(
    "keep_analytics_current", target=AssetSelection.assets("reward_analytics"),
    default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=30, run_tags={"dagster/priority": "-1"},
)


# Off by default: evaluates each continuously trained experiment's latest checkpoint again, every
# six hours (after a change of the held-out split or the verifier, say).
@schedule(job=evaluation_job, cron_schedule="0 */6 * * *", default_status=DefaultScheduleStatus.STOPPED)
def evaluate_latest_checkpoints(context: ScheduleEvaluationContext, crucible: CrucibleResource):
    trained = latest_iterations(context, context.instance.get_materialized_partitions(AssetKey("checkpoint")))
    stamp = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "now"
    requests = [RunRequest(run_key=f"{key}@{stamp}", partition_key=key)
                for key in (iteration_key(name, trained[name]) for name in crucible.experiment_names()
                            if name in trained and _continued(context, crucible, name))]
    return requests or SkipReason("no continuously trained experiment has a checkpoint yet")


def _continued(context: ScheduleEvaluationContext, crucible: CrucibleResource, name: str) -> bool:
    try:
        return crucible.experiment(name).continuous
    except ExperimentFileError as error:  # one experiment's broken settings never fail the tick
        context.log.warning(f"skipped {name!r}: {error}")
        return False
