"""Held-out pass rates with honest standard errors.

Tasks are the unit: a task's pass rate is the share of its samples that passed (0 or 1 when
evaluated greedily), the pass rate is the mean over tasks, and its standard error is the
spread of the task rates over sqrt(tasks), so that samples of one task never count as
independent evidence. Two checkpoints evaluated on the same tasks are compared pairwise: the
improvement's standard error comes from the per-task differences.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PassRate:
    rate: float
    stderr: float
    tasks: int


@dataclass(frozen=True)
class Improvement:
    delta: float  # new pass rate minus the baseline's
    stderr: float  # of the paired difference
    tasks: int

    @property
    def stderrs(self) -> float:
        """The improvement in standard errors (inf when every task moved by the same amount > 0)."""
        if self.stderr == 0:
            return 0.0 if self.delta == 0 else math.copysign(math.inf, self.delta)
        return self.delta / self.stderr


def per_task(results: Iterable[tuple[str, bool]]) -> dict[str, float]:
    """(task id, passed) pairs -> each task's pass rate."""
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for task_id, passed in results:
        outcomes[task_id].append(bool(passed))
    return {task_id: sum(values) / len(values) for task_id, values in outcomes.items()}


def _mean_and_stderr(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def pass_rate(results: Iterable[tuple[str, bool]]) -> PassRate:
    rates = list(per_task(results).values())
    if not rates:
        raise ValueError("no evaluation results")
    mean, stderr = _mean_and_stderr(rates)
    return PassRate(mean, stderr, len(rates))


def improvement(baseline: Iterable[tuple[str, bool]], new: Iterable[tuple[str, bool]]) -> Improvement:
    """Paired over the tasks both evaluations share."""
    before, after = per_task(baseline), per_task(new)
    shared = sorted(before.keys() & after.keys())
    if not shared:
        raise ValueError("the two evaluations share no task")
    delta, stderr = _mean_and_stderr([after[t] - before[t] for t in shared])
    return Improvement(delta, stderr, len(shared))
