"""Local files that appear whole or not at all."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def written_atomically(path: Path) -> Iterator[Path]:
    """A scratch path beside `path` for the block to write; renamed over `path` when the block
    succeeds, removed when it fails, so a reader never sees a half-written file."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
