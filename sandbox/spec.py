"""SandboxSpec: everything that decides how a command is isolated, with a stable hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

ENVIRONMENT_ROOT = "/opt/crucible/env"  # where a built environment is seen inside the sandbox


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    pids: int = 64
    disk_mb: int = 64  # size of the workspace and /tmp together, and the largest file
    inodes: int = 16384  # files and directories the workspace and /tmp may hold
    output_bytes: int = 1 << 20  # stdout+stderr beyond this kills the command (status OL)
    excerpt_bytes: int = 16 << 10  # how much of each stream is kept in the result


@dataclass(frozen=True)
class SandboxSpec:
    """How to run: the interpreter image, limits, network and environment.

    `image` names the root filesystem; the local backend uses the host's read-only system
    directories and records "host" here (Docker images are referred to by digest). A task's
    built environment (environments/) is its own image on Docker, and on the local backend
    `overlay`: a host directory shown read-only at ENVIRONMENT_ROOT. An environment of another
    Python names that interpreter's prefix in `interpreter`: the local backend shows it at its
    own path, and the environment's Docker image holds it there.
    """

    image: str = "host"
    overlay: str = ""
    interpreter: str = ""  # the prefix of a host interpreter the environment runs (local: shown read-only at its path)
    workspace_alias: str = ""  # another path the workspace is seen at (a Harbor task's /app), a symlink
    limits: Limits = field(default_factory=Limits)
    network: bool = False
    env: tuple[tuple[str, str], ...] = (
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
        ("HOME", "/workspace"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
    )
    uid: int = 65534
    gid: int = 65534
    # Run even where memory and process limits cannot be enforced by a cgroup, or seccomp is
    # unavailable: limits fall back to rlimits and every result says so in `notes`. Off by
    # default: a backend refuses to start rather than run weaker than asked.
    allow_weak_isolation: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @cached_property  # every result records it; computing it costs more than an exec's overhead
    def hash(self) -> str:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]
