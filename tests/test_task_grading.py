"""Every built-in task is solvable and discriminating under the real sandbox grader."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from grading.submission import grade_solution, sandbox_spec
from sandbox.backends import open_sandbox
from task_sets.loader import load_task_set


def _grade_all(pairs):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pair: grade_solution(*pair), pairs))


def test_every_reference_solution_scores_full_reward_in_the_sandbox():
    tasks = load_task_set("default").tasks
    grades = _grade_all([(task, task.reference_solution) for task in tasks])
    failing = [task.id for task, grade in zip(tasks, grades) if (grade.reward_status, grade.reward) != ("scored", 1.0)]
    assert not failing


def test_a_solution_returning_none_scores_below_full_reward():
    tasks = load_task_set("default").tasks
    stubs = [(task, f"def {task.entry_point}(*args):\n    return None\n") for task in tasks[::5]]
    grades = _grade_all(stubs)
    assert all(grade.reward_status == "scored" and grade.reward < 1.0 for grade in grades)


def test_grading_records_the_task_limits_in_the_spec_hash():
    task = load_task_set("default").tasks[0]
    grade = grade_solution(task, task.reference_solution)
    assert grade.exec.backend == "local"
    assert len(grade.exec.spec_hash) == 16


def test_grading_gives_the_same_verdicts_on_every_backend(backend_name):
    tasks = load_task_set("default").tasks[:4]
    verdicts = []
    for task in tasks:
        sandbox = open_sandbox(backend_name, sandbox_spec(task))
        for solution in (task.reference_solution, f"def {task.entry_point}(*args):\n    return None\n"):
            grade = grade_solution(task, solution, sandbox)
            assert grade.exec.backend == backend_name
            verdicts.append((grade.reward_status, grade.reward == 1.0))
    assert verdicts == [("scored", True), ("scored", False)] * len(tasks)
