"""Learning-rate schedules as a multiplier of the peak rate, by optimizer step.

Linear warm-up over `warmup_steps`, then constant, linear or cosine decay to `min_ratio` of the
peak at `total_steps`. SFT decays over its own steps; RL decays over the experiment's steps,
counted across iterations (each checkpoint's manifest records the global step it reached).
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def lr_factor(step: int, kind: Schedule, warmup_steps: int = 0, total_steps: int | None = None,
              min_ratio: float = 0.0) -> float:
    """The multiplier at 0-based optimizer step `step`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant" or total_steps is None:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown learning-rate schedule {kind!r}; choose constant, linear or cosine")
