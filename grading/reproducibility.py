"""Are verdicts reproducible? Grade a sample of submissions a second time and compare.

A verdict is (reward status, reward). Grading is deterministic for a good task and a sound
sandbox, so every disagreement points at a flaky test, a submission that depends on time or
randomness, or a sandbox under too much pressure: the tasks involved are flagged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from grading.verdict import GradeResult


@dataclass(frozen=True)
class Agreement:
    sampled: int
    agreed: int
    disagreeing_task_ids: tuple[str, ...]

    @property
    def rate(self) -> float | None:
        return self.agreed / self.sampled if self.sampled else None


def regrade_sample(count: int, fraction: float, seed: int) -> list[int]:
    """Indices of the submissions to grade again: `fraction` of `count` (at least one when the
    fraction is positive), chosen by `seed`."""
    if count == 0 or fraction <= 0:
        return []
    size = min(count, max(1, round(count * fraction)))
    return sorted(random.Random(seed).sample(range(count), size))


def agreement(task_ids: Sequence[str], first: Sequence[GradeResult], second: Sequence[GradeResult]) -> Agreement:
    same = [(a.reward_status, a.reward) == (b.reward_status, b.reward) for a, b in zip(first, second, strict=True)]
    disagreeing = sorted({task_id for task_id, ok in zip(task_ids, same) if not ok})
    return Agreement(len(same), sum(same), tuple(disagreeing))
