"""No task of a set from outside is sampled or evaluated until it is proven gradable on the
backend that grades it: the reference passes, the wrong submissions fail, the environment
builds. Proofs are kept per task version and backend; the task_set asset proves what is
unproven and counts the rest in its metadata; a built-in set needs no proof."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from dagster import AssetKey, DagsterInstance, materialize
from patience import PATIENCE_S

from assets.io_manager import DatasetIOManager
from assets.iteration import task_set as task_set_asset
from assets.partitions import add_iteration
from assets.resources import CrucibleResource
from environments.store import EnvironmentStore
from grading.gradability import Gradability, ProofLedger, prove, unproven, with_proofs
from grading.verdict import GradeResult
from sandbox.backends import open_sandbox
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from task_sets.schema import parse_task
from training.experiment import ExperimentConfig
from training.iteration.tasks import loaded_task_set, prove_unproven

pytestmark = pytest.mark.usefixtures("local_backend")
SQUARE_TESTS = "from solution import square\n\ndef test_square():\n    assert square(3) == 9\n"


def function_task(name: str, split: str, tests: str = SQUARE_TESTS, **fields):
    return parse_task({"id": f"outside/{name}", "prompt": f"Write square(x) ({name}).", "entry_point": "square",
                       "reference_solution": "def square(x):\n    return x * x\n", "tests": tests,
                       "difficulty": "easy", "family": "square", "split": split, **fields})


TASKS = [
    function_task("good-train", "train"),
    function_task("good-eval", "eval"),
    # Tests that a function returning None passes: they cannot tell right from wrong.
    function_task("lax", "train", tests="from solution import square\n\ndef test_square():\n    square(3)\n"),
    function_task("no-python", "train", environment={"python_version": "3.4", "python": ["attrs==23.1.0"]}),
]


@pytest.fixture
def outside(tmp_path):
    """The set as a user's folder."""
    write_task_set(TASKS, tmp_path / "outside")
    return load_task_set(tmp_path / "outside")


@pytest.fixture
def ledger(tmp_path) -> ProofLedger:
    """The proofs of an environment store of the test's own."""
    return ProofLedger(EnvironmentStore(tmp_path / "environments"))


def prove_on(backend: str, tasks, ledger: ProofLedger) -> None:
    with SandboxPool(lambda spec: open_sandbox(backend, spec), PoolConfig(cpu_slots=2),
                     is_infra_failure=GradeResult.infra_failed) as pool:  # as the product proves
        prove(tasks, backend, pool, ledger)


def test_an_unproven_task_is_left_out_of_sampling_and_evaluation(outside, ledger):
    unproven_set = with_proofs(outside, "local", ledger)
    assert unproven_set.train() == [] and unproven_set.eval() == []
    assert "not yet proven gradable on the local backend" in unproven_set.unusable["outside/good-train"]
    assert len(unproven(outside, "local", ledger)) == len(TASKS)


def test_proven_tasks_are_sampled_and_the_others_left_out_with_their_reason(outside, ledger):
    prove_on("local", outside, ledger)
    proven = with_proofs(outside, "local", ledger)
    assert [t.id for t in proven.train()] == ["outside/good-train"] and [t.id for t in proven.eval()] == ["outside/good-eval"]
    assert proven.unusable["outside/lax"] == "the entry point returning None passes every test"
    assert "needs Python 3.4; available:" in proven.unusable["outside/no-python"]
    assert len(proven) == len(TASKS) and proven.version == outside.version  # nothing removed from the set itself


def test_a_task_whose_environment_did_not_build_is_proven_again_next_time_and_left_out_meanwhile(outside, ledger):
    prove_on("local", outside, ledger)
    # A build can fail for a while (the package index down): only that proof is sought again.
    assert [t.id for t in unproven(outside, "local", ledger)] == ["outside/no-python"]
    assert "outside/no-python" in with_proofs(outside, "local", ledger).unusable


def test_a_proof_holds_for_its_backend_and_its_task_version_only(outside, ledger):
    prove_on("local", [outside.by_id["outside/good-train"]], ledger)
    good = outside.by_id["outside/good-train"]
    assert ledger.status(outside, good, "local") == (Gradability.USABLE, "")
    assert ledger.status(outside, good, "docker") == (Gradability.UNPROVEN, "")
    edited = good.model_copy(update={"tests": SQUARE_TESTS + "\ndef test_zero():\n    assert square(0) == 0\n"})
    assert ledger.get(edited, "local") is None


def test_a_built_in_set_needs_no_proof(ledger):
    shopcart = load_task_set("shopcart")
    assert with_proofs(shopcart, "local", ledger) is shopcart and unproven(shopcart, "local", ledger) == []
    assert ledger.status(shopcart, shopcart.tasks[0], "local") == (Gradability.BUILT_IN, "")


def test_tasks_list_shows_each_tasks_gradability(outside, ledger, tmp_path):
    prove_on("local", outside, ledger)
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "tasks", "list", "--task-set", str(tmp_path / "outside"),
                           "--backend", "local"], capture_output=True, text=True, timeout=PATIENCE_S,
                          env={**os.environ, "COLUMNS": "250", "CRUCIBLE_ENVIRONMENTS": str(tmp_path / "environments")})
    rows = {line.split("│")[1].strip(): line.split("│")[-2].strip() for line in done.stdout.splitlines()
            if line.startswith("│ outside/")}
    assert rows["outside/good-train"] == "usable"
    assert rows["outside/lax"].startswith("unusable: the entry point returning None passes")


def test_the_task_set_asset_proves_what_is_unproven_and_counts_what_it_leaves_out(outside, tmp_path):
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"),
                                environments=str(tmp_path / "environments"))
    crucible.save_experiment(ExperimentConfig(name="exp", task_set=str(tmp_path / "outside"), samples_per_task=2))
    with DagsterInstance.ephemeral() as instance:
        result = materialize([task_set_asset], partition_key=add_iteration(instance, "exp", 1), instance=instance,
                             resources={"crucible": crucible,
                                        "io_manager": DatasetIOManager(storage_root=crucible.storage_root)})
        assert result.success
        [materialization] = [m for m in result.asset_materializations_for_node("task_set")
                             if m.asset_key == AssetKey("task_set")]
    metadata = {key: value.value for key, value in materialization.metadata.items()}
    assert (metadata["tasks"], metadata["tasks/usable"], metadata["tasks/unusable"],
            metadata["tasks/proven_this_run"]) == (1, 2, 2, 4)
    # The next iteration proves only what may pass now: the task whose environment did not build.
    assert prove_unproven(crucible, loaded_task_set(crucible, crucible.experiment("exp")), log=lambda line: None) == 1
    assert "outside/lax" in metadata["unusable_tasks"] and "needs Python 3.4" in metadata["unusable_tasks"]
    assert ProofLedger(crucible.environment_store()).get(outside.by_id["outside/good-eval"], "local").usable


def test_an_iteration_with_no_usable_train_task_fails_saying_so(tmp_path):
    write_task_set([TASKS[1], TASKS[2]], tmp_path / "lax-only")  # the only train task is lax
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"),
                                environments=str(tmp_path / "environments"))
    crucible.save_experiment(ExperimentConfig(name="exp", task_set=str(tmp_path / "lax-only"), samples_per_task=2))
    with DagsterInstance.ephemeral() as instance:
        result = materialize([task_set_asset], partition_key=add_iteration(instance, "exp", 1), instance=instance,
                             resources={"crucible": crucible,
                                        "io_manager": DatasetIOManager(storage_root=crucible.storage_root)},
                             raise_on_error=False)
    [failure] = [event for event in result.all_events if event.is_step_failure]
    assert "no train task of 'lax-only' is proven gradable on the local backend" in \
        failure.step_failure_data.error.message
