"""LocalSandbox: run untrusted code on this host under bubblewrap, as an unprivileged user.

A session is a directory on its own size- and inode-capped tmpfs (workspace/ and tmp/, so a
full disk is ENOSPC inside the session, never on the host), one cgroup for memory and process
limits, and an executor (sandbox/bwrap_exec.py) that runs each command under bubblewrap:
through a supervisor that lives as long as the session (`session()`), or in a sandbox of its
own (`run()`, one command, no start-up cost). Layers, outermost first:
  /bin/sh (root)       joins the session's cgroup(s), then execs bwrap; children inherit them
  bwrap (root)         new pid/net/ipc/uts/cgroup namespaces, a fresh root with read-only /usr,
                       the session's /workspace and /tmp, own /proc, minimal /dev, empty
                       environment, and the seccomp deny-list of sandbox/seccomp.py
  then either          setpriv + sh: uid/gid 65534, no capability, no_new_privs, rlimits, exec
  or the supervisor    (uid 0 with CAP_SETUID/SETGID/KILL/SETPCAP only, out of the sandbox
                       user's reach) forks per exec; the child does the same as setpriv + sh
  or the zygote        (the same and CAP_SYS_ADMIN/SYS_CHROOT/CHOWN, without the filter) forks
                       each exec into a fresh sandbox of its own: new mount, pid and IPC
                       namespaces over a fresh tmpfs, then the filter (sandbox/harness/zygote.py);
                       what `run` uses with warm workers
An exec is "ready" once our machinery started the command (a byte from the sandbox user's
shell, or the supervisor's report); without it the failure is ours (XX), and the command
cannot fake it.

Limits: wall clock and output bytes (every process of the run is killed), memory and process
count (the session's cgroup, or RLIMIT_AS / RLIMIT_NPROC where no cgroup is usable, recorded in
ExecResult.notes), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE and RLIMIT_CORE=0 per exec. Nothing a
command starts outlives its exec.

Requires root (bwrap without a user namespace, cgroup writes, mount, chown).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path, PurePosixPath

from sandbox import cgroups, seccomp
from sandbox.base import (
    NO_TREES,
    WORKSPACE,
    Mount,
    SandboxUnavailable,
    SessionLifecycle,
    Trees,
    process_alive,
    reap_once,
    run_once,
)
from sandbox.bwrap_exec import (
    HARNESS_DIR,
    HARNESS_IN_SANDBOX,
    SANDBOX_PYTHON,
    SETPRIV,
    SH,
    OneShotExecutor,
    Outcome,
    Sandboxing,
    SupervisedExecutor,
    ZygoteExecutor,
)
from sandbox.capture import OutputCapture
from sandbox.harness.bundle import runs_builtin_harness
from sandbox.result import ExecResult, infrastructure_error
from sandbox.spec import ENVIRONMENT_ROOT, SandboxSpec
from sandbox.warm_workers import WarmWorkers
from sandbox.workspace import HostWorkspace, as_bytes, clear_directory
from statuses import ExecStatus

BWRAP = "/usr/bin/bwrap"

# crucible-<owner pid>-<session id>-<random>: see LocalSession.__init__ and LocalSandbox.reap.
_SESSION_DIR = re.compile(r"crucible-(?P<owner>\d+)-(?P<session>[0-9a-f]{16})-\w+")
_SYSTEM_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
_ETC_BASE = ("alternatives", "ld.so.cache", "localtime")
_ETC_NETWORK = ("resolv.conf", "hosts", "nsswitch.conf", "gai.conf", "ssl", "ca-certificates")
# Where a warm worker's run may show a read-only tree: not in the sandbox's own layout.
_LAYOUT = {"", "workspace", "tmp", "dev", "proc", "usr", "etc", "bin", "sbin", "lib", "lib64", ".crucible",
           PurePosixPath(ENVIRONMENT_ROOT).parts[1]}
MAX_TREE_BYTES = 16 << 20  # read-only trees a warm worker's run copies in (a grader's: kilobytes)


class LocalSandbox:
    """Sessions on this host under bubblewrap; see the module docstring for the layers."""

    name = "local"

    def __init__(
        self,
        spec: SandboxSpec = SandboxSpec(),  # noqa: B008 (frozen: sharing the default is safe)
        *,
        scratch_dir: Path | None = None,
        cgroup_parent: str = "crucible",
        warm_workers: bool = False,
    ):
        """`scratch_dir` holds session and grading directories (default: see `_default_scratch`);
        `cgroup_parent` names the cgroup directory that per-session cgroups are created in;
        `warm_workers`: `run` forks its fresh sandboxes from zygotes kept between runs (one per
        run at once, until `close`), where the run allows (`_trees`): what a pool of gradings wants.

        Raises SandboxUnavailable when this host cannot isolate as `spec` asks."""
        self.spec = spec
        self.cgroup_parent = cgroup_parent
        self.cgroup_host = cgroups.detect(cgroup_parent)
        self.scratch_dir = Path(scratch_dir or _default_scratch(self.cgroup_host))
        reap_once(f"local:{self.scratch_dir}", self.reap)
        self.has_seccomp = _seccomp_available()
        if spec.overlay and not Path(spec.overlay, "environment.json").is_file():
            raise SandboxUnavailable(f"the environment at {spec.overlay} is not built (crucible env build)")
        self.weaknesses = self._weaknesses()
        if self.weaknesses and not spec.allow_weak_isolation:
            raise SandboxUnavailable(
                "the local sandbox cannot isolate as asked on this host: " + "; ".join(self.weaknesses)
                + " (set SandboxSpec(allow_weak_isolation=True) to run anyway with rlimits)"
            )
        self._workers = WarmWorkers(partial(LocalSession, self, {}, (), executor=ZygoteExecutor)) \
            if warm_workers and self.has_seccomp else None

    def session(self, files: Mapping[str, str | bytes] = {}, mounts: Sequence[Mount] = (),  # noqa: B006
                *, supervised: bool = True) -> LocalSession:
        """A session; `supervised` keeps one sandbox alive for fast execs (see bwrap_exec.py),
        else each exec starts its own. The sandbox dies with the thread that opened the session
        (bwrap's --die-with-parent follows the thread): open and use it in the same thread."""
        return LocalSession(self, files, mounts, executor=SupervisedExecutor if supervised else OneShotExecutor)

    def run(self, command: list[str], files: Mapping[str, str | bytes], mounts: Sequence[Mount] = (),
            protected: Sequence[str] = (), trees: Trees = NO_TREES) -> ExecResult:
        """One command in a fresh sandbox: forked by a warm worker where there are some and the
        run allows (no protected file, every mount a small read-only directory, every tree shown
        outside the sandbox's own layout), else a one-shot session, which starts no supervisor."""
        shown = self._trees(mounts, trees) if self._workers is not None and not protected else None
        if shown is None:
            return run_once(self, command, files, mounts, protected,
                            open_session=partial(self.session, supervised=False), trees=trees)
        started = time.monotonic()
        try:
            worker = self._workers.take()
        except SandboxUnavailable as e:
            return infrastructure_error(self.spec.hash, self.name, str(e), started)
        try:
            return worker.run_fresh(command, files, shown, self._runs_builtin_harness(command, shown))
        finally:
            self._workers.give_back(worker)

    def close(self) -> None:
        """Stop the warm workers (those at work once their runs end); a later `run` of a sandbox
        with warm workers is an infrastructure error."""
        if self._workers is not None:
            self._workers.close()

    def _runs_builtin_harness(self, command: list[str], trees: Mapping[str, Mapping[str, bytes]]) -> bool:
        """Whether a warm worker may run the command as the built-in harness its zygote imported:
        where a task's environment is shown, its PATH is not this host's."""
        path = dict(self.spec.env).get("PATH", "")
        return not self.spec.overlay and not self.spec.interpreter and runs_builtin_harness(command, trees, path)

    def _trees(self, mounts: Sequence[Mount], trees: Trees) -> dict[str, dict[str, bytes]] | None:
        """The trees and the mounts' files by where they are shown, when a warm worker can show
        them (each mount a read-only directory, all shown outside the sandbox's own layout, all
        together small); else None."""
        if not all(map(self._may_show, [*trees, *(mount.sandbox_path for mount in mounts)])):
            return None
        shown = {path: {name: as_bytes(content) for name, content in tree.items()} for path, tree in trees.items()}
        size = sum(len(content) for tree in shown.values() for content in tree.values())
        for mount in mounts:
            if mount.writable or not Path(mount.host_path).is_dir():
                return None
            tree = {str(file.relative_to(mount.host_path)): file for file in Path(mount.host_path).rglob("*")
                    if file.is_file() and not file.is_symlink()}
            size += sum(file.stat().st_size for file in tree.values())
            if size > MAX_TREE_BYTES:
                return None
            shown[mount.sandbox_path] = {name: file.read_bytes() for name, file in tree.items()}
        return shown if size <= MAX_TREE_BYTES else None

    def _may_show(self, sandbox_path: str) -> bool:
        """Whether a warm worker's run may show a tree there: a folder of its own, not in the layout."""
        path = PurePosixPath(sandbox_path)
        return (path.is_absolute() and len(path.parts) >= 2 and path.parts[1] not in _LAYOUT and ".." not in path.parts
                and str(path) != self.spec.workspace_alias)

    def reap(self) -> list[str]:
        """Remove what sessions of owner processes that died without closing them left behind
        (their sandboxes died with them): tmpfs mounts, directories and cgroups. Returns the
        session ids removed."""
        removed = []
        for directory in self.scratch_dir.iterdir():
            match = _SESSION_DIR.fullmatch(directory.name)
            if match is None or directory.is_symlink() or process_alive(int(match["owner"])):
                continue  # scratch may be world-writable: never follow what others planted
            if self.cgroup_host is not None:
                cgroups.RunCgroup(self.cgroup_host, f"{match['owner']}-{match['session']}").destroy()
            try:
                _unmount(directory)
                shutil.rmtree(directory)
            except FileNotFoundError:  # another process reaped it meanwhile
                continue
            removed.append(match["session"])
        return removed

    def _weaknesses(self) -> list[str]:
        found = []
        host = self.cgroup_host
        if host is None or host.memory_parent is None:
            found.append("no writable memory cgroup: memory limited by RLIMIT_AS, MemoryError instead of ML")
        if host is None or host.pids_parent is None:
            found.append("no writable pids cgroup: processes limited by RLIMIT_NPROC, shared by all runs")
        if self.spec.network:
            found.append("network: the local backend can only share the host's (its loopback services and "
                         "the metadata address included); the docker backend isolates it")
        if not self.has_seccomp:
            found.append("no seccomp filter: libseccomp is not usable here")
        return found


class LocalSession(SessionLifecycle):
    """One workspace on a capped tmpfs, one cgroup, and an executor that runs each command
    under bubblewrap (a supervised sandbox, or one sandbox per exec)."""

    _backend_name = "local"
    _infra_errors = (OSError, cgroups.CgroupError, SandboxUnavailable)

    def __init__(self, backend: LocalSandbox, files: Mapping[str, str | bytes], mounts: Sequence[Mount],
                 executor: type[OneShotExecutor | SupervisedExecutor | ZygoteExecutor] = SupervisedExecutor):
        self.id = secrets.token_hex(8)
        self.spec = backend.spec
        self.log: list[ExecResult] = []
        self._backend, self._mounts, self._closed = backend, tuple(mounts), False
        self._cgroup: cgroups.RunCgroup | None = None
        self._executor: OneShotExecutor | SupervisedExecutor | None = None
        self._broken: str | None = None
        _check_host(self.spec)
        self._dir = Path(tempfile.mkdtemp(prefix=f"crucible-{os.getpid()}-{self.id}-", dir=backend.scratch_dir))
        try:
            self._mount_tmpfs()
            self._make_layout()
            self._cgroup = self._make_cgroup()
            self.workspace.put(files)
            self._initial = self.workspace.snapshot()
            sandboxing = Sandboxing(self.spec, self._bwrap_args, self._cgroup, backend.has_seccomp,
                                    self._dir / "sandbox.log")
            self._executor = executor(sandboxing)
        except BaseException as e:  # bad input files included: nothing may be left behind
            self._abandon(e)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the sandbox, remove the cgroup, unmount and delete the session directory."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._executor is not None:
                self._executor.close()
            if self._cgroup is not None:
                self._cgroup.destroy()
        finally:
            _unmount(self._dir)
            shutil.rmtree(self._dir)

    def reset(self, files: Mapping[str, str | bytes] | None = None) -> None:
        """See Session.reset; the supervisor stays (nothing a command started outlived it)."""
        self._check_open()
        # SysV IPC objects live in the sandbox's IPC namespace, which lives as long as the session.
        removed = self.exec(["ipcrm", "--all"])
        if not removed.ok:
            raise SandboxUnavailable(f"the session's IPC objects could not be removed: "
                                     f"{removed.error or removed.stderr.strip()}")
        clear_directory(self._dir / "tmp")
        clear_directory(self._dir / "shm")
        if files is None:
            self.workspace.restore(self._initial)
        else:
            self.workspace.clear()
            self.workspace.put(files)
            self._initial = self.workspace.snapshot()

    @property
    def usable(self) -> bool:
        return not self._closed and self._broken is None

    def run_fresh(self, command: list[str], files: Mapping[str, str | bytes],
                  trees: Mapping[str, Mapping[str, bytes]], harness: bool) -> ExecResult:
        """A warm worker's run (executor ZygoteExecutor): `command` in a fresh sandbox of its own
        holding `files` and the read-only `trees`; `harness`: it is the built-in harness's."""
        self._executor.stage(files, trees, harness)
        try:
            return self.exec(command)
        finally:
            self.log.clear()  # a worker serves thousands of runs: their results are the callers'

    # -- files -------------------------------------------------------------------------------

    def put_files(self, files: Mapping[str, str | bytes]) -> None:
        self._check_open()
        self.workspace.put(files)

    def get_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        self._check_open()
        return self.workspace.get(paths)

    def protect(self, paths: Sequence[str]) -> None:
        self._check_open()
        self.workspace.protect(paths)

    def snapshot(self) -> bytes:
        self._check_open()
        return self.workspace.snapshot()

    def restore(self, snapshot: bytes) -> None:
        self._check_open()
        self.workspace.restore(snapshot)

    # -- execution ---------------------------------------------------------------------------

    def _run(self, command, stdout, stderr, deadline, on_output, started) -> ExecResult:
        if self._broken:
            raise SandboxUnavailable(f"the session is broken ({self._broken}); open a new one")
        outcome = Outcome()
        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        if self._cgroup:
            self._cgroup.reset_peak_memory()
        self._executor.execute(command, stdout, stderr, outcome, deadline, on_output)
        self._broken = outcome.broken
        outcome.wall_s = time.monotonic() - started
        if self._cgroup is not None:
            outcome.oom_killed = self._cgroup.oom_kills() > oom_before
        return self._result(outcome, stdout, stderr)

    def _result(self, outcome: Outcome, stdout: OutputCapture, stderr: OutputCapture) -> ExecResult:
        status, exit_code, sig = _classify(outcome)
        error = None
        if status is ExecStatus.XX:
            error = f"SandboxStartError: {outcome.broken or 'the command never started'}"
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

    def _bwrap_args(self, seccomp_fd: int | None, caps: tuple[str, ...]) -> list[str]:
        args = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
        for cap in caps:
            args += ["--cap-add", cap]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if not self.spec.network:
            args.append("--unshare-net")  # a fresh namespace with loopback only
        for key, value in self.spec.env:
            args += ["--setenv", key, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for link, target in _SYSTEM_LINKS.items():
            args += ["--symlink", target, link]
        if self.spec.overlay:  # the task's environment: its packages beside the host's /usr
            for parent in reversed(PurePosixPath(ENVIRONMENT_ROOT).parents[:-1]):
                args += ["--perms", "0755", "--dir", str(parent)]  # else 0700: unreachable
            args += ["--ro-bind", self.spec.overlay, ENVIRONMENT_ROOT]
        if self.spec.interpreter:  # the environment's Python, where its own build looks for its libraries
            for parent in reversed(PurePosixPath(self.spec.interpreter).parents[:-1]):
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", self.spec.interpreter, self.spec.interpreter]
        args += ["--perms", "0755", "--dir", "/etc"]  # else bwrap makes it 0700: unreadable
        for name in _ETC_BASE + (_ETC_NETWORK if self.spec.network else ()):
            if os.path.lexists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        args += ["--ro-bind", str(self._dir / "passwd"), "/etc/passwd",
                 "--ro-bind", str(self._dir / "group"), "/etc/group",
                 "--ro-bind", str(HARNESS_DIR), HARNESS_IN_SANDBOX,
                 "--proc", "/proc", "--dev", "/dev",
                 "--bind", str(self._dir / "shm"), "/dev/shm",
                 "--bind", str(self._dir / "tmp"), "/tmp",
                 "--bind", str(self._dir / "workspace"), WORKSPACE]
        made = set()
        if self.spec.workspace_alias:
            for parent in reversed(PurePosixPath(self.spec.workspace_alias).parents[:-1]):
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--symlink", WORKSPACE, self.spec.workspace_alias]
        for m in self._mounts:
            # Directories bwrap creates on the way to a mount point are 0700 unless told: the
            # sandbox user could not reach /logs/verifier through them.
            for parent in reversed(PurePosixPath(m.sandbox_path).parents[:-1]):
                if str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--bind" if m.writable else "--ro-bind", str(m.host_path), m.sandbox_path]
        return args + ["--chdir", WORKSPACE, "--"]

    def _mount_tmpfs(self) -> None:
        limits = self.spec.limits
        # 0700: other host users cannot reach the workspace (nor set-uid files in it, which
        # nosuid disarms anyway).
        _mount_tmpfs(self._dir, f"size={limits.disk_mb}m,nr_inodes={limits.inodes},mode=0700")

    def _make_layout(self) -> None:
        spec = self.spec
        workspace = self._dir / "workspace"
        workspace.mkdir()
        os.chown(workspace, spec.uid, spec.gid)
        for shared in ("tmp", "shm"):  # /tmp and /dev/shm: inside the session's disk cap
            (self._dir / shared).mkdir()
            (self._dir / shared).chmod(0o1777)
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


def _classify(outcome: Outcome) -> tuple[ExecStatus, int | None, int | None]:
    """(status, exit code, signal) of a run.

    A run that never started, or whose sandbox stopped answering, is XX whatever else happened
    (unless the memory limit was hit meanwhile: ML); an OOM kill anywhere in the run makes it
    ML, even if the command survived it (the limit was hit either way).
    """
    exit_code, sig = outcome.exit_code, outcome.signal
    if outcome.oom_killed and outcome.ready:
        return ExecStatus.ML, exit_code, sig
    if not outcome.ready or outcome.broken or not outcome.finished:
        return ExecStatus.XX, exit_code, sig
    if outcome.killed_for is not None:
        return outcome.killed_for, exit_code, sig
    if sig == signal.SIGXCPU:  # RLIMIT_CPU: a time limit, like the wall clock
        return ExecStatus.TO, exit_code, sig
    if sig is not None:
        return ExecStatus.SG, exit_code, sig
    return (ExecStatus.OK if exit_code == 0 else ExecStatus.RE), exit_code, sig


def _seccomp_available() -> bool:
    try:
        seccomp.bpf_program()
    except seccomp.SeccompUnavailable:
        return False
    return True


def _check_host(spec: SandboxSpec) -> None:
    if spec.image != "host" and not spec.overlay:  # an environment's image is its overlay here
        raise SandboxUnavailable(f"the local backend runs image 'host' only, not {spec.image!r}")
    for tool in (BWRAP, SH, SETPRIV, SANDBOX_PYTHON):
        if not os.access(tool, os.X_OK):
            raise SandboxUnavailable(f"{tool} is missing (install bubblewrap and python3: scripts/install-system-packages)")


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


_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


def _mount_tmpfs(target: Path, options: str) -> None:
    if _libc.mount(b"tmpfs", bytes(target), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs on {target}: {os.strerror(code)}")


def _unmount(target: Path) -> None:
    """Detach the session's tmpfs; a directory that was never mounted is fine."""
    if _libc.umount2(bytes(target), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0 and ctypes.get_errno() != errno.EINVAL:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")
