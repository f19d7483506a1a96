"""LocalSandbox: run untrusted code on this host under bubblewrap, as an unprivileged user.

A session is a directory on its own size- and inode-capped tmpfs (workspace/ and tmp/, so a
full disk is ENOSPC inside the session, never on the host), one cgroup for memory and process
limits, and one long-lived bubblewrap sandbox whose supervisor starts every exec with a fork
(sandbox/harness/supervisor.py). Layers, outermost first:
  /bin/sh (root)       joins the session's cgroup(s), then execs bwrap; children inherit them
  bwrap (root)         new pid/net/ipc/uts/cgroup namespaces, a fresh root with read-only /usr,
                       the session's /workspace and /tmp, own /proc, minimal /dev, empty
                       environment, no capability but CAP_SETUID/SETGID/KILL/SETPCAP, and the seccomp
                       deny-list of sandbox/seccomp.py
  supervisor (uid 0)   for each exec: fork; the child lowers rlimits, becomes uid/gid 65534 for
                       real (no user namespace; every capability gone), sets no_new_privs and
                       execs the command. The sandbox user can neither signal nor trace it.
An exec is "ready" when the supervisor reports the fork; without that report the failure is
ours (XX), and the command cannot fake it.

Limits: wall clock and output bytes (the supervisor kills every process in the sandbox:
kill(-1) spares only itself and init), memory and process count (the session's cgroup, or
RLIMIT_AS / RLIMIT_NPROC where no cgroup is usable, recorded in ExecResult.notes), and
RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0 per exec. When the command exits, the
supervisor kills whatever it left behind, so nothing outlives an exec.

Requires root (bwrap without a user namespace, cgroup writes, mount, chown).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sandbox import cgroups, seccomp
from sandbox.base import WORKSPACE, Mount, OutputCallback, SandboxUnavailable, SessionLifecycle, process_alive, run_once
from sandbox.capture import OutputCapture
from sandbox.result import ExecResult, ExecStatus, infrastructure_error
from sandbox.spec import Limits, SandboxSpec
from sandbox.workspace import HostWorkspace, clear_directory

BWRAP = "/usr/bin/bwrap"
SH = "/bin/sh"
# Debian's interpreter runs the supervisor: it needs nothing outside /usr (a pyenv Python
# would need its own prefix bound in).
SANDBOX_PYTHON = "/usr/bin/python3"
SUPERVISOR = Path(__file__).with_name("harness") / "supervisor.py"
SUPERVISOR_IN_SANDBOX = "/.crucible/supervisor.py"
NOFILE = 1024
# With a pids cgroup the per-session limit lives there; RLIMIT_NPROC counts every uid-65534
# process on the machine, so it is only a machine-wide backstop that parallel runs share.
NPROC_BACKSTOP = 4096
_READ_CHUNK = 1 << 16
_START_TIMEOUT_S = 10.0
_KILL_GRACE_S = 5.0  # how long the supervisor may take to report after we asked for a kill

# Joins the cgroups listed after the count, then execs the rest. $$ is this shell = bwrap's pid.
_JOIN_CGROUPS = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done;'
    ' exec "$@"'
)

# crucible-<owner pid>-<session id>-<random>: see LocalSession.__init__ and LocalSandbox.reap.
_SESSION_DIR = re.compile(r"crucible-(?P<owner>\d+)-(?P<session>[0-9a-f]{16})-\w+")
_SYSTEM_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
_ETC_BASE = ("alternatives", "ld.so.cache", "localtime")
_ETC_NETWORK = ("resolv.conf", "hosts", "nsswitch.conf", "gai.conf", "ssl", "ca-certificates")


@dataclass
class _Outcome:
    """What happened to the command, before it is turned into an ExecStatus."""

    ready: bool = False  # the supervisor forked the command
    killed_for: ExecStatus | None = None  # TO or OL when we had the sandbox's processes killed
    wait_status: int | None = None
    cpu_s: float = 0.0
    max_rss_bytes: int | None = None
    oom_killed: bool = False  # the session cgroup counted an OOM kill during this run
    broken: str | None = None  # the supervisor stopped answering: the session is unusable
    wall_s: float = 0.0


class LocalSandbox:
    """Sessions on this host under bubblewrap; see the module docstring for the layers."""

    name = "local"

    def __init__(
        self,
        spec: SandboxSpec = SandboxSpec(),  # noqa: B008 (frozen: sharing the default is safe)
        *,
        scratch_dir: Path | None = None,
        cgroup_parent: str = "crucible",
    ):
        """`scratch_dir` holds session and grading directories (default: see `_default_scratch`);
        `cgroup_parent` names the cgroup directory that per-session cgroups are created in.

        Raises SandboxUnavailable when this host cannot isolate as `spec` asks."""
        self.spec = spec
        self.cgroup_parent = cgroup_parent
        self.cgroup_host = cgroups.detect(cgroup_parent)
        self.scratch_dir = Path(scratch_dir or _default_scratch(self.cgroup_host))
        self.weaknesses = self._weaknesses()
        if self.weaknesses and not spec.allow_weak_isolation:
            raise SandboxUnavailable(
                "the local sandbox cannot isolate as asked on this host: " + "; ".join(self.weaknesses)
                + " (set SandboxSpec(allow_weak_isolation=True) to run anyway with rlimits)"
            )

    def session(self, files: Mapping[str, str | bytes] = {}, mounts: Sequence[Mount] = ()) -> LocalSession:  # noqa: B006
        return LocalSession(self, files, mounts)

    def run(self, command: list[str], files: Mapping[str, str | bytes], mounts: Sequence[Mount] = ()) -> ExecResult:
        return run_once(self, command, files, mounts)

    def reap(self) -> list[str]:
        """Remove what sessions of owner processes that died without closing them left behind
        (their sandboxes died with them): tmpfs mounts, directories and cgroups. Returns the
        session ids removed."""
        removed = []
        for directory in self.scratch_dir.iterdir():
            match = _SESSION_DIR.fullmatch(directory.name)
            if match is None or process_alive(int(match["owner"])):
                continue
            if self.cgroup_host is not None:
                cgroups.RunCgroup(self.cgroup_host, f"{match['owner']}-{match['session']}").destroy()
            _unmount(directory)
            shutil.rmtree(directory)
            removed.append(match["session"])
        return removed

    def _weaknesses(self) -> list[str]:
        found = []
        host = self.cgroup_host
        if host is None or host.memory_parent is None:
            found.append("no writable memory cgroup: memory limited by RLIMIT_AS, MemoryError instead of ML")
        if host is None or host.pids_parent is None:
            found.append("no writable pids cgroup: processes limited by RLIMIT_NPROC, shared by all runs")
        try:
            seccomp.bpf_program()
            self.has_seccomp = True
        except seccomp.SeccompUnavailable as e:
            self.has_seccomp = False
            found.append(f"no seccomp filter: {e}")
        return found


class LocalSession(SessionLifecycle):
    """One workspace on a capped tmpfs, one cgroup, one bubblewrap sandbox with a supervisor."""

    def __init__(self, backend: LocalSandbox, files: Mapping[str, str | bytes], mounts: Sequence[Mount]):
        self.id = secrets.token_hex(8)
        self.spec = backend.spec
        self.log: list[ExecResult] = []
        self._backend, self._mounts, self._closed = backend, tuple(mounts), False
        self._cgroup: cgroups.RunCgroup | None = None
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._broken: str | None = None
        _check_host(self.spec)
        self._dir = Path(tempfile.mkdtemp(prefix=f"crucible-{os.getpid()}-{self.id}-", dir=backend.scratch_dir))
        try:
            self._mount_tmpfs()
            self._make_layout()
            self._cgroup = self._make_cgroup()
            self.workspace.put(files)
            self._initial = self.workspace.snapshot()
            self._start_supervisor()
        except BaseException as e:  # bad input files included: nothing may be left behind
            self._abandon(e, (OSError, cgroups.CgroupError, SandboxUnavailable), LocalSandbox.name)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the sandbox, remove the cgroup, unmount and delete the session directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stop_supervisor()
            if self._cgroup is not None:
                self._cgroup.destroy()
        finally:
            _unmount(self._dir)
            shutil.rmtree(self._dir)

    def reset(self) -> None:
        """Back to the files the session was opened with; /tmp emptied."""
        self._check_open()
        clear_directory(self._dir / "tmp")
        self.workspace.restore(self._initial)

    # -- files -------------------------------------------------------------------------------

    def put_files(self, files: Mapping[str, str | bytes]) -> None:
        self._check_open()
        self.workspace.put(files)

    def get_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        self._check_open()
        return self.workspace.get(paths)

    def snapshot(self) -> bytes:
        self._check_open()
        return self.workspace.snapshot()

    def restore(self, snapshot: bytes) -> None:
        self._check_open()
        self.workspace.restore(snapshot)

    # -- execution ---------------------------------------------------------------------------

    def exec(
        self, command: Sequence[str], *, timeout_s: float | None = None, on_output: OutputCallback | None = None
    ) -> ExecResult:
        self._check_open()
        if not command:
            raise ValueError("command must not be empty")
        started_at, started = time.time(), time.monotonic()
        limits = self.spec.limits
        deadline = started + (limits.wall_s if timeout_s is None else timeout_s)
        stdout, stderr = OutputCapture("stdout", limits.excerpt_bytes), OutputCapture("stderr", limits.excerpt_bytes)
        outcome = _Outcome()
        try:
            if self._broken:
                raise SandboxUnavailable(f"the session is broken ({self._broken}); open a new one")
            oom_before = self._cgroup.oom_kills() if self._cgroup else 0
            if self._cgroup:
                self._cgroup.reset_peak_memory()
            self._execute(list(command), stdout, stderr, outcome, deadline, on_output)
            outcome.wall_s = time.monotonic() - started
            if self._cgroup is not None:
                outcome.oom_killed = self._cgroup.oom_kills() > oom_before
            result = self._result(outcome, stdout, stderr)
        except (OSError, cgroups.CgroupError, SandboxUnavailable) as e:
            result = infrastructure_error(self.spec.hash, LocalSandbox.name, f"{type(e).__name__}: {e}", started)
        result = replace(result, command=tuple(command), started_at=started_at, session_id=self.id)
        self.log.append(result)
        return result

    def _execute(self, command, stdout, stderr, outcome: _Outcome, deadline: float, on_output) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = {"op": "exec", "argv": command, "env": dict(self.spec.env), "cwd": WORKSPACE,
                   "uid": self.spec.uid, "gid": self.spec.gid, "rlimits": _rlimits(self.spec.limits, self._cgroup)}
        try:
            socket.send_fds(self._control, [json.dumps(request).encode()], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            self._pump(out_r, err_r, stdout, stderr, outcome, deadline, on_output)
        finally:
            os.close(out_r)
            os.close(err_r)
        if outcome.broken:
            self._broken = outcome.broken
            self._stop_supervisor()  # takes every process of the session with it

    def _pump(self, out_r, err_r, stdout, stderr, outcome: _Outcome, deadline: float, on_output) -> None:
        """Read both streams and the supervisor's reports until the command has exited and its
        output is drained, asking the supervisor to kill everything when a limit is hit."""
        sel = selectors.DefaultSelector()
        sel.register(self._control, selectors.EVENT_READ, None)
        sel.register(out_r, selectors.EVENT_READ, stdout)
        sel.register(err_r, selectors.EVENT_READ, stderr)
        kill_deadline = None
        try:
            while outcome.wait_status is None or sel.get_map():  # the report, then the output's end
                now = time.monotonic()
                if kill_deadline is None and now >= deadline:
                    kill_deadline = self._kill(outcome, ExecStatus.TO)
                if kill_deadline is not None and now >= kill_deadline:
                    outcome.broken = "the supervisor did not report after a kill"
                    return
                timeout = (kill_deadline or deadline) - now
                for key, _ in sel.select(max(timeout, 0)):
                    if key.data is None:
                        if not self._report(outcome):
                            sel.unregister(self._control)
                            if outcome.wait_status is None:
                                outcome.broken = "the supervisor died"
                                return
                        continue
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    key.data.add(chunk)
                    if on_output is not None:
                        on_output(key.data.name, chunk)
                if kill_deadline is None and stdout.total + stderr.total > self.spec.limits.output_bytes:
                    kill_deadline = self._kill(outcome, ExecStatus.OL)
                if outcome.wait_status is not None and self._control.fileno() in sel.get_map():
                    sel.unregister(self._control)  # only the output is left to drain
        finally:
            sel.close()

    def _report(self, outcome: _Outcome) -> bool:
        """Take one message of the supervisor; False when it has gone."""
        data = self._control.recv(1 << 16)
        if not data:
            return False
        message = json.loads(data)
        if "started" in message:
            outcome.ready = True
        elif "exit" in message:
            outcome.wait_status = message["exit"]
            outcome.cpu_s = message["cpu_s"]
            outcome.max_rss_bytes = message["max_rss_kb"] * 1024
        return True

    def _kill(self, outcome: _Outcome, reason: ExecStatus) -> float:
        outcome.killed_for = reason
        self._control.send(b'{"op": "kill"}')
        return time.monotonic() + _KILL_GRACE_S

    def _result(self, outcome: _Outcome, stdout: OutputCapture, stderr: OutputCapture) -> ExecResult:
        status, exit_code, sig = _classify(outcome)
        error = None
        if status is ExecStatus.XX:
            error = f"SandboxStartError: {outcome.broken or 'the command never started'}: {self._supervisor_log()}"
        cgroup = self._cgroup
        peak = cgroup.peak_memory_bytes() if cgroup is not None and cgroup.has_memory else None
        return ExecResult(
            status=status, exit_code=exit_code, signal=sig,
            wall_s=round(outcome.wall_s, 4), cpu_s=round(outcome.cpu_s, 4),
            peak_memory_bytes=peak if peak is not None else outcome.max_rss_bytes,
            stdout=stdout.text, stderr=stderr.text,
            stdout_truncated=stdout.truncated, stderr_truncated=stderr.truncated,
            spec_hash=self.spec.hash, backend=LocalSandbox.name, error=error,
            notes=tuple(self._backend.weaknesses),
        )

    # -- the supervisor ----------------------------------------------------------------------

    def _start_supervisor(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours
        seccomp_fd = seccomp.bpf_fd() if self._backend.has_seccomp else None
        argv = [SH, "-c", _JOIN_CGROUPS, "sh", *_join_args(self._cgroup), *self._bwrap_args(seccomp_fd),
                SANDBOX_PYTHON, "-I", "-S", SUPERVISOR_IN_SANDBOX, str(theirs.fileno())]
        log = open(self._dir / "supervisor.log", "wb")  # noqa: SIM115 (handed to the child)
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env={}, cwd="/",
                pass_fds=(theirs.fileno(),) + (() if seccomp_fd is None else (seccomp_fd,)),
            )
        finally:
            log.close()
            theirs.close()
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        ready, _, _ = select.select([ours], [], [], _START_TIMEOUT_S)
        if not ready or not ours.recv(1 << 16):
            raise SandboxUnavailable(f"the sandbox did not start: {self._supervisor_log()}")

    def _stop_supervisor(self) -> None:
        """Closing the control socket ends the supervisor, and with it bwrap and the whole pid
        namespace; kill the process group if that does not happen at once."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc.pid)
            self._proc.wait()

    def _supervisor_log(self) -> str:
        try:
            return (self._dir / "supervisor.log").read_text(errors="replace").strip()[-2000:] or "no output"
        except OSError:
            return "no log"

    def _bwrap_args(self, seccomp_fd: int | None) -> list[str]:
        args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL",
                "--cap-add", "CAP_SETPCAP"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if not self.spec.network:
            args.append("--unshare-net")  # a fresh namespace with loopback only
        args += ["--ro-bind", "/usr", "/usr"]
        for link, target in _SYSTEM_LINKS.items():
            args += ["--symlink", target, link]
        args += ["--perms", "0755", "--dir", "/etc"]  # else bwrap makes it 0700: unreadable
        for name in _ETC_BASE + (_ETC_NETWORK if self.spec.network else ()):
            if os.path.lexists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        args += ["--ro-bind", str(self._dir / "passwd"), "/etc/passwd",
                 "--ro-bind", str(self._dir / "group"), "/etc/group",
                 "--ro-bind", str(SUPERVISOR), SUPERVISOR_IN_SANDBOX,
                 "--proc", "/proc", "--dev", "/dev",
                 "--size", str(self.spec.limits.disk_mb << 20), "--tmpfs", "/dev/shm",
                 "--bind", str(self._dir / "tmp"), "/tmp",
                 "--bind", str(self._dir / "workspace"), WORKSPACE]
        for m in self._mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(m.host_path), m.sandbox_path]
        return args + ["--chdir", "/", "--"]

    # -- setup -------------------------------------------------------------------------------

    def _mount_tmpfs(self) -> None:
        limits = self.spec.limits
        _mount_tmpfs(self._dir, f"size={limits.disk_mb}m,nr_inodes={limits.inodes},mode=0755")

    def _make_layout(self) -> None:
        spec = self.spec
        workspace, tmp = self._dir / "workspace", self._dir / "tmp"
        workspace.mkdir()
        tmp.mkdir()
        os.chown(workspace, spec.uid, spec.gid)
        tmp.chmod(0o1777)
        (self._dir / "passwd").write_text(
            f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{spec.uid}:{spec.gid}::{WORKSPACE}:/usr/sbin/nologin\n"
        )
        (self._dir / "group").write_text(f"root:x:0:\nsandbox:x:{spec.gid}:\n")
        max_file = spec.limits.disk_mb << 20
        self.workspace = HostWorkspace(workspace, spec.uid, spec.gid, max_file_bytes=max_file)

    def _make_cgroup(self) -> cgroups.RunCgroup | None:
        host = self._backend.cgroup_host
        if host is None:
            return None
        cgroup = cgroups.RunCgroup(host, f"{os.getpid()}-{self.id}")
        cgroup.create(self.spec.limits.memory_mb << 20, self.spec.limits.pids)
        return cgroup


def _classify(outcome: _Outcome) -> tuple[ExecStatus, int | None, int | None]:
    """(status, exit code, signal) from the command's wait status, as the supervisor saw it.

    A run that never started or whose supervisor stopped answering is XX whatever else
    happened; an OOM kill anywhere in the run makes it ML, even if the command survived it
    (the limit was hit either way).
    """
    status = outcome.wait_status
    exit_code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
    if outcome.oom_killed and (outcome.broken or status is not None):
        return ExecStatus.ML, exit_code, sig
    if not outcome.ready or outcome.broken or status is None:
        return ExecStatus.XX, exit_code, sig
    if outcome.killed_for is not None:
        return outcome.killed_for, exit_code, sig
    if sig == signal.SIGXCPU:  # RLIMIT_CPU: a time limit, like the wall clock
        return ExecStatus.TO, exit_code, sig
    if sig is not None:
        return ExecStatus.SG, exit_code, sig
    return (ExecStatus.OK if exit_code == 0 else ExecStatus.RE), exit_code, sig


def _check_host(spec: SandboxSpec) -> None:
    if spec.image != "host":
        raise SandboxUnavailable(f"the local backend runs image 'host' only, not {spec.image!r}")
    for tool in (BWRAP, SH, SANDBOX_PYTHON):
        if not os.access(tool, os.X_OK):
            raise SandboxUnavailable(f"{tool} is missing (install bubblewrap and python3: scripts/install-system-packages)")


def _kill_group(pgid: int) -> None:
    # bwrap leads its own process group; killing it takes its pid namespace (all of it) down.
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


def _default_scratch(cgroup_host: cgroups.CgroupHost | None) -> str:
    """/dev/shm when it is a tmpfs and runs have a memory cgroup: tmpfs pages are charged to
    the writer's cgroup, so whatever a run writes (workspace, /report) counts against its
    memory limit instead of filling the host's disk. Otherwise the system temp directory."""
    if cgroup_host is not None and cgroup_host.memory_parent is not None and _is_tmpfs("/dev/shm"):
        return "/dev/shm"
    return tempfile.gettempdir()


def _is_tmpfs(path: str) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[1:3] == [path, "tmpfs"] for line in mounts) and os.access(path, os.W_OK)


def _join_args(cgroup) -> list[str]:
    files = cgroup.procs_files if cgroup is not None else []
    return [str(len(files)), *files]


def _rlimits(limits: Limits, cgroup) -> list[tuple[str, int, int]]:
    """(resource name, soft, hard) the supervisor sets for each command."""
    has_pids = cgroup is not None and cgroup.has_pids
    found = [
        # SIGXCPU at the soft limit, SIGKILL a second later.
        ("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
        ("RLIMIT_FSIZE", limits.disk_mb << 20, limits.disk_mb << 20),
        ("RLIMIT_NOFILE", NOFILE, NOFILE),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", *(2 * [NPROC_BACKSTOP if has_pids else limits.pids])),
    ]
    if cgroup is None or not cgroup.has_memory:
        found.append(("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20))
    return found


_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


def _mount_tmpfs(target: Path, options: str) -> None:
    if _libc.mount(b"tmpfs", bytes(target), b"tmpfs", 0, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs on {target}: {os.strerror(code)}")


def _unmount(target: Path) -> None:
    """Detach the session's tmpfs; a directory that was never mounted is fine."""
    if _libc.umount2(bytes(target), _MNT_DETACH) != 0 and ctypes.get_errno() != errno.EINVAL:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")
