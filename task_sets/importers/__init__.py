"""Importers: task sets in public formats turned into Crucible task files.

Each importer reads its format record by record; a bad record is rejected with its position
and reason and the rest still import. `write_task_set` then writes the accepted tasks as one
JSONL file, atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from task_sets.schema import Task

FORMATS = ("humaneval",)


class ImportError_(ValueError):
    """The input cannot be imported at all (missing file, unknown format, nothing valid)."""


@dataclass
class Imported:
    tasks: list[Task] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # "file:line: reason"


def import_tasks(fmt: str, path: Path, name: str, split: str) -> Imported:
    if fmt == "humaneval":
        from task_sets.importers.humaneval import import_humaneval

        return import_humaneval(path, name, split)
    raise ImportError_(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def write_task_set(tasks: list[Task], directory: Path) -> Path:
    """`directory/tasks.jsonl`, complete or not at all (written aside, then renamed)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "tasks.jsonl"
    fd, staging = tempfile.mkstemp(prefix=".tasks-", suffix=".jsonl", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for task in tasks:
                out.write(json.dumps(task.model_dump(mode="json", exclude={"version"}), ensure_ascii=False) + "\n")
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return target
