"""No task is trained on or evaluated until it is proven gradable where it will be graded.

A task of a set that came from outside (an imported set in the library, or a set given by path)
is proven by grading its reference submission and its wrong ones (an empty diff for a
repository) in its built environment, on the backend that will grade it (grading/validation.py):
usable when the reference passes and every wrong submission fails, unusable otherwise, with the
reason (the reference's failure, "an empty diff passes every test", the environment's build
error). Built-in sets are proven by the test suite and need no proof here.

An infrastructure error or an environment that does not build says nothing final about the
task: its proof leaves it out meanwhile and it is proven again the next time proofs are sought.
Proofs are kept in the environment store (`<store>/proofs/<backend>/<task version>.json`): a
task's version covers its environment's spec, so an edited task or environment is proven anew,
and two processes proving the same task write the same file (atomically). Sampling and
evaluation see only usable tasks: a task without a proof is left out like an unusable one
(TaskSet.unusable), so an unproven task is never trained on by accident.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from environments.build import BuildError, build, locked
from environments.spec import EnvironmentSpec
from environments.store import EnvironmentStore
from grading.validation import TaskReport, ValidationReport, validate
from sandbox.pool import SandboxPool
from statuses import ClosedSet
from task_sets.loader import TaskSet
from task_sets.schema import RepositoryTask, Task

PROOFS = "proofs"  # under the environment store's root
BUILDS_AT_ONCE = 2  # a build mostly waits on the package index (benchmarks/environment_builds.py)


class Gradability(ClosedSet):
    """Whether a task may be sampled and evaluated on a backend."""

    USABLE = "usable", "the reference passed and every wrong submission failed in the built environment"
    UNUSABLE = "unusable", "the reference failed, a wrong submission passed, or the environment does not build"
    UNPROVEN = "unproven", "not yet graded on this backend: left out until it is"
    BUILT_IN = "built_in", "a built-in set's task, proven by the test suite"


@dataclass(frozen=True)
class Proof:
    task_id: str
    task_version: str
    backend: str
    usable: bool
    reason: str = ""  # why not, one line
    # False where what it found may pass (an infrastructure error, an environment whose build
    # failed: the package index down, say): left out meanwhile, and proven again next time.
    final: bool = True

    @property
    def status(self) -> Gradability:
        return Gradability.USABLE if self.usable else Gradability.UNUSABLE


class ProofLedger:
    """The proofs of one environment store, per backend and task version."""

    def __init__(self, store: EnvironmentStore):
        self.store = store
        self.root = store.root / PROOFS

    def get(self, task: Task, backend: str) -> Proof | None:
        try:
            return Proof(**json.loads(self._path(task.version, backend).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def put(self, proof: Proof) -> None:
        path = self._path(proof.task_version, proof.backend)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(dataclasses.asdict(proof), f)
        os.replace(f.name, path)

    def status(self, task_set: TaskSet, task: Task, backend: str) -> tuple[Gradability, str]:
        if not needs_proof(task_set):
            return Gradability.BUILT_IN, ""
        proof = self.get(task, backend)
        return (Gradability.UNPROVEN, "") if proof is None else (proof.status, proof.reason)

    def _path(self, version: str, backend: str) -> Path:
        return self.root / backend / f"{version}.json"


def needs_proof(task_set: TaskSet) -> bool:
    return not task_set.built_in


def with_proofs(task_set: TaskSet, backend: str, ledger: ProofLedger) -> TaskSet:
    """`task_set` with every task that is not proven usable on `backend` left out of its splits."""
    if not needs_proof(task_set):
        return task_set
    unusable = {}
    for task in task_set:
        status, reason = ledger.status(task_set, task, backend)
        if status is not Gradability.USABLE:
            unusable[task.id] = reason or f"not yet proven gradable on the {backend} backend (crucible tasks validate)"
    return dataclasses.replace(task_set, unusable=unusable)


def unproven(task_set: TaskSet, backend: str, ledger: ProofLedger) -> list[Task]:
    if not needs_proof(task_set):
        return []
    return [task for task in task_set if (proof := ledger.get(task, backend)) is None or not proof.final]


def prove(tasks: Iterable[Task], backend: str, pool: SandboxPool, ledger: ProofLedger,
          repeats: int = 1, progress: Callable[[str], None] = lambda line: None, task_set: str = "") -> ValidationReport:
    """Build each task's environment, grade its reference `repeats` times and its wrong
    submissions once (grading/validation.py), and record a proof per task: usable when the
    validation's verdict is "ok". A task whose environment does not build is broken for that
    reason; the others are graded through `pool`."""
    tasks = list(tasks)
    failed = build_environments(tasks, backend, ledger.store, progress)
    unbuilt = [t for t in tasks if t.environment and t.environment.digest in failed]
    report = validate([t for t in tasks if not (t.environment and t.environment.digest in failed)], pool, ledger.store,
                      repeats, task_set, progress=lambda done, total: _every(25, done, total, progress))
    report.tasks += [TaskReport(t.id, "broken", (f"its environment does not build: {failed[t.environment.digest]}",))
                     for t in unbuilt]
    versions, unbuilt_ids = {t.id: t.version for t in tasks}, {t.id for t in unbuilt}
    for checked in report.tasks:
        final = checked.verdict != "unjudgeable" and checked.task_id not in unbuilt_ids
        ledger.put(Proof(checked.task_id, versions[checked.task_id], backend, checked.verdict == "ok",
                         "; ".join(checked.reasons), final))
    return report


def _every(step: int, done: int, total: int, progress: Callable[[str], None]) -> None:
    if done % step == 0 or done == total:
        progress(f"graded {done}/{total} tasks' reference and wrong submissions")


def build_environments(tasks: Iterable[Task], backend: str, store: EnvironmentStore,
                       progress: Callable[[str], None] = lambda line: None, at_once: int = BUILDS_AT_ONCE
                       ) -> dict[str, str]:
    """Build every distinct environment of `tasks` for `backend` into `store`, `at_once` at a
    time; the ones that failed, by digest, with the sentence that says why (the others are built)."""
    tasks = list(tasks)
    repositories = repositories_of(tasks)

    def failure(spec: EnvironmentSpec) -> str | None:
        try:
            build(spec, store, backend, progress, repositories)
        except BuildError as e:
            return str(e)
        return None

    specs = list({t.environment.digest: t.environment for t in tasks if t.environment}.values())
    with ThreadPoolExecutor(at_once) as builds:
        return {spec.digest: why for spec, why in zip(specs, builds.map(failure, specs)) if why is not None}


def lock_environments(tasks: Iterable[Task], store: EnvironmentStore,
                      progress: Callable[[str], None] = lambda line: None) -> list[Task]:
    """`tasks` with each environment of a named Python locked to the exact pins it resolves to
    today (environments/build.py, `locked`), so that the set, once written, builds the same next
    month. An environment that does not build stays as declared: its proof says why."""
    tasks = list(tasks)
    repositories = repositories_of(tasks)
    pinned = {}
    for spec in {t.environment.digest: t.environment for t in tasks if t.environment}.values():
        try:
            pinned[spec.digest] = locked(spec, store, progress, repositories)
        except BuildError as e:
            progress(str(e))
    return [t.model_copy(update={"environment": pinned[t.environment.digest]})
            if t.environment and t.environment.digest in pinned else t for t in tasks]


def repositories_of(tasks: Iterable[Task]) -> Mapping[str, Mapping[str, str | bytes]]:
    """The starting files of each repository an environment's setup runs in."""
    return {t.environment.repository: {**t.binary_contents(), **t.files} for t in tasks
            if isinstance(t, RepositoryTask) and t.environment and t.environment.repository}

