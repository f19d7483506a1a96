"""Iterations in turn against iterations that overlap (`max_staleness` 1), on the default experiment.

    .venv/bin/python benchmarks/staleness.py [--config experiments/repair.toml] [--iterations 4]
                                             [--variants k0,k1,k0-pinned,k1-pinned] [--out DIR]

Each variant is the experiment of `--config` (its seed, its settings) under a name of its own, run
by `crucible run` from a fresh storage root and Dagster instance, one variant after the other:

  k0           max_staleness 0: iteration N samples checkpoint N-1 (every run before overlap)
  k1           max_staleness 1: two iterations under way, N+1 sampling while N trains
  k0-pinned    as k0, the training step on core 0 and everything else (sampling, grading,
  k1-pinned    the daemon) on core 1: a model of a cluster where trainer and sampler are two machines

Printed: the wall time of the iterations (first iteration run's start to the last one's end, the
base policy's warm-up left out), the held-out pass rate after each iteration, the staleness each
iteration sampled at, and the seconds per stage summed over the iterations (the `stages`
dataset), from which the last line projects what overlap gives where sampling and training run
on machines of their own: an iteration in turn costs the sum of its stages, one that overlaps
the larger of the sampler's (sampling, grading, evaluation) and the trainer's (training).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from dagster import DagsterInstance, RunsFilter
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from datastore import catalog, metrics  # noqa: E402

VARIANTS = {"k0": (0, False), "k1": (1, False), "k0-pinned": (0, True), "k1-pinned": (1, True)}
SAMPLER_STAGES = ("rollouts", "verified_rollouts", "trajectories", "checkpoint_eval")
TRAINER_STAGES = ("checkpoint",)


def run_variant(config: str, variant: str, iterations: int, out: Path, console: Console) -> dict:
    staleness, pinned = VARIANTS[variant]
    home = out / variant
    (home / "dagster").mkdir(parents=True)
    name = f"{tomllib.loads(config)['name']}-{variant}"
    settings = home / "experiment.toml"
    # The file as it is, but for its name and the bound (top-level keys: before its first table).
    settings.write_text(re.sub(r"^name = .*$", f'name = "{name}"\nmax_staleness = {staleness}', config, count=1,
                               flags=re.MULTILINE))
    assert tomllib.loads(settings.read_text())["max_staleness"] == staleness
    environment = {**os.environ, "DAGSTER_HOME": str(home / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(home / "data"),
                   "CRUCIBLE_CHECKPOINT_ROOT": str(home / "checkpoints")}
    command = [str(ROOT / ".venv" / "bin" / "crucible"), "run", "--config", str(settings), "--iterations",
               str(iterations)]
    if pinned:
        environment["CRUCIBLE_TRAIN_LAUNCHER"] = f"taskset -c 0 {sys.executable}"
        command = ["taskset", "-c", "1", *command]
    console.print(f"[bold]{variant}[/bold]: {' '.join(command)}")
    started = time.perf_counter()
    with (home / "crucible-run.log").open("w") as log:
        done = subprocess.run(command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{variant}: crucible run failed ({done.returncode}); its output is in {home}/crucible-run.log")
    with DagsterInstance.from_config(str(home / "dagster")) as instance:
        runs = instance.get_run_records(RunsFilter(job_name="iteration", tags={"dagster/partition/experiment": name}))
    connection = catalog.connect(str(home / "data"))
    held_out = {row["iteration"]: row["pass_rate"] for row in metrics.curve(connection, "held_out", name)}
    stages = metrics.records(connection, "SELECT stage, sum(seconds) AS seconds FROM stages WHERE experiment = ? "
                                         "AND iteration > 0 GROUP BY stage", [name])
    sampled = metrics.records(connection, "SELECT iteration, any_value(staleness) AS staleness FROM trajectories "
                                          "WHERE experiment = ? GROUP BY iteration ORDER BY iteration", [name])
    return {"variant": variant, "command_s": time.perf_counter() - started,
            "iterations_s": max(r.end_time for r in runs) - min(r.start_time for r in runs),
            "held_out": [held_out.get(n) for n in range(iterations + 1)],
            "staleness": [row["staleness"] for row in sampled],
            "stages": {row["stage"]: row["seconds"] for row in stages}}


def projected_speed_up(stages: dict[str, float]) -> float:
    """Serial cost over overlapped cost, with the sampler's and the trainer's work on machines of their own."""
    sampler = sum(stages.get(stage, 0.0) for stage in SAMPLER_STAGES)
    trainer = sum(stages.get(stage, 0.0) for stage in TRAINER_STAGES)
    return (sampler + trainer) / max(sampler, trainer)


def show(results: list[dict], console: Console) -> None:
    baseline = {r["variant"]: r["iterations_s"] for r in results}
    table = Table(title="max_staleness 0 against 1 (the iterations' wall time; held-out pass rate after each)")
    for column in ("variant", "iterations s", "vs k0 (same pinning)", "held-out 0 → N", "staleness",
                   "sampling s", "grading s", "training s", "waiting for N-1 s", "evaluation s"):
        table.add_column(column, justify="left" if column in ("variant", "held-out 0 → N") else "right")
    for r in results:
        peer = baseline.get(r["variant"].replace("k1", "k0"))
        stages = r["stages"]
        table.add_row(r["variant"], f"{r['iterations_s']:.0f}", f"{peer / r['iterations_s']:.2f}x" if peer else "-",
                      " ".join("-" if p is None else f"{p:.3f}" for p in r["held_out"]),
                      ",".join(str(s) for s in r["staleness"]),
                      *(f"{stages.get(stage, 0.0):.0f}" for stage in ("rollouts", "verified_rollouts", "checkpoint",
                                                                       "parent_checkpoint", "checkpoint_eval")))
    console.print(table)
    for r in results:
        if r["variant"].startswith("k0"):
            console.print(f"{r['variant']}: sampler and trainer on machines of their own, overlapped: "
                          f"{projected_speed_up(r['stages']):.2f}x projected from its stage timings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "experiments" / "repair.toml"))
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--variants", default="k0,k1,k0-pinned,k1-pinned")
    parser.add_argument("--out", help="keep each variant's storage and instance here (default: a scratch folder)")
    args = parser.parse_args()
    config = Path(args.config).read_text()
    console = Console(width=180)  # a table of ten columns, kept whole in a log
    with tempfile.TemporaryDirectory(prefix="staleness-") as scratch:
        out = Path(args.out or scratch)
        results = [run_variant(config, variant, args.iterations, out, console) for variant in args.variants.split(",")]
    show(results, console)


if __name__ == "__main__":
    main()
