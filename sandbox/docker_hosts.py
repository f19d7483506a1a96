"""The Docker daemons the docker backend spreads its sessions over, each with its capacity: the
docker_hosts setting's value (commands/settings.py), without the Docker SDK.

One daemon, from Docker's own convention (DOCKER_HOST, or the local socket), unless the setting
lists several, with how many sessions each may hold at once:

    CRUCIBLE_DOCKER_HOSTS="unix:///var/run/docker.sock=16,tcp://10.0.0.7:2375=64"
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DockerHost:
    url: str  # a DOCKER_HOST URL: unix:///var/run/docker.sock, tcp://host:2375, ssh://user@host
    capacity: int | None = None  # sessions at once; None: as many as the sandbox pool admits


def parse_hosts(text: str) -> tuple[DockerHost, ...]:
    """CRUCIBLE_DOCKER_HOSTS: comma-separated `URL=CAPACITY` items; ValueError saying which item is wrong."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        url, sep, capacity = item.rpartition("=")
        if not sep or "://" not in url or not capacity.isdigit() or int(capacity) < 1:
            raise ValueError(f"CRUCIBLE_DOCKER_HOSTS: {item!r} is not URL=CAPACITY "
                             "(for example unix:///var/run/docker.sock=16; the capacity a whole number ≥ 1)")
        hosts.append(DockerHost(url, int(capacity)))
    if len({h.url for h in hosts}) != len(hosts):
        raise ValueError("CRUCIBLE_DOCKER_HOSTS: a daemon is listed twice")
    if not hosts:
        raise ValueError("CRUCIBLE_DOCKER_HOSTS is set but lists no daemon")
    return tuple(hosts)


def docker_host_default() -> tuple[DockerHost, ...]:
    """The daemon Docker's own convention names (DOCKER_HOST), when none are configured."""
    return (DockerHost(os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"),)

