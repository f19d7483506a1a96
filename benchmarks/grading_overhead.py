"""What isolation costs: grading a task in the bubblewrap sandbox vs the same harness run bare.

    .venv/bin/python benchmarks/grading_overhead.py [--tasks 40] [--workers 1]

Both columns run the identical harness on identical files with Debian's python3; the sandbox
column adds bwrap namespaces, cgroups, privilege drop, rlimits and the report checks. Prints a
table with the ratio, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grading.submission import HIDDEN_TESTS_FILE, grade_solution
from sandbox.harness.bundle import harness_files
from task_sets.loader import load_task_set
from task_sets.schema import SOLUTION_FILE


def bare_run(task) -> float:
    """The harness on the host, no isolation at all: the floor any sandbox is measured against.
    It is loaded the way the sandbox loads it: as a module, from the same precompiled byte code."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for name, content in harness_files().items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content.encode() if isinstance(content, str) else content)
        (root / "workspace").mkdir()
        (root / "tests").mkdir()
        (root / "workspace" / SOLUTION_FILE).write_text(task.reference_solution)
        (root / "tests" / HIDDEN_TESTS_FILE).write_text(task.tests)
        launcher = f"import sys; sys.path.insert(0, {str(root / 'harness')!r}); import run_tests; run_tests.run()"
        started = time.perf_counter()
        subprocess.run(
            ["/usr/bin/python3", "-I", "-S", "-c", launcher, "--tests", str(root / "tests"),
             "--report", str(root / "junit.xml"), "--workspace", str(root / "workspace")],
            check=True, capture_output=True,
        )
        return time.perf_counter() - started


def sandboxed_run(task) -> float:
    started = time.perf_counter()
    grade = grade_solution(task, task.reference_solution)
    elapsed = time.perf_counter() - started
    assert grade.reward == 1.0, grade
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    args = parser.parse_args()
    tasks = load_task_set("default").tasks[: args.tasks]
    bare, sandboxed = [], []
    for task in tasks:  # interleaved, so machine noise hits both columns alike
        bare.append(bare_run(task))
        sandboxed.append(sandboxed_run(task))

    table = Table(title=f"grading one task ({len(tasks)} tasks, sequential)")
    for column in ("runner", "mean ms", "p50 ms", "p95 ms", "ratio vs bare"):
        table.add_column(column, justify="right")
    base = statistics.mean(bare)
    for name, times in (("bare harness", bare), ("bwrap sandbox + grading", sandboxed)):
        p95 = statistics.quantiles(times, n=20)[-1]
        table.add_row(name, f"{statistics.mean(times) * 1e3:.1f}", f"{statistics.median(times) * 1e3:.1f}",
                      f"{p95 * 1e3:.1f}", f"{statistics.mean(times) / base:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
