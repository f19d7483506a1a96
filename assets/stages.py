"""Wall-clock time of each stage, stored as data so the run summary and SQL can read it back."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import contextmanager

from datastore.store import DatasetStore, rows_to_table


@contextmanager
def timed_stage(store: DatasetStore, experiment: str, iteration: int, stage: str) -> Iterator[None]:
    """Time the body; on success record it as part `<stage>` of the `stages` partition."""
    started_at, start = dt.datetime.now(dt.timezone.utc), time.perf_counter()
    yield
    _write(store, experiment, iteration, stage, started_at, time.perf_counter() - start)


def record_stage(store: DatasetStore, experiment: str, iteration: int, stage: str, started_at: dt.datetime) -> None:
    """Record a stage that began at `started_at`, in another step (and process), and ends now."""
    _write(store, experiment, iteration, stage, started_at, (dt.datetime.now(dt.timezone.utc) - started_at).total_seconds())


def _write(store: DatasetStore, experiment: str, iteration: int, stage: str, started_at: dt.datetime,
           seconds: float) -> None:
    row = {"stage": stage, "seconds": seconds, "started_at": started_at}
    store.write_partition("stages", experiment, iteration, rows_to_table("stages", [row]), part=stage)
