"""What the training process (assets/train_process.py) streams over Pipes for each optimizer step,
and how the asset that launched it reads that back: one definition for both ends, importable
without the training libraries the process loads."""

from __future__ import annotations

STEP_MESSAGE = "train_step"


def step_messages(custom_messages: list) -> list[dict]:
    """The step reports among a Pipes invocation's custom messages, in the order they came."""
    return [m for m in custom_messages if isinstance(m, dict) and m.get("kind") == STEP_MESSAGE]
