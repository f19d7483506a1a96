"""A query's result as CSV, JSON lines or Parquet: on standard output, or as a file that appears
whole or not at all."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from datastore.atomic import written_atomically

FORMATS = ("csv", "json", "parquet")


def write_result(table: pa.Table, file_format: str, out: Path | None, stdout: BinaryIO) -> None:
    """`table` in `file_format` to `out`, or to `stdout` when `out` is None (not for Parquet)."""
    if file_format not in FORMATS:
        raise ValueError(f"unknown format {file_format!r}; choose one of {', '.join(FORMATS)}")
    if out is None:
        if file_format == "parquet":
            raise ValueError("parquet is binary: give --out FILE")
        stdout.write(_encode(table, file_format))
        return
    with written_atomically(out) as partial:
        if file_format == "parquet":
            pq.write_table(table, partial, compression="zstd")
        else:
            partial.write_bytes(_encode(table, file_format))


def _encode(table: pa.Table, file_format: str) -> bytes:
    if file_format == "csv":
        nested = [field.name for field in table.schema if pa.types.is_nested(field.type)]
        if nested:
            raise ValueError(f"CSV has no place for column {nested[0]!r} ({table.schema.field(nested[0]).type}): use "
                             "--format json or parquet, or flatten it in the query (array_to_string, unnest)")
        sink = io.BytesIO()
        pa_csv.write_csv(table, sink)
        return sink.getvalue()
    # JSON lines; values JSON has no type for (timestamps, decimals) are written as strings.
    return "".join(json.dumps(row, default=str) + "\n" for row in table.to_pylist()).encode()
