"""Warm workers: sandboxes started once and kept for the next run, one per run under way.

A worker is started on a thread of its own that lives as long as any worker does: bubblewrap's
--die-with-parent (the kernel's parent-death signal) follows the thread that started it, and a
pool's runs come from threads that end with each job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

from sandbox.base import SandboxUnavailable


class Worker(Protocol):
    usable: bool

    def close(self) -> None: ...


W = TypeVar("W", bound=Worker)


class WarmWorkers(Generic[W]):
    def __init__(self, start: Callable[[], W]):
        self._start = start
        self._idle: list[W] = []
        self._busy = 0
        self._closed = False
        self._lock = threading.Lock()
        self._starter: ThreadPoolExecutor | None = None

    def take(self) -> W:
        """An idle worker, or a new one (what starting it raises, raised); SandboxUnavailable
        once closed."""
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("the sandbox was closed")
            self._busy += 1
            if self._idle:
                return self._idle.pop()
            if self._starter is None:
                self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm-workers")
            starter = self._starter
        try:
            return starter.submit(self._start).result()
        except BaseException:
            self._done_with(None)
            raise

    def give_back(self, worker: W) -> None:
        """Kept for the next run while it works and the workers are open; closed otherwise."""
        self._done_with(worker)

    def close(self) -> None:
        """Close the idle workers now, those at work as their runs end (which they may finish:
        their starting thread ends only after the last)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()
        self._stop_starter_when_idle()

    def _done_with(self, worker: W | None) -> None:
        with self._lock:
            self._busy -= 1
            kept = worker is not None and worker.usable and not self._closed
            if kept:
                self._idle.append(worker)
        if worker is not None and not kept:
            worker.close()
        self._stop_starter_when_idle()

    def _stop_starter_when_idle(self) -> None:
        with self._lock:
            if not self._closed or self._busy or self._starter is None:
                return
            starter, self._starter = self._starter, None
        starter.shutdown()
