"""One writer at a time of an experiment's checkpoints, across the processes of this machine.

Every run that writes an experiment's checkpoints (an iteration or its base policy, launched from
the UI, a backfill, a sensor or `crucible run`) holds the experiment's lock for as long as it runs,
so two of them never train the same iteration into the same folder. The lock is an advisory
`flock` on a file in the experiment's checkpoint folder: the kernel releases it when its process
ends, however it ends. It is re-entrant within a process (not per thread): `crucible run` holds
it across all its iterations, and the runs it executes in its own process take it again. A run
whose steps run in processes of their own (the multiprocess executor) holds it in the process that
runs them, lent to its steps: they, asking for a share with the run's purpose, go on under that
hold (never under a sibling step's), each holding a shared `flock` on a second file. Those steps
are not the run process's children: should it die, they may go on writing, and the next writer
waits for (or is refused by) their shares, not only for the lock.
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
SHARES_FILE = ".writer.lock.shares"  # flocked shared by the steps under a lent hold


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
            os.close(descriptor)  # releases the flock (the lock's, or a share's)


def _acquire(lock_file: Path, purpose: str, wait: Callable[[str], None] | None, shared: bool, lends: bool) -> int:
    """The locked descriptor: of the lock, or, when `shared` and another process lends the lock
    for `purpose`, of a share under its hold."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if shared and (share := _share_of_lent_hold(lock_file, purpose)) is not None:
            os.close(descriptor)
            return share
        if wait is None:
            os.close(descriptor)
            raise ExperimentBusy(holder(lock_file)) from None
        try:
            wait(holder(lock_file))
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except BaseException:  # interrupted while waiting
            os.close(descriptor)
            raise
    previous = None
    try:
        previous, earlier_holder = lock_file.read_bytes(), holder(lock_file)
        record = {"purpose": purpose, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                  "lends": lends}
        _write(descriptor, json.dumps(record).encode())  # before looking for shares: see _share_of_lent_hold
        _outlasting_shares_gone(lock_file, earlier_holder, wait)
    except BaseException:  # refused, or interrupted: the lock is not kept
        if previous is not None:
            _write(descriptor, previous)  # so that the next to try is told of the same holder
        os.close(descriptor)
        raise
    return descriptor


def _write(descriptor: int, record: bytes) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, record, 0)


def _lent_for(lock_file: Path, purpose: str) -> bool:
    record = _record(lock_file)
    return record.get("purpose") == purpose and bool(record.get("lends"))


def _share_of_lent_hold(lock_file: Path, purpose: str) -> int | None:
    """A shared flock on the shares file while the lock is lent for `purpose`; None if it is not.
    The record is read again once the share is held: a new holder writes its own before it looks
    for shares, so a share taken on the word of a dead lender's record is either seen by the new
    holder or given back here."""
    if not _lent_for(lock_file, purpose):
        return None
    share = os.open(lock_file.with_name(SHARES_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(share, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # a new holder is looking for (or waiting out) the shares
        os.close(share)
        return None
    if _lent_for(lock_file, purpose):
        return share
    os.close(share)
    return None


def _outlasting_shares_gone(lock_file: Path, earlier_holder: str, wait: Callable[[str], None] | None) -> None:
    """Wait for (or, without `wait`, refuse on) shares still held under an earlier hold: the steps
    of a run whose process died, which may still be writing."""
    shares = os.open(lock_file.with_name(SHARES_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(shares, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = f"the steps of {earlier_holder}, which go on after its process is gone"
            if wait is None:
                raise ExperimentBusy(message) from None
            wait(message)
            fcntl.flock(shares, fcntl.LOCK_EX)
    finally:
        os.close(shares)
