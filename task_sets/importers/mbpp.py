"""MBPP format (Austin et al. 2021): the full `mbpp.jsonl` (text, code, task_id, test_list,
test_setup_code, challenge_test_list) or the hand-verified `sanitized-mbpp.json` (a JSON list:
prompt, code, task_id, test_imports, test_list), read as published: integer task ids, CRLF
line ends, and `test_list` as a list or as its Python repr (as some re-publications store it).

Each problem becomes a function task:
- the prompt is the paper's: the problem statement, then "Your code should pass these tests:"
  and the test asserts (the tests name the function and show how it is called);
- the submission is the whole module (MBPP has no prefix to complete); the entry point is the
  function the first assert calls that the reference code defines;
- the hidden tests are one test function per assert of test_list and challenge_test_list, after
  the record's test imports and set-up code, run against `from solution import *` (MBPP's
  asserts call the function as a global, as the paper's harness exec'd them);
- split "source" is the paper's: task ids 11-510 are the test set (eval), the others (few-shot
  prompts 1-10, validation 511-600, training 601-974) are train.
"""

from __future__ import annotations

import ast
from functools import partial
from pathlib import Path

from sandbox import python_ast
from task_sets.importers.records import (
    Imported,
    ImportOptions,
    RecordError,
    collect,
    json_records,
)
from task_sets.schema import Difficulty, FunctionTask, Split

EVAL_IDS = range(11, 511)  # the paper's test split
EASY_MAX_LINES, MEDIUM_MAX_LINES = 4, 10


def import_mbpp(path: Path, options: ImportOptions) -> Imported:
    records = [(where, partial(_fields, record, options.name)) for where, record in json_records(path)]
    if options.split != "source":
        return collect(records, FunctionTask, options.split)
    imported = collect(records, FunctionTask, "eval")
    imported.tasks = [task.model_copy(update={"split": _paper_split(task.id)}) for task in imported.tasks]
    return imported


def _paper_split(task_id: str) -> Split:
    number = task_id.rsplit("/", 1)[-1]
    return "eval" if number.isdigit() and int(number) in EVAL_IDS else "train"


def _fields(record: object, name: str) -> dict:
    """The FunctionTask fields of one problem (all but the split)."""
    if isinstance(record, str):
        raise RecordError(record)
    if not isinstance(record, dict):
        raise RecordError("expected a JSON object")
    task_id = record.get("task_id")
    statement = record.get("prompt", record.get("text"))
    code = record.get("code")
    missing = [field for field, value in (("task_id", task_id), ("prompt or text", statement), ("code", code))
               if value is None or (isinstance(value, str) and not value.strip())]
    if missing:
        raise RecordError(f"missing or empty field(s): {', '.join(missing)}")
    if not isinstance(task_id, (int, str)) or isinstance(task_id, bool):
        raise RecordError(f"task_id must be an integer or a string, not {type(task_id).__name__}")
    if not isinstance(statement, str) or not isinstance(code, str):
        raise RecordError("prompt (or text) and code must be strings")
    asserts = _asserts(record, "test_list") + _asserts(record, "challenge_test_list")
    if not asserts:
        raise RecordError(f"task {task_id}: test_list is empty")
    code = _unix(code)
    defined = _definitions(code, task_id)
    entry_point = _entry_point(asserts[0], defined, task_id)
    shown = "\n".join(_asserts(record, "test_list"))
    return {
        "id": f"{name}/{task_id}", "prompt": f"{statement.strip()}\nYour code should pass these tests:\n\n{shown}\n",
        "entry_point": entry_point, "reference_solution": code, "tests": _tests(record, asserts, defined),
        "difficulty": _difficulty(code), "domain": "python-functions", "family": name,
    }


def _asserts(record: dict, key: str) -> list[str]:
    value = record.get(key) or []
    if isinstance(value, str):  # a list's repr, as some re-publications store it
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise RecordError(f"{key} is neither a list nor a list's repr") from None
    if not isinstance(value, list) or not all(isinstance(line, str) for line in value):
        raise RecordError(f"{key} must be a list of assert statements")
    return [_unix(line).strip() for line in value if line.strip()]


def _definitions(code: str, task_id: object) -> set[str]:
    """The functions and classes the reference defines at top level."""
    try:
        return {node.name for node in python_ast.parse(code).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    except SyntaxError as e:
        raise RecordError(f"task {task_id}: code does not parse: {e.msg} (line {e.lineno})") from None


def _names(source: str, task_id: object) -> list[str]:
    return [node.id for node in ast.walk(_parsed(source, task_id)) if isinstance(node, ast.Name)]


def _parsed(source: str, task_id: object) -> ast.Module:
    try:
        return python_ast.parse(source)
    except (SyntaxError, ValueError) as e:
        raise RecordError(f"task {task_id}: a test does not parse: {getattr(e, 'msg', e)} ({source[:80]})") from None


def _entry_point(first_assert: str, defined: set[str], task_id: object) -> str:
    """The function the first assert calls that the reference defines at top level."""
    called = [node.func.id for node in ast.walk(_parsed(first_assert, task_id))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    found = [name for name in called if name in defined]
    if not found:
        raise RecordError(f"task {task_id}: the first test calls no function the code defines ({first_assert[:80]})")
    return found[0]


def _tests(record: dict, asserts: list[str], defined: set[str]) -> str:
    imports = record.get("test_imports") or []
    if not isinstance(imports, list) or not all(isinstance(line, str) for line in imports):
        raise RecordError("test_imports must be a list of import statements")
    setup = _unix(record.get("test_setup_code") or "")
    # By name too: a star import leaves out names with a leading underscore.
    used = sorted({name for line in [*asserts, setup] for name in _names(line, record["task_id"]) if name in defined})
    header = "# MBPP's asserts, one test each, with the names they call from the submission.\n" \
             f"from solution import *  # noqa: F403\nfrom solution import {', '.join(used)}\n"
    body = "".join(f"\n\ndef test_{index}():\n    {line}\n" for index, line in enumerate(asserts))
    return header + "".join(f"{line}\n" for line in imports) + (f"\n{setup.strip()}\n" if setup.strip() else "") + body


def _unix(text: str) -> str:
    return text.replace("\r\n", "\n")


def _difficulty(code: str) -> Difficulty:
    lines = sum(1 for line in code.splitlines() if line.strip())
    if lines <= EASY_MAX_LINES:
        return "easy"
    return "medium" if lines <= MEDIUM_MAX_LINES else "hard"
