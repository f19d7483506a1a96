"""Train/eval separation: exact copies are leaks, near-duplicates are reported."""

from __future__ import annotations

from pathlib import Path

import yaml

from task_sets.loader import load_task_set
from task_sets.separation import separation


def write(tmp_path: Path, prompts: list[tuple[str, str]]) -> Path:
    tasks = [{"id": f"sep/{i}", "prompt": prompt, "entry_point": "f", "reference_solution": "def f():\n    return 1\n",
              "tests": "from solution import f\n\ndef test_f():\n    assert f() == 1\n", "difficulty": "easy",
              "family": "sep", "split": split} for i, (prompt, split) in enumerate(prompts)]
    path = tmp_path / "sep.yaml"
    path.write_text(yaml.safe_dump(tasks))
    return path


def test_an_eval_prompt_copied_into_train_is_a_leak(tmp_path):
    path = write(tmp_path, [
        ("Write f() that returns one.", "train"),
        ("  write F()   that returns ONE. ", "eval"),  # the same prompt, other case and spacing
        ("Sort a list of integers in place and return how many swaps it took.", "eval"),
    ])
    split = separation(load_task_set(path))
    assert (split.exact_duplicates, split.leaks) == ((("sep/0", "sep/1"),), True)


def test_template_siblings_are_near_duplicates_not_leaks(tmp_path):
    path = write(tmp_path, [
        ("Write a Python function `add(x)` that takes an integer x and returns x plus 17.", "train"),
        ("Write a Python function `add(x)` that takes an integer x and returns x plus 23.", "eval"),
        ("Reverse the words of a sentence.", "eval"),
    ])
    split = separation(load_task_set(path))
    assert not split.leaks
    assert [(a, b) for a, b, _ in split.near_duplicates] == [("sep/0", "sep/1")]


def test_the_built_in_set_has_no_leak():
    assert not separation(load_task_set("default")).leaks
