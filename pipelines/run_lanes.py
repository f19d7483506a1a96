"""The run queue's lanes: how many iterations of an experiment are under way at once.

Every run of an experiment submitted to the instance (the UI, a backfill, a sensor, `crucible
run`) is given the tag `crucible/lane` before it is queued, and the queue starts one run per lane
at a time (pipelines/dagster.yaml's tag limit):

    <experiment>/<N mod (k+1)>   iteration N of an experiment with `max_staleness` k
    <experiment>/0               its base policy (with k ≥ 1, an iteration of another lane may
                                 start beside a rebuild of it, and is refused: assets/partitions.py)

So an experiment with k = 0 (the default) runs one iteration at a time, in the order they were
queued, as before lanes; one with k ≥ 1 has at most k+1 consecutive iterations under way
(iteration N+k+1 waits for N, which shares its lane), each sampling from the newest checkpoint
within its bound. One training step at a time follows from the data: iteration N trains from
checkpoint N-1 and waits for it (assets/iteration.py `parent_checkpoint`), and the `training`
pool orders training steps across runs (assets/pools.py). How many lanes are busy at once across
experiments is the queue's `max_concurrent_runs`. A lane tag set by hand on a launch is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dagster import DagsterRun, DagsterRunStatus
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext

from assets.partitions import experiment_of_run

LANE_TAG = "crucible/lane"


def lane(tags: Mapping[str, str], max_staleness: Callable[[str], int]) -> str | None:
    """The lane of a run with these tags, None for a run of no experiment (the analytics);
    `max_staleness(experiment)` is the experiment's setting."""
    experiment = experiment_of_run(tags)
    if experiment is None:
        return None
    number = tags.get("dagster/partition/iteration", "")
    return f"{experiment}/{int(number) % (max_staleness(experiment) + 1) if number.isdigit() else 0}"


class IterationLanes(QueuedRunCoordinator):
    """Dagster's queued run coordinator, which tags each run with its lane as it is queued."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Tag the run with its lane and queue it; fail it, in one sentence, when its experiment's
        settings cannot be read (a run in the wrong lane would start beside what it must follow)."""
        run = context.dagster_run
        if run.status == DagsterRunStatus.NOT_STARTED and LANE_TAG not in run.tags:
            try:
                its_lane = lane(run.tags, _max_staleness)
            except Exception as error:  # noqa: BLE001 (the storage's or the settings' own error, named)
                self._instance.report_run_failed(run, f"run {run.run_id} was not queued: the settings of experiment "
                                                      f"{experiment_of_run(run.tags)!r} could not be read to choose "
                                                      f"its lane ({error}); launch it again once they can")
                return self._instance.get_run_by_id(run.run_id)
            if its_lane is not None:
                self._instance.add_run_tags(run.run_id, {LANE_TAG: its_lane})
                context = SubmitRunContext(self._instance.get_run_by_id(run.run_id), context.workspace)
        return super().submit_run(context)


def _max_staleness(experiment: str) -> int:
    """The experiment's stored `max_staleness`, from the storage the queueing process's settings
    name (the defaults' 0 for an experiment not stored yet). Imported here: the instance loads this
    coordinator in every process that opens it, most of which queue nothing."""
    from commands.settings import load_settings
    from pipelines.resources import crucible_resource

    return crucible_resource(load_settings()).experiment(experiment).max_staleness
