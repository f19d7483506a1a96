"""A Dagster run under way for as long as a test needs one: a one-step asset of the iterations'
partitions that waits in its step until released."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import DagsterInstance, MultiPartitionKey, asset, materialize
from patience import PATIENCE_S

from assets.partitions import iterations


@contextmanager
def run_under_way(instance: DagsterInstance, asset_name: str, partition_key: MultiPartitionKey) -> Iterator[None]:
    """A run materializing `asset_name` for the partition, started and under way until the block ends
    (then it succeeds)."""
    started, release = threading.Event(), threading.Event()

    @asset(partitions_def=iterations, name=asset_name)
    def held() -> None:
        started.set()
        release.wait(timeout=PATIENCE_S)

    holder = threading.Thread(target=materialize, args=([held],),
                              kwargs={"instance": instance, "partition_key": partition_key})
    holder.start()
    try:
        assert started.wait(timeout=PATIENCE_S)
        yield
    finally:
        release.set()
        holder.join()
