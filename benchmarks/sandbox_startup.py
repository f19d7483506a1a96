"""Sandbox start-up and throughput, side by side with a bare process start on this host.

    .venv/bin/python benchmarks/sandbox_startup.py [--runs 40] [--backends local,docker]

Every row runs `true` (the cost of the sandbox, not of the command):
  bare start            subprocess.run(["true"]): the floor
  <backend> run         one command in a fresh sandbox: what grading does
  <backend> session     open and close a session (local: starts the supervisor)
  <backend> exec        one more exec in a warm session: an agent's next turn
  <backend> reset       session.reset() (workspace back to its first files, /tmp emptied)
  throughput            commands per second through a 2-slot SandboxPool, fresh session each
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from sandbox.backends import open_sandbox
from sandbox.base import SandboxUnavailable
from sandbox.pool import PoolConfig, SandboxPool
from sandbox.spec import SandboxSpec

FILES = {"main.py": "print('hello')\n", "data/input.txt": "x" * 1000}


def timings(action: Callable[[], object], runs: int) -> list[float]:
    action()  # warm caches (imports, page cache, image layers)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


def throughput(backend: str, runs: int) -> float:
    spec = SandboxSpec()
    with SandboxPool(lambda s: open_sandbox(backend, s), PoolConfig(cpu_slots=2)) as pool:
        started = time.perf_counter()
        futures = [pool.submit(spec, lambda sb: sb.run(["true"], FILES)) for _ in range(runs)]
        assert all(f.result().ok for f in futures)
        return runs / (time.perf_counter() - started)


def bare_throughput(runs: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: subprocess.run(["true"], check=True), range(runs)))
    return runs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--backends", default="local,docker")
    args = parser.parse_args()
    console = Console()

    rows: list[tuple[str, list[float]]] = []
    console.print("bare start …")
    bare = timings(lambda: subprocess.run(["true"], check=True), args.runs)
    rows.append(("bare start", bare))
    rates = [("bare", bare_throughput(args.runs))]
    for backend in args.backends.split(","):
        try:
            sandbox = open_sandbox(backend, SandboxSpec())
        except SandboxUnavailable as e:
            console.print(f"[yellow]{backend}: unavailable here: {e}[/yellow]")
            continue
        console.print(f"{backend}: fresh sessions …")
        rows.append((f"{backend} run (fresh sandbox)", timings(lambda: sandbox.run(["true"], FILES), args.runs)))
        rows.append((f"{backend} session open+close", timings(lambda: sandbox.session(FILES).close(), args.runs)))
        with sandbox.session(FILES) as session:
            console.print(f"{backend}: warm session …")
            rows.append((f"{backend} exec (warm session)", timings(lambda: session.exec(["true"]), args.runs)))
            rows.append((f"{backend} reset", timings(session.reset, args.runs)))
        console.print(f"{backend}: throughput …")
        rates.append((backend, throughput(backend, args.runs)))

    bare_p50 = statistics.median(bare)
    table = Table(title=f"Sandbox start-up, `true`, {args.runs} runs each (ms)")
    for column in ("", "p50", "p90", "p50 − bare", "p50 / bare"):
        table.add_column(column, justify="right" if column else "left")
    for name, samples in rows:
        p50 = statistics.median(samples)
        table.add_row(name, f"{p50:.1f}", f"{percentile(samples, 90):.1f}", f"{p50 - bare_p50:+.1f}",
                      f"{p50 / bare_p50:.1f}x")
    console.print(table)

    rate_table = Table(title="Throughput with 2 workers (commands/s, fresh session each)")
    rate_table.add_column("")
    rate_table.add_column("commands/s", justify="right")
    rate_table.add_column("vs bare", justify="right")
    for name, rate in rates:
        rate_table.add_row(name, f"{rate:.1f}", f"{rate / rates[0][1]:.2f}x")
    console.print(rate_table)


if __name__ == "__main__":
    main()
