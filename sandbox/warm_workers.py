"""Warm workers: sandboxes started once and kept for the next run, one per run under way.

A worker is started on a thread of its own that lives as long as the workers may: bubblewrap's
--die-with-parent (the kernel's parent-death signal) follows the thread that started it, and a
pool's runs come from threads that end with each job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar


class Worker(Protocol):
    usable: bool

    def close(self) -> None: ...


W = TypeVar("W", bound=Worker)


class WarmWorkers(Generic[W]):
    def __init__(self, start: Callable[[], W]):
        self._start = start
        self._idle: list[W] = []
        self._lock = threading.Lock()
        self._starter: ThreadPoolExecutor | None = None

    def take(self) -> W:
        """An idle worker, or a new one (what starting it raises, raised)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self._starter is None:
                self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm-workers")
            starter = self._starter
        return starter.submit(self._start).result()

    def give_back(self, worker: W) -> None:
        """Kept for the next run while it works; closed once it does not."""
        if worker.usable:
            with self._lock:
                if self._starter is not None:  # not closed meanwhile
                    self._idle.append(worker)
                    return
        worker.close()

    def close(self) -> None:
        """Close the idle workers (those at work are closed as they come back)."""
        with self._lock:
            idle, self._idle = self._idle, []
            starter, self._starter = self._starter, None
        for worker in idle:
            worker.close()
        if starter is not None:
            starter.shutdown()
