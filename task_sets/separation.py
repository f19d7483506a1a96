"""Train/eval separation: no task of the evaluation split may be trained on, not even as a copy.

A task is what the policy is shown (its prompt and its starting workspace: files, the starting
solution, the built environment) and what judges it (the hidden tests, the command that runs
them, the tests it must pass). Each part has a content hash (`Fingerprint`). A train task leaks an
eval task when training on it is training on the eval task:

- it shows the policy the same thing (same prompt, same workspace): whatever the hidden tests,
  the policy learns the answer to exactly what it will be evaluated on; or
- the same tests judge the same workspace: whatever the prompt says, the same submission earns
  the reward on both.

A set whose tasks share a prompt and differ in their workspace (the built-in `repair` set: "the
check fails, fix it" over 848 different repositories) does not leak. Prompts are compared after
normalising case and whitespace.

Near-duplicates are train/eval pairs whose prompts overlap by at least `threshold` (Jaccard over
character 5-grams) and whose workspaces do too (Jaccard over their lines): template siblings that
differ in a constant. They are reported, not refused: the report says how close the splits are.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass

from task_sets.loader import TaskSet
from task_sets.schema import FunctionTask, RepositoryTask, Task

NEAR_DUPLICATE_THRESHOLD = 0.9
_SHINGLE = 5
SAME_SHOWN = "prompt and workspace"
SAME_JUDGED = "workspace and tests"


@dataclass(frozen=True)
class Fingerprint:
    """Content hashes of a task's parts."""

    prompt: str
    workspace: str
    tests: str


@dataclass(frozen=True)
class Separation:
    exact_duplicates: tuple[tuple[str, str, str], ...]  # (train id, eval id, what they share)
    near_duplicates: tuple[tuple[str, str, float], ...]  # (train id, eval id, prompt similarity)

    @property
    def leaks(self) -> bool:
        return bool(self.exact_duplicates)


def fingerprint(task: Task) -> Fingerprint:
    return Fingerprint(_hash(_normal(task.prompt)), _hash(_workspace(task)), _hash(_tests(task)))


def separation(task_set: TaskSet, threshold: float = NEAR_DUPLICATE_THRESHOLD) -> Separation:
    train, evaluation = task_set.train(), task_set.eval()
    prints = {task.id: fingerprint(task) for task in train + evaluation}
    copies = _copies([t.id for t in train], [t.id for t in evaluation], prints)
    copied = {(train_id, eval_id) for train_id, eval_id, _ in copies}
    near = [pair for pair in _near_duplicates(train, evaluation, threshold) if pair[:2] not in copied]
    return Separation(copies, tuple(near))


def _copies(train: list[str], evaluation: list[str], prints: dict[str, Fingerprint]) -> tuple[tuple[str, str, str], ...]:
    """Every (train, eval) pair that shows the same thing or is judged the same way, by hash lookup."""
    shown, judged = defaultdict(list), defaultdict(list)
    for task_id in train:
        shown[_shown(prints[task_id])].append(task_id)
        judged[_judged(prints[task_id])].append(task_id)
    copies = []
    for eval_id in evaluation:
        same_shown, same_judged = shown[_shown(prints[eval_id])], judged[_judged(prints[eval_id])]
        for train_id in dict.fromkeys(same_shown + same_judged):
            shared = [part for part, alike in ((SAME_SHOWN, same_shown), (SAME_JUDGED, same_judged)) if train_id in alike]
            copies.append((train_id, eval_id, "; ".join(shared)))
    return tuple(sorted(copies))


def _shown(hashes: Fingerprint) -> tuple[str, str]:
    return hashes.prompt, hashes.workspace


def _judged(hashes: Fingerprint) -> tuple[str, str]:
    return hashes.workspace, hashes.tests


def _near_duplicates(train: list[Task], evaluation: list[Task], threshold: float) -> list[tuple[str, str, float]]:
    """Pairs alike in prompt and in workspace. The prompts' similarity is measured first, the
    workspaces' (a repository can be large) only for the pairs that pass it."""
    prompts = {task.id: _shingles(_normal(task.prompt)) for task in train + evaluation}
    workspaces: dict[str, frozenset[str]] = {}

    def lines(task: Task) -> frozenset[str]:
        if task.id not in workspaces:
            workspaces[task.id] = frozenset(f"{path}:{line}" for path, text in _workspace_files(task).items()
                                            for line in text.splitlines())
        return workspaces[task.id]

    near = []
    for train_task in train:
        for eval_task in evaluation:
            similarity = _jaccard(prompts[train_task.id], prompts[eval_task.id])
            if similarity >= threshold and _jaccard(lines(train_task), lines(eval_task)) >= threshold:
                near.append((train_task.id, eval_task.id, round(similarity, 3)))
    return near


def _workspace_files(task: Task) -> dict[str, str]:
    files = dict(task.files)
    if isinstance(task, FunctionTask) and task.solution_prefix:
        files["solution.py"] = task.solution_prefix
    if isinstance(task, RepositoryTask):
        files.update({path: f"<binary {digest}>" for path, digest in task.binary_files.items()})
    return files


def _workspace(task: Task) -> object:
    return {"files": _workspace_files(task), "environment": task.environment.digest if task.environment else None,
            "image": task.image}


def _tests(task: Task) -> object:
    if isinstance(task, FunctionTask):
        return {"tests": task.tests, "entry_point": task.entry_point, "entry_command": task.entry_command}
    return {"hidden_tests": task.hidden_tests, "grader_files": task.grader_files, "test_command": task.test_command,
            "fail_to_pass": task.fail_to_pass, "pass_to_pass": task.pass_to_pass, "verdict_file": task.verdict_file}


def _hash(value: object) -> str:
    canonical = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _shingles(text: str) -> frozenset[str]:
    return frozenset(text[i:i + _SHINGLE] for i in range(max(1, len(text) - _SHINGLE + 1)))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0
