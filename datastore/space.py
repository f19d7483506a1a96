"""Out-of-space failures told in one sentence: a size in binary units, what a local filesystem
has free, and whether an error is the device running out of space (pyarrow's included, which
carries the errno in its message only)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


def size_text(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def free_bytes(path: str | Path) -> int | None:
    """Free space of the filesystem holding `path` (or its nearest existing parent); None where
    it is not a local path."""
    if "://" in str(path):
        return None
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def out_of_space(error: BaseException) -> bool:
    """ENOSPC or EDQUOT, raised as such or told in the message (pyarrow's, safetensors' Rust
    "os error 28"): writers that wrap the system's error keep only its text."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(text in str(error) for text in ("No space left on device", "Disk quota exceeded", "os error 28"))
