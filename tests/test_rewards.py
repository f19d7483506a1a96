"""Reward functions: tiers, quality and process terms, versions, and reward.toml errors, on real
grades of built-in tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grading.rewards import ONE_TURN, Process
from grading.submission import grade_solution
from task_sets.loader import BUILTIN_DIR, TaskSetError, load_task_set
from task_sets.rewards import DEFAULT, RewardFunction
from task_sets.schema import parse_task

TASK = load_task_set("default").by_id["default/add_k/0000"]  # add(x) returns x + 17
TIERED = RewardFunction(name="tiered", compiles=0.2, tests_passed=0.5, all_passed=0.3)


def grade(solution: str, reward: RewardFunction, process: Process = ONE_TURN):
    return grade_solution(TASK, solution, reward=reward, process=process)


def test_the_default_function_is_the_fraction_of_tests_passed():
    half = "def add(x):\n    return x + 17 if x % 2 else 0\n"
    g = grade(half, DEFAULT)
    assert g.reward == g.reward_components["tests_passed_fraction"] and 0 < g.reward < 1
    assert g.reward_version == DEFAULT.version


def test_tiers_add_up_to_one_for_a_correct_submission():
    g = grade(TASK.reference_solution, TIERED)
    assert g.reward == 1.0
    assert {k: g.reward_components[k] for k in ("compiles", "tests_passed_fraction", "all_passed")} == {
        "compiles": 1.0, "tests_passed_fraction": 1.0, "all_passed": 1.0}


def test_code_that_defines_the_entry_point_but_fails_earns_tier_one_only():
    assert grade("def add(x):\n    return None\n", TIERED).reward == pytest.approx(0.2)


@pytest.mark.parametrize("solution", ["", "def add(x) return x\n", "def other(x):\n    return x + 17\n"])
def test_nothing_unparsable_or_the_wrong_function_earns_nothing(solution):
    g = grade(solution, TIERED)
    assert (g.reward_components["compiles"], g.reward) == (0.0, 0.0)


def test_lint_findings_and_complexity_cost_what_the_function_says():
    quality = RewardFunction(name="quality", lint=0.1, complexity=0.05, complexity_budget=1)
    sloppy = "import os\nimport sys\n\ndef add(x):\n    if x > 0:\n        return x + 17\n    return x + 17\n"
    g = grade(sloppy, quality)
    assert (g.reward_components["lint_findings"], g.reward_components["complexity"]) == (2.0, 2.0)
    assert g.reward == pytest.approx(1.0 - 2 * 0.1 - (2 - 1) * 0.05)
    assert grade(TASK.reference_solution, quality).reward == 1.0


def test_process_terms_charge_turns_after_the_first_and_tokens():
    frugal = RewardFunction(name="frugal", turns=0.1, tokens=0.02)
    g = grade(TASK.reference_solution, frugal, Process(turns=3, tokens=5000))
    assert (g.reward_components["turns"], g.reward_components["tokens"]) == (3.0, 5000.0)
    assert g.reward == pytest.approx(1.0 - 2 * 0.1 - 5 * 0.02)
    assert grade(TASK.reference_solution, frugal, Process(turns=30, tokens=0)).reward == 0.0  # clipped at 0


def test_the_version_names_the_function_and_changes_with_any_weight():
    assert TIERED.version.startswith("tiered@")
    assert TIERED.version == RewardFunction(name="tiered", compiles=0.2, tests_passed=0.5, all_passed=0.3).version
    assert TIERED.version != TIERED.model_copy(update={"lint": 0.01}).version
    assert DEFAULT.version != TIERED.version


def test_tier_weights_must_sum_to_one():
    with pytest.raises(ValueError, match="must sum to 1, not 1.5"):
        RewardFunction(compiles=0.5, tests_passed=1.0)


def copy_of_shopcart(tmp_path: Path, reward_toml: str) -> Path:
    target = tmp_path / "shop"
    shutil.copytree(BUILTIN_DIR / "shopcart", target)
    (target / "reward.toml").write_text(reward_toml)
    return target


def test_a_task_set_loads_its_reward_toml():
    assert load_task_set("shopcart").reward.name == "shopcart-tiered"
    assert load_task_set("default").reward == DEFAULT


@pytest.mark.parametrize(("toml", "message"), [
    ("compiles = 0.5\n", r"reward.toml: reward: Value error, the tier weights .* must sum to 1, not 1.5"),
    ("tests_passed = 'lots'\n", r"reward.toml: tests_passed: Input should be a valid number"),
    ("bonus = 1\n", r"reward.toml: bonus: Extra inputs are not permitted"),
    ("compiles = \n", r"reward.toml: malformed TOML"),
])
def test_a_bad_reward_toml_names_the_file_and_field(tmp_path, toml, message):
    with pytest.raises(TaskSetError, match=message):
        load_task_set(copy_of_shopcart(tmp_path, toml))


CALC = parse_task({
    "id": "rewards/calc", "kind": "repository", "prompt": "Fix add and sub.", "difficulty": "easy", "family": "calc",
    "split": "train", "test_command": "python3 -m pytest -q tests", "protected_paths": ["tests/*"],
    "files": {"calc.py": "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a + b\n\n\n"
                         "def mul(a, b):\n    return a * b\n",
              "tests/test_calc.py": "from calc import add, mul, sub\n\n\ndef test_add():\n    assert add(2, 1) == 3\n\n\n"
                                    "def test_sub():\n    assert sub(2, 1) == 1\n\n\n"
                                    "def test_mul():\n    assert mul(2, 3) == 6\n"},
    "fail_to_pass": ["tests/test_calc.py::test_add", "tests/test_calc.py::test_sub"],
    "pass_to_pass": ["tests/test_calc.py::test_mul"],
    "reference_solution": "--- a/calc.py\n+++ b/calc.py\n@@ -1,6 +1,6 @@\n def add(a, b):\n-    return a - b\n"
                          "+    return a + b\n \n \n def sub(a, b):\n-    return a + b\n+    return a - b\n"})
RENAME_ONLY = "--- a/calc.py\n+++ b/calc.py\n@@ -8,2 +8,2 @@\n-def mul(a, b):\n-    return a * b\n+def mul(x, y):\n+    return x * y\n"
ADD_ONLY = "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n"


def test_a_repository_diff_that_resolves_no_fail_to_pass_test_earns_nothing_whatever_it_keeps():
    graded = grade_solution(CALC, RENAME_ONLY, reward=TIERED)
    assert graded.reward_components["compiles"] == 1.0 and graded.reward_components["pass_to_pass_fraction"] == 1.0
    assert graded.reward == 0.0


def test_a_repository_diff_that_resolves_some_earns_the_documented_partial_credit():
    graded = grade_solution(CALC, ADD_ONLY, reward=TIERED)
    assert graded.reward_components["tests_passed_fraction"] == 0.5  # 1 of 2 fail-to-pass x all pass-to-pass
    assert graded.reward == pytest.approx(0.2 + 0.5 * 0.5)
