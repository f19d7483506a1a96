"""Where built environments live: one directory per digest, complete or absent.

    <root> (the environments setting: CRUCIBLE_ENVIRONMENTS, default ./.crucible/environments)/
        <digest>/environment.json   what was built: the spec, when, what pip installed, the image
        <digest>/site-packages/     Python packages (pip --target, for the sandbox's python3)
        <digest>/venv/              or a virtual environment of the spec's Python (environments/virtualenv.py)
        <digest>/workspace/         files the repository's setup made, laid under every workspace
        <digest>/requirements.lock  what the virtual environment holds (pip freeze --all)
        <digest>/<files>            the spec's extra files
        <digest>.lock               held while one process builds it; others wait, then reuse it

The local backend shows `<digest>/` read-only at ENVIRONMENT_ROOT; the Docker image
`crucible-env:<digest>` holds the same tree at the same place.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from environments.spec import WORKSPACE_LAYER

RECORD = "environment.json"
IMAGE_REPOSITORY = "crucible-env"


def image_tag(digest: str) -> str:
    return f"{IMAGE_REPOSITORY}:{digest[:16]}"


@dataclass(frozen=True)
class Built:
    """One built environment, as its record says."""

    digest: str
    path: Path
    record: dict

    @property
    def interpreter_prefix(self) -> str:
        """The host interpreter a virtual environment runs ('' for the sandbox's python3)."""
        return self.record.get("interpreter", {}).get("prefix", "")

    def workspace_layer(self) -> dict[str, bytes]:
        """The files the repository's setup made (egg-info, version files, built extensions),
        by workspace path: every workspace of the task starts with them, under its own files."""
        return {name: (self.path / WORKSPACE_LAYER / name).read_bytes()
                for name in self.record.get("workspace_layer", ())}

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file() and not p.is_symlink())


class EnvironmentStore:
    """Built environments under `root` (the environments setting's folder), a folder each by digest."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        return self.root / digest

    def get(self, digest: str) -> Built | None:
        record = self.path(digest) / RECORD
        try:
            return Built(digest, self.path(digest), json.loads(record.read_text()))
        except (OSError, ValueError):
            return None

    def find(self, prefix: str) -> Built | None:
        """The built environment whose digest starts with `prefix` (None: none, or several)."""
        found = [built for built in self.all() if built.digest.startswith(prefix)]
        return found[0] if len(found) == 1 else None

    def all(self) -> list[Built]:
        if not self.root.is_dir():
            return []
        found = (self.get(path.name) for path in sorted(self.root.iterdir()) if path.is_dir() and len(path.name) == 64)
        return [built for built in found if built is not None]

    @contextmanager
    def building(self, digest: str) -> Iterator[Path]:
        """Hold `digest`'s lock and yield a fresh staging directory; the caller fills it and
        `publish`es it. Another process building the same digest waits here."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.lock(digest):
            for left in self.root.glob(f".staging-{digest}-*"):  # a build killed before it finished
                shutil.rmtree(left, ignore_errors=True)
            staging = self.root / f".staging-{digest}-{os.getpid()}"
            staging.mkdir()
            try:
                yield staging
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def publish(self, staging: Path, digest: str, record: dict) -> Built:
        """Write the record last, then rename: a directory with a record is a complete build."""
        (staging / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        for path in [staging, *staging.rglob("*")]:  # read-only to everyone, the sandbox user included
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        target = self.path(digest)
        done = self.get(digest)
        if done is not None:  # complete already, perhaps in use: keep it
            return done
        if target.exists():  # an unfinished build left without its record
            shutil.rmtree(target)
        staging.rename(target)
        return Built(digest, target, record)

    def remove(self, digest: str) -> None:
        """Remove a built environment, waiting for a build of it to finish (the lock file stays:
        a process waiting on it must keep the same lock)."""
        with self.lock(digest):
            shutil.rmtree(self.path(digest), ignore_errors=True)

    @contextmanager
    def lock(self, digest: str) -> Iterator[None]:
        """Held while `digest` is built, published or removed: one process at a time."""
        with open(self.root / f"{digest}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
