"""Discounts a cart can apply to its subtotal."""

from __future__ import annotations

from dataclasses import dataclass

from shopcart.money import Money


@dataclass(frozen=True)
class FixedOff:
    """A fixed amount off, never more than the subtotal."""

    off: Money

    def amount(self, subtotal: Money) -> Money:
        return min(self.off, subtotal)
