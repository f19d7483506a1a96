"""LocalSandbox: run untrusted code on this host under bubblewrap, as an unprivileged user.

A session is a directory on its own size-capped tmpfs (workspace/ and tmp/, so a full disk or
inode table is ENOSPC inside the session, never on the host) plus one cgroup for memory and
process limits; every `exec` is one bubblewrap run over that directory. Layers, outermost first:
  /bin/sh (root)       joins the run's cgroup(s), then execs bwrap; children inherit the cgroup
  bwrap (root)         new pid/net/ipc/uts/cgroup namespaces, a fresh root with read-only /usr,
                       private /workspace, empty /tmp, own /proc, minimal /dev, empty environment
  seccomp              bwrap installs the deny-list of sandbox/seccomp.py before the next exec
  setpriv              becomes uid/gid 65534 for real (no user namespace), drops every capability,
                       sets no_new_privs
  /bin/sh (65534)      lowers rlimits, tells us that the sandbox is up by writing one byte to
                       stdin (a pipe to us), swaps stdin for /dev/null and execs the command
A run whose "ready" byte never arrives failed in our machinery (XX); the command cannot fake
that, since it only starts after the byte is sent.

Limits: wall clock (we SIGKILL bwrap's process group, which takes the whole pid namespace down,
then sweep the cgroup), output bytes (same kill), memory and process count (a per-run cgroup,
or RLIMIT_AS / RLIMIT_NPROC where no cgroup is usable, recorded in ExecResult.notes), and
RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0 set by the sandbox user's shell.

Requires root (bwrap without a user namespace, cgroup writes, mount, chown).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sandbox import cgroups, seccomp
from sandbox.base import WORKSPACE, Mount, OutputCallback, SandboxUnavailable, SessionLifecycle, run_once
from sandbox.capture import OutputCapture
from sandbox.result import ExecResult, ExecStatus, infrastructure_error
from sandbox.spec import Limits, SandboxSpec
from sandbox.workspace import HostWorkspace, clear_directory

BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
SH = "/bin/sh"
NOFILE = 1024
# With a pids cgroup the per-run limit lives there; RLIMIT_NPROC counts every uid-65534
# process on the machine, so it is only a machine-wide backstop that parallel runs share.
NPROC_BACKSTOP = 4096
_READ_CHUNK = 1 << 16

# Joins the cgroups listed after the count, then execs the rest. $$ is this shell = bwrap's pid.
_JOIN_CGROUPS = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done;'
    ' exec "$@"'
)
# Runs as the sandbox user; the ready byte is the last thing before the command replaces us.
_LOWER_LIMITS_AND_EXEC = "{ulimits} && unset PWD OLDPWD && printf R >&0 && exec 0</dev/null && exec \"$@\""

_SYSTEM_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
_ETC_BASE = ("alternatives", "ld.so.cache", "localtime")
_ETC_NETWORK = ("resolv.conf", "hosts", "nsswitch.conf", "gai.conf", "ssl", "ca-certificates")


@dataclass
class _Outcome:
    """What happened to the process, before it is turned into an ExecStatus."""

    ready: bool = False
    killed_for: ExecStatus | None = None  # TO or OL when we killed the tree
    wait_status: int | None = None
    cpu_s: float = 0.0
    max_rss_bytes: int | None = None
    oom_killed: bool = False  # the session cgroup counted an OOM kill during this run
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
    """One workspace on a size-capped tmpfs, one cgroup, many bwrap runs."""

    def __init__(self, backend: LocalSandbox, files: Mapping[str, str | bytes], mounts: Sequence[Mount]):
        self.id = secrets.token_hex(8)
        self.spec = backend.spec
        self.log: list[ExecResult] = []
        self._backend, self._mounts, self._closed = backend, tuple(mounts), False
        self._cgroup: cgroups.RunCgroup | None = None
        _check_host(self.spec)
        self._dir = Path(tempfile.mkdtemp(prefix=f"crucible-{os.getpid()}-{self.id}-", dir=backend.scratch_dir))
        try:
            self._mount_tmpfs()
            self._make_layout()
            self._cgroup = self._make_cgroup()
            self.workspace.put(files)
            self._initial = self.workspace.snapshot()
        except BaseException as e:  # bad input files included: nothing may be left behind
            self._abandon(e, (OSError, cgroups.CgroupError), LocalSandbox.name)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what runs, remove the cgroup, unmount and delete the session directory."""
        if self._closed:
            return
        self._closed = True
        try:
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
            oom_before = self._cgroup.oom_kills() if self._cgroup else 0
            if self._cgroup:
                self._cgroup.reset_peak_memory()
            self._execute(list(command), stdout, stderr, outcome, deadline, on_output)
            outcome.wall_s = time.monotonic() - started
            if self._cgroup is not None:
                self._cgroup.kill_all()  # nothing of this run may outlive it, even if bwrap misbehaved
                outcome.oom_killed = self._cgroup.oom_kills() > oom_before
            result = self._result(outcome, stdout, stderr)
        except (OSError, cgroups.CgroupError, seccomp.SeccompUnavailable) as e:
            result = infrastructure_error(self.spec.hash, LocalSandbox.name, f"{type(e).__name__}: {e}", started)
        result = replace(result, command=tuple(command), started_at=started_at, session_id=self.id)
        self.log.append(result)
        return result

    def _execute(self, command, stdout, stderr, outcome: _Outcome, deadline: float, on_output) -> None:
        limits = self.spec.limits
        seccomp_fd = self._seccomp_fd()
        argv = [SH, "-c", _JOIN_CGROUPS, "sh", *_join_args(self._cgroup)]
        argv += self._bwrap_args(seccomp_fd)
        argv += [SETPRIV, "--reuid", str(self.spec.uid), "--regid", str(self.spec.gid), "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        argv += [SH, "-c", _LOWER_LIMITS_AND_EXEC.format(ulimits=_ulimits(limits, self._cgroup)), "sh", *command]
        ready_r, ready_w = os.pipe()
        try:
            proc = subprocess.Popen(
                argv, stdin=ready_w, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, env={}, cwd="/", pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            )
        finally:
            os.close(ready_w)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        try:
            self._pump(proc, ready_r, stdout, stderr, outcome, deadline, on_output)
        finally:
            os.close(ready_r)
            proc.stdout.close()
            proc.stderr.close()

    def _seccomp_fd(self) -> int | None:
        return seccomp.bpf_fd() if self._backend.has_seccomp else None

    def _bwrap_args(self, seccomp_fd: int | None) -> list[str]:
        args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if not self.spec.network:
            args.append("--unshare-net")  # a fresh namespace with loopback only
        for key, value in self.spec.env:
            args += ["--setenv", key, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for link, target in _SYSTEM_LINKS.items():
            args += ["--symlink", target, link]
        args += ["--perms", "0755", "--dir", "/etc"]  # else bwrap makes it 0700: unreadable
        for name in _ETC_BASE + (_ETC_NETWORK if self.spec.network else ()):
            if os.path.lexists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        args += ["--ro-bind", str(self._dir / "passwd"), "/etc/passwd",
                 "--ro-bind", str(self._dir / "group"), "/etc/group",
                 "--proc", "/proc", "--dev", "/dev",
                 "--size", str(self.spec.limits.disk_mb << 20), "--tmpfs", "/dev/shm",
                 "--bind", str(self._dir / "tmp"), "/tmp",
                 "--bind", str(self._dir / "workspace"), WORKSPACE]
        for m in self._mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(m.host_path), m.sandbox_path]
        return args + ["--chdir", WORKSPACE, "--"]

    def _pump(self, proc, ready_r, stdout, stderr, outcome: _Outcome, deadline: float, on_output) -> None:
        """Read both streams and the ready pipe until the sandbox exits or a limit is hit."""
        sel = selectors.DefaultSelector()
        sel.register(ready_r, selectors.EVENT_READ, None)
        sel.register(proc.stdout, selectors.EVENT_READ, stdout)
        sel.register(proc.stderr, selectors.EVENT_READ, stderr)
        try:
            while sel.get_map() and outcome.killed_for is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    outcome.killed_for = ExecStatus.TO
                    break
                for key, _ in sel.select(remaining):
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data is None:
                        outcome.ready = True
                    else:
                        key.data.add(chunk)
                        if on_output is not None:
                            on_output(key.data.name, chunk)
                if stdout.total + stderr.total > self.spec.limits.output_bytes:
                    outcome.killed_for = ExecStatus.OL
        finally:
            sel.close()
        if outcome.killed_for is not None:
            _kill_group(proc.pid)
        _reap(proc, outcome, deadline)

    def _result(self, outcome: _Outcome, stdout: OutputCapture, stderr: OutputCapture) -> ExecResult:
        status, exit_code, sig = _classify(outcome)
        error = None
        if status is ExecStatus.XX:
            error = f"SandboxStartError: exit status {exit_code}: {stderr.text.strip()[-2000:]}"
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


def _reap(proc, outcome: _Outcome, deadline: float) -> None:
    """Wait for bwrap, with its resource usage; kill it if it outlives the deadline."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline and outcome.killed_for is None:
            outcome.killed_for = ExecStatus.TO
            _kill_group(proc.pid)
        time.sleep(0.001)
    proc.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
    outcome.wait_status = status
    outcome.cpu_s = usage.ru_utime + usage.ru_stime
    outcome.max_rss_bytes = usage.ru_maxrss * 1024


def _classify(outcome: _Outcome) -> tuple[ExecStatus, int | None, int | None]:
    """(status, exit code, signal) from how bwrap ended.

    bwrap reports a command killed by signal N as exit code 128+N, so a command that itself
    exits with 128+N reads as signal N (both are failures). A run that never signalled ready
    is XX whatever else happened. An OOM kill anywhere in the run makes it ML, even if the
    command survived it (the limit was hit either way).
    """
    status = outcome.wait_status
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if exit_code is not None and 128 < exit_code <= 128 + 64:
        exit_code, sig = None, exit_code - 128
    if not outcome.ready:
        return ExecStatus.XX, exit_code, sig
    if outcome.killed_for is not None:
        return outcome.killed_for, exit_code, sig
    if outcome.oom_killed:
        return ExecStatus.ML, exit_code, sig
    if sig == signal.SIGXCPU:  # RLIMIT_CPU: a time limit, like the wall clock
        return ExecStatus.TO, exit_code, sig
    if sig is not None:
        return ExecStatus.SG, exit_code, sig
    return (ExecStatus.OK if exit_code == 0 else ExecStatus.RE), exit_code, sig


def _check_host(spec: SandboxSpec) -> None:
    if spec.image != "host":
        raise SandboxUnavailable(f"the local backend runs image 'host' only, not {spec.image!r}")
    for tool in (BWRAP, SETPRIV, SH):
        if not os.access(tool, os.X_OK):
            raise SandboxUnavailable(f"{tool} is missing (install bubblewrap / util-linux)")


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


def _ulimits(limits: Limits, cgroup) -> str:
    """Shell `ulimit` commands for the sandbox user (dash takes one resource per call)."""
    cmds = [
        # SIGXCPU at the soft limit, SIGKILL a second later (soft first: it must stay <= hard).
        f"ulimit -S -t {limits.cpu_s}", f"ulimit -H -t {limits.cpu_s + 1}",
        f"ulimit -f {limits.disk_mb * 2048}",  # 512-byte blocks
        f"ulimit -n {NOFILE}",
        "ulimit -c 0",
    ]
    has_pids = cgroup is not None and cgroup.has_pids
    cmds.append(f"ulimit -p {NPROC_BACKSTOP if has_pids else limits.pids}")
    if cgroup is None or not cgroup.has_memory:
        cmds.append(f"ulimit -v {limits.memory_mb * 1024}")
    return " && ".join(cmds)


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
