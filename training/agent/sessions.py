"""Sandbox sessions for episodes: a new one holding a task's starting files, or an ended episode's
session reset to them.

Opening a local session starts a bubblewrap sandbox and its supervisor (~50 ms, most of an
episode's sandbox cost; 1,024 of them took a third of an iteration's rollouts on 2 cores), while
resetting one empties its workspace, /tmp and /dev/shm and writes the next task's files (~1 ms).
Nothing an exec starts outlives it, so an ended episode leaves nothing behind but files, and the
reset removes them. A session is re-used only under the very sandbox spec the next task asks for
(limits, network, environment); one that cannot be reset (its sandbox failed) is closed and
replaced.
"""

from __future__ import annotations

from typing import Protocol

from grading.submission import repository_files, sandbox_spec
from sandbox.backends import open_sandbox
from sandbox.base import SandboxUnavailable, Session, WorkspacePathError
from task_sets.schema import SOLUTION_FILE, RepositoryTask, Task


class OpenSession(Protocol):
    """A session holding `task`'s starting files: `previous` (an ended episode's session, which
    it may re-use or must close) or a new one."""

    def __call__(self, task: Task, previous: Session | None = None, /) -> Session: ...


def starting_files(task: Task) -> dict[str, str | bytes]:
    """What an episode's workspace holds at the start: the task's files (a repository's binary
    files and its environment's workspace layer included; for a function task, solution.py with
    the task's prefix unless the files hold the solution.py to start from)."""
    if isinstance(task, RepositoryTask):
        return repository_files(task, sandbox_spec(task))
    return {SOLUTION_FILE: task.solution_prefix, **task.files}


def episode_session(backend: str, task: Task, previous: Session | None = None) -> Session:
    """An OpenSession on the named sandbox backend (bind the backend with functools.partial)."""
    spec = sandbox_spec(task)
    files = starting_files(task)
    if previous is not None:
        if previous.spec == spec and _reset(previous, files):
            return previous
        previous.close()
    return open_sandbox(backend, spec).session(files)


def _reset(session: Session, files: dict[str, str | bytes]) -> bool:
    """Whether `session` now holds `files` and nothing else (False: its sandbox failed, or it
    could not be emptied)."""
    try:
        session.reset(files)
    except (SandboxUnavailable, WorkspacePathError):
        return False
    return True
