"""Train/eval splits that depend on task ids only: stable across runs, seeds and machines."""

from __future__ import annotations

import hashlib

from task_sets.schema import Split


def hash_splits(ids: list[str], eval_fraction: float) -> dict[str, Split]:
    """Eval gets the ids with the smallest hashes: deterministic, seed-independent, never empty."""
    eval_count = max(1, round(len(ids) * eval_fraction))
    ranked = sorted(ids, key=lambda task_id: hashlib.sha256(task_id.encode()).hexdigest())
    eval_ids = set(ranked[:eval_count])
    return {task_id: "eval" if task_id in eval_ids else "train" for task_id in ids}
