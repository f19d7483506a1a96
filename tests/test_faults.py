"""Faults as a platform engineer meets them, each a real process and a real fault, then
`crucible run` again: the experiment goes on by itself, from where it stopped.

(A full disk: tests/test_out_of_space.py; a corrupt checkpoint: tests/test_end_to_end.py; a
damaged partition: tests/test_sql_cli.py.)"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, materialize

from assets.partitions import experiments
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from pipelines.instance import POSTGRES_URL_ENV, prepare_instance
from pipelines.local_daemon import live_daemons
from sandbox.local import BWRAP
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from tests.lineage import EVERY_STEP_MOVES, assert_one_lineage
from training.experiment import BasePolicySettings, ExperimentConfig
from training.policy.checkpoint import verify_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parent.parent
GRADING_S = 2  # a sandbox open long enough to be seen


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> dict[str, str]:
    """A tiny experiment with its base policy built: the environment `crucible run` runs it in."""
    workdir = tmp_path_factory.mktemp("faults")
    environment = {**os.environ, "DAGSTER_HOME": str(workdir / "dagster"), "HF_HUB_OFFLINE": "1",
                   "CRUCIBLE_STORAGE_ROOT": str(workdir / "data"), "CRUCIBLE_CHECKPOINT_ROOT": str(workdir / "ckpt")}
    environment.pop(POSTGRES_URL_ENV, None)
    compose = load_task_set("compose")
    # Grading whose sandbox stays open long enough to be seen.
    slow = [task.model_copy(update={"tests": f"import time\ntime.sleep({GRADING_S})\n{task.tests}"})
            for task in [*compose.train()[:4], *compose.eval()[:2]]]
    write_task_set(slow, workdir / "mini")
    crucible = CrucibleResource(storage_root=environment["CRUCIBLE_STORAGE_ROOT"],
                                checkpoint_root=environment["CRUCIBLE_CHECKPOINT_ROOT"])
    crucible.save_experiment(ExperimentConfig(
        name="tiny", task_set=str(workdir / "mini"), tasks_per_iteration=2, samples_per_task=2, max_new_tokens=16,
        eval_tasks=2, eval_samples=1, refill_rounds=0, regrade_fraction=0.0, max_turns=1,
        base=BasePolicySettings(hidden_size=32, num_layers=1, sft_steps=0), grpo=EVERY_STEP_MOVES))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", environment["DAGSTER_HOME"])
        prepare_instance()
        with DagsterInstance.get() as instance:
            instance.add_dynamic_partitions(experiments.name, ["tiny"])
            assert materialize([base_policy], partition_key="tiny", instance=instance,
                               resources={"crucible": crucible, "training_step": TrainingStepClient()}).success
    return environment


@dataclass(frozen=True)
class Kill:
    """Where `crucible run` and everything it started (code server, daemon, run worker, step
    processes, the training job) are SIGKILLed: in `stage`, once a line has `after` (and, with
    `sandbox_open`, once a sandbox runs under it)."""

    stage: str
    after: str
    sandbox_open: bool = False

    def said_in(self, line: str) -> bool:
        """Whether a line of the command (`HH:MM:SS step: message`) says `after`: from the step's
        name on, so "checkpoint: step start" is not parent_checkpoint's."""
        return line.partition(" ")[2].startswith(self.after)


# One stage per iteration. A grading step cannot have ended while one of its sandboxes is open, and
# none opens between `after` and it: a line read seconds late on a loaded machine still kills it.
KILLED_IN = {
    1: Kill("rollouts.sample_rollout_shard[shard_0]", after="rollouts.sample_rollout_shard[shard_0]: step start"),
    2: Kill("verified_rollouts.grade_rollout_shard[shard_0]", after="rollouts.sample_rollout_shard[shard_0]: step start",
            sandbox_open=True),
    3: Kill("checkpoint", after="checkpoint: step start"),  # the training step, with its job's process
    4: Kill("checkpoint_eval", after="checkpoint: step start", sandbox_open=True),
}
SANDBOX = Path(BWRAP).name


def crucible_run(environment: dict[str, str], iterations: int, kill: Kill | None = None) -> tuple[int, str]:
    """`crucible run` through `iterations`, killed as `kill` says; its exit code and lines."""
    process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "tiny",
                                "--iterations", str(iterations)], cwd=ROOT, env=environment, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines, shown = [], threading.Event()

    def read() -> None:  # all along: a full pipe would stop the processes that write to it
        for line in process.stderr:
            lines.append(line)
            if kill and kill.said_in(line):
                shown.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if kill:
        _kill_when(process, kill, shown)
    process.wait(timeout=900)
    reader.join(timeout=60)
    return process.returncode, "".join(lines)


def _kill_when(process: subprocess.Popen, kill: Kill, shown: threading.Event) -> None:
    _wait_for(shown.is_set, process)
    command = psutil.Process(process.pid)
    if kill.sandbox_open:
        _wait_for(lambda: SANDBOX in _names(command), process)
    for member in [command, *command.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()


def _wait_for(condition: Callable[[], bool], process: subprocess.Popen) -> None:
    """Until `condition` holds, or the command has ended."""
    while not condition() and process.poll() is None:
        time.sleep(0.05)


def _names(process: psutil.Process) -> set[str]:
    names = set()
    for member in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            names.add(member.name())
    return names


def steps(instance: DagsterInstance, run_id: str, event: DagsterEventType) -> set[str]:
    return {record.event_log_entry.step_key for record in instance.get_records_for_run(run_id, of_type=event).records}


def test_a_run_killed_with_its_command_at_any_stage_resumes_at_that_stage(experiment):
    for number, kill in KILLED_IN.items():
        stage = kill.stage
        killed, said = crucible_run(experiment, number, kill)
        assert killed == -9, said[-3000:]
        with DagsterInstance.from_config(experiment["DAGSTER_HOME"]) as instance:
            # Its daemon's last heartbeat is fresh, but it died with its command: not one to wait for.
            assert live_daemons(instance) == set()
        code, said = crucible_run(experiment, number)
        assert code == 0, said[-3000:]
        assert "and the code server that started it" in said and "are gone: killed" in said
        assert "Dagster's run retries launch it again" in said
        partition = f"tiny|{number:04d}"
        with DagsterInstance.from_config(experiment["DAGSTER_HOME"]) as instance:
            [resumed, first] = [run for run in instance.get_runs() if run.tags.get("dagster/partition") == partition]
            done_before = steps(instance, first.run_id, DagsterEventType.STEP_SUCCESS)
            under_way = steps(instance, first.run_id, DagsterEventType.STEP_START) - done_before
            assert under_way == {stage}, f"iteration {number}: killed in {under_way}, not in {stage}"
            run_again = steps(instance, resumed.run_id, DagsterEventType.STEP_START)
            assert stage in run_again and not run_again & done_before, f"iteration {number}: {run_again}"
            for asset in ("trajectories", "checkpoint", "checkpoint_eval"):
                assert len(instance.fetch_materializations(
                    AssetRecordsFilter(AssetKey(asset), asset_partitions=[partition]), limit=5).records) == 1, asset
        crucible = CrucibleResource(storage_root=experiment["CRUCIBLE_STORAGE_ROOT"],
                                    checkpoint_root=experiment["CRUCIBLE_CHECKPOINT_ROOT"])
        verify_checkpoint(crucible.checkpoint_dir("tiny", number))
    assert_one_lineage(crucible, "tiny", len(KILLED_IN))
