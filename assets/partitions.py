"""One dynamic partition per experiment iteration, keyed `<experiment>-<iteration:04d>`."""

from __future__ import annotations

import re

from dagster import DynamicPartitionsDefinition

iterations = DynamicPartitionsDefinition(name="iterations")

_KEY = re.compile(r"^(?P<experiment>[a-z0-9][a-z0-9_\-]*)-(?P<iteration>\d{4})$")


def iteration_key(experiment: str, iteration: int) -> str:
    return f"{experiment}-{iteration:04d}"


def parse_iteration_key(key: str) -> tuple[str, int]:
    match = _KEY.match(key)
    if not match:
        raise ValueError(
            f"partition key {key!r} is not '<experiment>-<iteration>' (for example 'default-0001')"
        )
    return match["experiment"], int(match["iteration"])
