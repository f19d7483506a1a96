"""SandboxPool: many sandbox jobs at once, admitted by CPU slots and a memory budget.

A job is a function of a Sandbox (grading one submission, an agent episode). The pool:

- admits a job when a CPU slot is free and its spec's memory limit fits in what is left of
  the memory budget, highest priority first (ties: first come, first served);
- applies a per-job timeout by lowering the wall-clock limit of the job's spec;
- retries a job whose result is an infrastructure failure (SandboxUnavailable, or a result
  the caller's `is_infra_failure` recognises) on a fresh sandbox, up to `max_attempts`;
- quarantines a backend instance after `quarantine_after` infrastructure failures in a row:
  it is dropped (recorded in `quarantined` with the reason), its orphans reaped, and the next
  job gets a newly built one.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Generic, TypeVar

from sandbox.base import Sandbox, SandboxUnavailable
from sandbox.spec import SandboxSpec

T = TypeVar("T")


@dataclass(frozen=True)
class PoolConfig:
    cpu_slots: int = os.cpu_count() or 1
    memory_budget_mb: int = 8192
    max_attempts: int = 3
    quarantine_after: int = 2


@dataclass(frozen=True)
class Quarantined:
    backend: str
    spec_hash: str
    reason: str


@dataclass(order=True)
class _Job(Generic[T]):
    sort_key: tuple[int, int]
    spec: SandboxSpec
    work: Callable[[Sandbox], T]
    future: Future
    attempts: int = 0


class SandboxPool:
    def __init__(
        self,
        make_sandbox: Callable[[SandboxSpec], Sandbox],
        config: PoolConfig = PoolConfig(),  # noqa: B008 (frozen)
        is_infra_failure: Callable[[object], bool] = lambda result: False,
    ):
        self._make_sandbox, self.config, self._is_infra_failure = make_sandbox, config, is_infra_failure
        self._lock = threading.Condition()
        self._queue: list[_Job] = []
        self._order = itertools.count()
        self._free_slots, self._free_memory_mb = config.cpu_slots, config.memory_budget_mb
        self._sandboxes: dict[SandboxSpec, Sandbox] = {}
        self._failures_in_a_row: dict[SandboxSpec, int] = {}
        self.quarantined: list[Quarantined] = []
        self.retries = 0
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch, name="sandbox-pool", daemon=True)
        self._dispatcher.start()

    # -- public ------------------------------------------------------------------------------

    def submit(
        self, spec: SandboxSpec, work: Callable[[Sandbox], T], *, priority: int = 0, timeout_s: float | None = None
    ) -> Future[T]:
        """Queue `work(sandbox)`; higher `priority` runs first."""
        if spec.limits.memory_mb > self.config.memory_budget_mb:
            raise ValueError(
                f"a job needing {spec.limits.memory_mb} MB can never fit the pool's "
                f"{self.config.memory_budget_mb} MB memory budget"
            )
        if timeout_s is not None:
            spec = replace(spec, limits=replace(spec.limits, wall_s=min(spec.limits.wall_s, timeout_s)))
        job = _Job((-priority, next(self._order)), spec, work, Future())
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is closed")
            heapq.heappush(self._queue, job)
            self._lock.notify_all()
        return job.future

    def map(self, spec_of: Callable[[object], SandboxSpec], work: Callable[[Sandbox, object], T],
            items: Iterable, priority: int = 0) -> Iterable[T]:
        """Results in the order of `items`, as they complete."""
        futures = [self.submit(spec_of(item), lambda sb, item=item: work(sb, item), priority=priority) for item in items]
        return (f.result() for f in futures)

    def close(self) -> None:
        """Finish queued jobs, then stop, and the sandboxes with it (a local one's warm workers)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._dispatcher.join()
        for sandbox in self._sandboxes.values():
            _close(sandbox)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- scheduling --------------------------------------------------------------------------

    def _dispatch(self) -> None:
        with self._lock:
            while True:
                job = self._next_admissible()
                if job is None:
                    if self._closed and not self._queue and self._free_slots == self.config.cpu_slots:
                        return
                    self._lock.wait()
                    continue
                self._free_slots -= 1
                self._free_memory_mb -= job.spec.limits.memory_mb
                threading.Thread(target=self._run, args=(job,), daemon=True).start()

    def _next_admissible(self) -> _Job | None:
        """The highest-priority job, if it fits now. It waits for room rather than letting
        smaller jobs overtake it forever."""
        if not self._queue or self._free_slots == 0:
            return None
        if self._queue[0].spec.limits.memory_mb > self._free_memory_mb:
            return None
        return heapq.heappop(self._queue)

    def _run(self, job: _Job) -> None:
        try:
            settle = self._attempt(job)
        except BaseException as e:  # the pool's own bookkeeping failed: the job must still end
            settle = partial(job.future.set_exception, e)
        finally:
            with self._lock:
                self._free_slots += 1
                self._free_memory_mb += job.spec.limits.memory_mb
                self._lock.notify_all()
        settle()

    def _attempt(self, job: _Job) -> Callable[[], None]:
        """Run the job until it succeeds or runs out of attempts; returns what settles its
        future (called after the slot is released)."""
        while True:
            job.attempts += 1
            try:
                result = job.work(self._sandbox(job.spec))
                failed = self._is_infra_failure(result)
                error = None
            except SandboxUnavailable as e:
                result, failed, error = None, True, e
            except BaseException as e:  # the job's own bug: no retry
                return partial(job.future.set_exception, e)
            self._record(job.spec, failed, error or result)
            if not failed or job.attempts >= self.config.max_attempts:
                if error is not None:
                    return partial(job.future.set_exception, error)
                return partial(job.future.set_result, result)
            with self._lock:
                self.retries += 1

    def _sandbox(self, spec: SandboxSpec) -> Sandbox:
        with self._lock:
            sandbox = self._sandboxes.get(spec)
        if sandbox is None:
            made = self._make_sandbox(spec)  # SandboxUnavailable counts as an attempt
            with self._lock:
                sandbox = self._sandboxes.setdefault(spec, made)
            if sandbox is not made:  # another job's came first
                _close(made)
        return sandbox

    def _record(self, spec: SandboxSpec, failed: bool, evidence: object) -> None:
        with self._lock:
            count = self._failures_in_a_row.get(spec, 0) + 1 if failed else 0
            self._failures_in_a_row[spec] = count
            if count < self.config.quarantine_after:
                return
            sandbox = self._sandboxes.pop(spec, None)
            self._failures_in_a_row[spec] = 0
        reason = str(getattr(getattr(evidence, "exec", evidence), "error", None) or evidence)[:500]
        reap = getattr(sandbox, "reap", None)
        try:
            _close(sandbox)
            if reap is not None:
                reap()
        except Exception as e:  # noqa: BLE001 (recorded: a failed clean-up must not fail the job)
            reason += f"; reaping failed: {type(e).__name__}: {e}"
        self.quarantined.append(Quarantined(getattr(sandbox, "name", "?"), spec.hash, reason))


def _close(sandbox: Sandbox | None) -> None:
    """What a sandbox keeps between jobs (a local one's warm workers), where it keeps any."""
    if hasattr(sandbox, "close"):
        sandbox.close()
