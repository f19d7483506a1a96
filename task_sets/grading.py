"""Grade a submission for a task: the task's files plus `solution.py`, its hidden tests, its limits."""

from __future__ import annotations

import shlex

from sandbox.backends import open_sandbox
from sandbox.base import Sandbox
from sandbox.grading import GradeResult, grade
from sandbox.spec import Limits, SandboxSpec
from task_sets.schema import Task

SOLUTION_FILE = "solution.py"
HIDDEN_TESTS_FILE = "test_hidden.py"


def sandbox_spec(task: Task) -> SandboxSpec:
    limits = task.limits
    return SandboxSpec(
        image=task.image,
        network=task.network,
        limits=Limits(
            wall_s=limits.wall_s,
            cpu_s=limits.cpu_s,
            memory_mb=limits.memory_mb,
            pids=limits.pids,
            disk_mb=limits.disk_mb,
        ),
    )


def grade_solution(task: Task, solution: str, sandbox: Sandbox | None = None) -> GradeResult:
    """Grade in a fresh session of `sandbox` (which must run `sandbox_spec(task)`; default: a
    local one); the hidden tests exist only inside this grading run."""
    sandbox = sandbox or open_sandbox("local", sandbox_spec(task))
    workspace = {**task.files, SOLUTION_FILE: task.solution_file(solution)}
    return grade(sandbox, workspace, {HIDDEN_TESTS_FILE: task.tests}, command=shlex.split(task.entry_command))
