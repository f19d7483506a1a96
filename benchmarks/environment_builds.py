"""Building the SWE-bench test instances' environments one at a time and two at a time, side by
side, each from an empty store (its own pip cache: every wheel downloaded again).

    .venv/bin/python benchmarks/environment_builds.py [--instances 6] [--at-once 1,2]

What proving an imported set costs before its first grading: a virtual environment per instance,
its requirements from the package index, the repository's own install (grading/gradability.py
builds BUILDS_AT_ONCE at a time).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from environments.store import EnvironmentStore
from grading.gradability import build_environments
from task_sets.importers import ImportOptions, import_tasks

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "swebench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=6, help="the first N test instances (default 6)")
    parser.add_argument("--at-once", default="1,2", help="builds at a time to compare (default 1,2)")
    args = parser.parse_args()
    tasks = [t for path in ("instances.jsonl", "published.jsonl")
             for t in import_tasks("swebench", DATA / path, ImportOptions("bench", repos=DATA / "repos")).tasks]
    tasks = tasks[: args.instances]
    table = Table(title=f"building {len(tasks)} SWE-bench environments from an empty store (local backend)")
    for column in ("builds at once", "environments", "failed", "wall s", "s per environment"):
        table.add_column(column, justify="right")
    for at_once in map(int, args.at_once.split(",")):
        with tempfile.TemporaryDirectory(prefix="crucible-bench-") as root:
            started = time.perf_counter()
            failed = build_environments(tasks, "local", EnvironmentStore(Path(root)), at_once=at_once)
            wall = time.perf_counter() - started
        table.add_row(str(at_once), str(len(tasks)), str(len(failed)), f"{wall:.1f}", f"{wall / len(tasks):.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
