"""The ExecResult contract: what one command in a sandbox did."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from statuses import ExecStatus


@dataclass(frozen=True)
class ExecResult:
    status: ExecStatus
    exit_code: int | None
    signal: int | None
    wall_s: float
    cpu_s: float
    peak_memory_bytes: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    spec_hash: str
    backend: str
    error: str | None = None  # what went wrong, for XX
    # How the limits were enforced when it differs from the backend's normal way (e.g. a
    # memory limit by RLIMIT_AS because no cgroup was usable), so weaker runs can be found.
    notes: tuple[str, ...] = ()
    # The execution log: what ran, when (unix time) and in which session.
    command: tuple[str, ...] = ()
    started_at: float | None = None
    session_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is ExecStatus.OK

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def infrastructure_error(spec_hash: str, backend: str, error: str, started: float) -> ExecResult:
    """An XX result: the sandbox failed before or around the command (`started`: monotonic)."""
    return ExecResult(
        status=ExecStatus.XX, exit_code=None, signal=None,
        wall_s=round(time.monotonic() - started, 4), cpu_s=0.0, peak_memory_bytes=None,
        stdout="", stderr="", stdout_truncated=False, stderr_truncated=False,
        spec_hash=spec_hash, backend=backend, error=error,
    )
