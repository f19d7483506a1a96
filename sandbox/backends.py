"""Sandbox backends by name, as settings and the command line refer to them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.base import Sandbox
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:  # the docker SDK loads only for the docker backend
    from sandbox.docker_hosts import DockerHost

BACKENDS = ("local", "docker")


def open_sandbox(backend: str, spec: SandboxSpec = SandboxSpec(),  # noqa: B008 (frozen)
                 hosts: tuple[DockerHost, ...] = (), warm_workers: bool = False) -> Sandbox:
    """A sandbox of `backend` (`hosts`: the docker backend's daemons; none given, DOCKER_HOST's);
    SandboxUnavailable if this host cannot run it as `spec` asks. `warm_workers`: the local
    backend's `run` forks from zygotes kept until `close` (a pool's many runs)."""
    if backend == "local":
        from sandbox.local import LocalSandbox

        return LocalSandbox(spec, warm_workers=warm_workers)
    if backend == "docker":  # imported on demand: the docker SDK is needed only here
        from sandbox.docker import DockerSandbox

        return DockerSandbox(spec, hosts=hosts or None)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
