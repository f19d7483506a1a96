"""What every sandbox backend offers: run one command over a fresh workspace, with extra mounts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandbox.result import ExecResult
from sandbox.spec import SandboxSpec


@dataclass(frozen=True)
class Mount:
    """A host directory (or file) shown inside the sandbox at `sandbox_path`."""

    host_path: Path
    sandbox_path: str
    writable: bool = False


class Sandbox(Protocol):
    name: str
    spec: SandboxSpec
    scratch_dir: Path  # host directory for per-run directories (workspace, grading mounts)

    def run(
        self,
        command: list[str],
        files: Mapping[str, str | bytes],
        mounts: Sequence[Mount] = (),
    ) -> ExecResult: ...
