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
    started_at = dt.datetime.now(dt.timezone.utc)
    start = time.perf_counter()
    yield
    row = {"stage": stage, "seconds": time.perf_counter() - start, "started_at": started_at}
    store.write_partition("stages", experiment, iteration, rows_to_table("stages", [row]), part=stage)
