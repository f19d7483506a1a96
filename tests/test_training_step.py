"""The `checkpoint` asset end to end: a real Dagster run launches the training step as a
process of its own through Pipes, on a stored trajectory partition, and judges the result.

The samples are real (the tiny policy's, graded in the sandbox); only their rewards are set by
the test, sample 0 of each group rewarded, so that the step has a known signal to learn from.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, materialize
from patience import PATIENCE_S

from assets.iteration import STABILITY_CHECKS, checkpoint
from assets.partitions import add_iteration, experiments
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from datastore import catalog, metrics
from datastore.store import rows_to_table
from grading.submission import grade_solution
from task_sets.loader import load_task_set
from training.agent.rollout import sample_rollouts
from training.agent.trajectory import VerifiedRollout, trajectory_row
from training.evaluation.monitors import SAMPLE_SIGNALS, MonitorConfig
from training.experiment import BasePolicySettings, ExperimentConfig
from training.inference.engine import SamplingParams
from training.inference.transformers_engine import TransformersEngine
from training.iteration.context import Refused
from training.iteration.lineage import Checkpoints
from training.iteration.training_step import NOTHING_LEARNED
from training.policy.chat import ChatFormat
from training.policy.checkpoint import verify_checkpoint
from training.policy.model import build_base_policy, load_policy
from training.policy.settings import PolicyConfig
from training.rl.settings import GRPOConfig
from training.sft.demonstrations import single_turn_examples
from training.sft.settings import SFTConfig
from training.sft.warmup import supervised_warmup

ROOT = Path(__file__).parent.parent

pytestmark = pytest.mark.slow

TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=512, seed=0)
# Four passes over one batch of 16: the surrogate of that batch is what the step minimises.
GRPO = GRPOConfig(lr=1e-3, lr_warmup_steps=0, epochs=4, minibatch_size=16, micro_batch_tokens=512)


@pytest.fixture(scope="module")
def crucible(tmp_path_factory) -> CrucibleResource:
    root = tmp_path_factory.mktemp("step")
    resource = CrucibleResource(storage_root=str(root / "data"), checkpoint_root=str(root / "checkpoints"))
    tasks = load_task_set("default").train()[:4]
    initial = build_base_policy(root / "init", TINY)
    examples = single_turn_examples(ChatFormat.from_pretrained(initial), [(t.prompt, t.reference_solution) for t in tasks])
    for experiment in ("learns", "diverges", "ranks", "contained", "flat"):
        supervised_warmup(initial, examples, resource.base_policy_dir(experiment),
                          SFTConfig(steps=20, lr=1e-2, warmup_steps=2, batch_size=4))
    _store_iteration(resource, "learns", tasks)
    _store_iteration(resource, "diverges", tasks)
    _store_iteration(resource, "ranks", tasks)
    _store_iteration(resource, "contained", tasks)
    _store_iteration(resource, "flat", tasks)
    return resource


def _store_iteration(crucible: CrucibleResource, experiment: str, tasks) -> None:
    """Iteration 1's trajectories: 4 samples per task from the base policy, really graded, with
    the test's rewards."""
    monitors = MonitorConfig(max_step_kl=1e-9) if experiment == "diverges" else MonitorConfig()
    crucible.save_experiment(ExperimentConfig(name=experiment, task_set="default", samples_per_task=4,
                                              temperature=1.0, grpo=GRPO, max_turns=1, monitors=monitors))
    base = crucible.base_policy_dir(experiment)
    engine = TransformersEngine(base, verify_checkpoint(base)["content_hash"])
    params = SamplingParams(n=4, max_new_tokens=16, temperature=1.0, seed=0)
    rollouts = sample_rollouts(engine, engine.chat, tasks, params, f"{experiment}-0001")
    by_id = {task.id: task for task in tasks}
    rows = []
    for rollout in rollouts:
        task = by_id[rollout.task_id]
        grade = grade_solution(task, rollout.solution)
        reward = 0.0 if experiment == "flat" else float(rollout.sample_index == 0)  # flat: no group has a spread
        grade = dataclasses.replace(grade, reward=reward, reward_status="scored")
        rows.append(trajectory_row(VerifiedRollout(rollout, task, grade, verify_s=0.0)))
    crucible.store().write_partition("trajectories", experiment, 1, rows_to_table("trajectories", rows))
    if experiment == "diverges":  # as though iterations 1 to 3 had been trained before this re-run of 1
        for number in (1, 3):
            earlier = {name: None for name in rows_to_table("checkpoints", []).schema.names}
            earlier.update(path="p", content_hash=f"{number}" * 64, blocked=False, monitor_messages=[], trajectories=[])
            crucible.store().write_partition("checkpoints", experiment, number, rows_to_table("checkpoints", [earlier]))


def _train(crucible: CrucibleResource, experiment: str, dagster_home, training_step=None):
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    try:
        with DagsterInstance.get() as instance:
            key = add_iteration(instance, experiment, 1)
            result = materialize([checkpoint], partition_key=key, instance=instance,
                                 resources={"crucible": crucible, "training_step": training_step or TrainingStepClient()},
                                 raise_on_error=False)
            history = {name: [record.event.dagster_event.event_specific_data for record in
                              instance.event_log_storage.get_asset_check_execution_history(
                                  AssetCheckKey(AssetKey("checkpoint"), name), limit=10)]
                       for name in STABILITY_CHECKS}
            # The run's own evaluations (of its partition), and any it reported on later partitions.
            checks = {name: next(e for e in evaluations if e.partition in (None, key))
                      for name, evaluations in history.items()}
            checks["later"] = {e.partition: e for e in history["lineage_current"] if e.partition not in (None, key)}
            materialization = instance.get_latest_materialization_event(AssetKey("checkpoint"))
    finally:
        del os.environ["DAGSTER_HOME"]
    return result, checks, materialization


@pytest.fixture(scope="module")
def learned(crucible, tmp_path_factory):
    """The `learns` experiment's iteration 1, trained once for every test that reads it."""
    return _train(crucible, "learns", tmp_path_factory.mktemp("dagster"))


@pytest.fixture(scope="module")
def diverged(crucible, tmp_path_factory):
    return _train(crucible, "diverges", tmp_path_factory.mktemp("dagster"))


@pytest.fixture(scope="module")
def flat(crucible, tmp_path_factory):
    """The `flat` experiment's iteration 1: every sample scored 0, so no optimizer step."""
    return _train(crucible, "flat", tmp_path_factory.mktemp("dagster"))


@pytest.fixture(scope="module")
def two_ranks(crucible, tmp_path_factory):
    """The `ranks` experiment's iteration 1, trained by two data parallel ranks under torchrun."""
    launcher = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2"
    under_torchrun = CrucibleResource(storage_root=crucible.storage_root, checkpoint_root=crucible.checkpoint_root,
                                      train_launcher=launcher)
    return _train(under_torchrun, "ranks", tmp_path_factory.mktemp("dagster"))


@pytest.fixture(scope="module")
def contained(crucible, tmp_path_factory, project_image):
    """The `contained` experiment's iteration 1, trained in a container of the project image
    through Dagster's PipesDockerClient."""
    return _train(crucible, "contained", tmp_path_factory.mktemp("dagster"),
                  TrainingStepClient(client="docker", image=project_image))


def test_the_step_runs_as_its_own_process_and_its_loss_decreases(crucible, learned):
    result, checks, materialization = learned
    assert result.success
    steps = crucible.store().read_partition("training_steps", "learns", 1).to_pylist()
    assert [row["step"] for row in steps] == [1, 2, 3, 4]
    losses = [row["loss"] for row in steps]
    assert losses[-1] < losses[0], losses  # four passes over the same batch minimise its surrogate
    assert all(row["entropy"] > 0 and row["lr"] == pytest.approx(1e-3) for row in steps)
    assert all(check.passed for name, check in checks.items() if name != "later")
    metadata = materialization.asset_materialization.metadata
    assert metadata["optimizer_steps"].value == 4  # streamed back from the training process
    assert "| loss |" in metadata["steps"].value


def test_the_manifest_names_the_trajectory_partition_it_learned_from(crucible, learned):
    store = crucible.store()
    manifest = verify_checkpoint(crucible.checkpoint_dir("learns", 1))
    lineage = manifest["lineage"]
    assert lineage["trajectories"] == store.partition_files("trajectories", "learns", 1)
    assert lineage["parent"]["content_hash"] == verify_checkpoint(crucible.base_policy_dir("learns"))["content_hash"]
    assert lineage["task_set_version"] == load_task_set("default").version
    assert lineage["code_version"].startswith("crucible ") and len(lineage["config_hash"]) == 64
    [row] = store.read_partition("checkpoints", "learns", 1).to_pylist()
    assert row["content_hash"] == manifest["content_hash"] and row["global_step"] == 4 and not row["blocked"]
    assert row["trajectories"] == lineage["trajectories"]


def test_the_stored_sample_signals_are_the_iteration_rewards_view(crucible, learned):
    [row] = crucible.store().read_partition("checkpoints", "learns", 1).to_pylist()
    [view] = metrics.records(catalog.connect(crucible.storage_root),
                             "SELECT * FROM iteration_rewards WHERE experiment = 'learns' AND iteration = 1")
    assert {name: row[name] for name in SAMPLE_SIGNALS} == {name: view[name] for name in SAMPLE_SIGNALS}
    assert view["zero_variance_fraction"] < 1.0  # sample 0 of each group rewarded: every group informative


def test_in_a_docker_container_the_step_trains_what_the_subprocess_trains(crucible, learned, contained):
    result, checks, materialization = contained
    assert result.success
    assert all(check.passed for name, check in checks.items() if name != "later")
    assert materialization.asset_materialization.metadata["optimizer_steps"].value == 4  # from the container's log
    in_docker = crucible.store().read_partition("training_steps", "contained", 1).to_pylist()
    in_process = crucible.store().read_partition("training_steps", "learns", 1).to_pylist()
    assert [row["loss"] for row in in_docker] == pytest.approx([row["loss"] for row in in_process], rel=1e-4)
    manifest = verify_checkpoint(crucible.checkpoint_dir("contained", 1))
    assert manifest["global_step"] == 4


def _warm_up(crucible: CrucibleResource, experiment: str, dagster_home, training_step: TrainingStepClient):
    """The base_policy asset of a small built-in model with a six-step warm-up."""
    crucible.save_experiment(ExperimentConfig(name=experiment, task_set="default", max_turns=1,
                                              base=BasePolicySettings(hidden_size=64, num_layers=2, sft_steps=6)))
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    try:
        with DagsterInstance.get() as instance:
            instance.add_dynamic_partitions(experiments.name, [experiment])
            result = materialize([base_policy], partition_key=experiment, instance=instance,
                                 resources={"crucible": crucible, "training_step": training_step})
            materialization = instance.get_latest_materialization_event(AssetKey("base_policy"))
    finally:
        del os.environ["DAGSTER_HOME"]
    assert result.success
    return materialization.asset_materialization.metadata


def test_the_warm_up_runs_through_the_training_steps_client_in_a_process_or_a_container(crucible, project_image,
                                                                                       tmp_path_factory):
    """The base policy's warm-up is a job of the training step's Pipes client: the same weights
    from a process of its own and from a container; its inputs are gone afterwards."""
    in_process = _warm_up(crucible, "warm", tmp_path_factory.mktemp("dagster"), TrainingStepClient())
    contained = _warm_up(crucible, "warm-box", tmp_path_factory.mktemp("dagster"),
                         TrainingStepClient(client="docker", image=project_image))
    assert in_process["sft/steps"].value == contained["sft/steps"].value == 6
    assert in_process["examples"].value == contained["examples"].value > 0
    assert contained["sft/final_loss"].value == pytest.approx(in_process["sft/final_loss"].value, rel=1e-4)
    first, second = (load_policy(crucible.base_policy_dir(name))[0].state_dict() for name in ("warm", "warm-box"))
    assert max(float((first[name] - second[name]).abs().max()) for name in first) < 1e-5
    assert verify_checkpoint(crucible.base_policy_dir("warm"))["kind"] == "sft"
    assert not list(crucible.experiment_dir("warm").parent.glob("*/.base-inputs"))


def test_under_torchrun_two_ranks_train_the_step_and_rank_0_reports_it(crucible, two_ranks):
    result, checks, materialization = two_ranks
    assert result.success
    assert all(check.passed for name, check in checks.items() if name != "later")
    manifest = verify_checkpoint(crucible.checkpoint_dir("ranks", 1))
    assert (manifest["world_size"], manifest["device"], manifest["global_step"]) == (2, "cpu", 4)
    steps = crucible.store().read_partition("training_steps", "ranks", 1).to_pylist()
    assert [row["step"] for row in steps] == [1, 2, 3, 4]  # one report per step: rank 0's alone
    assert materialization.asset_materialization.metadata["content_hash"].value == manifest["content_hash"]


def test_a_rerun_of_an_iteration_marks_every_later_checkpoint_off_lineage(crucible, diverged):
    """Dagster draws no edge from checkpoint N-1 to iteration N, so a re-run of iteration 1 could
    not mark the later ones stale: the lineage_current check does, on each later partition."""
    _, checks, _ = diverged
    assert checks["lineage_current"].passed
    [later] = checks["later"].values()
    assert later.partition == "diverges|0003" and not later.passed
    assert "the re-run of iteration 1 replaced: materialize iterations 2 to 3 again, in order" in later.description


def test_a_diverged_step_blocks_the_next_iteration(crucible, diverged):
    result, checks, _ = diverged
    assert not result.success  # the blocking check failed the run
    assert not checks["training_not_diverged"].passed and checks["training_finite"].passed
    [row] = crucible.store().read_partition("checkpoints", "diverges", 1).to_pylist()
    assert row["blocked"]
    with pytest.raises(Refused, match="failed its stability checks \\(training_not_diverged: error"):
        Checkpoints(crucible, "diverges").sampled_by(2)


def test_a_step_without_an_optimizer_step_says_so_and_runs_no_monitor(crucible, flat):
    result, checks, _ = flat
    assert result.success
    [row] = crucible.store().read_partition("checkpoints", "flat", 1).to_pylist()
    assert row["monitor_messages"] == [NOTHING_LEARNED] and not row["blocked"]
    assert row["content_hash"] == verify_checkpoint(crucible.base_policy_dir("flat"))["content_hash"]
    assert row["entropy"] is None and row["loss"] is None  # nothing was measured, so nothing is judged
    for name in ("training_finite", "training_not_diverged", "entropy_not_collapsed", "tamper_rate_not_rising"):
        assert checks[name].description == f"not run: {NOTHING_LEARNED}", name


# What the checkpoint step does, reduced to its process tree: a run process starts the training
# step with the launcher command, then is killed without a word.
STEP = "import time; time.sleep(600)"
ORPHANED_STEP = f"""
import subprocess, sys
from assets.resources import CrucibleResource
STEP = {STEP!r}
command = CrucibleResource().train_launcher_command()
step = subprocess.Popen([*command, "-c", STEP])
print(step.pid, flush=True)
step.wait()
"""


def _executes_the_step(process: psutil.Process) -> bool:
    command = process.cmdline()
    return bool(command) and command[-1] == STEP and "setpriv" not in command[0]


def test_a_training_step_dies_with_a_run_killed_without_a_word(tmp_path):
    """Left running, it would go on writing the checkpoint the run, started again, trains too."""
    run = subprocess.Popen([sys.executable, "-c", ORPHANED_STEP], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    step = psutil.Process(int(run.stdout.readline()))
    # setpriv sets the parent-death signal and then executes the step: a run killed before that
    # would not be the case under test. Until then the process is the run's fork (its command line
    # the run's, or empty while it executes), then setpriv.
    deadline = time.monotonic() + 120
    while not _executes_the_step(step) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _executes_the_step(step), step.cmdline()
    run.kill()
    run.wait(timeout=PATIENCE_S)
    step.wait(timeout=PATIENCE_S)  # psutil.TimeoutExpired: the step outlived its run
    assert not step.is_running()


@pytest.mark.parametrize("setting, said", [
    ({"CRUCIBLE_TRAIN_CLIENT": "k8s"}, "error: CRUCIBLE_TRAIN_CLIENT='k8s': choose one of subprocess, docker, kubernetes"),
    ({"CRUCIBLE_TRAIN_CLIENT": "kubernetes"}, "error: CRUCIBLE_TRAIN_CLIENT=kubernetes needs CRUCIBLE_TRAIN_POD_TEMPLATE: "
                                              "a PodTemplate file such as deploy/kubernetes/training-step.yaml"),
    ({"CRUCIBLE_TRAIN_CLIENT": "kubernetes", "CRUCIBLE_TRAIN_POD_TEMPLATE": "deploy/kubernetes/sandbox.yaml"},
     "error: CRUCIBLE_TRAIN_POD_TEMPLATE: deploy/kubernetes/sandbox.yaml: template.spec.volumes has no volume named "
     "'checkpoints' (the claim that holds the checkpoints)"),
    ({"CRUCIBLE_TRAIN_CLIENT": "docker"}, "error: CRUCIBLE_TRAIN_CLIENT=docker needs CRUCIBLE_TRAIN_IMAGE: the tag "
                                          "scripts/build-project-image prints"),
])
def test_crucible_run_refuses_a_training_client_it_cannot_use_in_one_line(tmp_path, setting, said):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"),
           **setting}
    env.pop("CRUCIBLE_POSTGRES_URL", None)
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "x", "--iterations", "1"],
                          env=env, capture_output=True, text=True, timeout=PATIENCE_S, cwd=ROOT)
    assert (done.returncode, done.stderr.strip()) == (2, said)
