"""ClosedSet: a status vocabulary as an enum whose every member carries its meaning.

Status names are data (stored in Parquet, written by `crucible verify`, matched in SQL), so each
set is closed: a value outside it is a bug, refused where a row is written (datastore/schema.py),
and each value is documented where it is defined, which docs/schema.md is generated from.
"""

from __future__ import annotations

import enum


class ClosedSet(str, enum.Enum):
    """Members are declared as `NAME = "value", "what it means"`."""

    def __new__(cls, value: str, meaning: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)
