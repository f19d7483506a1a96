"""`passed` means what it says everywhere: a submission whose hidden tests all pass but that was
caught tampering (here: the real fix of a shopcart task, plus a conftest.py of its own) is not
passed in its grade, its trajectory and evaluation rows, the SQL views, the sample monitors and
`crucible verify`'s output. Before, every pass rate read the tests alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from datastore import catalog, metrics
from datastore.store import DatasetStore, rows_to_table
from grading.submission import grade_solution
from task_sets.loader import load_task_set
from task_sets.patches import apply_patch, make_patch
from training.agent.rollout import Rollout
from training.agent.trajectory import VerifiedRollout, evaluation_row, trajectory_row
from training.evaluation.monitors import judge_samples

SHOPCART = load_task_set("shopcart")
TASK = SHOPCART.by_id["shopcart/negative-money"]
# The reference fix, and a runner configuration file the grader removes and flags.
TAMPERED = make_patch(TASK.files, {**apply_patch(TASK.files, TASK.reference_solution), "conftest.py": "# mine\n"})


@pytest.fixture(scope="module")
def verified() -> VerifiedRollout:
    grade = grade_solution(TASK, TAMPERED, reward=SHOPCART.reward)
    rollout = Rollout(task_id=TASK.id, group_id="g", sample_index=0, policy_version="p", prompt_ids=[1, 2],
                      response_ids=[3], behaviour_logprobs=[-0.1], finish_reason="stop", response_text=TAMPERED,
                      generate_s=0.1, solution=TAMPERED)
    return VerifiedRollout(rollout, TASK, grade, verify_s=0.1)


def test_the_grade_is_not_passed_though_every_hidden_test_passed(verified):
    grade = verified.grade
    assert set(grade.outcomes.values()) == {"passed"} and grade.reward_components["all_passed"] == 1.0
    assert grade.tamper_flags == ("runner_config_added",) and grade.reward == 0.0
    assert not grade.passed


def test_the_trajectory_and_evaluation_rows_store_it_as_not_passed(verified):
    assert trajectory_row(verified)["passed"] is False and evaluation_row(verified)["passed"] is False


def test_the_sql_views_and_the_sample_monitors_count_it_as_not_passed(verified, tmp_path):
    store = DatasetStore(str(tmp_path))
    store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", [trajectory_row(verified)]))
    store.write_partition("evaluations", "exp", 0, rows_to_table("evaluations", [evaluation_row(verified)]))
    con = catalog.connect(str(tmp_path))
    [rewards] = metrics.records(con, "SELECT * FROM iteration_rewards")
    [task] = metrics.records(con, "SELECT * FROM task_rewards")
    [held_out] = metrics.records(con, "SELECT * FROM held_out")
    assert (rewards["pass_rate"], task["pass_rate"], held_out["pass_rate"]) == (0.0, 0.0, 0.0)
    verdicts = {v.check: v for v in judge_samples(rewards)}
    assert not verdicts["tampering_within_limit"].passed and rewards["tamper_rate"] == 1.0


def test_verify_writes_it_as_not_passed(tmp_path):
    solutions = tmp_path / "solutions.jsonl"
    solutions.write_text(json.dumps({"task_id": TASK.id, "solution": TAMPERED}) + "\n")
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", "--task-set", "shopcart", "--solutions",
                           str(solutions), "--backend", "local"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [result] = map(json.loads, done.stdout.splitlines())
    assert (result["passed"], set(result["tests"].values()), result["tamper_flags"]) == (
        False, {"passed"}, ["runner_config_added"])
    assert "1 solutions: 0 passed, 1 failed" in done.stderr
