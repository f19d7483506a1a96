"""What the trackers are shown of an experiment, read from the catalog's views (datastore/catalog.py),
grouped by the iteration they belong to:

- `train/<statistic>`: each optimizer step's row of `training_steps` (loss, clip_fraction,
  approx_kl, kl_to_reference, entropy, grad_norm, lr, tokens) on the optimizer-step axis, counted
  from the base policy across iterations as `checkpoints.global_step` counts it;
- `iteration/<column>`: each iteration's row of the run summary, `iterations` (rewards, pass
  rates, the held-out pass rate and its standard error, sampled tokens per sample, the training
  throughput, stage seconds…), on the iteration axis; iteration 0 is the base policy's held-out
  evaluation.

Every number is the view's; only the optimizer-step axis is defined here. A null, or a number a
chart cannot draw (±inf), is left out.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import duckdb

from datastore import metrics
from datastore.schema import TRAINING_STEPS

STEP_PREFIX, ITERATION_PREFIX = "train/", "iteration/"
STEP_STATISTICS = [name for name in TRAINING_STEPS.names if name != "step"]



@dataclass(frozen=True)
class Point:
    tag: str
    step: int
    value: float


@dataclass(frozen=True)
class IterationPoints:
    """An iteration's points: its optimizer steps' and its summary's."""

    iteration: int
    points: tuple[Point, ...]

    @property
    def fingerprint(self) -> str:
        """What the points are, in one hash: equal exactly when a tracker would be shown the same."""
        return hashlib.sha256(json.dumps([(p.tag, p.step, p.value) for p in self.points]).encode()).hexdigest()


def experiment_points(con: duckdb.DuckDBPyConnection, experiment: str) -> dict[int, IterationPoints]:
    """Every point the views hold of `experiment`, by iteration."""
    points: dict[int, list[Point]] = {}
    for row in metrics.optimizer_steps(con, experiment):
        points.setdefault(row["iteration"], []).extend(
            _drawable(STEP_PREFIX, row["global_step"], row, STEP_STATISTICS))
    for row in metrics.curve(con, "iterations", experiment):
        columns = [name for name in row if name not in ("experiment", "iteration")]
        points.setdefault(row["iteration"], []).extend(_drawable(ITERATION_PREFIX, row["iteration"], row, columns))
    return {iteration: IterationPoints(iteration, tuple(found)) for iteration, found in sorted(points.items()) if found}


def _drawable(prefix: str, step: int, row: dict, columns: list[str]) -> list[Point]:
    return [Point(prefix + name, int(step), float(row[name])) for name in columns
            if isinstance(row[name], (int, float)) and not isinstance(row[name], bool) and math.isfinite(row[name])]
