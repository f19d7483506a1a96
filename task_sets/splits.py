"""Train/eval splits that depend on task ids only: stable across runs, seeds and machines."""

from __future__ import annotations

import hashlib

from task_sets.schema import Split


def hash_splits(ids: list[str], eval_fraction: float) -> dict[str, Split]:
    """Eval gets the ids with the smallest hashes: deterministic, seed-independent, never empty."""
    eval_ids = hash_share(ids, eval_fraction)
    return {task_id: "eval" if task_id in eval_ids else "train" for task_id in ids}


def hash_share(ids: list[str], fraction: float, salt: str = "") -> set[str]:
    """The `fraction` of `ids` (at least one) with the smallest hashes of `salt` + id: a
    different salt draws a share independent of the eval split's."""
    count = max(1, round(len(ids) * fraction))
    return set(sorted(ids, key=lambda task_id: hashlib.sha256((salt + task_id).encode()).hexdigest())[:count])
