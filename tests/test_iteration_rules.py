"""training/iteration.py, without Dagster: which tasks an iteration samples, which checkpoint it
may sample from, and what it refuses."""

from __future__ import annotations

import pytest

from assets.resources import CrucibleResource
from datastore.store import rows_to_table
from training.experiment import ExperimentConfig
from training.iteration import Iteration, Refused


@pytest.fixture
def crucible(tmp_path) -> CrucibleResource:
    return CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "checkpoints"))


def iteration(crucible: CrucibleResource, number: int, **settings) -> Iteration:
    return Iteration(crucible, ExperimentConfig(name="exp", **settings), number, log=lambda message: None)


def test_an_iteration_samples_a_seeded_subset_of_train_tasks_that_changes_each_iteration(crucible):
    first, again, second = (iteration(crucible, n).sample_tasks() for n in (1, 1, 2))
    assert [t.id for t in first] == [t.id for t in again] and len(first) == 64
    assert {t.id for t in first} != {t.id for t in second}
    assert all(task.split == "train" for task in first + second)
    other_seed = iteration(crucible, 1, seed=1).sample_tasks()
    assert {t.id for t in other_seed} != {t.id for t in first}


def test_an_experiment_without_a_subset_samples_every_train_task(crucible):
    rule = iteration(crucible, 1, tasks_per_iteration=None)
    assert len(rule.sample_tasks()) == len(rule.task_set.train())


def test_every_task_of_the_set_is_recorded_and_marked_sampled_or_not(crucible):
    rule = iteration(crucible, 3)
    sampled = rule.sample_tasks()
    table = rows_to_table("tasks", rule.task_rows(sampled))
    assert table.num_rows == len(rule.task_set)
    assert sum(table["sampled"].to_pylist()) == len(sampled)


def test_one_seed_drives_every_random_choice_of_an_iteration(crucible):
    assert iteration(crucible, 7, seed=2).seed == iteration(crucible, 7, seed=2).rollout_params().seed
    assert len({iteration(crucible, n, seed=s).seed for n in range(1, 50) for s in range(3)}) == 147


def test_an_iteration_refuses_a_checkpoint_that_does_not_exist_and_says_what_to_do(crucible):
    with pytest.raises(Refused, match=r"iteration 3 samples from checkpoint 2, which is not usable: .* "
                                      r"Materialize iteration 2 \(or base_policy\) first\."):
        iteration(crucible, 3).policy()


def test_an_evaluation_with_nothing_scored_is_refused(crucible):
    with pytest.raises(Refused, match=r"the base policy's held-out evaluation \(iteration 0\) has no scored sample"):
        iteration(crucible, 1).held_out_curve()
