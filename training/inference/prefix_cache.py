"""Prefix caching: the keys and values an earlier call computed, re-used by a prompt that extends it.

An episode's next turn is its last turn's context plus the reply and the observation, so almost
all of it was already computed by the model on the previous call; vLLM's automatic prefix caching
re-uses such prefixes on GPU, and TransformersEngine does it with this store. An entry is one
sequence's keys and values per layer, without padding, at positions 0..len-1, keyed by the token
ids they were computed from. The engine asks for the longest stored prefix of each prompt and
prefills only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class CachedPrefix:
    ids: tuple[int, ...]
    keys: tuple[Tensor, ...]  # per layer: [kv_heads, len(ids), head_dim]
    values: tuple[Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PrefixCache:
    """Cached prefixes up to `max_bytes` of keys and values; an entry past the budget is not kept
    (its sequence is prefilled in full if it comes back)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._by_length: dict[int, dict[tuple[int, ...], CachedPrefix]] = {}

    def fits(self, nbytes: int) -> bool:
        return self.nbytes + nbytes <= self.max_bytes

    def add(self, prefix: CachedPrefix) -> bool:
        """Keep `prefix` if it fits the budget; False if it does not."""
        size = prefix.nbytes
        if not self.fits(size):
            return False
        same_length = self._by_length.setdefault(len(prefix.ids), {})
        if prefix.ids not in same_length:
            same_length[prefix.ids] = prefix
            self.nbytes += size
        return True

    def longest_prefix(self, ids: Sequence[int]) -> CachedPrefix | None:
        """The longest cached prefix strictly shorter than `ids` (the last token is always fed:
        the next token's distribution is its output)."""
        for length in sorted(self._by_length, reverse=True):
            if length < len(ids) and (hit := self._by_length[length].get(tuple(ids[:length]))):
                return hit
        return None

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_length.values())
