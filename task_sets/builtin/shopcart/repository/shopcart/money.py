"""Amounts of money, held as whole cents so that sums are exact."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Money:
    cents: int

    @classmethod
    def parse(cls, text: str) -> Money:
        """'12.34' -> Money(1234); '7' -> Money(700); '0.5' -> Money(50)."""
        whole, _, fraction = text.strip().partition(".")
        if len(fraction) > 2:
            raise ValueError(f"more than two decimals: {text!r}")
        return cls(int(whole) * 100 + int((fraction + "00")[:2]))

    def __add__(self, other: Money) -> Money:
        return Money(self.cents + other.cents)

    def __sub__(self, other: Money) -> Money:
        return Money(self.cents - other.cents)

    def __mul__(self, times: int) -> Money:
        return Money(self.cents * times)

    def __str__(self) -> str:
        return f"{self.cents // 100}.{self.cents % 100:02d}"


ZERO = Money(0)
