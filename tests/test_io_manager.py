"""assets/io_manager.py: what one iteration asset hands the next is stored as Parquet, so a middle
asset can be re-materialized alone, in another run (problem 8 of issue 16: the in-memory IO
manager could not load its inputs)."""

from __future__ import annotations

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    FilesystemIOManager,
    build_input_context,
    build_output_context,
    materialize,
)
from dagster._core.types.dagster_type import resolve_dagster_type  # how Dagster types an input annotation

from assets.io_manager import DatasetIOManager
from assets.iteration import task_set, trajectories
from assets.partitions import add_iteration, iteration_key
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.rollouts import rollouts
from assets.step_outputs import STEP_OUTPUTS
from assets.training_step import TrainingStepClient
from assets.verification import verified_rollouts
from grading.submission import grade_solution
from pipelines.run_failures import innermost
from task_sets.loader import load_task_set
from task_sets.schema import TaskBase
from training.agent.rollout import Rollout, Turn
from training.agent.trajectory import VerifiedRollout
from training.experiment import ExperimentConfig
from training.policy.model import build_base_policy
from training.policy.settings import PolicyConfig

pytestmark = pytest.mark.usefixtures("local_backend")
ASSETS = [base_policy, task_set, rollouts, verified_rollouts, trajectories]
TINY = PolicyConfig(hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=32)


@pytest.fixture
def crucible(tmp_path) -> CrucibleResource:
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    crucible.save_experiment(ExperimentConfig(name="exp", tasks_per_iteration=2, samples_per_task=2, max_new_tokens=8,
                                              regrade_fraction=0.0))
    build_base_policy(crucible.base_policy_dir("exp"), TINY)
    return crucible


def resources(crucible: CrucibleResource) -> dict:
    return {"crucible": crucible, "io_manager": DatasetIOManager(storage_root=crucible.storage_root),
            STEP_OUTPUTS: FilesystemIOManager(base_dir=f"{crucible.storage_root}/step_outputs"),
            "training_step": TrainingStepClient()}


def _run(crucible: CrucibleResource, instance: DagsterInstance, *selection) -> None:
    result = materialize(ASSETS, selection=list(selection), partition_key=add_iteration(instance, "exp", 1),
                         instance=instance, resources=resources(crucible))
    assert result.success


def test_a_middle_asset_is_rematerialized_alone_from_the_stored_outputs(crucible):
    with DagsterInstance.ephemeral() as instance:
        _run(crucible, instance, task_set, rollouts)
        # the tasks dataset written beside task_set is recorded as its own asset's partition
        assert instance.get_materialized_partitions(AssetKey(["datasets", "tasks"])) == {"exp|0001"}
    with DagsterInstance.ephemeral() as instance:  # another run, another process's worth of memory
        _run(crucible, instance, verified_rollouts)
        _run(crucible, instance, trajectories)
        stored = instance.get_latest_materialization_event(AssetKey("verified_rollouts")).asset_materialization
    table = crucible.store().read_partition("trajectories", "exp", 1)
    assert table.num_rows == 4 and stored.metadata["samples"].value == 4
    assert "/outputs/experiment=exp/iteration=1/verified_rollouts-" in stored.metadata["stored_as"].value


def test_an_input_never_stored_fails_with_what_to_materialize(crucible):
    with DagsterInstance.ephemeral() as instance:
        result = materialize(ASSETS, selection=[verified_rollouts], partition_key=add_iteration(instance, "exp", 1),
                             instance=instance, raise_on_error=False, resources=resources(crucible))
    [failure] = [event for event in result.all_events if event.is_step_failure]
    message = innermost(failure.step_failure_data.error).message
    assert "of exp iteration 1 was never stored: materialize it first (or the whole iteration)" in message


def test_a_stored_episode_comes_back_as_the_same_objects(tmp_path):
    """Every type an iteration hands on survives the round trip, an episode's turns included."""
    task = load_task_set("shopcart").train()[0]
    turn = Turn(reply="<run>pytest</run>", action="run", detail="pytest", status="ok", exit_code=1,
                observation="1 failed", generate_s=0.1, exec_s=0.2, sampled_tokens=5)
    rollout = Rollout(task_id=task.id, group_id="g", sample_index=0, policy_version="p", prompt_ids=[1],
                      response_ids=[2, 3], behaviour_logprobs=[-0.1, 0.0], finish_reason="stop", response_text="x",
                      generate_s=0.1, loss_mask=[1, 0], turns=(turn,), solution="diff")
    verified = [VerifiedRollout(rollout, task, grade_solution(task, task.reference_solution), verify_s=0.5)]
    manager = DatasetIOManager(storage_root=str(tmp_path))
    key = iteration_key("exp", 1)
    for asset, value, declared in (("task_set", [task], list[TaskBase]), ("verified_rollouts", verified,
                                                                           list[VerifiedRollout])):
        manager.handle_output(build_output_context(asset_key=AssetKey(asset), partition_key=key), value)
        loaded = manager.load_input(build_input_context(asset_key=AssetKey(asset), partition_key=key,
                                                        dagster_type=resolve_dagster_type(declared)))
        assert loaded == value and type(loaded[0]) is type(value[0])
