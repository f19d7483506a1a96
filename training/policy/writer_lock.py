"""One writer at a time of an experiment's checkpoints, across the processes of this machine.

Every run that writes an experiment's checkpoints (an iteration or its base policy, launched from
the UI, a backfill, a sensor or `crucible run`) holds the experiment's lock for as long as it runs,
so two of them never train the same iteration into the same folder. The lock is an advisory
`flock` on a file in the experiment's checkpoint folder: the kernel releases it when its process
ends, however it ends. It is re-entrant within a process (not per thread): `crucible run` holds
it across all its iterations, and the runs it executes in its own process take it again. A run
whose steps run in processes of their own (the multiprocess executor) holds it in the process that
runs them, lent to its steps: they, asking for a share with the run's purpose, go on under that
hold (never under a sibling step's).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".writer.lock"


class ExperimentBusy(Exception):
    """Another process holds the experiment's lock; the message names it."""


_held: dict[Path, tuple[int, int]] = {}  # lock file -> (descriptor, depth) held by this process
_guard = threading.Lock()


def _record(lock_file: Path) -> dict:
    """What the holder (or the last one) wrote: purpose, pid, host, since; {} when unreadable."""
    try:
        record = json.loads(lock_file.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and {"purpose", "pid", "host", "since"} <= record.keys() else {}


def holder(lock_file: Path) -> str:
    """Who holds (or last held) the lock, as recorded in its file."""
    record = _record(lock_file)
    if not record:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["since"]))
    return f"{record['purpose']} (pid {record['pid']} on {record['host']}, since {since})"


@contextmanager
def writer_lock(folder: Path, purpose: str, wait: Callable[[str], None] | None = None,
                shared: bool = False, lends: bool = False) -> Iterator[None]:
    """Hold the lock of the experiment whose checkpoints live in `folder`; `lends`: for processes
    of the same `purpose` too (a run's process, for its steps). Taken by another process: when
    `shared` and lent for this same purpose, go on under that process's hold; otherwise raise
    ExperimentBusy at once, or, given `wait`, tell it who holds the lock and block until it is free."""
    lock_file = (Path(folder) / LOCK_FILE).resolve()
    with _guard:
        held = lock_file in _held
        if held:
            descriptor, depth = _held[lock_file]
            _held[lock_file] = (descriptor, depth + 1)
    if not held:
        descriptor = _acquire(lock_file, purpose, wait, shared, lends)  # outside the guard: it may wait
        if descriptor is None:  # the run's own process holds it
            yield
            return
        with _guard:
            _held[lock_file] = (descriptor, 1)
    try:
        yield
    finally:
        with _guard:
            descriptor, depth = _held.pop(lock_file)
            if depth > 1:
                _held[lock_file] = (descriptor, depth - 1)
        if depth == 1:
            os.close(descriptor)  # releases the flock


def _acquire(lock_file: Path, purpose: str, wait: Callable[[str], None] | None, shared: bool,
             lends: bool) -> int | None:
    """The locked descriptor; None when `shared` and another process lends it for `purpose`."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        record = _record(lock_file)
        if shared and record.get("purpose") == purpose and record.get("lends"):
            os.close(descriptor)
            return None
        if wait is None:
            os.close(descriptor)
            raise ExperimentBusy(holder(lock_file)) from None
        wait(holder(lock_file))
        fcntl.flock(descriptor, fcntl.LOCK_EX)
    record = {"purpose": purpose, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
              "lends": lends}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(record).encode(), 0)
    return descriptor
