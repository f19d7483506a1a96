"""One cgroup per sandbox run: memory and process limits, OOM detection, and a sure kill.

cgroup v1 (separate `memory` and `pids` hierarchies) and v2 (one unified directory) are both
supported. Run cgroups are created under the cgroup this process already lives in, so a run
never escapes limits the host placed on us. Everything here raises CgroupError on failure; the
sandbox turns that into an infrastructure error (XX), never into the model's fault.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_REMOVE_TIMEOUT_S = 5.0


class CgroupError(RuntimeError):
    """A cgroup could not be created, limited or joined: the run becomes an XX result."""


@dataclass(frozen=True)
class _Names:
    """Control file names, which differ between cgroup v1 and v2."""

    memory_limit: str
    swap_limit: str
    peak_memory: str
    oom_events: str  # a flat-keyed file with an "oom_kill N" line


_V1 = _Names(
    "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control"
)
_V2 = _Names("memory.max", "memory.swap.max", "memory.peak", "memory.events")


@dataclass(frozen=True)
class CgroupHost:
    """Where run cgroups can be created on this host (found once by `detect`)."""

    version: int
    memory_parent: Path | None  # run cgroups for memory are created inside this directory
    pids_parent: Path | None  # equal to memory_parent on v2


def detect(parent_name: str = "crucible") -> CgroupHost | None:
    """Find writable memory/pids cgroup hierarchies; None when there are none."""
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    v2_mount = mounts.get("cgroup2")
    if v2_mount is not None:
        base = _v2_delegating_ancestor(v2_mount, own.get("", "/"))
        if base is not None:
            parent = base / parent_name
            return CgroupHost(2, parent, parent)
    memory = _v1_parent(mounts.get("memory"), own.get("memory"), parent_name)
    pids = _v1_parent(mounts.get("pids"), own.get("pids"), parent_name)
    if memory is None and pids is None:
        return None
    return CgroupHost(1, memory, pids)


def _cgroup_mounts() -> dict[str, Path]:
    """Writable cgroup mounts: v1 controller name (or "cgroup2") -> mount point."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point, fstype, options = fields[1], fields[2], fields[3].split(",")
        if "ro" in options:
            continue  # e.g. a container that shows cgroups read-only: unusable
        if fstype == "cgroup2":
            found["cgroup2"] = Path(mount_point)
        elif fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    found[controller] = Path(mount_point)
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller; key "" holds the v2 path."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


def _v1_parent(mount: Path | None, own_path: str | None, parent_name: str) -> Path | None:
    if mount is None:
        return None
    base = mount / (own_path or "/").lstrip("/")
    # When the mount shows only a subtree (some containers), our path is not under it.
    if not base.is_dir():
        base = mount
    return base / parent_name if os.access(base, os.W_OK) else None


def _v2_delegating_ancestor(mount: Path, own_path: str) -> Path | None:
    """The nearest ancestor of our cgroup that hands memory and pids down to its children.

    Our own cgroup cannot be the parent on v2: a cgroup holding processes may not enable
    controllers for children ("no internal processes" rule), so runs go next to us.
    """
    candidate = mount / own_path.lstrip("/")
    if not candidate.is_dir():
        candidate = mount
    while True:
        try:
            enabled = (candidate / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        if {"memory", "pids"} <= set(enabled) and os.access(candidate, os.W_OK):
            return candidate
        if candidate == mount:
            return None
        candidate = candidate.parent


class RunCgroup:
    """The cgroup(s) of one run. Create with `create`, always finish with `destroy`."""

    def __init__(self, host: CgroupHost, run_id: str):
        self._names = _V1 if host.version == 1 else _V2
        self._version = host.version
        self._memory_dir = host.memory_parent / run_id if host.memory_parent else None
        self._pids_dir = host.pids_parent / run_id if host.pids_parent else None
        self._dirs = tuple(dict.fromkeys(d for d in (self._memory_dir, self._pids_dir) if d))

    @property
    def has_memory(self) -> bool:
        return self._memory_dir is not None

    @property
    def has_pids(self) -> bool:
        return self._pids_dir is not None

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes its pid into to join this run's cgroup(s)."""
        return [str(d / "cgroup.procs") for d in self._dirs]

    def create(self, memory_bytes: int, pids: int) -> None:
        try:
            for d in self._dirs:
                self._make_parent(d.parent)
                d.mkdir()
            if self._memory_dir:
                self._limit_memory(self._memory_dir, memory_bytes)
            if self._pids_dir:
                (self._pids_dir / "pids.max").write_text(str(pids))
        except OSError as e:
            self.destroy()
            raise CgroupError(f"cannot set up cgroup: {e}") from e

    def _make_parent(self, parent: Path) -> None:
        parent.mkdir(exist_ok=True)
        if self._version == 2:
            controls = parent / "cgroup.subtree_control"
            if not {"memory", "pids"} <= set(controls.read_text().split()):
                controls.write_text("+memory +pids")

    def _limit_memory(self, d: Path, memory_bytes: int) -> None:
        (d / self._names.memory_limit).write_text(str(memory_bytes))
        swap = d / self._names.swap_limit
        if swap.exists():  # absent when the kernel does not account swap
            # v1 limits memory+swap together; v2 limits swap alone. Either way: no swapping.
            swap.write_text(str(memory_bytes) if self._version == 1 else "0")

    def pids(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError, ValueError):  # the cgroup went away meanwhile
                found.update(int(p) for p in Path(f).read_text().split())
        return found

    def kill_all(self, timeout_s: float = _REMOVE_TIMEOUT_S) -> bool:
        """SIGKILL every process in the run, repeating until none is left (forks race us)."""
        for d in self._dirs:
            kill_file = d / "cgroup.kill"  # v2, kernel >= 5.14: atomic, beats fork races
            if kill_file.exists():
                with contextlib.suppress(OSError):  # fall back to killing pid by pid below
                    kill_file.write_text("1")
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # already exited
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        return True

    def oom_kills(self) -> int:
        """OOM kills so far; a session compares the count before and after each run."""
        if not self._memory_dir:
            return 0
        events = _flat_keyed(self._memory_dir / self._names.oom_events)
        if "oom_kill" in events:
            return events["oom_kill"]
        # Kernels before 4.13 have no counter; times the limit was hit is the best evidence left.
        return _read_int(self._memory_dir / "memory.failcnt", 0)

    def peak_memory_bytes(self) -> int | None:
        if not self._memory_dir:
            return None
        return _read_int(self._memory_dir / self._names.peak_memory, None)

    def reset_peak_memory(self) -> None:
        """Start a new peak for the next run (v1, and v2 on kernels >= 6.12); where the peak
        cannot be reset it stays the session's peak so far."""
        if self._memory_dir:
            with contextlib.suppress(OSError):
                (self._memory_dir / self._names.peak_memory).write_text("0")

    def destroy(self) -> None:
        """Kill what is left and remove the directories; CgroupError if that is impossible."""
        if not self.kill_all():
            raise CgroupError(f"processes survive in {self._dirs}: {sorted(self.pids())}")
        for d in self._dirs:
            _rmdir_patiently(d)


def _rmdir_patiently(d: Path) -> None:
    # rmdir answers EBUSY for a moment after the last process died (exit is asynchronous).
    deadline = time.monotonic() + _REMOVE_TIMEOUT_S
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise CgroupError(f"cannot remove cgroup {d}: {e}") from e
            time.sleep(0.005)


def _flat_keyed(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split() for line in lines)
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _read_int(path: Path, default: int | None) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default
