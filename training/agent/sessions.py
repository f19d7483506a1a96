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

from typing import TYPE_CHECKING, Protocol

from grading.submission import repository_files, sandbox_spec
from sandbox.backends import open_sandbox
from sandbox.base import SandboxUnavailable, Session, WorkspacePathError
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from environments.store import EnvironmentStore
    from sandbox.docker_hosts import DockerHost
from task_sets.schema import SOLUTION_FILE, RepositoryTask, Task


class OpenSession(Protocol):
    """A session holding `task`'s starting files: `previous` (an ended episode's session, which
    it may re-use or must close) or a new one."""

    def __call__(self, task: Task, previous: Session | None = None, /) -> Session: ...


def starting_files(task: Task, spec: SandboxSpec) -> dict[str, str | bytes]:
    """What an episode's workspace holds at the start in the sandbox `spec` runs: the task's files
    (a repository's binary files and its environment's workspace layer included; for a function
    task, solution.py with the task's prefix unless the files hold the solution.py to start from)."""
    if isinstance(task, RepositoryTask):
        return repository_files(task, spec)
    return {SOLUTION_FILE: task.solution_prefix, **task.files}


def episode_session(backend: str, task: Task, previous: Session | None = None, *,
                    store: EnvironmentStore | None = None, hosts: tuple[DockerHost, ...] = ()) -> Session:
    """An OpenSession on the named sandbox backend (bind the backend, the environment store
    tasks with an environment need and the Docker daemons with functools.partial)."""
    spec = sandbox_spec(task, store)
    files = starting_files(task, spec)
    if previous is not None:
        if previous.spec == spec and _reset(previous, files):
            return previous
        previous.close()
    return open_sandbox(backend, spec, hosts).session(files)


def _reset(session: Session, files: dict[str, str | bytes]) -> bool:
    """Whether `session` now holds `files` and nothing else (False: its sandbox failed, or it
    could not be emptied)."""
    try:
        session.reset(files)
    except (SandboxUnavailable, WorkspacePathError):
        return False
    return True
