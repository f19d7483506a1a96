"""What one step hands another inside a fanned-out asset (a shard's samples or grades): kept by
Dagster's FilesystemIOManager under the storage root, which every process, container and pod of
a run reaches, at `<run id>/<step key>/…`, and deleted once the gathering step has succeeded.

The deletion is a success hook on the gathering step, so it runs after the gathered output is
stored: a run that fails before then keeps its hand-overs, which its re-execution from failure
reads (and then deletes with its own). The hook also deletes those of every ended run of the same
partition (a run killed mid-fan-out, then run afresh rather than re-executed): this run has just
gathered the asset they were for, so nothing will read them. It deletes the asset's steps'
hand-overs only: with a process per step, the run's next fan-out may already be writing its own.
"""

import fsspec
from dagster import DagsterInstance, DagsterRunStatus, HookContext, HookDefinition, RunsFilter, success_hook

ENDED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
PARTITION_TAG = "dagster/partition"
# Dagster's tags on a failed run that its run retries will launch again, and on it, its retry.
WILL_RETRY_TAG, RETRY_TAG = "dagster/will_retry", "dagster/auto_retry_run_id"

STEP_OUTPUTS = "step_outputs"  # the IO manager's resource key


def step_outputs_dir(storage_root: str) -> str:
    """Where STEP_OUTPUTS keeps them: a folder per run, under the storage root."""
    return f"{storage_root.rstrip('/')}/step_outputs"


def hand_overs_gathered(asset: str) -> HookDefinition:
    """The hook, for the gathering step of `asset`'s fan-out."""

    @success_hook(name=f"{asset}_hand_overs_gathered", required_resource_keys={"crucible"})
    def delete(context: HookContext) -> None:
        for run_id in done_with(context.instance, context.run_id):
            delete_hand_overs(context.resources.crucible.storage_root, run_id, asset)

    return delete


def done_with(instance: DagsterInstance, run_id: str) -> set[str]:
    """The runs whose hand-overs of an asset are of no use once `run_id` has gathered it: itself,
    the runs it re-executes, and the ended runs of its partition."""
    _, group = instance.get_run_group(run_id) or ("", [])
    partition = instance.get_run_by_id(run_id).tags.get(PARTITION_TAG)
    ended = instance.get_runs(RunsFilter(tags={PARTITION_TAG: partition}, statuses=ENDED)) if partition else []
    # A failed run whose retry is still to be made: the retry, a re-execution from its failure, reads them.
    awaiting_retry = {run.run_id for run in ended
                      if run.tags.get(WILL_RETRY_TAG) == "true" and RETRY_TAG not in run.tags}
    return {run_id, *(run.run_id for run in group), *(run.run_id for run in ended)} - awaiting_retry


def delete_hand_overs(storage_root: str, run_id: str, asset: str) -> None:
    """The run's hand-overs between the steps of `asset` (step keys `<asset>.<op>…`), and the
    run's folder once nothing else is in it."""
    fs, path = fsspec.core.url_to_fs(f"{step_outputs_dir(storage_root)}/{run_id}")
    for step in fs.glob(f"{path}/{asset}.*"):
        fs.rm(step, recursive=True)
    if fs.isdir(path) and not fs.ls(path):
        fs.rmdir(path)
