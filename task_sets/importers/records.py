"""What every importer shares: options, records turned into tasks (a bad record rejected with its
position and reason, the rest still imported), split assignment, and the atomic task file."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from task_sets.schema import Split, Task, TaskBase
from task_sets.splits import hash_splits

SPLITS = ("eval", "train", "hash", "source")  # hash: 80/20 by task id; source: the format's own split
EVAL_FRACTION = 0.2


class ImportError_(ValueError):
    """The input cannot be imported at all (missing file, unknown format, nothing valid)."""


class RecordError(ValueError):
    """One record cannot become a task; the message says why (the rest still import)."""


@dataclass
class Imported:
    tasks: list[Task] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # "file:line: reason"
    warnings: list[str] = field(default_factory=list)  # imported, but the user should know


@dataclass(frozen=True)
class ImportOptions:
    name: str  # the new task set's name, the first part of every task id
    split: str = "eval"  # one of SPLITS
    repos: Path | None = None  # swebench: where the repositories are (default: PATH's folder/repos)
    specs: Path | None = None  # swebench: specifications over the published ones (JSON, the table's shape)


def collect(records: Iterable[tuple[str, Callable[[], dict]]], task_type: type[TaskBase], split: str) -> Imported:
    """Tasks from (position, fields maker) pairs, in order: a maker raising RecordError, or
    fields the task type refuses, becomes a rejection "position: reason"; the split is
    assigned over the accepted tasks' ids."""
    outcomes: list[tuple[str, dict | str]] = []
    for where, make_fields in records:
        try:
            outcomes.append((where, make_fields()))
        except RecordError as e:
            outcomes.append((where, str(e)))
    splits = assign_splits([f["id"] for _, f in outcomes if isinstance(f, dict)], split)
    imported = Imported()
    for where, fields in outcomes:
        if isinstance(fields, str):
            imported.rejected.append(f"{where}: {fields}")
            continue
        try:
            imported.tasks.append(task_type(**fields, split=splits[fields["id"]]))
        except ValidationError as err:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            imported.rejected.append(f"{where}: task {fields['id']!r}: {reasons}")
    return imported


def assign_splits(task_ids: list[str], split: str) -> dict[str, Split]:
    """Every id in `split`, or (split "hash") a stable 80/20 train/eval split by id."""
    return hash_splits(task_ids, EVAL_FRACTION) if split == "hash" else dict.fromkeys(task_ids, split)


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


def json_records(path: Path) -> Iterator[tuple[str, object]]:
    """(position, record) of each record of a JSON list, JSONL or JSONL.gz file. A line that is
    not JSON comes as its error message, for the importer to reject with its position."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ImportError_(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ImportError_(f"{path}: cannot read: {err}") from None
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise ImportError_(f"{path.name}: malformed JSON: {err.msg} (line {err.lineno})") from None
        yield from ((f"{path.name}[{index}]", record) for index, record in enumerate(records))
        return
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                yield f"{path.name}:{number}", json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path.name}:{number}", f"malformed JSON: {err.msg} (column {err.colno})"
