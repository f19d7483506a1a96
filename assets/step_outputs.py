"""What one step hands another inside a fanned-out asset (a shard's samples or grades): kept by
Dagster's FilesystemIOManager under the storage root, which every process, container and pod of
a run reaches, at `<run id>/<step key>/…`, and deleted once the gathering step has succeeded.

The deletion is a success hook on the gathering step, so it runs after the gathered output is
stored: a run that fails before then keeps its hand-overs, which its re-execution from failure
reads (and then deletes with its own). It deletes the asset's steps' hand-overs only: with a
process per step, the run's next fan-out may already be writing its own.
"""

import fsspec
from dagster import HookContext, HookDefinition, success_hook

STEP_OUTPUTS = "step_outputs"  # the IO manager's resource key


def step_outputs_dir(storage_root: str) -> str:
    """Where STEP_OUTPUTS keeps them: a folder per run, under the storage root."""
    return f"{storage_root.rstrip('/')}/step_outputs"


def hand_overs_gathered(asset: str) -> HookDefinition:
    """The hook, for the gathering step of `asset`'s fan-out."""

    @success_hook(name=f"{asset}_hand_overs_gathered", required_resource_keys={"crucible"})
    def delete(context: HookContext) -> None:
        _, group = context.instance.get_run_group(context.run_id) or ("", [])  # with the runs it re-executes
        for run_id in {context.run_id, *(run.run_id for run in group)}:
            delete_hand_overs(context.resources.crucible.storage_root, run_id, asset)

    return delete


def delete_hand_overs(storage_root: str, run_id: str, asset: str) -> None:
    """The run's hand-overs between the steps of `asset` (step keys `<asset>.<op>…`), and the
    run's folder once nothing else is in it."""
    fs, path = fsspec.core.url_to_fs(f"{step_outputs_dir(storage_root)}/{run_id}")
    for step in fs.glob(f"{path}/{asset}.*"):
        fs.rm(step, recursive=True)
    if fs.isdir(path) and not fs.ls(path):
        fs.rmdir(path)
