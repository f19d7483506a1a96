"""A full disk, for real: a size-limited tmpfs under the checkpoint or the data. Every out-of-space
failure names the checkpoint or partition and its path and says how much the write needed;
nothing half-written stays; and a training job that fails so is not retried (a retry fails the
same way), with the job's own error passed up through Pipes."""

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetExecutionContext, DagsterEventType, DagsterInstance, RetryPolicy, asset, materialize

from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from datastore.store import DatasetStore, StorageFull, rows_to_table
from training.policy.checkpoint import CheckpointSpaceError, save_checkpoint
from training.policy.model import build_base_policy, load_policy
from training.policy.settings import PolicyConfig
from training.rl.sample import TrainSample
from training.rl.settings import GRPOConfig
from training.rl.trainer import train_policy
from training.sft.job import Example, WarmupJob, write_examples
from training.sft.settings import SFTConfig

TINY = PolicyConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)


@pytest.fixture
def full_disk(tmp_path) -> Iterator[Path]:
    """A 256 KiB filesystem: smaller than any checkpoint of the tiny policy."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): these tests need root")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return build_base_policy(tmp_path_factory.mktemp("policy") / "base", TINY)


def test_a_trained_checkpoint_that_cannot_fit_is_refused_before_a_byte_is_written(policy, full_disk):
    samples = [TrainSample([5, 6, 7], [8, 9], [-1.0, -1.0], reward=float(i), group_id="g") for i in range(2)]
    with pytest.raises(CheckpointSpaceError) as refused:
        train_policy(policy, samples, full_disk / "trained", GRPOConfig(epochs=1, lr_warmup_steps=0))
    assert str(refused.value).startswith(f"checkpoint {full_disk / 'trained'} needs ")
    assert "KiB free: free space there or move the checkpoint root" in str(refused.value)
    assert list(full_disk.iterdir()) == []


def test_a_checkpoint_whose_disk_fills_while_it_is_written_is_named_and_leaves_nothing(tmp_path, full_disk):
    """Written without a size to check first: safetensors' own error (not an OSError) tells of it."""
    policy = build_base_policy(tmp_path / "larger", PolicyConfig(hidden_size=64, num_layers=2))  # ~0.6 MiB
    model, _ = load_policy(policy)
    with pytest.raises(CheckpointSpaceError, match=rf"^checkpoint {full_disk / 'ckpt'} did not fit and its "
                       "filesystem filled up while it was written"):
        save_checkpoint(model, policy, full_disk / "ckpt", {"kind": "test"})
    assert list(full_disk.iterdir()) == []


def test_a_dataset_part_that_cannot_fit_names_its_partition_and_size_and_leaves_no_file(full_disk):
    store = DatasetStore(str(full_disk / "data"))
    rows = [{"index": index, "record": os.urandom(1024).hex()} for index in range(256)]  # ~512 KiB, incompressible
    with pytest.raises(StorageFull, match=r"^outputs, experiment 'e' iteration 3: no space left on the device of "
                       rf"file://{full_disk / 'data'}/outputs/experiment=e/iteration=3 for its 256 rows \(\d+\.\d KiB before "
                       r"compression, \d+\.\d KiB free\): free space there or move the storage root$"):
        store.write_partition("outputs", "e", 3, rows_to_table("outputs", rows))
    assert [path for path in (full_disk / "data").rglob("*") if path.is_file()] == []


def warm_up(policy: Path, out_dir: Path, scratch: Path, launcher: str = "", examples: bool = True):
    """The warm-up job of `policy` into `out_dir`, run by the Pipes client in a process of its own,
    as an asset with the checkpoint asset's retry policy: the materialization's result."""
    if examples:
        write_examples([Example([5, 6, 7], [8, 9])] * 4, scratch / "examples.parquet")
    job = WarmupJob(initial_dir=str(policy), examples_file=str(scratch / "examples.parquet"), out_dir=str(out_dir),
                    sft=SFTConfig(steps=1, batch_size=2))

    @asset(retry_policy=RetryPolicy(max_retries=2))
    def warmed_up(context: AssetExecutionContext, crucible: CrucibleResource, training_step: TrainingStepClient):
        return training_step.run(context, crucible, extras={"job": job.model_dump(mode="json")}).get_materialize_result()

    crucible = CrucibleResource(storage_root=str(scratch / "data"), checkpoint_root=str(out_dir.parent),
                                train_launcher=launcher)
    with DagsterInstance.ephemeral() as instance:
        return materialize([warmed_up], instance=instance, raise_on_error=False,
                           resources={"crucible": crucible, "training_step": TrainingStepClient()})


def restarts(result) -> int:
    return len([event for event in result.all_events if event.event_type == DagsterEventType.STEP_RESTARTED])


def test_a_training_job_that_runs_out_of_space_fails_once_with_its_own_error(policy, full_disk, tmp_path):
    """Writing to a full checkpoint root: the job's error reaches the step's failure, and the
    retry policy does not run it again."""
    result = warm_up(policy, full_disk / "base", tmp_path)
    [failure] = result.get_step_failure_events()
    assert failure.step_failure_data.user_failure_data.description.startswith(
        f"the training job failed: CheckpointSpaceError: checkpoint {full_disk / 'base'} needs ")
    assert restarts(result) == 0
    assert list(full_disk.iterdir()) == []


def test_a_training_job_that_raises_is_run_once_and_its_error_is_the_steps(policy, tmp_path):
    """Any error the job raises (here: its examples file is missing) would be met again: the
    step fails with it, as the job's process passed it up through Pipes, and is not retried."""
    result = warm_up(policy, tmp_path / "checkpoints" / "base", tmp_path, examples=False)
    [failure] = result.get_step_failure_events()
    assert failure.step_failure_data.user_failure_data.description.startswith(
        "the training job failed: FileNotFoundError: ")
    assert str(tmp_path / "examples.parquet") in failure.step_failure_data.user_failure_data.description
    assert restarts(result) == 0


def test_a_training_job_killed_without_a_word_is_run_again(policy, tmp_path):
    """A job process that dies by SIGKILL (the OOM killer, a lost node) raised nothing a retry
    would meet again: the retry policy runs it once more, and it finishes."""
    marker = tmp_path / "killed-once"
    script = f'test -e {marker} || {{ touch {marker}; kill -KILL $$; }}; exec {sys.executable} "$@"'
    launcher = f"sh -c {shlex.quote(script)} launcher"  # killed by SIGKILL the first time only
    result = warm_up(policy, tmp_path / "checkpoints" / "base", tmp_path, launcher)
    assert result.success and restarts(result) == 1
