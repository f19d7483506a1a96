"""Re-grading a sample: which submissions, and what counts as a disagreement."""

from __future__ import annotations

from grading.reproducibility import agreement, regrade_sample
from grading.submission import grade_solution
from task_sets.loader import load_task_set


def test_the_sample_is_a_fraction_at_least_one_and_seeded():
    assert len(regrade_sample(200, 0.05, seed=1)) == 10
    assert len(regrade_sample(8, 0.05, seed=1)) == 1
    assert regrade_sample(200, 0.05, seed=1) == regrade_sample(200, 0.05, seed=1) != regrade_sample(200, 0.05, seed=2)
    assert regrade_sample(0, 0.05, seed=1) == regrade_sample(50, 0.0, seed=1) == []


def test_changed_verdicts_flag_their_tasks():
    tasks = load_task_set("default").tasks[:3]
    first = [grade_solution(t, t.reference_solution) for t in tasks]
    second = [first[0], grade_solution(tasks[1], "def nothing():\n    pass\n"), grade_solution(tasks[2], tasks[2].reference_solution)]
    result = agreement([t.id for t in tasks], first, second)
    assert (result.sampled, result.agreed, result.disagreeing_task_ids, round(result.rate, 3)) == (
        3, 2, (tasks[1].id,), 0.667)
