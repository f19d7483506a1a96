"""Atomic, hive-partitioned Parquet datasets on any fsspec filesystem (local directory or S3).

Layout under the storage root:

    <root>/<dataset>/experiment=<name>/iteration=<n>/<part>.parquet
    <root>/_staging/<dataset>/<uuid>.parquet        (never read; swept on the next write)

Each file is written by one writer (most datasets have a single part, `data`; `stages` has
one part per stage, written by the asset that ran it). It is written completely under `_staging/`, outside every reader's
glob, and then moved to its final name: a local rename and an S3 object write are both atomic,
so a reader sees the old partition or the new one, never a mix, and re-writing an iteration
replaces it instead of adding to it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from datastore.schema import DATASETS, SCHEMA_VERSION

STAGING = "_staging"
STALE_STAGING_S = 3600.0
ROW_GROUP_ROWS = 64_000


class SchemaError(ValueError):
    """Rows do not fit a dataset's schema; the message names the dataset and column."""


def rows_to_table(dataset: str, rows: Iterable[dict]) -> pa.Table:
    schema = DATASETS[dataset]
    rows = list(rows)
    for index, row in enumerate(rows):
        missing = set(schema.names) - row.keys()
        extra = row.keys() - set(schema.names)
        if missing or extra:
            raise SchemaError(
                f"{dataset} row {index}: missing columns {sorted(missing)}, unknown {sorted(extra)}"
            )
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise SchemaError(f"{dataset}: {error}") from None


class DatasetStore:
    def __init__(self, root_uri: str):
        self.uri = root_uri.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.uri)

    def partition_dir(self, dataset: str, experiment: str, iteration: int) -> str:
        return f"{self.root}/{dataset}/experiment={experiment}/iteration={iteration}"

    def partition_file(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> str:
        return f"{self.partition_dir(dataset, experiment, iteration)}/{part}.parquet"

    def uri_of(self, path: str) -> str:
        """Full URI of a path inside this store (what DuckDB and people are given)."""
        return self.fs.unstrip_protocol(path)

    def write_partition(
        self, dataset: str, experiment: str, iteration: int, table: pa.Table, part: str = "data"
    ) -> str:
        """Replace one partition (or one part of it) atomically; returns the final path."""
        expected = DATASETS[dataset]
        if not table.schema.equals(expected):
            raise SchemaError(f"{dataset}: table schema differs from schema v{SCHEMA_VERSION}")
        self._sweep_stale_staging(dataset)
        staging_dir = f"{self.root}/{STAGING}/{dataset}"
        staged = f"{staging_dir}/{uuid.uuid4().hex}.parquet"
        final = self.partition_file(dataset, experiment, iteration, part)
        self.fs.makedirs(staging_dir, exist_ok=True)
        self.fs.makedirs(self.partition_dir(dataset, experiment, iteration), exist_ok=True)
        pq.write_table(
            table.replace_schema_metadata({"crucible_schema_version": str(SCHEMA_VERSION)}),
            staged,
            filesystem=self.fs,
            compression="zstd",
            row_group_size=ROW_GROUP_ROWS,
        )
        self.fs.mv(staged, final)
        return final

    def read_partition(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> pa.Table:
        path = self.partition_file(dataset, experiment, iteration, part)
        return pq.read_table(path, filesystem=self.fs, schema=DATASETS[dataset])

    def has_partition(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> bool:
        return self.fs.exists(self.partition_file(dataset, experiment, iteration, part))

    def has_files(self, dataset: str) -> bool:
        return bool(self.fs.glob(f"{self.root}/{dataset}/experiment=*/iteration=*/*.parquet"))

    def _sweep_stale_staging(self, dataset: str) -> None:
        """Remove files left by writes that died half-way (older than any live write)."""
        staging_dir = f"{self.root}/{STAGING}/{dataset}"
        if not self.fs.exists(staging_dir):
            return
        now = time.time()
        for info in self.fs.ls(staging_dir, detail=True):
            modified = info.get("mtime") or info.get("LastModified")
            stamp = modified.timestamp() if hasattr(modified, "timestamp") else modified
            if stamp is not None and now - float(stamp) > STALE_STAGING_S:
                self.fs.rm(info["name"])
