"""The wait of iteration N's `parent_checkpoint` step for checkpoint N-1, made by a run beside it
where iterations overlap (`max_staleness` ≥ 1, pipelines/run_lanes.py).

The step waits outside the `training` pool, which the parent's training step needs. It ends when
the run making iteration N-1 has materialized its checkpoint (not when any record of N-1 exists:
a re-run of N-1 rewrites one that is there), or, with no run of N-1 queued, under way or waiting
for Dagster's run retries, when N-1 has a training step on record. It is refused, in one sentence,
when N-1 has neither, or when N-1's run stays queued: runs waiting like this one would then hold
the queue's slots that N-1 needs to start.
"""

from __future__ import annotations

import time

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRunStatus, Failure

from assets.partitions import iteration_key, runs_making
from training.iteration.lineage import Checkpoints

POLL_S = 2.0  # a training step takes seconds at the least: the wait sees it end within a poll
QUEUED_PATIENCE_S = 600.0  # the parent's run starts within seconds of a free slot, or never will


def wait_for_parent(instance: DagsterInstance, checkpoints: Checkpoints, number: int, poll_s: float = POLL_S,
                    queued_patience_s: float = QUEUED_PATIENCE_S) -> float:
    """Wait until checkpoint `number` - 1 is trained (see the module docstring); the seconds waited."""
    parent, experiment, started, queued_since = number - 1, checkpoints.experiment, time.monotonic(), None
    while parent > 0:
        making = runs_making(instance, experiment, parent)
        if not making:
            if checkpoints.has_record(parent):
                break
            raise Failure(f"iteration {number} trains from checkpoint {parent}, which has no training step on record, "
                          f"and no run of iteration {parent} is queued or under way: materialize iteration {parent} "
                          "first", allow_retries=False)
        if _trained_by(instance, experiment, parent, {run.run_id for run in making}):
            break
        queued = all(run.status == DagsterRunStatus.QUEUED for run in making)
        queued_since = (queued_since or time.monotonic()) if queued else None
        if queued and time.monotonic() - queued_since > queued_patience_s:
            raise Failure(f"iteration {number} has waited {time.monotonic() - started:.0f} s for iteration {parent}, "
                          f"whose run {making[0].run_id} is still queued: runs that wait like this one hold the queue's "
                          "slots it needs (raise the instance's max_concurrent_runs to max_staleness + 1 for each "
                          f"experiment run at once), then materialize iteration {number} again", allow_retries=False)
        time.sleep(poll_s)
    return time.monotonic() - started


def _trained_by(instance: DagsterInstance, experiment: str, iteration: int, run_ids: set[str]) -> bool:
    """Whether one of these runs has materialized the iteration's checkpoint."""
    records = instance.fetch_materializations(AssetRecordsFilter(
        asset_key=AssetKey("checkpoint"), asset_partitions=[str(iteration_key(experiment, iteration))]), limit=10).records
    return any(record.run_id in run_ids for record in records)
