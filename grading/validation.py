"""Is each task of a set fit to judge with? Checks run in the real sandbox grader.

For every task:
- the reference submission passes, `repeats` times out of `repeats` (never: broken; sometimes:
  flaky, with the tests whose outcome varied);
- an empty submission and a trivially wrong one (the entry point returning None) both fail
  (else the tests are too lax to tell a correct implementation from a coincidental pass);
  for a repository task, the empty diff fails;
- no grading ends as an infrastructure error (else the task cannot be judged here).
An environment error of the reference (a module its tests import is not installed) makes the
task broken, with the missing piece named: its environment must be fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from environments.store import EnvironmentStore
from grading.submission import grade_solution, sandbox_spec
from grading.verdict import GradeResult
from sandbox.pool import SandboxPool
from statuses import RewardStatus
from task_sets.schema import RepositoryTask, Task

DEFAULT_REPEATS = 3
VERDICTS = ("ok", "broken", "flaky", "lax", "unjudgeable")


@dataclass(frozen=True)
class TaskReport:
    task_id: str
    verdict: str  # one of VERDICTS
    reasons: tuple[str, ...] = ()
    flaky_tests: tuple[str, ...] = ()


@dataclass
class ValidationReport:
    task_set: str
    repeats: int
    tasks: list[TaskReport] = field(default_factory=list)

    @property
    def problems(self) -> list[TaskReport]:
        return [t for t in self.tasks if t.verdict != "ok"]

    def count(self, verdict: str) -> int:
        return sum(t.verdict == verdict for t in self.tasks)


def wrong_submissions(task: Task) -> dict[str, str]:
    """Submissions that must fail: nothing at all, and (function tasks) the entry point
    returning None. For a repository task "nothing" is the empty diff: its fail-to-pass tests
    must fail on the repository as it is."""
    if isinstance(task, RepositoryTask):
        return {"an empty diff": ""}
    if task.solution_prefix:  # the submission completes a function the prefix opens
        trivially_wrong = "    return None\n"
    else:
        trivially_wrong = f"def {task.entry_point}(*args, **kwargs):\n    return None\n"
    return {"an empty submission": "", "the entry point returning None": trivially_wrong}


def validate(
    tasks: Iterable[Task], pool: SandboxPool, store: EnvironmentStore | None = None, repeats: int = DEFAULT_REPEATS,
    task_set: str = "", progress: Callable[[int, int], None] | None = None,
) -> ValidationReport:
    """Grade every task's reference `repeats` times and its wrong submissions once, through `pool`
    (in their environments, built in `store`, for tasks that declare one)."""
    tasks = list(tasks)
    jobs = {
        task.id: (
            [pool.submit(sandbox_spec(task, store), partial(grade_solution, task, task.reference_solution))
             for _ in range(repeats)],
            {name: pool.submit(sandbox_spec(task, store), partial(grade_solution, task, submission))
             for name, submission in wrong_submissions(task).items()},
        )
        for task in tasks
    }
    report = ValidationReport(task_set, repeats)
    for done, task in enumerate(tasks, start=1):
        references, wrongs = jobs[task.id]
        report.tasks.append(_judge(task, [f.result() for f in references], {n: f.result() for n, f in wrongs.items()}))
        if progress is not None:
            progress(done, len(tasks))
    return report


def _judge(task: Task, references: list[GradeResult], wrongs: dict[str, GradeResult]) -> TaskReport:
    infra = [g for g in [*references, *wrongs.values()] if g.reward_status is RewardStatus.INFRA_ERROR]
    if infra:
        return TaskReport(task.id, "unjudgeable", (f"infrastructure error: {infra[0].exec.error}",))
    passes = sum(g.passed for g in references)
    flaky_tests = _varying_tests(references)
    if passes == 0:
        return TaskReport(task.id, "broken", (_first_failure(references[0]),))
    if passes < len(references) or flaky_tests:
        reason = f"reference passed {passes} of {len(references)} times"
        return TaskReport(task.id, "flaky", (reason,), flaky_tests)
    lax = [name for name, grade in wrongs.items() if grade.passed]
    if lax:
        return TaskReport(task.id, "lax", tuple(f"{name} passes every test" for name in lax))
    return TaskReport(task.id, "ok")


def _varying_tests(grades: list[GradeResult]) -> tuple[str, ...]:
    tests = sorted({test for g in grades for test in g.outcomes})
    return tuple(t for t in tests if len({g.outcomes.get(t) for g in grades}) > 1)


def _first_failure(grade: GradeResult) -> str:
    """Why the reference failed, in one line: the reason and its detail (grading/diagnosis.py)."""
    status = "" if grade.reward_status is RewardStatus.SCORED else f"{grade.reward_status.value}, "
    if grade.failure is None:  # not passed, yet nothing failed: every test passed but one was never counted
        return f"reference fails ({status}not every expected test was counted)"
    return f"reference fails ({status}{grade.failure.reason.value}): {grade.failure.detail}"
