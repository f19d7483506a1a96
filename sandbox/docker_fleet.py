"""The daemons of a docker backend at work: a session goes to the answering daemon with the most
free capacity that has the session's image; with every one full it waits. A daemon that stops
answering (an API error, then a ping that fails) is drained: no new session goes there, and the
sessions it held fail as infrastructure errors, which the sandbox pool retries on a fresh sandbox,
so on another daemon. A drained daemon is pinged again after `DRAIN_S` and takes sessions again
once it answers. DOCKER_TLS_VERIFY and DOCKER_CERT_PATH apply to every daemon.

Capacities count the sessions of this process: processes sharing daemons divide them among
themselves by their own settings (sandbox/docker_hosts.py lists them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from sandbox.docker_hosts import DockerHost

DRAIN_S = 30.0  # how long a daemon that stopped answering gets no sessions before it is pinged again
_PING_TIMEOUT_S = 5
_log = logging.getLogger(__name__)


class NoDaemon(RuntimeError):
    """No listed daemon answers and has what the session needs."""



@dataclass(eq=False)
class Daemon:
    host: DockerHost
    timeout_s: int
    live: int = 0  # sessions of this process on it now
    placed: int = 0  # sessions of this process it was given, in all
    pinged: bool = False  # answered once: a daemon is pinged before its first session
    _sees_our_files: bool | None = field(default=None, repr=False)
    _networks: dict[str, bool] = field(default_factory=dict, repr=False)
    drained_until: float = 0.0  # monotonic time before which it gets no session
    reason: str = ""  # why it was drained
    abandoned: list[str] = field(default_factory=list)  # containers it could not remove while it did not answer
    _client: docker.DockerClient | None = field(default=None, repr=False)
    _images: dict[str, str | None] = field(default_factory=dict, repr=False)  # tag -> image id on this daemon

    @property
    def url(self) -> str:
        return self.host.url

    @property
    def client(self) -> docker.DockerClient:
        client = self._client  # read once: a drain may reset it meanwhile
        if client is None:
            client = self._client = _connect(self.url, self.timeout_s)
        return client

    def sees_our_files(self) -> bool:
        """Whether its containers can bind-mount this process's files (grading's test files and
        report): its socket is a unix one and its data root is in this process's filesystem. A
        daemon elsewhere, or this host's seen from inside a container through a mounted socket
        (a run's container), gets copies instead."""
        if self._sees_our_files is None:
            self._sees_our_files = self.url.startswith("unix://") and Path(self.client.info()["DockerRootDir"]).is_dir()
        return self._sees_our_files

    def answers(self) -> bool:
        try:
            with contextlib.closing(_connect(self.url, _PING_TIMEOUT_S)) as probe:
                probe.ping()
        except (docker.errors.DockerException, OSError):
            return False
        return True

    def image_id(self, image: str, *, fixed: bool = False) -> str | None:
        """The id of `image` on this daemon; None where it has no such image. `fixed`: the name
        always means the same image (an id, a content-addressed tag), so the answer is kept;
        other tags are looked up each time, as a rebuild moves them."""
        images = self._images  # read once: a drain may replace it meanwhile
        if fixed and image in images:
            return images[image]
        try:
            found = self.client.images.get(image).id
        except docker.errors.ImageNotFound:
            found = None
        if fixed:
            images[image] = found
        return found

    def remove_abandoned(self) -> None:
        while self.abandoned:
            with contextlib.suppress(docker.errors.DockerException, OSError):
                self.client.api.remove_container(self.abandoned.pop(), force=True, v=True)

    def has_network(self, name: str) -> bool:
        """Whether the daemon has network `name`; asked once (a session placement asks each time)."""
        networks = self._networks  # read once: a drain may replace it meanwhile
        if name not in networks:
            networks[name] = bool(self.client.networks.list(names=[name]))
        return networks[name]

    def forget_images(self) -> None:
        """Look every image up again (one was built or removed meanwhile)."""
        self._images = {}

    def has_room(self) -> bool:
        return self.host.capacity is None or self.live < self.host.capacity


class Fleet:
    """The listed daemons of this process; sessions acquire a daemon and release it on close."""

    def __init__(self, hosts: tuple[DockerHost, ...], timeout_s: int):
        self.daemons = [Daemon(host, timeout_s) for host in hosts]
        self._changed = threading.Condition()

    def answering(self) -> list[Daemon]:
        """The daemons not drained, pinging again those whose drain has run out."""
        with self._changed:
            now, found = time.monotonic(), []
            for daemon in self.daemons:
                if daemon.drained_until > now:
                    continue
                if (daemon.drained_until or not daemon.pinged) and not daemon.answers():
                    self._drain(daemon, daemon.reason or "it does not answer a ping")
                    continue
                daemon.pinged = True
                if daemon.drained_until:
                    _log.warning(f"Docker daemon {daemon.url} answers again; it takes sessions again")
                    daemon.drained_until, daemon.reason = 0.0, ""
                    daemon.remove_abandoned()
                found.append(daemon)
            return found

    def acquire(self, usable: Callable[[Daemon], bool], timeout_s: float) -> Daemon:
        """The usable answering daemon with the most free capacity, waiting up to `timeout_s`
        while all of them are full; NoDaemon when none is usable."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                candidates = [d for d in self.answering() if usable(d)]
                if not candidates:
                    raise NoDaemon(self._none_usable())
                free = [d for d in candidates if d.has_room()]
                if free:
                    chosen = max(free, key=_free_share)
                    chosen.live += 1
                    chosen.placed += 1
                    return chosen
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NoDaemon(f"every daemon is at its capacity ({_capacities(candidates)}) after {timeout_s:.0f} s")
                self._changed.wait(min(remaining, DRAIN_S))

    def release(self, daemon: Daemon) -> None:
        with self._changed:
            daemon.live -= 1
            self._changed.notify_all()  # the waiters may want different images

    def check(self, daemon: Daemon, error: BaseException) -> None:
        """After `error` from `daemon`'s API: drain it if it no longer answers a ping, unless it
        is the last one undrained (then sessions fail as they come, and the pool retries them,
        rather than all of them failing for DRAIN_S)."""
        if daemon.answers():
            return
        with self._changed:
            others = [d for d in self.daemons if d is not daemon and d.drained_until <= time.monotonic()]
            if others:
                self._drain(daemon, f"{type(error).__name__}: {error}"[:300])
                self._changed.notify_all()

    def _drain(self, daemon: Daemon, reason: str) -> None:
        if daemon.drained_until <= time.monotonic():
            _log.warning(f"Docker daemon {daemon.url} does not answer ({reason}); no new sessions go there "
                         f"for {DRAIN_S:.0f} s")
        daemon.drained_until, daemon.reason = time.monotonic() + DRAIN_S, reason
        daemon._client, daemon._images, daemon._networks = None, {}, {}

    def _none_usable(self) -> str:
        drained = [f"{d.url} ({d.reason})" for d in self.daemons if d.drained_until > time.monotonic()]
        told = f"; drained: {', '.join(drained)}" if drained else ""
        return f"no Docker daemon of {', '.join(d.url for d in self.daemons)} answers and has the image{told}"


def _free_share(daemon: Daemon) -> float:
    capacity = daemon.host.capacity
    return 1.0 if capacity is None else (capacity - daemon.live) / capacity


def _capacities(daemons: list[Daemon]) -> str:
    return ", ".join(f"{d.url}: {d.live}/{d.host.capacity}" for d in daemons)


def _connect(url: str, timeout_s: int) -> docker.DockerClient:
    # from_env with DOCKER_HOST replaced: the TLS settings of the environment apply to every daemon.
    return docker.from_env(environment={**os.environ, "DOCKER_HOST": url}, timeout=timeout_s)


_fleets: dict[tuple[DockerHost, ...], Fleet] = {}
_fleets_lock = threading.Lock()


def fleet(hosts: tuple[DockerHost, ...], timeout_s: int) -> Fleet:
    """This process's fleet of `hosts`: one per list, so that every sandbox counts the same sessions."""
    with _fleets_lock:
        if hosts not in _fleets:
            _fleets[hosts] = Fleet(hosts, timeout_s)
        return _fleets[hosts]
