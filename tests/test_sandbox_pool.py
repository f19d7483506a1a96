"""SandboxPool on real sandboxes of every backend: admission, priority, timeouts, retries and
quarantine."""

from __future__ import annotations

import threading

import pytest

from sandbox.base import Mount
from sandbox.pool import PoolConfig, SandboxPool
from sandbox.spec import Limits, SandboxSpec
from statuses import ExecStatus


@pytest.fixture
def pool_of(make_sandbox):
    """A pool whose sandboxes come from the test's backend factory."""
    pools = []

    def make(**config) -> SandboxPool:
        def build(spec: SandboxSpec):
            return make_sandbox(**{k: getattr(spec.limits, k) for k in ("wall_s", "memory_mb")})

        pool = SandboxPool(build, PoolConfig(**config), is_infra_failure=lambda r: getattr(r, "status", None) is ExecStatus.XX)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


class Concurrency:
    """Counts how many jobs run at once."""

    def __init__(self):
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def job(self, command):
        def run(sandbox):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            try:
                return sandbox.run(command, {})
            finally:
                with self.lock:
                    self.now -= 1
        return run


def spec(memory_mb=128, wall_s=5.0) -> SandboxSpec:
    return SandboxSpec(limits=Limits(memory_mb=memory_mb, wall_s=wall_s))


def test_cpu_slots_bound_concurrency(pool_of):
    pool, counter = pool_of(cpu_slots=2), Concurrency()
    futures = [pool.submit(spec(), counter.job(["sleep", "0.3"])) for _ in range(5)]
    assert [f.result().status for f in futures] == [ExecStatus.OK] * 5
    assert counter.most == 2


def test_memory_budget_bounds_concurrency(pool_of):
    pool, counter = pool_of(cpu_slots=4, memory_budget_mb=256), Concurrency()
    futures = [pool.submit(spec(memory_mb=128), counter.job(["sleep", "0.3"])) for _ in range(4)]
    assert all(f.result().ok for f in futures)
    assert counter.most == 2


def test_a_job_that_can_never_fit_is_refused(pool_of):
    with pytest.raises(ValueError, match="memory budget"):
        pool_of(memory_budget_mb=256).submit(spec(memory_mb=512), lambda sb: None)


def test_higher_priority_runs_first(pool_of):
    pool, gate, order = pool_of(cpu_slots=1), threading.Event(), []
    pool.submit(spec(), lambda sb: gate.wait(5))  # holds the only slot while the others queue
    futures = [pool.submit(spec(), lambda sb, name=name: order.append(name), priority=p)
               for name, p in (("low", 0), ("high", 5), ("middle", 1))]
    gate.set()
    for f in futures:
        f.result()
    assert order == ["high", "middle", "low"]


def test_per_job_timeout_lowers_the_wall_clock_limit(pool_of):
    result = pool_of().submit(spec(wall_s=30), lambda sb: sb.run(["sleep", "30"], {}), timeout_s=0.3).result()
    assert result.status is ExecStatus.TO


def test_an_infrastructure_failure_is_retried_on_a_fresh_sandbox(pool_of, tmp_path):
    pool, sandboxes = pool_of(max_attempts=3, quarantine_after=5), []

    def flaky(sandbox):
        sandboxes.append(sandbox)
        missing = [Mount(tmp_path / "missing", "/x")] if len(sandboxes) == 1 else []
        return sandbox.run(["echo", "ok"], {}, missing)  # the first attempt fails for real: XX

    result = pool.submit(spec(), flaky).result()
    assert (result.status, result.stdout, pool.retries) == (ExecStatus.OK, "ok\n", 1)


def test_a_backend_failing_again_and_again_is_quarantined(pool_of, tmp_path):
    pool = pool_of(max_attempts=3, quarantine_after=2)
    broken = [Mount(tmp_path / "missing", "/x")]
    result = pool.submit(spec(), lambda sb: sb.run(["true"], {}, broken)).result()
    assert result.status is ExecStatus.XX
    assert pool.retries == 2 and len(pool.quarantined) == 1
    assert "missing" in pool.quarantined[0].reason
