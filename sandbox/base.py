"""What every sandbox backend offers.

A backend (`Sandbox`) opens sessions. A `Session` is one isolated workspace with its own
limits, used for many commands in a row (an agent's turns), and closed when done:

    with sandbox.session(files) as s:
        s.exec(["python3", "main.py"])       # ExecResult; s.log keeps every one
        s.put_files({"main.py": b"..."})
        s.get_files(["out.txt"])             # {"out.txt": b"..."}
        snap = s.snapshot()                  # the workspace as a tar archive (bytes)
        s.restore(snap)
        s.reset()                            # back to the files the session opened with

Contract shared by the backends:
- Nothing a command starts outlives its `exec`: the process tree is killed when the command
  ends, times out or floods output. State lives in the workspace (and /tmp) only.
- `exec` never raises for a problem of the sandbox itself: it returns status XX.
- `put_files` / `get_files` take relative paths inside the workspace; absolute paths, `..`
  and symlinks planted by the command are refused with WorkspacePathError.
- `close` is idempotent and leaves nothing behind: no process, mount, cgroup, container or file.
- `run` is one command in a fresh session: what grading uses.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Protocol

from sandbox.capture import OutputCapture
from sandbox.result import ExecResult, infrastructure_error
from sandbox.spec import SandboxSpec

WORKSPACE = "/workspace"
# Read-only files given by content, by the folder they are shown at ({"/grader": {"tests/t.py": ...}}).
Trees = Mapping[str, Mapping[str, str | bytes]]
NO_TREES: Trees = MappingProxyType({})

# Called with ("stdout" | "stderr", chunk) as output arrives, for streaming.
OutputCallback = Callable[[str, bytes], None]


class SandboxUnavailable(RuntimeError):
    """A session could not be opened or kept alive: an infrastructure failure, never the
    model's fault. A pool retries it on a fresh sandbox."""


class WorkspacePathError(ValueError):
    """A put/get path leaves the workspace, or names something that is not a regular file."""


@dataclass(frozen=True)
class Mount:
    """A host directory (or file) shown inside the sandbox at `sandbox_path`."""

    host_path: Path
    sandbox_path: str
    writable: bool = False


class Session(Protocol):
    id: str
    spec: SandboxSpec
    log: list[ExecResult]

    def exec(
        self, command: Sequence[str], *, timeout_s: float | None = None, on_output: OutputCallback | None = None
    ) -> ExecResult: ...
    def put_files(self, files: Mapping[str, str | bytes]) -> None: ...
    def get_files(self, paths: Sequence[str]) -> dict[str, bytes]: ...
    def protect(self, paths: Sequence[str]) -> None:
        """Make these workspace files unchangeable by the commands: root-owned and read-only,
        every directory on the way to them root-owned and sticky, so that a command can still
        add files beside them but never edit, delete, rename or replace them (grading uses it
        for hidden tests and protected paths). Until reset or close."""
        ...
    def snapshot(self) -> bytes: ...
    def restore(self, snapshot: bytes) -> None: ...
    def reset(self, files: Mapping[str, str | bytes] | None = None) -> None:
        """Back to the files the session was opened with (or last reset to), or to `files`, which
        it resets to from then on (the session serves another task); /tmp, /dev/shm and SysV IPC
        objects removed, protection lifted. Raises SandboxUnavailable when the session's sandbox
        has failed, WorkspacePathError when it could not be emptied: open a new one."""
        ...
    def close(self) -> None: ...
    def __enter__(self) -> Session: ...
    def __exit__(self, *exc) -> None: ...


class SessionLifecycle(ABC):
    """What every backend's session does the same way: context management, refusing use after
    close, and cleaning up when opening fails."""

    id: str
    spec: SandboxSpec
    log: list[ExecResult]
    _closed: bool
    _backend_name: str
    _infra_errors: tuple[type[BaseException], ...]  # failures of ours, reported as XX

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None: ...

    def exec(
        self, command: Sequence[str], *, timeout_s: float | None = None, on_output: OutputCallback | None = None
    ) -> ExecResult:
        """Run `command` (see Session); the backend's `_run` does the work, infrastructure
        errors (`_infra_errors`) become XX, and every result lands in `log`."""
        self._check_open()
        if not command:
            raise ValueError("command must not be empty")
        started_at, started = time.time(), time.monotonic()
        limits = self.spec.limits
        deadline = started + (limits.wall_s if timeout_s is None else timeout_s)
        stdout, stderr = OutputCapture("stdout", limits.excerpt_bytes), OutputCapture("stderr", limits.excerpt_bytes)
        try:
            result = self._run(list(command), stdout, stderr, deadline, on_output, started)
        except self._infra_errors as e:
            result = infrastructure_error(self.spec.hash, self._backend_name, f"{type(e).__name__}: {e}", started)
        result = replace(result, command=tuple(command), started_at=started_at, session_id=self.id)
        self.log.append(result)
        return result

    @abstractmethod
    def _run(self, command: list[str], stdout: OutputCapture, stderr: OutputCapture, deadline: float,
             on_output: OutputCallback | None, started: float) -> ExecResult: ...

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"session {self.id} is closed")

    def _abandon(self, error: BaseException) -> None:
        """Close a session that failed to open; an infrastructure error becomes
        SandboxUnavailable, anything else (bad input files) is raised as it is."""
        self.close()
        if isinstance(error, self._infra_errors):
            raise SandboxUnavailable(f"cannot open a {self._backend_name} session: {type(error).__name__}: {error}") from error
        raise error

class Sandbox(Protocol):
    name: str
    spec: SandboxSpec
    scratch_dir: Path  # host directory for grading mounts (test files, report)

    def session(self, files: Mapping[str, str | bytes] = {}, mounts: Sequence[Mount] = ()) -> Session: ...  # noqa: B006
    def run(self, command: list[str], files: Mapping[str, str | bytes], mounts: Sequence[Mount] = (),
            protected: Sequence[str] = (), trees: Trees = NO_TREES) -> ExecResult:
        """One command in a fresh sandbox holding `files`, `mounts` and the read-only `trees`."""
        ...


def run_once(
    sandbox: Sandbox,
    command: list[str],
    files: Mapping[str, str | bytes],
    mounts: Sequence[Mount],
    protected: Sequence[str] = (),
    open_session: Callable[..., Session] | None = None,
    trees: Trees = NO_TREES,
) -> ExecResult:
    """One command in a fresh session (what `Sandbox.run` does; `open_session` defaults to
    `sandbox.session`), `trees` written beside it and mounted, `protected` files sealed first; a
    session that cannot open is an XX result."""
    started = time.monotonic()
    try:
        with trees_as_mounts(sandbox.scratch_dir, trees) as shown, \
                (open_session or sandbox.session)(files, [*mounts, *shown]) as session:
            if protected:
                session.protect(protected)
            return session.exec(command)
    except SandboxUnavailable as e:
        return infrastructure_error(sandbox.spec.hash, sandbox.name, str(e), started)


@contextmanager
def trees_as_mounts(scratch_dir: Path, trees: Trees) -> Iterator[list[Mount]]:
    """Each tree written in a fresh directory of `scratch_dir` (root-owned and world-readable, so
    the sandbox user can read but not change it) and shown read-only; removed afterwards."""
    if not trees:
        yield []
        return
    root = Path(tempfile.mkdtemp(prefix="crucible-grade-", dir=scratch_dir))
    try:
        mounts = []
        for number, (sandbox_path, files) in enumerate(trees.items()):
            write_read_only_tree(root / f"tree-{number}", files)
            mounts.append(Mount(root / f"tree-{number}", sandbox_path))
        yield mounts
    finally:
        shutil.rmtree(root)


def write_read_only_tree(tree: Path, files: Mapping[str, str | bytes]) -> None:
    tree.mkdir()
    for filename, content in files.items():
        target = tree / tree_file_name(filename)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
    for path in [tree, *tree.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.suffix == ".sh" else 0o644)


def tree_file_name(filename: str) -> PurePosixPath:
    """A tree's file name as a path that stays inside it; ValueError otherwise."""
    path = PurePosixPath(filename)
    if path.is_absolute() or ".." in path.parts or not path.parts or "\0" in filename:
        raise ValueError(f"grader file name must be a relative path: {filename!r}")
    return path


_reaped: set[str] = set()
_reaped_lock = threading.Lock()


def reap_once(place: str, reap: Callable[[], object]) -> None:
    """Call `reap` the first time this process opens a sandbox at `place` (a scratch directory,
    a daemon). What owners killed without closing left there costs every later sandbox: each
    leaked tmpfs mount is copied into every new mount namespace, and 448 of them made grading
    1.8x slower (49 s instead of 28 s for 1,024 submissions)."""
    with _reaped_lock:
        if place in _reaped:
            return
        _reaped.add(place)
    try:
        reap()
    except Exception as e:  # noqa: BLE001 (the new sandbox works regardless; the operator is told)
        logging.getLogger(__name__).warning(f"could not remove what dead sandbox owners left at {place}: {e}")


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (for reapers)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
