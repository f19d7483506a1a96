"""Faults as a platform engineer meets them, each a real process and a real fault, then
`crucible run` again: the experiment goes on by itself, from where it stopped.

(A full disk: tests/test_out_of_space.py; a corrupt checkpoint: tests/test_end_to_end.py; a
damaged partition: tests/test_sql_cli.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
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
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from training.experiment import BasePolicySettings, ExperimentConfig
from training.policy.checkpoint import verify_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> dict[str, str]:
    """A tiny experiment with its base policy built: the environment `crucible run` runs it in."""
    workdir = tmp_path_factory.mktemp("faults")
    environment = {**os.environ, "DAGSTER_HOME": str(workdir / "dagster"), "HF_HUB_OFFLINE": "1",
                   "CRUCIBLE_STORAGE_ROOT": str(workdir / "data"), "CRUCIBLE_CHECKPOINT_ROOT": str(workdir / "ckpt")}
    environment.pop(POSTGRES_URL_ENV, None)
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:4], *compose.eval()[:2]], workdir / "mini")
    crucible = CrucibleResource(storage_root=environment["CRUCIBLE_STORAGE_ROOT"],
                                checkpoint_root=environment["CRUCIBLE_CHECKPOINT_ROOT"])
    crucible.save_experiment(ExperimentConfig(
        name="tiny", task_set=str(workdir / "mini"), tasks_per_iteration=2, samples_per_task=2, max_new_tokens=16,
        eval_tasks=2, eval_samples=1, refill_rounds=0, regrade_fraction=0.0, max_turns=1,
        base=BasePolicySettings(hidden_size=32, num_layers=1, sft_steps=0)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", environment["DAGSTER_HOME"])
        prepare_instance()
        with DagsterInstance.get() as instance:
            instance.add_dynamic_partitions(experiments.name, ["tiny"])
            assert materialize([base_policy], partition_key="tiny", instance=instance,
                               resources={"crucible": crucible, "training_step": TrainingStepClient()}).success
    return environment


def crucible_run(environment: dict[str, str], until: str | None = None) -> tuple[int, str]:
    """`crucible run` for one iteration; with `until`, the command and everything it started
    (code server, daemon, run worker, training process) are SIGKILLed once a line has it."""
    process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "tiny",
                                "--iterations", "1"], cwd=ROOT, env=environment, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if until and until in line:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
            for member in tree:
                member.kill()
            break
    process.wait(timeout=900)
    return process.returncode, "".join(lines)


def test_a_run_killed_with_its_command_in_the_training_step_resumes_at_that_step(experiment):
    killed, _ = crucible_run(experiment, until="checkpoint: step start")
    assert killed == -9
    with DagsterInstance.from_config(experiment["DAGSTER_HOME"]) as instance:
        # Its daemon's last heartbeat is fresh, but it died with its command: not one to wait for.
        assert live_daemons(instance) == set()
    code, said = crucible_run(experiment)
    assert code == 0, said[-3000:]
    assert "and the code server that started it" in said and "are gone: killed" in said
    assert "Dagster's run retries launch it again" in said
    with DagsterInstance.from_config(experiment["DAGSTER_HOME"]) as instance:
        [resumed, _killed] = [run for run in instance.get_runs() if run.tags.get("dagster/partition") == "tiny|0001"]
        steps = {record.event_log_entry.step_key for record in instance.get_records_for_run(
            resumed.run_id, of_type=DagsterEventType.STEP_START).records}
        assert steps == {"checkpoint", "checkpoint_eval"}  # from the step it was killed in; rollouts were not redone
        for asset in ("trajectories", "checkpoint_eval"):
            assert len(instance.fetch_materializations(
                AssetRecordsFilter(AssetKey(asset), asset_partitions=["tiny|0001"]), limit=5).records) == 1, asset
    crucible = CrucibleResource(storage_root=experiment["CRUCIBLE_STORAGE_ROOT"],
                                checkpoint_root=experiment["CRUCIBLE_CHECKPOINT_ROOT"])
    verify_checkpoint(crucible.checkpoint_dir("tiny", 1))
