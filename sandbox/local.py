"""LocalSandbox: run untrusted code on this host under bubblewrap, as an unprivileged user.

Layers, outermost first:
  /bin/sh (root)       joins the run's cgroup(s), then execs bwrap; children inherit the cgroup
  bwrap (root)         new pid/net/ipc/uts/cgroup namespaces, a fresh root with read-only /usr,
                       private /workspace, empty /tmp, own /proc, minimal /dev, empty environment
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

Requires root (bwrap without a user namespace, cgroup writes, chown).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sandbox import cgroups
from sandbox.base import Mount
from sandbox.result import ExecResult, ExecStatus
from sandbox.spec import Limits, SandboxSpec

BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
SH = "/bin/sh"
WORKSPACE = "/workspace"
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


class SandboxSetupError(RuntimeError):
    """Our own machinery failed; the run is reported as XX."""


@dataclass
class _Capture:
    """The first `keep` bytes of one stream, and how many bytes it produced in all."""

    keep: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)


@dataclass
class _Outcome:
    """What happened to the process, before it is turned into an ExecStatus."""

    ready: bool = False
    killed_for: ExecStatus | None = None  # TO or OL when we killed the tree
    wait_status: int | None = None
    cpu_s: float = 0.0
    max_rss_bytes: int | None = None


class LocalSandbox:
    name = "local"

    def __init__(
        self,
        spec: SandboxSpec = SandboxSpec(),  # noqa: B008 (frozen: sharing the default is safe)
        *,
        scratch_dir: Path | None = None,
        cgroup_parent: str = "crucible",
    ):
        """`scratch_dir` holds the per-run host directories (default: see `_default_scratch`);
        `cgroup_parent` names the cgroup directory that per-run cgroups are created in."""
        self.spec = spec
        self.cgroup_host = cgroups.detect(cgroup_parent)
        self.scratch_dir = Path(scratch_dir or _default_scratch(self.cgroup_host))

    def run(
        self,
        command: list[str],
        files: Mapping[str, str | bytes],
        mounts: Sequence[Mount] = (),
    ) -> ExecResult:
        if not command:
            raise ValueError("command must not be empty")
        started = time.monotonic()
        try:
            self._check_host()
            with self._run_dir() as run_dir:
                workspace = _populate_workspace(run_dir, files, self.spec)
                with self._cgroup() as cgroup:
                    return self._execute(command, run_dir, workspace, mounts, cgroup, started)
        except (SandboxSetupError, cgroups.CgroupError, OSError) as e:
            return self._infra_error(f"{type(e).__name__}: {e}", started)

    # -- setup -------------------------------------------------------------------------------

    def _check_host(self) -> None:
        if self.spec.image != "host":
            raise SandboxSetupError(f"the local backend runs image 'host' only, not {self.spec.image!r}")
        for tool in (BWRAP, SETPRIV, SH):
            if not os.access(tool, os.X_OK):
                raise SandboxSetupError(f"{tool} is missing (install bubblewrap / util-linux)")

    @contextmanager
    def _run_dir(self):
        run_dir = Path(tempfile.mkdtemp(prefix="crucible-run-", dir=self.scratch_dir))
        try:
            yield run_dir
        finally:
            # rmtree never follows symlinks the command may have planted; root ignores modes.
            shutil.rmtree(run_dir)

    @contextmanager
    def _cgroup(self):
        if self.cgroup_host is None:
            yield None
            return
        cgroup = cgroups.RunCgroup(self.cgroup_host, secrets.token_hex(8))
        cgroup.create(self.spec.limits.memory_mb << 20, self.spec.limits.pids)
        try:
            yield cgroup
        finally:
            cgroup.destroy()

    # -- execution ---------------------------------------------------------------------------

    def _execute(self, command, run_dir, workspace, mounts, cgroup, started) -> ExecResult:
        limits = self.spec.limits
        argv = [SH, "-c", _JOIN_CGROUPS, "sh", *_join_args(cgroup)]
        argv += self._bwrap_args(run_dir, workspace, mounts)
        argv += [SETPRIV, "--reuid", str(self.spec.uid), "--regid", str(self.spec.gid), "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        argv += [SH, "-c", _LOWER_LIMITS_AND_EXEC.format(ulimits=_ulimits(limits, cgroup)), "sh", *command]
        ready_r, ready_w = os.pipe()
        try:
            proc = subprocess.Popen(
                argv, stdin=ready_w, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, env={}, cwd="/",
            )
        except OSError:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        stdout, stderr = _Capture(limits.excerpt_bytes), _Capture(limits.excerpt_bytes)
        outcome = _Outcome()
        try:
            self._pump(proc, ready_r, stdout, stderr, outcome, started + limits.wall_s)
        finally:
            os.close(ready_r)
            proc.stdout.close()
            proc.stderr.close()
        return self._result(outcome, stdout, stderr, cgroup, started)

    def _bwrap_args(self, run_dir: Path, workspace: Path, mounts: Sequence[Mount]) -> list[str]:
        args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
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
        args += ["--ro-bind", str(run_dir / "passwd"), "/etc/passwd",
                 "--ro-bind", str(run_dir / "group"), "/etc/group",
                 "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm",
                 "--size", str(self.spec.limits.disk_mb << 20), "--tmpfs", "/tmp",
                 "--bind", str(workspace), WORKSPACE]
        for m in mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(m.host_path), m.sandbox_path]
        return args + ["--chdir", WORKSPACE, "--"]

    def _pump(self, proc, ready_r, stdout, stderr, outcome: _Outcome, deadline: float) -> None:
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
                if stdout.total + stderr.total > self.spec.limits.output_bytes:
                    outcome.killed_for = ExecStatus.OL
        finally:
            sel.close()
        if outcome.killed_for is not None:
            _kill_group(proc.pid)
        self._reap(proc, outcome, deadline)

    def _reap(self, proc, outcome: _Outcome, deadline: float) -> None:
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

    # -- result ------------------------------------------------------------------------------

    def _result(self, outcome: _Outcome, stdout: _Capture, stderr: _Capture, cgroup, started) -> ExecResult:
        if cgroup is not None:
            cgroup.kill_all()  # nothing of this run may outlive it, even if bwrap misbehaved
        status, exit_code, sig = _classify(outcome, cgroup)
        error = None
        if status is ExecStatus.XX:
            error = f"SandboxStartError: exit status {exit_code}: {stderr.text.strip()[-2000:]}"
        peak = cgroup.peak_memory_bytes() if cgroup is not None and cgroup.has_memory else None
        return ExecResult(
            status=status, exit_code=exit_code, signal=sig,
            wall_s=round(time.monotonic() - started, 4), cpu_s=round(outcome.cpu_s, 4),
            peak_memory_bytes=peak if peak is not None else outcome.max_rss_bytes,
            stdout=stdout.text, stderr=stderr.text,
            stdout_truncated=stdout.truncated, stderr_truncated=stderr.truncated,
            spec_hash=self.spec.hash, backend=self.name, error=error, notes=self._notes(cgroup),
        )

    def _notes(self, cgroup) -> tuple[str, ...]:
        notes = []
        if cgroup is None or not cgroup.has_memory:
            notes.append("memory limited by RLIMIT_AS (no memory cgroup): MemoryError, not ML; peak = max RSS")
        if cgroup is None or not cgroup.has_pids:
            notes.append("processes limited by RLIMIT_NPROC (no pids cgroup): shared by all uid runs")
        return tuple(notes)

    def _infra_error(self, error: str, started: float) -> ExecResult:
        return ExecResult(
            status=ExecStatus.XX, exit_code=None, signal=None,
            wall_s=round(time.monotonic() - started, 4), cpu_s=0.0, peak_memory_bytes=None,
            stdout="", stderr="", stdout_truncated=False, stderr_truncated=False,
            spec_hash=self.spec.hash, backend=self.name, error=error,
        )


def _classify(outcome: _Outcome, cgroup) -> tuple[ExecStatus, int | None, int | None]:
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
    if cgroup is not None and cgroup.oom_killed():
        return ExecStatus.ML, exit_code, sig
    if sig == signal.SIGXCPU:  # RLIMIT_CPU: a time limit, like the wall clock
        return ExecStatus.TO, exit_code, sig
    if sig is not None:
        return ExecStatus.SG, exit_code, sig
    return (ExecStatus.OK if exit_code == 0 else ExecStatus.RE), exit_code, sig


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


def _populate_workspace(run_dir: Path, files: Mapping[str, str | bytes], spec: SandboxSpec) -> Path:
    """Write `files` into a new workspace owned by the sandbox user, plus passwd/group files."""
    workspace = run_dir / "workspace"
    workspace.mkdir()
    for rel, content in files.items():
        target = workspace / _safe_relative(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
    for path in [workspace, *workspace.rglob("*")]:
        os.chown(path, spec.uid, spec.gid)
    (run_dir / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{spec.uid}:{spec.gid}::{WORKSPACE}:/usr/sbin/nologin\n"
    )
    (run_dir / "group").write_text(f"root:x:0:\nsandbox:x:{spec.gid}:\n")
    return workspace


def _safe_relative(rel: str) -> PurePosixPath:
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"workspace file path must be relative and stay inside: {rel!r}")
    return path
