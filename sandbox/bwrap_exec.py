"""How a local session runs its commands under bubblewrap: two executors with one contract.

- `OneShotExecutor`: a fresh bubblewrap sandbox per exec (bwrap -> setpriv -> sh -> command).
  Nothing to start up front: the cheapest way to run one command, which is what grading does.
- `SupervisedExecutor`: one bubblewrap sandbox for the session's whole life, whose supervisor
  (sandbox/harness/supervisor.py) forks each exec: it costs an interpreter start once, then
  every exec is a few milliseconds. What multi-turn sessions use.
- `ZygoteExecutor`: the same, but each exec is a fresh sandbox of its own (new mount, pid and IPC
  namespaces over a fresh tmpfs holding the files it is given), forked by a zygote
  (sandbox/harness/zygote.py) that has the built-in harness imported. What a warm grading
  worker of LocalSandbox.run uses.

Both put the command in the same namespaces, mounts, seccomp filter, cgroup and rlimits, as
uid 65534 without capabilities; both kill everything the command left behind when it ends, and
report into an `Outcome`.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sandbox import cgroups, seccomp
from sandbox.base import WORKSPACE, OutputCallback, SandboxUnavailable, tree_file_name
from sandbox.capture import OutputCapture
from sandbox.spec import Limits, SandboxSpec
from sandbox.workspace import as_bytes, safe_relative, write_all
from statuses import ExecStatus

SH = "/bin/sh"
SETPRIV = "/usr/bin/setpriv"
# Debian's interpreter runs the supervisor: it needs nothing outside /usr (a pyenv Python
# would need its own prefix bound in).
SANDBOX_PYTHON = "/usr/bin/python3"
HARNESS_DIR = Path(__file__).with_name("harness")  # shown read-only at /.crucible
HARNESS_IN_SANDBOX = "/.crucible"
SUPERVISOR_IN_SANDBOX = f"{HARNESS_IN_SANDBOX}/supervisor.py"
ZYGOTE_IN_SANDBOX = f"{HARNESS_IN_SANDBOX}/zygote.py"
# Enough to switch to the sandbox user, clear its capabilities and kill what it leaves.
SUPERVISOR_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SETPCAP")
# And to make each run's namespaces and mounts (and go back to its own), and give its workspace to the sandbox user.
ZYGOTE_CAPS = (*SUPERVISOR_CAPS, "CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_CHOWN")
NOFILE = 1024
# With a pids cgroup the per-session limit lives there; RLIMIT_NPROC counts every uid-65534
# process on the machine, so it is only a machine-wide backstop that parallel runs share.
NPROC_BACKSTOP = 4096
MARSHAL_VERSION = 4  # the supervisor's Python may differ from ours; version 4 reads on both
_READ_CHUNK = 1 << 16
_START_TIMEOUT_S = 10.0
_KILL_GRACE_S = 5.0  # how long the supervisor may take to report after we asked for a kill

# Joins the cgroups listed after the count, then execs the rest. $$ is this shell = bwrap's pid.
_JOIN_CGROUPS = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done;'
    ' exec "$@"'
)
# One-shot: runs as the sandbox user; the ready byte is the last thing before the command.
_LOWER_LIMITS_AND_EXEC = "{ulimits} && unset PWD OLDPWD && printf R >&0 && exec 0</dev/null && exec \"$@\""


@dataclass
class Outcome:
    """What happened to the command, before it is turned into an ExecStatus."""

    ready: bool = False  # the command was started by our machinery
    killed_for: ExecStatus | None = None  # TO or OL when we killed the sandbox's processes
    finished: bool = False
    exit_code: int | None = None
    signal: int | None = None
    cpu_s: float = 0.0
    max_rss_bytes: int | None = None
    oom_killed: bool = False  # the session cgroup counted an OOM kill during this run
    broken: str | None = None  # the supervisor stopped answering: the session is unusable
    wall_s: float = 0.0

    def set_wait_status(self, status: int) -> None:
        self.finished = True
        self.exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        self.signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


@dataclass(frozen=True)
class Sandboxing:
    """What both executors take from the session: the bwrap command line and the limits."""

    spec: SandboxSpec
    bwrap_args: Callable[[int | None, tuple[str, ...]], list[str]]  # (seccomp fd, capabilities)
    cgroup: cgroups.RunCgroup | None
    has_seccomp: bool
    log_path: Path  # bwrap's and the supervisor's own messages

    def join_args(self) -> list[str]:
        files = self.cgroup.procs_files if self.cgroup is not None else []
        return [str(len(files)), *files]

    def launch(self, tail: list[str], stdin, stdout, stderr, extra_fds: tuple[int, ...] = (),
               caps: tuple[str, ...] = (), filtered: bool = True) -> subprocess.Popen:
        """bwrap running `tail`; `filtered`: under the seccomp deny-list (else `tail` applies it)."""
        seccomp_fd = seccomp.bpf_fd() if self.has_seccomp and filtered else None
        argv = [SH, "-c", _JOIN_CGROUPS, "sh", *self.join_args(), *self.bwrap_args(seccomp_fd, caps), *tail]
        try:
            return subprocess.Popen(
                argv, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True, env={}, cwd="/",
                pass_fds=extra_fds + (() if seccomp_fd is None else (seccomp_fd,)),
            )
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()[-2000:] or "no output"
        except OSError:
            return "no log"


class OneShotExecutor:
    """A fresh bubblewrap sandbox for every exec."""

    def __init__(self, sandboxing: Sandboxing):
        self.sandboxing = sandboxing

    def execute(self, command: list[str], stdout: OutputCapture, stderr: OutputCapture, outcome: Outcome,
                deadline: float, on_output: OutputCallback | None) -> None:
        spec = self.sandboxing.spec
        tail = [SETPRIV, "--reuid", str(spec.uid), "--regid", str(spec.gid), "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--",
                SH, "-c", _LOWER_LIMITS_AND_EXEC.format(ulimits=_ulimits(spec.limits, self.sandboxing.cgroup)),
                "sh", *command]
        ready_r, ready_w = os.pipe()
        try:
            proc = self.sandboxing.launch(tail, ready_w, subprocess.PIPE, subprocess.PIPE)
        finally:
            os.close(ready_w)
        try:
            self._pump(proc, ready_r, stdout, stderr, outcome, deadline, on_output)
        finally:
            os.close(ready_r)
            proc.stdout.close()
            proc.stderr.close()
        if not outcome.ready:  # bwrap failed: its message is the error
            outcome.broken = f"bwrap: exit {outcome.exit_code}: {stderr.text.strip()[-2000:]}"

    def _pump(self, proc, ready_r, stdout, stderr, outcome: Outcome, deadline: float, on_output) -> None:
        """Read both streams and the ready pipe until the sandbox exits or a limit is hit."""
        with selectors.DefaultSelector() as sel:
            sel.register(ready_r, selectors.EVENT_READ, None)
            sel.register(proc.stdout, selectors.EVENT_READ, stdout)
            sel.register(proc.stderr, selectors.EVENT_READ, stderr)
            while sel.get_map() and outcome.killed_for is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    outcome.killed_for = ExecStatus.TO
                    break
                for key, _ in sel.select(remaining):
                    if key.data is None:
                        if os.read(ready_r, 1):
                            outcome.ready = True
                        else:
                            sel.unregister(ready_r)
                    elif not _take_output(key.fd, key.data, on_output):
                        sel.unregister(key.fileobj)
                if stdout.total + stderr.total > self.sandboxing.spec.limits.output_bytes:
                    outcome.killed_for = ExecStatus.OL
        if outcome.killed_for is not None:
            _kill_group(proc.pid)
        self._reap(proc, outcome, deadline)

    @staticmethod
    def _reap(proc, outcome: Outcome, deadline: float) -> None:
        """Wait for bwrap, with its resource usage; kill it if it outlives the deadline."""
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline and outcome.killed_for is None:
                outcome.killed_for = ExecStatus.TO
                _kill_group(proc.pid)
            if time.monotonic() > deadline + _KILL_GRACE_S:  # unkillable (stuck in the kernel)
                outcome.broken = "bwrap did not die after SIGKILL"
                return
            time.sleep(0.001)
        proc.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
        outcome.set_wait_status(status)
        # bwrap reports a command killed by signal N as exit code 128+N (so a command that
        # itself exits with 128+N reads as signal N; both are failures).
        if outcome.exit_code is not None and 128 < outcome.exit_code <= 128 + 64:
            outcome.exit_code, outcome.signal = None, outcome.exit_code - 128
        outcome.cpu_s = usage.ru_utime + usage.ru_stime
        outcome.max_rss_bytes = usage.ru_maxrss * 1024

    def close(self) -> None:
        pass  # nothing outlives an exec


class SupervisedExecutor:
    """One bubblewrap sandbox for the session; its supervisor forks each exec."""

    _program = SUPERVISOR_IN_SANDBOX
    _caps = SUPERVISOR_CAPS
    _filtered = True  # the supervisor runs under the deny-list itself

    def __init__(self, sandboxing: Sandboxing):
        self.sandboxing = sandboxing
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control: socket.socket | None = ours
        with open(sandboxing.log_path, "ab") as log:
            try:
                tail = [SANDBOX_PYTHON, "-I", "-S", self._program, str(theirs.fileno())]
                self._proc = sandboxing.launch(tail, subprocess.DEVNULL, log, log, (theirs.fileno(),), self._caps,
                                               self._filtered)
            finally:
                theirs.close()
        with selectors.DefaultSelector() as sel:  # not select(): a run of a thousand episodes holds fds past 1024
            sel.register(ours, selectors.EVENT_READ)
            ready = sel.select(_START_TIMEOUT_S)
        if not ready or not ours.recv(1 << 16):
            self.close()
            raise SandboxUnavailable(f"the sandbox did not start: {sandboxing.log_text()}")

    def execute(self, command: list[str], stdout: OutputCapture, stderr: OutputCapture, outcome: Outcome,
                deadline: float, on_output: OutputCallback | None) -> None:
        request, sent = self._request(command)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            socket.send_fds(self._control, [marshal.dumps(request, MARSHAL_VERSION)], [out_w, err_w, *sent])
        finally:
            for fd in (out_w, err_w, *sent):
                os.close(fd)
        try:
            self._pump(out_r, err_r, stdout, stderr, outcome, deadline, on_output)
        finally:
            os.close(out_r)
            os.close(err_r)
        if outcome.broken:
            self.close()  # takes every process of the session with it

    def _request(self, command: list[str]) -> tuple[dict, list[int]]:
        """The exec message, and the descriptors it sends beside the command's stdout and stderr."""
        spec = self.sandboxing.spec
        return {"op": "exec", "argv": command, "env": dict(spec.env), "cwd": WORKSPACE, "uid": spec.uid,
                "gid": spec.gid, "rlimits": _rlimits(spec.limits, self.sandboxing.cgroup)}, []

    def _pump(self, out_r, err_r, stdout, stderr, outcome: Outcome, deadline: float, on_output) -> None:
        """Read both streams and the supervisor's reports until the command has finished and
        its output is drained, asking the supervisor to kill everything when a limit is hit."""
        kill_deadline = None
        with selectors.DefaultSelector() as sel:
            sel.register(self._control, selectors.EVENT_READ, None)
            sel.register(out_r, selectors.EVENT_READ, stdout)
            sel.register(err_r, selectors.EVENT_READ, stderr)
            while not outcome.finished or sel.get_map():  # the report, then the output's end
                now = time.monotonic()
                if kill_deadline is None and now >= deadline:
                    kill_deadline = self._kill(outcome, ExecStatus.TO)
                if kill_deadline is not None and now >= kill_deadline:
                    outcome.broken = "the supervisor did not report after a kill"
                    return
                for key, _ in sel.select(max((kill_deadline or deadline) - now, 0)):
                    if key.data is not None:
                        if not _take_output(key.fd, key.data, on_output):
                            sel.unregister(key.fd)
                    elif not self._report(outcome):
                        outcome.broken = outcome.broken or "the supervisor died"
                        return
                    elif outcome.finished:
                        sel.unregister(self._control)  # only the output is left to drain
                if kill_deadline is None and stdout.total + stderr.total > self.sandboxing.spec.limits.output_bytes:
                    kill_deadline = self._kill(outcome, ExecStatus.OL)

    def _report(self, outcome: Outcome) -> bool:
        """Take one message of the supervisor; False when it has gone or failed to start the
        command (then `outcome.broken` says why)."""
        data = self._control.recv(1 << 16)
        if not data:
            return False
        message = marshal.loads(data)
        if "started" in message:
            outcome.ready = True
        elif "spawn_failed" in message:
            outcome.broken = f"the command could not be set up: {message['spawn_failed']}"
            return False
        elif "exit" in message:
            outcome.set_wait_status(message["exit"])
            outcome.cpu_s = message["cpu_s"]
            outcome.max_rss_bytes = message["max_rss_kb"] * 1024
        return True

    def _kill(self, outcome: Outcome, reason: ExecStatus) -> float:
        outcome.killed_for = reason
        self._control.send(marshal.dumps({"op": "kill"}, MARSHAL_VERSION))
        return time.monotonic() + _KILL_GRACE_S

    def close(self) -> None:
        """Closing the control socket ends the supervisor, and with it bwrap and the whole pid
        namespace; kill the process group if that does not happen at once."""
        if self._control is not None:
            self._control.close()
            self._control = None
        try:
            self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc.pid)
            self._proc.wait()


class ZygoteExecutor(SupervisedExecutor):
    """One bubblewrap sandbox holding a zygote; each exec is a fresh sandbox it forks, holding the
    files `stage` gave it and nothing any earlier exec left (see sandbox/harness/zygote.py)."""

    _program = ZYGOTE_IN_SANDBOX
    _caps = ZYGOTE_CAPS
    _filtered = False  # the zygote makes namespaces and mounts; each run loads the deny-list before it runs

    def __init__(self, sandboxing: Sandboxing):
        if not sandboxing.has_seccomp:
            raise SandboxUnavailable("a warm worker needs the seccomp filter, which each of its runs loads")
        super().__init__(sandboxing)
        program = seccomp.bpf_fd()
        try:
            socket.send_fds(self._control, [marshal.dumps({"op": "seccomp"}, MARSHAL_VERSION)], [program])
        finally:
            os.close(program)
        self._staged: tuple[dict, dict, bool] | None = None

    def stage(self, workspace: Mapping[str, str | bytes], trees: Mapping[str, Mapping[str, bytes]],
              harness: bool) -> None:
        """The files of the next exec: the workspace's, and read-only trees by where they are
        shown; `harness`: the command is the built-in harness's, which the zygote runs itself."""
        self._staged = ({str(safe_relative(path)): as_bytes(content) for path, content in workspace.items()},
                        {mount: {str(tree_file_name(path)): content for path, content in tree.items()}
                         for mount, tree in trees.items()}, harness)

    def _request(self, command: list[str]) -> tuple[dict, list[int]]:
        if self._staged is None:
            raise ValueError("a warm worker runs only what was staged for it")
        (workspace, trees, harness), self._staged = self._staged, None
        request, _ = super()._request(command)
        limits = self.sandboxing.spec.limits
        files = os.memfd_create("crucible-run-files", os.MFD_CLOEXEC)
        write_all(files, marshal.dumps({"workspace": workspace, "trees": trees}, MARSHAL_VERSION))
        os.lseek(files, 0, os.SEEK_SET)
        return {**request, "op": "run", "tmpfs": f"size={limits.disk_mb}m,nr_inodes={limits.inodes},mode=0755",
                "trees": list(trees), "harness": harness}, [files]


def _take_output(fd: int, capture: OutputCapture, on_output: OutputCallback | None) -> bool:
    """Read what `fd` has into `capture`; False at end of stream."""
    chunk = os.read(fd, _READ_CHUNK)
    if not chunk:
        return False
    capture.add(chunk)
    if on_output is not None:
        on_output(capture.name, chunk)
    return True


def _kill_group(pgid: int) -> None:
    # bwrap leads its own process group; killing it takes its pid namespace (all of it) down.
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


def _rlimits(limits: Limits, cgroup) -> list[tuple[str, int, int]]:
    """(resource name, soft, hard) the supervisor sets for each command."""
    has_pids = cgroup is not None and cgroup.has_pids
    found = [
        ("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),  # SIGXCPU at the soft limit, SIGKILL 1 s later
        ("RLIMIT_FSIZE", limits.disk_mb << 20, limits.disk_mb << 20),
        ("RLIMIT_NOFILE", NOFILE, NOFILE),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", *(2 * [NPROC_BACKSTOP if has_pids else limits.pids])),
    ]
    if cgroup is None or not cgroup.has_memory:
        found.append(("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20))
    return found


def _ulimits(limits: Limits, cgroup) -> str:
    """The same limits as shell `ulimit` commands for the one-shot path (dash takes one
    resource per call; -f and -v count 512-byte blocks and KiB)."""
    flags = {"RLIMIT_CPU": "t", "RLIMIT_FSIZE": "f", "RLIMIT_NOFILE": "n", "RLIMIT_CORE": "c",
             "RLIMIT_NPROC": "p", "RLIMIT_AS": "v"}
    scale = {"RLIMIT_FSIZE": 512, "RLIMIT_AS": 1024}
    cmds = []
    for name, soft, hard in _rlimits(limits, cgroup):
        div = scale.get(name, 1)
        # soft first: it must stay <= hard when hard is lowered after it
        cmds += [f"ulimit -S -{flags[name]} {soft // div}", f"ulimit -H -{flags[name]} {hard // div}"]
    return " && ".join(cmds)
