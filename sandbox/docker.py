"""DockerSandbox: each session is one long-lived, locked-down container; each exec a docker exec.

The container (see `_container_options`): the sandbox image by digest, no network, read-only
root, size-capped tmpfs for /workspace and /tmp, every capability dropped, no-new-privileges,
the seccomp deny-list of sandbox/seccomp.py, uid 65534, memory (no swap), pids and cpu limits,
capped logs, and labels naming the owner process so that `reap` can remove orphans.

Every command runs through a small shell that lowers rlimits and writes one "ready" byte to
stderr before it execs the command: a run without it failed in our machinery (XX). When the
command ends, anything it left running is killed (`kill -9 -1` as the sandbox user spares only
the container's init, which its pid namespace protects), so nothing outlives an exec, as in
the local backend. Files move in and out as tar streams through exec, never through the
container's filesystem API, which cannot see tmpfs mounts.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import selectors
import shlex
import signal
import socket
import struct
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path, PurePosixPath

import docker
import docker.errors
from docker.types import LogConfig
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from sandbox import seccomp
from sandbox.base import (
    NO_TREES,
    WORKSPACE,
    Mount,
    SandboxUnavailable,
    SessionLifecycle,
    Trees,
    WorkspacePathError,
    process_alive,
    reap_once,
    run_once,
)
from sandbox.capture import OutputCapture
from sandbox.docker_fleet import Daemon, NoDaemon, fleet
from sandbox.docker_hosts import DockerHost, docker_host_default
from sandbox.result import ExecResult
from sandbox.spec import SandboxSpec
from sandbox.workspace import files_to_tar, regular_files_from_tar, regular_files_in_tar, safe_relative
from statuses import ExecStatus

DEFAULT_IMAGE = "crucible-sandbox:bookworm-2"  # built by scripts/build-sandbox-image
LABEL = "crucible.sandbox"
OWNER_LABEL = "crucible.owner"  # "<hostname>:<pid>" of the process that opened the session
NOFILE = 1024
_READY = b"\x00crucible-ready\x00"
# Docker adds HOSTNAME to every process's environment; the spec's allowlist is all there is.
_PREAMBLE = "{ulimits} && unset HOSTNAME PWD OLDPWD && printf '\\000crucible-ready\\000' >&2"
# A docker exec lasts until every holder of its output is gone, so a daemon the command left
# could keep acting "during" the run. The envelope waits for the command alone, then kills
# every other process of the sandbox user (init is spared: its pid namespace protects it).
# (`env --default-signal`: sh starts background jobs with SIGINT and SIGQUIT ignored.)
_ENVELOPE = _PREAMBLE + ' && {{ env --default-signal=INT,QUIT "$@" & wait $!; }}; rc=$?; kill -9 -1 2>/dev/null; exit $rc'
_HELPER = _PREAMBLE + ' && exec "$@"'  # our own tar/find, which read stdin
# Refuses put/get paths that a symlink the command planted would lead out of the workspace.
_PATH_GUARD = (
    f"cd {WORKSPACE} && for p; do case \"$(realpath -m -- \"$p\")\" in {WORKSPACE}/*) ;;"
    " *) echo \"$p: leads out of the workspace\" >&2; exit 3;; esac;"
    " if [ -L \"$p\" ]; then echo \"$p: is a symlink\" >&2; exit 3; fi; done; "
)
_STREAMS = {1: "stdout", 2: "stderr"}
_READ_CHUNK = 1 << 16
_API_TIMEOUT_S = 60
_PLACEMENT_TIMEOUT_S = 600  # how long a session waits while every daemon is at its capacity


class DockerSandbox:
    name = "docker"

    def __init__(
        self,
        spec: SandboxSpec = SandboxSpec(),  # noqa: B008 (frozen: sharing the default is safe)
        *,
        scratch_dir: Path | None = None,
        labels: Mapping[str, str] | None = None,
        hosts: tuple[DockerHost, ...] | None = None,
    ):
        """`spec.image` is a tag or digest; "host" (the local backend's default) means
        DEFAULT_IMAGE. The spec is recorded with the image's digest, so results name exactly
        what they ran in; a daemon whose image differs gets none of this sandbox's sessions.
        `labels` are added to every container (tests use them to find theirs). `hosts`: the
        daemons sessions are spread over (default: the one DOCKER_HOST names).

        Raises SandboxUnavailable when no daemon answers or none has the image."""
        try:
            self.fleet = fleet(hosts or docker_host_default(), _API_TIMEOUT_S)
        except ValueError as e:
            raise SandboxUnavailable(str(e)) from None
        answering = self.fleet.answering()
        if not answering:
            raise SandboxUnavailable(f"no Docker daemon answers ({', '.join(d.url for d in self.fleet.daemons)}); "
                                     "start it with scripts/docker-daemon")
        for daemon in answering:
            reap_once(f"docker:{daemon.url}", partial(self._reap, daemon))
        image = DEFAULT_IMAGE if spec.image == "host" else spec.image
        digest = next(filter(None, (self._image_on(daemon, image) for daemon in answering)), None)
        if digest is None:
            hint = "crucible env build" if image.startswith("crucible-env:") else "scripts/build-sandbox-image"
            raise SandboxUnavailable(f"no image {image!r}; build it with {hint}")
        self.spec = replace(spec, image=digest)
        self.scratch_dir = Path(scratch_dir or "/tmp")
        self.labels = {LABEL: "1", OWNER_LABEL: _owner(), **(labels or {})}
        if spec.network and not any(map(_has_bridge, answering)):
            raise SandboxUnavailable(
                "the spec asks for network, but the Docker daemons have no bridge network "
                "(scripts/docker-daemon starts it with --bridge=none, which keeps the host firewall as it is)"
            )

    def usable(self, daemon: Daemon) -> bool:
        """Whether `daemon` can hold this sandbox's sessions: the same image, a network if asked."""
        if self._image_on(daemon, self.spec.image, fixed=True) != self.spec.image:
            return False
        try:
            return not self.spec.network or _has_bridge(daemon)
        except (docker.errors.DockerException, OSError) as e:
            self.fleet.check(daemon, e)
            return False

    def run_image(self, daemon: Daemon) -> str:
        """The image a session runs on `daemon`: the spec's, with the workspace alias added if asked."""
        alias = self.spec.workspace_alias
        return _with_alias(daemon, self.spec.image, alias) if alias else self.spec.image

    def _image_on(self, daemon: Daemon, image: str, fixed: bool = False) -> str | None:
        try:
            return daemon.image_id(image, fixed=fixed)
        except (docker.errors.DockerException, OSError) as e:
            self.fleet.check(daemon, e)
            return None

    def session(self, files: Mapping[str, str | bytes] = {}, mounts: Sequence[Mount] = ()) -> DockerSession:  # noqa: B006
        return DockerSession(self, files, mounts)

    def run(self, command: list[str], files: Mapping[str, str | bytes], mounts: Sequence[Mount] = (),
            protected: Sequence[str] = (), trees: Trees = NO_TREES) -> ExecResult:
        return run_once(self, command, files, mounts, protected, trees=trees)

    def containers(self, **labels: str) -> list:
        """Containers of any Crucible sandbox on the answering daemons, narrowed by `labels`."""
        return [container for daemon in self.fleet.answering() for container in _containers(daemon, labels)]

    def reap(self) -> list[str]:
        """Remove containers whose owner process on this host is gone; returns their names."""
        return [name for daemon in self.fleet.answering() for name in self._reap(daemon)]

    @staticmethod
    def _reap(daemon: Daemon) -> list[str]:
        removed = []
        for container in _containers(daemon, {}):
            host, _, pid = container.labels.get(OWNER_LABEL, ":").partition(":")
            if host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
                with contextlib.suppress(docker.errors.APIError):  # another process removes it (409)
                    _remove(container)
                    removed.append(container.name)
        return removed


def _containers(daemon: Daemon, labels: Mapping[str, str]) -> list:
    wanted = [LABEL] + [f"{k}={v}" for k, v in labels.items()]
    return daemon.client.containers.list(all=True, filters={"label": wanted})


def _has_bridge(daemon: Daemon) -> bool:
    return daemon.has_network("bridge")


def _with_alias(daemon: Daemon, digest: str, alias: str) -> str:
    """`digest` with a symlink from `alias` to the workspace, on `daemon`: a layer built once
    per daemon, no network."""
    recipe = 2  # counts changes to the layer below
    tag = f"crucible-alias:{hashlib.sha256(f'{digest} {alias} {recipe}'.encode()).hexdigest()[:16]}"
    found = daemon.image_id(tag, fixed=True)
    if found:
        return found
    # The image's own directory there (a Harbor image's WORKDIR /app) gives way to the workspace.
    dockerfile = f"FROM {digest}\nRUN rm -rf {shlex.quote(alias)} && mkdir -p " \
                 f"{shlex.quote(str(PurePosixPath(alias).parent))} && ln -s {WORKSPACE} {shlex.quote(alias)}\n"
    try:
        image, _ = daemon.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="none",
                                              rm=True, labels={"crucible.workspace-alias": alias})
    except docker.errors.DockerException as e:
        raise SandboxUnavailable(f"cannot add the workspace alias {alias} to the image on {daemon.url}: {e}") from e
    daemon.forget_images()
    return image.id


@dataclass
class _Run:
    """What one exec did, before it becomes an ExecResult."""

    exit_code: int | None = None
    ready: bool = False
    killed_for: ExecStatus | None = None
    oom_killed: bool = False
    cpu_s: float = 0.0  # the container's CPU time during the run (includes the envelope)
    peak_memory_bytes: int | None = None


class DockerSession(SessionLifecycle):
    """One container serving many execs."""

    _backend_name = "docker"
    _infra_errors = (docker.errors.DockerException, OSError)

    def __init__(self, backend: DockerSandbox, files: Mapping[str, str | bytes], mounts: Sequence[Mount]):
        self.id = secrets.token_hex(8)
        self.spec = backend.spec
        self.log: list[ExecResult] = []
        self._backend, self._closed, self._daemon = backend, False, None
        self._initial = files_to_tar(files, self.spec.uid, self.spec.gid)
        try:
            self._daemon = backend.fleet.acquire(backend.usable, _PLACEMENT_TIMEOUT_S)
        except NoDaemon as e:
            raise SandboxUnavailable(f"cannot open a docker session: {e}") from None
        self._copied: tuple[Mount, ...] = ()
        try:
            # A daemon that cannot see this process's files gets them copied in, and what the
            # sandbox writes to a writable one is copied back after every exec.
            self._copied = () if self._daemon.sees_our_files() else tuple(mounts)
            self._api = self._daemon.client.api
            # create, not run: run pulls an image it cannot find, and sandbox images come from no registry
            self._container = self._daemon.client.containers.create(
                backend.run_image(self._daemon), ["sleep", "infinity"], name=f"crucible-{self.id}",
                **_container_options(self.spec, () if self._copied else mounts, backend.labels, self._copied),
            )
            self._container.start()
            self._user = f"{self.spec.uid}:{self.spec.gid}"
            self._container.reload()
            self._init_pid = self._container.attrs["State"]["Pid"]
            # Read on this host where the daemon is local (cgroup v1): leftovers are then
            # killed and OOM kills counted without a round trip through the daemon.
            cgroup_file = partial(_cgroup_file, self._init_pid, self._container.id)
            self._procs_file = cgroup_file("pids", "cgroup.procs")
            self._oom_file = cgroup_file("memory", "memory.oom_control")
            self._peak_file = cgroup_file("memory", "memory.max_usage_in_bytes")
            self._cpu_file = cgroup_file("cpuacct", "cpuacct.usage")
            for mount in self._copied:  # a read-only copy is root's: the sandbox user cannot change it
                self._call(["tar", "-x", "--no-same-owner", "-C", mount.sandbox_path, "-f", "-"],
                           stdin=_directory_tar(mount.host_path), user=None if mount.writable else "0:0")
            self._restore(self._initial)
        except BaseException as e:  # bad input files included: nothing may be left behind
            if isinstance(e, docker.errors.ImageNotFound):  # removed since it was looked up
                self._daemon.forget_images()
            self._daemon_failed(e)
            self._abandon(e)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        container = getattr(self, "_container", None)
        try:
            if container is not None:
                _remove(container)
        except (docker.errors.DockerException, OSError):  # the daemon is gone: removed when it answers again
            self._daemon.abandoned.append(container.id)
        finally:
            if self._daemon is not None:
                self._backend.fleet.release(self._daemon)

    def _daemon_failed(self, error: BaseException) -> None:
        """After an error of ours: drain the session's daemon if it no longer answers."""
        if self._daemon is not None and isinstance(error, self._infra_errors):
            self._backend.fleet.check(self._daemon, error)

    def reset(self, files: Mapping[str, str | bytes] | None = None) -> None:
        """See Session.reset."""
        self._check_open()
        if files is not None:
            self._initial = files_to_tar(files, self.spec.uid, self.spec.gid)
        try:
            # SysV IPC objects live in the container's IPC namespace (an image without ipcrm keeps them).
            self._call(["sh", "-c", "find /tmp /dev/shm -mindepth 1 -delete && "
                                    "if command -v ipcrm >/dev/null; then ipcrm --all; fi"])
            self._restore(self._initial)
        except self._infra_errors as e:  # the container or the daemon is gone
            self._daemon_failed(e)
            raise SandboxUnavailable(f"session {self.id} cannot be reset: {e}") from e

    # -- files -------------------------------------------------------------------------------

    def put_files(self, files: Mapping[str, str | bytes]) -> None:
        self._check_open()
        archive = files_to_tar(files, self.spec.uid, self.spec.gid)
        script = _PATH_GUARD + "exec tar -x -m --no-same-owner -f -"
        self._call(["sh", "-c", script, "sh", *files], stdin=archive)

    def get_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        self._check_open()
        names = [str(safe_relative(p)) for p in paths]
        # --no-recursion: a directory yields no member and is reported as not a regular file.
        script = _PATH_GUARD + 'exec tar -c --no-recursion -f - -- "$@"'
        archive = self._call(["sh", "-c", script, "sh", *names])
        return regular_files_from_tar(archive, names)

    def protect(self, paths: Sequence[str]) -> None:
        """Weaker than Session.protect asks: the files become read-only but stay the sandbox
        user's, who could make them writable again. Sealing needs root with CAP_CHOWN, which
        an exec never holds under no-new-privileges. Grading checks protected files from inside
        the test run as well (harness/pytest_session.py), which is what stands on Docker."""
        self._check_open()
        names = [str(safe_relative(p)) for p in paths]
        self._call(["sh", "-c", _PATH_GUARD + 'exec chmod a-w -- "$@"', "sh", *names])

    def snapshot(self) -> bytes:
        self._check_open()
        return self._call(["tar", "-c", "-C", WORKSPACE, "-f", "-", "."])

    def restore(self, snapshot: bytes) -> None:
        self._check_open()
        self._restore(snapshot)

    def _restore(self, archive: bytes) -> None:
        script = f"find {WORKSPACE} -mindepth 1 -delete && tar -x -m --no-same-owner -C {WORKSPACE} -f -"
        self._call(["sh", "-c", script], stdin=archive)

    # -- execution ---------------------------------------------------------------------------

    def _run(self, command, stdout, stderr, deadline, on_output, started) -> ExecResult:
        oom_before, cpu_before = self._oom_kills(), _read_int(self._cpu_file)
        _write_zero(self._peak_file)  # a fresh peak for this run
        try:
            run = self._exec(command, stdout, stderr, deadline, on_output)
            self._kill_leftovers()
            self._copy_back()
        except self._infra_errors as e:  # reported as XX by exec; the pool retries it elsewhere
            self._daemon_failed(e)
            raise
        run.oom_killed = self._oom_kills() > oom_before
        run.cpu_s = ((_read_int(self._cpu_file) or 0) - (cpu_before or 0)) / 1e9 if cpu_before else 0.0
        run.peak_memory_bytes = _read_int(self._peak_file)
        return self._result(run, stdout, stderr, time.monotonic() - started)

    def _copy_back(self) -> None:
        """Each copied writable mount's host directory made the mirror of its regular files in
        the container: what the sandbox wrote appears, what it deleted goes. What the sandbox
        made unreadable, or too large to copy, is missing, as a failing grade says, never an
        infrastructure error (that would be a way out of a failing grade)."""
        for mount in (m for m in self._copied if m.writable):
            try:
                archive = self._call(["tar", "-c", "--ignore-failed-read", "-C", mount.sandbox_path, "-f", "-", "."])
                files = regular_files_in_tar(archive)
            except (WorkspacePathError, tarfile.TarError):
                files = {}
            _mirror(mount.host_path, files)

    def _exec(self, command, stdout, stderr, deadline, on_output, stdin: bytes | None = None, helper=False,
              output_limit: int | None = None, user: str | None = None) -> _Run:
        envelope = (_HELPER if stdin is not None or helper else _ENVELOPE).format(ulimits=_ulimits(self.spec))
        exec_id = self._api.exec_create(
            self._container.id, ["sh", "-c", envelope, "sh", *command], user=user or self._user,
            workdir=WORKSPACE, stdin=stdin is not None,
        )["Id"]
        sock = self._api.exec_start(exec_id, socket=True)
        raw = sock._sock  # the SDK's socket wrapper hides the fd that select needs
        run = _Run()
        try:
            if stdin is not None:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            self._pump(raw, stdout, stderr, run, deadline, on_output, output_limit or self.spec.limits.output_bytes)
        finally:
            sock.close()
        if run.killed_for is not None:
            self._kill_leftovers()
        run.exit_code = self._wait_exit_code(exec_id)
        return run

    def _pump(self, raw: socket.socket, stdout, stderr, run: _Run, deadline: float, on_output, output_limit: int) -> None:
        """Demultiplex Docker's framed stream (8-byte header: stream, 0, 0, 0, size) until EOF,
        the deadline or the output cap."""
        captures = {"stdout": stdout, "stderr": stderr}
        frames = _FrameReader()
        with selectors.DefaultSelector() as sel:
            sel.register(raw, selectors.EVENT_READ)
            while run.killed_for is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    run.killed_for = ExecStatus.TO
                    break
                if not sel.select(remaining):
                    continue
                chunk = raw.recv(_READ_CHUNK)
                if not chunk:
                    return
                for stream, data in frames.feed(chunk):
                    if stream == "stderr" and not run.ready:
                        data = self._strip_ready(frames, data, run)
                    if data:
                        captures[stream].add(data)
                        if on_output is not None:
                            on_output(stream, data)
                # Docker reads stdout and stderr from separate pipes: a flood on stdout can arrive
                # before the ready marker on stderr, and stopping then would report our machinery
                # as failed (XX). Any stdout means the marker was written; read on until it is seen.
                if stdout.total + stderr.total > output_limit and run.ready:
                    run.killed_for = ExecStatus.OL

    @staticmethod
    def _strip_ready(frames: _FrameReader, data: bytes, run: _Run) -> bytes:
        """The ready marker is the first thing on stderr; it may arrive split across frames."""
        frames.marker += data
        if len(frames.marker) < len(_READY) and _READY.startswith(frames.marker):
            return b""
        if frames.marker.startswith(_READY):
            run.ready = True
            return frames.marker[len(_READY):]
        run.ready = False  # stderr without the marker: our shell never ran
        return frames.marker

    def _wait_exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code; None if the daemon still reports it running after 10 s (then
        the run is XX: we cannot tell what the command did)."""
        deadline, pause = time.monotonic() + 10, 0.001
        while True:
            info = self._api.exec_inspect(exec_id)
            if not info["Running"]:
                return info["ExitCode"]
            if time.monotonic() > deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _result(self, run: _Run, stdout, stderr, wall_s: float) -> ExecResult:
        status, exit_code, sig = _classify(run)
        error = None
        if status is ExecStatus.XX:
            error = f"SandboxStartError: exit status {exit_code}: {(stdout.text + stderr.text).strip()[-2000:]}"
        return ExecResult(
            status=status, exit_code=exit_code, signal=sig, wall_s=round(wall_s, 4), cpu_s=round(run.cpu_s, 4),
            peak_memory_bytes=run.peak_memory_bytes, stdout=stdout.text, stderr=stderr.text,
            stdout_truncated=stdout.truncated, stderr_truncated=stderr.truncated,
            spec_hash=self.spec.hash, backend=DockerSandbox.name, error=error,
        )

    def _call(self, command: list[str], stdin: bytes | None = None, user: str | None = None) -> bytes:
        """Run one of our own helper commands (tar, find) as the sandbox user (or `user`); its stdout."""
        cap = 2 * (self.spec.limits.disk_mb << 20)  # a tar of the whole workspace fits; sparse files do not
        stdout, stderr = OutputCapture("stdout", cap), OutputCapture("stderr", 4096)
        run = self._exec(command, stdout, stderr, time.monotonic() + _API_TIMEOUT_S, None, stdin=stdin, helper=True,
                         output_limit=cap, user=user)
        if run.killed_for is ExecStatus.OL:
            raise WorkspacePathError(f"{command[0]} in the sandbox: output over {cap} bytes (sparse files?)")
        if not run.ready or run.exit_code is None:  # our shell never ran, or the daemon never said how it ended
            raise OSError(f"{command[0]} in the sandbox did not run to its end: {stderr.text.strip()[-500:]}")
        if run.exit_code != 0:
            raise WorkspacePathError(f"{command[0]} in the sandbox failed: {stderr.text.strip()[-500:]}")
        return bytes(stdout.data)

    def _kill_leftovers(self) -> None:
        """SIGKILL every process but the container's init, until none is left."""
        if self._procs_file is None:
            # Remote daemon: as the sandbox user, signal every process but init (immune to
            # SIGKILL from inside its own pid namespace) and this kill itself.
            exec_id = self._api.exec_create(self._container.id, ["kill", "-9", "-1"], user=self._user)["Id"]
            self._api.exec_start(exec_id)
            return
        deadline = time.monotonic() + 5
        while leftovers := self._container_pids() - {self._init_pid}:
            if time.monotonic() > deadline:
                raise OSError(f"processes survive in container {self._container.name}: {sorted(leftovers)}")
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def _container_pids(self) -> set[int]:
        try:
            return {int(p) for p in self._procs_file.read_text().split()}
        except (OSError, ValueError):  # the container is gone: nothing left to kill
            return set()

    def _oom_kills(self) -> int:
        try:
            lines = self._oom_file.read_text().split("\n") if self._oom_file else []
        except OSError:  # the container is gone
            return 0
        counts = dict(line.split() for line in lines if line.count(" ") == 1)
        return int(counts.get("oom_kill", 0))


class _FrameReader:
    """Splits Docker's multiplexed attach stream into (stream name, payload) pieces."""

    def __init__(self):
        self.buffer = b""
        self.marker = b""  # stderr bytes held back until the ready marker is recognised

    def feed(self, chunk: bytes) -> list[tuple[str, bytes]]:
        self.buffer += chunk
        out = []
        while len(self.buffer) >= 8:
            kind, size = struct.unpack(">BxxxL", self.buffer[:8])
            if len(self.buffer) < 8 + size:
                break
            out.append((_STREAMS.get(kind, "stdout"), self.buffer[8:8 + size]))
            self.buffer = self.buffer[8 + size:]
        return out


def _classify(run: _Run) -> tuple[ExecStatus, int | None, int | None]:
    """(status, exit code, signal): the shell reports a command killed by signal N as 128+N."""
    exit_code, sig = run.exit_code, None
    if exit_code is not None and 128 < exit_code <= 128 + 64:
        exit_code, sig = None, exit_code - 128
    if not run.ready:
        return ExecStatus.XX, exit_code, sig
    if run.killed_for is not None:
        return run.killed_for, exit_code, sig
    if run.exit_code is None:  # the daemon never said how it ended
        return ExecStatus.XX, exit_code, sig
    if run.oom_killed:
        return ExecStatus.ML, exit_code, sig
    if sig == 24:  # SIGXCPU: RLIMIT_CPU, a time limit like the wall clock
        return ExecStatus.TO, exit_code, sig
    if sig is not None:
        return ExecStatus.SG, exit_code, sig
    return (ExecStatus.OK if exit_code == 0 else ExecStatus.RE), exit_code, sig


def _container_options(spec: SandboxSpec, mounts: Sequence[Mount], labels: Mapping[str, str],
                       copied: Sequence[Mount] = ()) -> dict:
    """`mounts` are bind-mounted; `copied` get a tmpfs each, root's where the sandbox may only
    read them, the sandbox user's alone where it may write."""
    limits = spec.limits
    tmpfs_size = f"size={limits.disk_mb}m,nr_inodes={limits.inodes}"
    copies = {m.sandbox_path: f"rw,exec,nosuid,nodev,{tmpfs_size},"
              + (f"uid={spec.uid},gid={spec.gid},mode=0700" if m.writable else "uid=0,gid=0,mode=0755") for m in copied}
    return dict(
        network_mode="bridge" if spec.network else "none",
        read_only=True,
        tmpfs={
            WORKSPACE: f"rw,exec,nosuid,nodev,{tmpfs_size},uid={spec.uid},gid={spec.gid},mode=0755",
            "/tmp": f"rw,exec,nosuid,nodev,{tmpfs_size},mode=1777",
            **copies,
        },
        shm_size=limits.disk_mb << 20,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges", f"seccomp={json.dumps(seccomp.docker_profile())}"],
        user=f"{spec.uid}:{spec.gid}",
        mem_limit=limits.memory_mb << 20,
        memswap_limit=limits.memory_mb << 20,
        pids_limit=limits.pids,
        nano_cpus=10**9,
        ulimits=[Ulimit(name="nofile", soft=NOFILE, hard=NOFILE), Ulimit(name="core", soft=0, hard=0)],
        environment=dict(spec.env),
        working_dir=WORKSPACE,
        hostname="sandbox",
        # Mount, unlike `volumes`, refuses a missing host path instead of creating it as root.
        mounts=[DockerMount(m.sandbox_path, str(m.host_path), type="bind", read_only=not m.writable) for m in mounts],
        labels=dict(labels),
        log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
    )


def _mirror(directory: Path, files: Mapping[str, bytes]) -> None:
    """`directory` (ours: nothing in it is followed) holding exactly `files`."""
    for path in sorted(directory.rglob("*"), reverse=True):  # children before their directories
        name = str(path.relative_to(directory))
        if path.is_dir() and not path.is_symlink():
            if not any(f.startswith(f"{name}/") for f in files):
                path.rmdir()
        elif name not in files:
            path.unlink()
    for name, data in files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _directory_tar(directory: Path) -> bytes:
    """`directory`'s tree as a tar archive (modes kept), to unpack in a container as root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(directory, arcname=".", filter=_owned_by_root)
    return buffer.getvalue()


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0  # not TarInfo.replace: Python 3.11 has it from 3.11.4 only
    info.uname = info.gname = ""
    return info


def _ulimits(spec: SandboxSpec) -> str:
    limits = spec.limits
    return " && ".join([
        f"ulimit -S -t {limits.cpu_s}", f"ulimit -H -t {limits.cpu_s + 1}",
        f"ulimit -f {limits.disk_mb * 2048}",  # 512-byte blocks
    ])


def _cgroup_file(pid: int, container_id: str, controller: str, name: str) -> Path | None:
    """A control file of the cgroup of host process `pid` (cgroup v1 layout) when that cgroup is
    container `container_id`'s; None where the daemon is remote (its pid names another process
    here, or none) or the layout differs (then an OOM kill shows as SG 9, not ML)."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(",") and container_id in path:
                candidate = Path("/sys/fs/cgroup") / controller / path.lstrip("/") / name
                return candidate if candidate.exists() else None
    except OSError:
        return None
    return None


def _read_int(path: Path | None) -> int | None:
    try:
        return int(path.read_text()) if path else None
    except (OSError, ValueError):
        return None


def _write_zero(path: Path | None) -> None:
    if path:
        with contextlib.suppress(OSError):  # best effort: else the peak is the session's so far
            path.write_text("0")


def _remove(container) -> None:
    with contextlib.suppress(docker.errors.NotFound):  # already gone: close is idempotent
        container.remove(force=True, v=True)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
