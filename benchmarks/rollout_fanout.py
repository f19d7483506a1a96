"""An iteration's rollouts fanned out over Dagster's executor: one process against a process a shard.

    .venv/bin/python benchmarks/rollout_fanout.py [--task-set repair] [--tasks 128] [--samples 8]
                                                  [--turns 3] [--warmup-steps 300]

Sets up one experiment in a scratch folder as `make run` sets up its own (the repair set, its
warm-up, its first iteration's 128 tasks x 8 episodes of up to 3 turns), then materializes that
iteration's `rollouts` with `dagster asset materialize`, as an operator would, three ways:

  1 shard, in the run's process      what every run did before the fan-out (CRUCIBLE_STEP_PROCESSES=1)
  2 shards, one process              the same two shards one after the other, in the run's process
  2 shards, a process each           the multiprocess executor, a process per step, both shards at once
                                     (CRUCIBLE_STEP_PROCESSES=3: the planning step's process counts
                                     until it exits; the sampling pool given 2 slots)

The last two must give the same samples, token for token and log-prob for log-prob: a shard's
threads and engine are its own, whatever runs beside it. The first samples differently (one engine
on all the cores), so it is compared by time only. The benchmark changes the stored experiment's
`rollout_shards` between the runs, which `crucible run` would refuse: it is one setting of the
same iteration, measured.

Printed: wall time of the command (its start and code loading included) and of the stage (first
step to last, from the `stages` dataset), samples per second, and whether the samples agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dagster import DagsterInstance, materialize
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assets.io_manager import DatasetIOManager  # noqa: E402
from assets.iteration import task_set  # noqa: E402
from assets.partitions import add_iteration, experiments  # noqa: E402
from assets.pools import SAMPLING  # noqa: E402
from assets.policy import base_policy  # noqa: E402
from assets.training_step import TrainingStepClient  # noqa: E402
from commands.settings import load_settings  # noqa: E402
from datastore.store import DatasetStore  # noqa: E402
from pipelines.instance import prepare_instance  # noqa: E402
from pipelines.resources import crucible_resource  # noqa: E402
from training.experiment import BasePolicySettings, ExperimentConfig  # noqa: E402

console = Console()
NAME, KEY = "fanout", "fanout|0001"
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the set-up runs' step events


def materialize_rollouts(environment: dict[str, str], processes: int) -> float:
    """`dagster asset materialize` of the iteration's rollouts; its wall time."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "pipelines.definitions",
                           "--select", "rollouts", "--partition", KEY], cwd=ROOT, capture_output=True, text=True,
                          env={**environment, "CRUCIBLE_STEP_PROCESSES": str(processes)})
    if done.returncode != 0:
        sys.exit(f"dagster asset materialize failed:\n{done.stderr[-4000:]}")
    return time.perf_counter() - began


def stored(store: DatasetStore) -> tuple[float, list]:
    """The rollouts stage's seconds and the samples, less how long each part of them took."""
    [stage] = store.read_partition("stages", NAME, 1, part="rollouts").to_pylist()
    rows = sorted(store.read_partition("outputs", NAME, 1, part="rollouts").to_pylist(), key=lambda row: row["index"])
    return stage["seconds"], [untimed(json.loads(row["record"])) for row in rows]


def untimed(value: object) -> object:
    """A stored sample without its timings (`generate_s`, `exec_s`, …), which no two runs share."""
    if isinstance(value, dict):
        return {key: untimed(item) for key, item in value.items() if not key.endswith("_s")}
    if isinstance(value, list):
        return [untimed(item) for item in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-set", default="repair")
    parser.add_argument("--tasks", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=300)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fanout-"))
    environment = {**os.environ, "DAGSTER_HOME": str(scratch / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(scratch / "data"),
                   "CRUCIBLE_CHECKPOINT_ROOT": str(scratch / "checkpoints"), "HF_HUB_OFFLINE": "1"}
    os.environ.update(environment)
    prepare_instance()
    crucible = crucible_resource(load_settings())  # the variables above, and the task-set library's
    settings = ExperimentConfig(name=NAME, task_set=args.task_set, tasks_per_iteration=args.tasks,
                                samples_per_task=args.samples, max_turns=args.turns, temperature=0.6,
                                base=BasePolicySettings(sft_steps=args.warmup_steps, warmup_fraction=0.5))
    crucible.save_experiment(settings)
    with console.status(f"base policy ({args.warmup_steps} warm-up steps) and the iteration's tasks"), \
            DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(experiments.name, [NAME])
        resources = {"crucible": crucible, "training_step": TrainingStepClient(),
                     "io_manager": DatasetIOManager(storage_root=crucible.storage_root)}
        assert materialize([base_policy], partition_key=NAME, instance=instance, resources=resources,
                           run_config=QUIET).success
        assert materialize([base_policy, task_set], selection=[task_set], partition_key=add_iteration(instance, NAME, 1),
                           instance=instance, resources=resources, run_config=QUIET).success
        instance.event_log_storage.set_concurrency_slots(SAMPLING, 2)
    store, results = crucible.store(), []
    for label, shards, processes in (("1 shard, in the run's process", 1, 1), ("2 shards, one process", 2, 1),
                                     ("2 shards, a process each", 2, 3)):
        crucible.save_experiment(settings.model_copy(update={"rollout_shards": shards}))
        with console.status(label):
            wall = materialize_rollouts(environment, processes)
        stage, samples = stored(store)
        results.append((label, wall, stage, samples))
    table = Table(title=f"rollouts of one iteration: {args.tasks} {args.task_set} tasks x {args.samples}, "
                        f"up to {args.turns} turns, {len(os.sched_getaffinity(0))} cores")
    for column in ("configuration", "command s", "stage s", "samples/s", "samples"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for label, wall, stage, samples in results:
        same = "" if "1 shard" in label else ("= one process's" if samples == results[1][3] else "DIFFER")
        table.add_row(label, f"{wall:.1f}", f"{stage:.1f}", f"{len(samples) / stage:.1f}", same)
    console.print(table)


if __name__ == "__main__":
    main()
