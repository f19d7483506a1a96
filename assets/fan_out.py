"""One stage of an iteration fanned out over shards, so that Dagster's executor spreads it over
processes (the multiprocess executor, CRUCIBLE_STEP_PROCESSES):

    plan (slices of the work) -> a step per shard -> gather (the shards' results in order)

Sampling (assets/rollouts.py) and grading (assets/verification.py) are fanned out this way. Shards
hand their results to the gathering step through the storage root (assets/step_outputs.py),
which every process and pod of a run reaches. The stage's time runs from its plan to the end of
its gathering.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

from dagster import DynamicOutput

from training.iteration.context import SamplingPolicy


@dataclass(frozen=True)
class Shard:
    index: int
    count: int  # shards in all
    work: list  # a contiguous slice of the stage's work: tasks to sample, (task, rollout) pairs to grade
    planned_at: dt.datetime  # when the stage began, for its timing
    policy: SamplingPolicy | None = None  # sampling: the checkpoint every shard samples


@dataclass(frozen=True)
class ShardDone:
    shard: Shard
    results: list  # one per item of the shard's work, in its order


def planned(slices: list[list], planned_at: dt.datetime, policy: SamplingPolicy | None = None
            ) -> Iterator[DynamicOutput[Shard]]:
    """A dynamic output per slice, keyed `shard_<index>`."""
    for index, work in enumerate(slices):
        yield DynamicOutput(Shard(index, len(slices), work, planned_at, policy), mapping_key=f"shard_{index}")


def gathered(done: list[ShardDone]) -> tuple[list, Shard]:
    """The shards' results in the order of their work, and the first shard (when the stage was
    planned, what it sampled)."""
    ordered = sorted(done, key=lambda finished: finished.shard.index)
    return [result for finished in ordered for result in finished.results], ordered[0].shard
