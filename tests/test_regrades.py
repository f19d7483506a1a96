"""Re-verification that keeps history (issue 16, problem 3): re-grading a trained iteration with
a new reward function stores a new version beside the old, the trajectory files its checkpoint was
trained on stay as they were, and SQL shows the original and re-graded rewards side by side."""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from assets.partitions import add_iteration
from assets.regrades import regrades
from assets.resources import CrucibleResource
from datastore import catalog, metrics
from datastore.store import rows_to_table
from grading.submission import grade_solution
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from training.agent.rollout import Rollout
from training.agent.trajectory import VerifiedRollout, trajectory_row
from training.experiment import ExperimentConfig

pytestmark = pytest.mark.usefixtures("local_backend")
WRONG = "def nothing():\n    return None\n"


@pytest.fixture
def trained(tmp_path) -> tuple[CrucibleResource, list[str]]:
    """Iteration 1 of `exp`, graded for real (each task's reference passes, a wrong answer fails)
    and trained on: its `checkpoints` row names the trajectory files."""
    tasks = load_task_set("compose").train()[:2]
    write_task_set(tasks, tmp_path / "set")
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    crucible.save_experiment(ExperimentConfig(name="exp", task_set=str(tmp_path / "set")))
    rows = []
    for task in tasks:
        for index, answer in enumerate((task.reference_solution, WRONG)):
            rollout = Rollout(task_id=task.id, group_id=f"exp-0001/{task.id}", sample_index=index, policy_version="p",
                              prompt_ids=[1], response_ids=[2], behaviour_logprobs=[-0.1], finish_reason="stop",
                              response_text=answer, generate_s=0.0, solution=answer)
            rows.append(trajectory_row(VerifiedRollout(rollout, task, grade_solution(task, answer), verify_s=0.0)))
    store = crucible.store()
    store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    files = store.partition_files("trajectories", "exp", 1)
    row = {name: None for name in rows_to_table("checkpoints", []).schema.names}
    row.update(path="p", content_hash="c", blocked=False, monitor_messages=[], trajectories=files)
    store.write_partition("checkpoints", "exp", 1, rows_to_table("checkpoints", [row]))
    return crucible, files


def _regrade(crucible: CrucibleResource) -> dict:
    with DagsterInstance.ephemeral() as instance:
        result = materialize([regrades], partition_key=add_iteration(instance, "exp", 1), instance=instance,
                             resources={"crucible": crucible})
        assert result.success
        return instance.get_latest_materialization_event(AssetKey("regrades")).asset_materialization.metadata


def test_a_regrade_under_a_new_reward_function_stands_beside_the_original(trained, tmp_path):
    crucible, files = trained
    store = crucible.store()
    before = [store.fs.cat_file(store.fs._strip_protocol(uri)) for uri in files]
    first = _regrade(crucible)
    assert first["samples"].value == 4 and first["verdicts_changed"].value == 0
    (tmp_path / "set" / "reward.toml").write_text('name = "all-or-nothing"\ntests_passed = 0.0\nall_passed = 1.0\n')
    second = _regrade(crucible)
    assert second["reward_version"].value.startswith("all-or-nothing@")
    assert second["reward_version"].value != first["reward_version"].value

    # The trajectories the checkpoint names are the same files, byte for byte.
    assert store.partition_files("trajectories", "exp", 1) == files
    assert [store.fs.cat_file(store.fs._strip_protocol(uri)) for uri in files] == before
    # Sampling the iteration again replaces its trajectories; the re-gradings still show what the
    # checkpoint was trained with, not the new samples.
    resampled = store.read_partition("trajectories", "exp", 1).to_pylist()
    store.write_partition("trajectories", "exp", 1, rows_to_table(
        "trajectories", [{**row, "reward": 0.5, "passed": False} for row in resampled]), keep=files)
    rows = metrics.records(catalog.connect(crucible.storage_root),
                           "SELECT reward_version, original_reward_version, sample_index, original_passed, passed, "
                           "original_reward, reward FROM regraded ORDER BY reward_version, task_id, sample_index")
    assert {row["reward_version"] for row in rows} == {first["reward_version"].value, second["reward_version"].value}
    assert len(rows) == 8 and {row["original_reward_version"] for row in rows} == {first["reward_version"].value}
    assert all(row["passed"] == row["original_passed"] == (row["sample_index"] == 0) for row in rows)
    assert {row["reward"] for row in rows if row["reward_version"] == second["reward_version"].value} == {0.0, 1.0}


def test_a_regrade_of_an_iteration_never_stored_fails_with_what_to_do(tmp_path):
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    crucible.save_experiment(ExperimentConfig(name="exp"))
    with DagsterInstance.ephemeral() as instance:
        result = materialize([regrades], partition_key=add_iteration(instance, "exp", 1), instance=instance,
                             resources={"crucible": crucible}, raise_on_error=False)
    [failure] = [event for event in result.all_events if event.is_step_failure]
    assert "iteration 1 has no stored trajectories to re-grade" in failure.step_failure_data.error.message
