"""Dynamic sampling (DAPO): keep sampling fresh prompts while too few groups carry signal.

A group whose samples all earned the same reward has zero advantage everywhere; the trainer
drops it (GRPOConfig.zero_variance_groups). When that leaves fewer informative groups than the
iteration asked for, further train tasks are sampled and graded, up to `max_rounds` more rounds,
each sized by the share of informative groups seen so far and never larger than the first batch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Task = TypeVar("Task")
Graded = TypeVar("Graded")


def informative_groups(rewards: Iterable[tuple[str, float]]) -> set[str]:
    """The group ids, among (group id, reward) pairs, whose rewards are not all equal."""
    by_group: dict[str, set[float]] = defaultdict(set)
    for group, reward in rewards:
        by_group[group].add(reward)
    return {group for group, values in by_group.items() if len(values) > 1}


def refill_size(informative: int, groups: int, target: int, available: int) -> int:
    """Tasks to sample next to reach `target` informative groups at the rate seen so far."""
    missing = target - informative
    if missing <= 0 or available <= 0 or groups <= 0:
        return 0
    rate = max(informative, 1) / groups  # none seen yet: assume one in this many
    return min(available, target, math.ceil(missing / rate))


@dataclass
class Refilled(Generic[Graded]):
    graded: list[Graded]  # every graded sample, the dropped groups' included (they are data too)
    informative: int  # groups with a reward spread
    groups: int  # groups sampled in all
    rounds: int  # extra rounds taken


def refill(
    graded: list[Graded],
    reserve: Sequence[Task],
    sample_and_grade: Callable[[list[Task], int], list[Graded]],
    reward_of: Callable[[Graded], tuple[str, float] | None],
    target: int,
    max_rounds: int,
) -> Refilled[Graded]:
    """Extend `graded` with rounds of `sample_and_grade(tasks, round)` on tasks from `reserve`.
    `reward_of` gives an item's (group id, reward), or None for one without a reward (an
    infrastructure error), which the trainer will not see either."""
    graded, reserve = list(graded), list(reserve)

    def pairs() -> list[tuple[str, float]]:
        return [pair for item in graded if (pair := reward_of(item)) is not None]

    rounds = 0
    while rounds < max_rounds:
        scored = pairs()
        size = refill_size(len(informative_groups(scored)), len({g for g, _ in scored}), target, len(reserve))
        if size == 0:
            break
        rounds += 1
        batch, reserve = reserve[:size], reserve[size:]
        graded += sample_and_grade(batch, rounds)
    scored = pairs()
    return Refilled(graded, len(informative_groups(scored)), len({g for g, _ in scored}), rounds)
