"""Train/eval separation: no task of the evaluation split may be trained on, not even as a copy.

Exact duplicates are prompts equal after normalising case and whitespace; near-duplicates are
prompts whose character 5-gram sets overlap by at least `threshold` (Jaccard). Near-duplicates
across splits are expected where a set holds several instances of one template (the built-in
generator's families differ only in constants): the report says how close the splits are, an
exact duplicate is a leak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from task_sets.loader import TaskSet

NEAR_DUPLICATE_THRESHOLD = 0.9
_SHINGLE = 5


@dataclass(frozen=True)
class Separation:
    exact_duplicates: tuple[tuple[str, str], ...]  # (train id, eval id)
    near_duplicates: tuple[tuple[str, str, float], ...]  # (train id, eval id, similarity)

    @property
    def leaks(self) -> bool:
        return bool(self.exact_duplicates)


def separation(task_set: TaskSet, threshold: float = NEAR_DUPLICATE_THRESHOLD) -> Separation:
    train = [(t.id, _normal(t.prompt)) for t in task_set.train()]
    evaluation = [(t.id, _normal(t.prompt)) for t in task_set.eval()]
    shingles = {task_id: _shingles(text) for task_id, text in train + evaluation}
    exact, near = [], []
    for train_id, train_text in train:
        for eval_id, eval_text in evaluation:
            if train_text == eval_text:
                exact.append((train_id, eval_id))
                continue
            similarity = _jaccard(shingles[train_id], shingles[eval_id])
            if similarity >= threshold:
                near.append((train_id, eval_id, round(similarity, 3)))
    return Separation(tuple(exact), tuple(near))


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _shingles(text: str) -> frozenset[str]:
    return frozenset(text[i:i + _SHINGLE] for i in range(max(1, len(text) - _SHINGLE + 1)))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0
