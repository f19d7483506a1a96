"""What one step hands another inside a fanned-out asset (a shard's samples or grades): kept by
Dagster's FilesystemIOManager under the storage root, which every process, container and pod of
a run reaches, a folder per run, deleted by the step that gathers them."""

import contextlib

import fsspec

STEP_OUTPUTS = "step_outputs"  # the IO manager's resource key


def step_outputs_dir(storage_root: str) -> str:
    """Where STEP_OUTPUTS keeps them: a folder per run, under the storage root."""
    return f"{storage_root.rstrip('/')}/step_outputs"


def delete_hand_overs(storage_root: str, run_id: str) -> None:
    """The run's hand-overs, once gathered: nothing reads them again (the run's next fan-out,
    planned after this gathering, writes its own)."""
    fs, path = fsspec.core.url_to_fs(f"{step_outputs_dir(storage_root)}/{run_id}")
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)
