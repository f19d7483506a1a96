"""`crucible tasks validate` on a set with a good, a lax, a flaky and a broken task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from grading.validation import validate
from sandbox.local import LocalSandbox
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.loader import load_task_set

REPO = Path(__file__).parent.parent
ADD_ONE = "def add_one(x):\n    return x + 1\n"


def task(task_id: str, tests: str, reference: str = ADD_ONE) -> dict:
    return {"id": f"check/{task_id}", "prompt": "Write add_one(x).", "entry_point": "add_one",
            "reference_solution": reference, "tests": tests, "difficulty": "easy", "family": "check",
            "split": "train"}


TASKS = [
    task("good", "from solution import add_one\n\ndef test_adds():\n    assert add_one(1) == 2\n"),
    # Only imports the solution: anything that defines add_one passes.
    task("lax", "from solution import add_one\n\ndef test_exists():\n    assert callable(add_one)\n"),
    # Passes about half the time, whatever the submission.
    task("flaky", "import os\nfrom solution import add_one\n\ndef test_adds():\n    assert add_one(1) == 2\n\n"
                  "def test_coin():\n    assert os.urandom(1)[0] < 128\n"),
    task("broken", "from solution import add_one\n\ndef test_adds():\n    assert add_one(1) == 3\n"),
]


def write_set(tmp_path: Path) -> Path:
    root = tmp_path / "check"
    root.mkdir()
    (root / "tasks.yaml").write_text(yaml.safe_dump(TASKS, sort_keys=False))
    return root


def test_the_report_names_each_kind_of_unfit_task(tmp_path):
    task_set = load_task_set(write_set(tmp_path))
    with SandboxPool(LocalSandbox, PoolConfig(cpu_slots=2)) as pool:
        # 12 runs: a fair coin gives the same outcome 12 times with probability 1/2048.
        report = validate(task_set, pool, repeats=12)
    verdicts = {t.task_id: (t.verdict, t.flaky_tests) for t in report.tasks}
    assert verdicts == {
        "check/good": ("ok", ()),
        "check/lax": ("lax", ()),
        "check/flaky": ("flaky", ("test_hidden.py::test_coin",)),
        "check/broken": ("broken", ()),
    }
    broken = next(t for t in report.tasks if t.verdict == "broken")
    assert "test_adds" in broken.reasons[0]


def test_the_command_exits_1_and_writes_the_report(tmp_path):
    root = write_set(tmp_path)
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "tasks", "validate", str(root), "--repeats", "12",
                           "--backend", "local", "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200", "CRUCIBLE_ENVIRONMENTS": str(tmp_path / "environments")},
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert "1 ok, 1 broken, 1 flaky, 1 lax" in done.stdout
    assert "splits: 0 eval tasks copied into train" in done.stdout
    report = json.loads(out.read_text())
    assert [t["verdict"] for t in report["tasks"]] == ["ok", "lax", "flaky", "broken"]
    assert report["separation"]["exact_duplicates"] == []


def test_a_repository_task_whose_fail_to_pass_tests_already_pass_is_lax():
    shopcart = load_task_set("shopcart")
    good = shopcart.by_id["shopcart/negative-money"]
    lax = good.model_copy(update={"id": "shopcart/lax", "fail_to_pass": ("tests/test_money.py::test_format_pads_cents",),
                                  "pass_to_pass": ()})
    with SandboxPool(LocalSandbox, PoolConfig(cpu_slots=2)) as pool:
        report = validate([good, lax], pool, repeats=2)
    verdicts = {t.task_id: t.verdict for t in report.tasks}
    assert verdicts == {"shopcart/negative-money": "ok", "shopcart/lax": "lax"}
    assert "an empty diff" in next(t for t in report.tasks if t.verdict == "lax").reasons[0]
