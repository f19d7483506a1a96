"""Train/eval separation: a train task that shows the policy an eval task's prompt and workspace,
or whose tests judge the same workspace, is a leak; the asset check over a sampled iteration
says so, and stays green on every built-in set."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from assets.iteration import eval_split_held_out
from task_sets.loader import builtin_task_set_names, load_task_set
from task_sets.separation import SAME_JUDGED, SAME_SHOWN, separation

pytestmark = pytest.mark.unit


def function_task(index: int, prompt: str, split: str, answer: int | None = None) -> dict:
    answer = index if answer is None else answer
    return {"id": f"sep/{index}", "prompt": prompt, "entry_point": "f",
            "reference_solution": f"def f():\n    return {answer}\n",
            "tests": f"from solution import f\n\ndef test_f():\n    assert f() == {answer}\n", "difficulty": "easy",
            "family": "sep", "split": split}


def write(tmp_path: Path, tasks: list[dict]) -> Path:
    path = tmp_path / "sep.yaml"
    path.write_text(yaml.safe_dump(tasks))
    return path


def test_an_eval_prompt_copied_into_train_is_a_leak_of_what_the_policy_is_shown(tmp_path):
    path = write(tmp_path, [
        function_task(0, "Write f() that returns one.", "train"),
        function_task(1, "  write F()   that returns ONE. ", "eval"),  # the same prompt, other case and spacing
        function_task(2, "Sort a list of integers in place and return how many swaps it took.", "eval"),
    ])
    split = separation(load_task_set(path))
    assert (split.exact_duplicates, split.leaks) == ((("sep/0", "sep/1", SAME_SHOWN),), True)


def test_eval_tests_copied_into_train_under_another_prompt_are_a_leak_of_what_judges(tmp_path):
    path = write(tmp_path, [
        function_task(0, "Write f() that returns seven.", "train", answer=7),
        function_task(1, "Implement f so that it gives back the number 7.", "eval", answer=7),
    ])
    assert separation(load_task_set(path)).exact_duplicates == (("sep/0", "sep/1", SAME_JUDGED),)


def test_one_prompt_over_different_workspaces_is_not_a_leak():
    repair = load_task_set("repair")
    assert len({task.prompt for task in repair.tasks}) < 10 < len(repair.tasks)  # what the set is
    assert not separation(repair).leaks


def test_template_siblings_are_near_duplicates_not_leaks(tmp_path):
    path = write(tmp_path, [
        function_task(0, "Write a Python function `add(x)` that takes an integer x and returns x plus 17.", "train"),
        function_task(1, "Write a Python function `add(x)` that takes an integer x and returns x plus 23.", "eval"),
        function_task(2, "Reverse the words of a sentence.", "eval"),
    ])
    split = separation(load_task_set(path))
    assert not split.leaks
    assert [(a, b) for a, b, _ in split.near_duplicates] == [("sep/0", "sep/1")]


@pytest.mark.parametrize("name", builtin_task_set_names())
def test_the_check_is_green_on_every_built_in_set_sampled_whole(name):
    task_set = load_task_set(name)
    assert eval_split_held_out(task_set, task_set.train()).passed


def test_the_check_is_red_when_an_iteration_samples_a_copy_of_a_held_out_repository_task(tmp_path):
    """The repair set with one of its eval tasks published again, as a train task, under a new id."""
    repair = load_task_set("repair")
    held_out = repair.eval()[0]
    copy = held_out.model_copy(update={"id": f"{held_out.id}-copy", "split": "train"})
    leaking = dataclasses.replace(repair, tasks=(*repair.tasks, copy))
    result = eval_split_held_out(leaking, [copy, *repair.train()[:3]])
    assert not result.passed
    assert copy.id in result.metadata["copies_of_eval_tasks_sampled"].value
