"""The `rollouts` asset fans out over shards of the sampled tasks (assets/rollouts.py): Dagster's
multiprocess executor runs the shards side by side, and they sample what the same shards sample
one after the other in one process. `verified_rollouts` fans out over slices of the rollouts
(assets/verification.py), and its shards grade what one grading does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, EventLogEntry, materialize

from assets.io_manager import DatasetIOManager
from assets.iteration import task_set
from assets.partitions import add_iteration, experiments
from assets.pools import SAMPLING
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.step_outputs import PARTITION_TAG, step_outputs_dir
from assets.training_step import TrainingStepClient
from pipelines.instance import POSTGRES_URL_ENV, prepare_instance
from task_sets.loader import load_task_set
from training.experiment import BasePolicySettings, ExperimentConfig
from training.iteration.sampling import shards as sampling_shards

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("tasks, shards, sizes", [(10, 3, [3, 3, 4]), (2, 4, [1, 1]), (5, 1, [5])])
def test_shards_are_contiguous_slices_of_whole_tasks_and_none_is_empty(tmp_path, tasks, shards, sizes):
    sampled = load_task_set("compose").train()[:tasks]
    parts = sampling_shards(ExperimentConfig(rollout_shards=shards), sampled)
    assert [len(part) for part in parts] == sizes and [task for part in parts for task in part] == sampled


@pytest.fixture(scope="module")
def fanned_out(tmp_path_factory) -> dict:
    """A two-shard iteration's rollouts materialized by `dagster asset materialize`, first with
    every step in the run's process, then with a process per step, both shards at once."""
    workdir = tmp_path_factory.mktemp("fanout")
    environment = {**os.environ, "DAGSTER_HOME": str(workdir / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(workdir / "data"),
                   "CRUCIBLE_CHECKPOINT_ROOT": str(workdir / "checkpoints"), "HF_HUB_OFFLINE": "1"}
    environment.pop(POSTGRES_URL_ENV, None)
    crucible = CrucibleResource(storage_root=environment["CRUCIBLE_STORAGE_ROOT"],
                                checkpoint_root=environment["CRUCIBLE_CHECKPOINT_ROOT"])
    crucible.save_experiment(ExperimentConfig(name="fan", tasks_per_iteration=8, samples_per_task=2, max_new_tokens=16,
                                              rollout_shards=2, refill_rounds=0, base=BasePolicySettings(hidden_size=64, num_layers=2,
                                                                                        sft_steps=0)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", environment["DAGSTER_HOME"])
        prepare_instance()
        with DagsterInstance.get() as instance:
            instance.add_dynamic_partitions(experiments.name, ["fan"])
            assert materialize([base_policy], partition_key="fan", instance=instance,
                               resources={"crucible": crucible, "training_step": TrainingStepClient()}).success
            key = add_iteration(instance, "fan", 1)
            assert materialize([base_policy, task_set], selection=[task_set], partition_key=key, instance=instance,
                               resources={"crucible": crucible, "training_step": TrainingStepClient(),
                                          "io_manager": DatasetIOManager(storage_root=crucible.storage_root)}).success
            instance.event_log_storage.set_concurrency_slots(SAMPLING, 2)  # both samplers at once
            debris = _ended_runs_hand_overs(instance, environment, {"fan|0001": "killed", "fan|0002": "other"})
        # Three processes: the executor counts the planning step's until it has exited, and the
        # pool's two slots still keep the shards at two.
        samples = {processes: _materialize(environment, crucible, "rollouts", processes) for processes in (1, 3)}
        last, steps = _last_run()
        # The same rollouts graded whole in the run's process, then in two shards in a process each.
        verified = {shards: _materialize(environment, crucible, "verified_rollouts", processes, grading_shards=shards)
                    for shards, processes in ((1, 1), (2, 3))}
        grading_run, grading_steps = _last_run()
    return {"samples": samples, "steps": steps, "run": last, "workdir": workdir, "debris": debris,
            "verified": verified, "grading_run": grading_run, "grading_steps": grading_steps}


def _ended_runs_hand_overs(instance: DagsterInstance, environment: dict[str, str],
                           runs: dict[str, str]) -> dict[str, Path]:
    """A shard's hand-over left by an ended run of each partition, as a run killed mid-fan-out
    leaves it once the daemon's monitoring has failed the run."""
    folders = {}
    for partition, run_id in runs.items():
        instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=run_id, status=DagsterRunStatus.FAILURE,
                                    tags={PARTITION_TAG: partition}))
        folder = Path(step_outputs_dir(environment["CRUCIBLE_STORAGE_ROOT"])) / run_id
        (folder / "rollouts.sample_rollout_shard[shard_0]").mkdir(parents=True)
        (folder / "rollouts.sample_rollout_shard[shard_0]" / "result").write_bytes(b"a pickled shard")
        folders[partition] = folder
    return folders


def _materialize(environment: dict[str, str], crucible: CrucibleResource, asset: str, processes: int,
                 grading_shards: int = 1) -> list:
    done = subprocess.run([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "pipelines.definitions",
                           "--select", asset, "--partition", "fan|0001"], cwd=ROOT, capture_output=True, text=True,
                          env={**environment, "CRUCIBLE_STEP_PROCESSES": str(processes),
                               "CRUCIBLE_GRADING_SHARDS": str(grading_shards)}, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = crucible.store().read_partition("outputs", "fan", 1, part=asset).to_pylist()
    return [_untimed(json.loads(row["record"])) for row in sorted(rows, key=lambda row: row["index"])]


def _last_run() -> tuple[DagsterRun, list[EventLogEntry]]:
    """The latest run, and its steps' starts (and launches) and successes."""
    with DagsterInstance.get() as instance:
        [last, *_] = instance.get_runs(limit=1)
        kinds = {DagsterEventType.STEP_WORKER_STARTING, DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}
        steps = [record.event_log_entry for record in instance.get_records_for_run(last.run_id, of_type=kinds).records]
    return last, steps


def _untimed(value: object) -> object:
    """A stored sample less its timings (generate_s, …), which no two runs share."""
    if isinstance(value, dict):
        return {key: _untimed(item) for key, item in value.items() if not key.endswith("_s")}
    return [_untimed(item) for item in value] if isinstance(value, list) else value


def test_two_processes_sample_what_one_process_samples(fanned_out):
    one, two = fanned_out["samples"][1], fanned_out["samples"][3]
    assert len(one) == 16 and one == two
    assert len({sample["task_id"] for sample in one}) == 8


def test_with_two_processes_both_shards_are_launched_before_either_ends_each_in_a_process_of_its_own(fanned_out):
    # The event log's order, not wall-clock overlap: with processes and pool slots for both, the
    # executor launches both shards in one pass; one at a time would launch the second after the
    # first has ended.
    shard_events = [(entry.dagster_event.event_type, entry.step_key, entry.dagster_event.pid)
                    for entry in fanned_out["steps"] if "sample_rollout_shard" in entry.step_key]
    order = [kind for kind, _, _ in shard_events]
    assert order.index(DagsterEventType.STEP_SUCCESS) > max(i for i, kind in enumerate(order)
                                                            if kind == DagsterEventType.STEP_WORKER_STARTING)
    starts = {step: pid for kind, step, pid in shard_events if kind == DagsterEventType.STEP_START}
    assert sorted(starts) == ["rollouts.sample_rollout_shard[shard_0]", "rollouts.sample_rollout_shard[shard_1]"]
    assert len(set(starts.values())) == 2


def test_the_shards_hand_overs_are_deleted_once_gathered(fanned_out):
    # Where the IO manager writes them (the product's own path): it exists, so they were written
    # there, and no run of the two left its folder behind.
    hand_overs = Path(step_outputs_dir(str(fanned_out["workdir"] / "data")))
    assert hand_overs.is_dir()
    assert [run.run_id for run in (fanned_out["run"], fanned_out["grading_run"])
            if (hand_overs / run.run_id).exists()] == []


def test_gathering_deletes_the_hand_overs_ended_runs_of_the_partition_left(fanned_out):
    """A killed run's hand-overs go once a later run of its partition has gathered that asset;
    another partition's stay (its re-execution from failure may still read them)."""
    assert {partition: folder.exists() for partition, folder in fanned_out["debris"].items()} == {
        "fan|0001": False, "fan|0002": True}


def test_two_grading_shards_in_a_process_each_give_the_verdicts_of_one_grading(fanned_out):
    # A grading's execution record (its sandbox, start, memory, the report's timestamps) is its own.
    whole, sharded = ([{**verified, "grade": {key: value for key, value in verified["grade"].items() if key != "exec"}}
                       for verified in fanned_out["verified"][shards]] for shards in (1, 2))
    assert len(whole) == 16 and whole == sharded
    assert [verified["rollout"] for verified in whole] == fanned_out["samples"][1]
    assert {verified["grade"]["reward_status"] for verified in whole} == {"scored"}  # judged, not failed to run
    graders = {entry.step_key: entry.dagster_event.pid for entry in fanned_out["grading_steps"]
               if entry.dagster_event.event_type == DagsterEventType.STEP_START and "grade_rollout_shard" in entry.step_key}
    assert sorted(graders) == ["verified_rollouts.grade_rollout_shard[shard_0]",
                               "verified_rollouts.grade_rollout_shard[shard_1]"]
    assert len(set(graders.values())) == 2
