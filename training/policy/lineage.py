"""What a checkpoint descends from: enough to say exactly how it was made.

A GRPO checkpoint's manifest carries `lineage`: the parent checkpoint (path and content hash),
the trajectory partitions it trained on and the checkpoints that sampled them (iteration and
content hash: the parent, or older ones within the experiment's max_staleness), the task set's version, the hash of the experiment's
settings and the version of the code that trained it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from functools import cache
from pathlib import Path

# The packages whose source decides what a training step does.
_SOURCE_PACKAGES = ("training", "grading", "task_sets", "sandbox", "statuses", "datastore")


def config_hash(settings: dict) -> str:
    """sha256 of the settings as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


@cache
def code_version() -> str:
    """`crucible <version>+src.<hash of the source that trains and grades>`: unlike a git commit
    it exists in an installed wheel too, and it changes whenever that code does."""
    root = Path(__file__).resolve().parents[2]  # the folder holding training/, sandbox/, …
    digest = hashlib.sha256()
    for package in _SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    try:
        version = importlib.metadata.version("crucible")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"crucible {version}+src.{digest.hexdigest()[:12]}"


def lineage(parent_dir: str | Path, parent_hash: str, trajectories: list[str], samplers: list[dict],
            task_set_version: str, settings: dict) -> dict:
    return {
        "parent": {"path": str(parent_dir), "content_hash": parent_hash},
        "trajectories": trajectories,
        "samplers": samplers,
        "task_set_version": task_set_version,
        "config_hash": config_hash(settings),
        "settings": settings,
        "code_version": code_version(),
    }
