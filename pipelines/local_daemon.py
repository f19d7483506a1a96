"""The Dagster daemon that takes a command's queued runs off the instance's queue and launches them.

Where the instance already has a daemon (`crucible ui`, `dagster dev`, a deployment's), its runs
go to that one. Where it has none, the command starts one for its own duration, as `dagster dev`
does: a code server that imports the code location once, on a socket of its own, and
`dagster-daemon run` on a workspace that points at it. Runs are submitted through the same
socket (pipelines/run_submission.py), so a submission does not import the project again.

Commands on one machine share the daemon one of them started: the starter holds a lock in
DAGSTER_HOME while its daemon lives (the lock file names it), and the others leave the launching
to it. A daemon a command started lives no longer than its starter holds the lock: the starter
stops it before letting go, and the kernel kills it with a starter that was killed. So a
command-started daemon whose starter holds no lock is gone, however fresh its last heartbeat
(those look alive for minutes): a command still following runs, or started after a kill, then
starts its own at once (`ensure`, called while it follows one). The code server stops last, once
the runs it launched have ended: a run's worker is its child.

While it lives, the daemon does all a daemon does: it evaluates the sensors that are on
(`keep_analytics_current` is, and may queue a reward_analytics run between iterations), watches
runs (monitoring) and retries those whose worker died.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from pipelines.errors import RunFailed

PROJECT_DIR = Path(__file__).resolve().parent.parent
LOCATION = "pipelines.definitions"  # workspace.yaml's code location: the UI lists the runs under it
# A daemon heartbeats every 30 s: one silent for five beats is gone (a loaded machine delays beats).
HEARTBEAT_FRESH_S = 150.0
COMMAND_DAEMONS_FILE = ".command-daemons"  # in DAGSTER_HOME: the ids of the daemons commands started
LOCK_FILE = ".local-daemon.lock"  # in DAGSTER_HOME: held by the command whose daemon lives; names it
GRPC_INFO_TAG = ".dagster/grpc_info"  # on a run: the code server that started its worker
START_TIMEOUT_S = 600.0  # importing the code location on a loaded 2-core machine
STOP_TIMEOUT_S = 60.0
CODE_SERVER_GRACE_S = 1.0
POLL_S = 1.0
UNFINISHED = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
# A command's code server lives in a folder named for this machine (its machine id; where the system
# has none, its host name, which a cloud VM may change on restart), so that a run's record (the socket
# path of the code server that started its worker) says on which machine its worker ran.
MACHINE_ID = Path("/etc/machine-id")
MACHINE = hashlib.sha256(
    (MACHINE_ID.read_text().strip() if MACHINE_ID.is_file() else os.uname().nodename).encode()).hexdigest()[:8]
SERVER_FOLDER = re.compile(r"/crucible-(?P<machine>[0-9a-f]{8})-[^/]+/[^/]+$")


def launched_here(socket_path: str) -> bool:
    """Whether a command's code server on this machine listens, or listened, on that socket."""
    found = SERVER_FOLDER.search(socket_path)
    return found is not None and found["machine"] == MACHINE


def live_daemons(instance: DagsterInstance) -> set[str]:
    """The ids of the daemons heartbeating on this instance now, less those commands started
    whose starter no longer holds the lock (stopped, or killed with it)."""
    home = Path(instance.root_directory)
    started = (home / COMMAND_DAEMONS_FILE).read_text().split() if (home / COMMAND_DAEMONS_FILE).exists() else []
    return _heartbeating(instance) - (set(started) - {_locked_daemon(home / LOCK_FILE)})


def _heartbeating(instance: DagsterInstance) -> set[str]:
    return {beat.daemon_id for beat in instance.get_daemon_heartbeats().values()
            if time.time() - beat.timestamp < HEARTBEAT_FRESH_S}


def _locked_daemon(lock: Path) -> str | None:
    """The daemon id the lock file names while a command holds it; None when none does."""
    if not lock.exists():
        return None
    with lock.open("r") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return probe.read().strip() or None
        fcntl.flock(probe, fcntl.LOCK_UN)
        return None


class LocalDaemon:
    """The daemon a command relies on: `ensure()` before it queues a run and while one waits,
    `close()` when it ends; nothing starts before the first `ensure()`, so a command with nothing
    to run starts nothing. `workspace` is what submissions load the code location from."""

    def __init__(self, instance: DagsterInstance, settings: dict[str, str],
                 say: Callable[[str], None] = lambda line: None):
        """`settings`: the variables the processes it starts read the deployment's settings from;
        `say`: where it tells what it waits for."""
        self.instance, self.say = instance, say
        self.environment = {**os.environ, **settings}
        self.workspace = PROJECT_DIR / "workspace.yaml"
        self._lock = (Path(instance.root_directory) / LOCK_FILE).open("a")
        self._folder: Path | None = None  # our code server's socket, workspace file and logs
        self._code_server: subprocess.Popen | None = None
        self._daemon: subprocess.Popen | None = None
        self._ensuring = threading.Lock()
        # The kernel sends a process its parent-death signal when the *thread* that started it ends:
        # the services are started by one thread that lives as long as this object, not by whichever
        # thread (an overlapping iteration's, which ends before the command) first asks for them.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-daemon")

    def __enter__(self) -> LocalDaemon:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ensure(self) -> None:
        """Start a daemon unless one takes runs off the queue, or another command here starts one
        (the threads following overlapping iterations ask at once: one at a time does it)."""
        with self._ensuring:
            self._ensure()

    def _ensure(self) -> None:
        if self._daemon is not None:
            self._check_alive()
            return
        if self._code_server is None:
            self._start_code_server()  # used for submissions whoever launches them
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another command on this machine runs (or is starting) the daemon
        self._name_in_lock("")  # a killed starter's daemon died with it
        if live_daemons(self.instance):
            fcntl.flock(self._lock, fcntl.LOCK_UN)  # the instance's own daemon
            return
        self._start_daemon()

    def close(self) -> None:
        """Stop what this command started: the daemon first (no more launches), then, once the
        runs it launched have ended, the code server."""
        if self._daemon is not None:
            _stop(self._daemon)
            self._daemon = None
            self._name_in_lock("")
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
        if self._code_server is not None:
            self._wait_for_launched_runs()
            # `dagster api grpc` defers interrupts and serves on; with no run of its left it holds
            # nothing, so it is killed after a moment.
            _stop(self._code_server, CODE_SERVER_GRACE_S)
            self._code_server = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._starter.shutdown()

    def _start_code_server(self) -> None:
        # Short: a socket path has 107 bytes.
        self._folder = Path(tempfile.mkdtemp(prefix=f"crucible-{MACHINE}-"))
        socket = self._folder / "code.sock"
        self._code_server = self._start(
            [console_script("dagster"), "api", "grpc", "--module-name", LOCATION, "--working-directory",
             str(PROJECT_DIR), "--location-name", LOCATION, "--socket", str(socket)],
            self._folder / "code-server.log", self.environment, dies_with=signal.SIGKILL)
        self.workspace = self._folder / "workspace.yaml"
        self.workspace.write_text(yaml.safe_dump(
            {"load_from": [{"grpc_server": {"socket": str(socket), "location_name": LOCATION}}]}))
        self._wait_for(socket.exists, "the code server", self._code_server, self._folder / "code-server.log")

    def _start_daemon(self) -> None:
        log, before = self._folder / "daemon.log", _heartbeating(self.instance)
        self._daemon = self._start([console_script("dagster-daemon"), "run", "-w", str(self.workspace)], log,
                              self.environment)
        self._wait_for(lambda: _heartbeating(self.instance) - before, "the Dagster daemon", self._daemon, log)
        daemon_id = min(_heartbeating(self.instance) - before)  # ours: the one that was not there before
        self._name_in_lock(daemon_id)  # first: once in the file below, only the lock says it lives
        with (Path(self.instance.root_directory) / COMMAND_DAEMONS_FILE).open("a") as started:
            started.write(f"{daemon_id}\n")

    def _start(self, command: list[str], log: Path, environment: dict[str, str],
               dies_with: signal.Signals = signal.SIGTERM) -> subprocess.Popen:
        return self._starter.submit(_spawn, command, log, environment, dies_with).result()

    def _name_in_lock(self, daemon_id: str) -> None:
        self._lock.truncate(0)
        self._lock.write(daemon_id)
        self._lock.flush()

    def _wait_for(self, ready, what: str, process: subprocess.Popen, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(f"{what} did not start: {_tail(log)}")
            time.sleep(POLL_S)

    def _check_alive(self) -> None:
        if self._daemon.poll() is not None:
            raise RunFailed(f"the Dagster daemon this command started exited ({self._daemon.returncode}): "
                            f"{_tail(self._folder / 'daemon.log')}")

    def _wait_for_launched_runs(self) -> None:
        """Runs whose worker our code server started (a run of another command, launched by our
        daemon) end before it stops."""
        socket, told = str(self._folder / "code.sock"), False
        while launched := [run.run_id for run in self.instance.get_runs(RunsFilter(statuses=UNFINISHED))
                           if socket in run.tags.get(GRPC_INFO_TAG, "")]:
            if not told:
                self.say(f"waiting for run {launched[0][:8]} to end: this command's code server runs its worker")
                told = True
            time.sleep(POLL_S)


def console_script(name: str) -> str:
    """A console script of this Python's environment (the venv's, not whatever PATH finds first)."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


def _spawn(command: list[str], log: Path, environment: dict[str, str],
           dies_with: signal.Signals = signal.SIGTERM) -> subprocess.Popen:
    """A service process that ends with this thread however it ends: the kernel sends it `dies_with`
    (the daemon stops cleanly on SIGTERM; `dagster api grpc` defers interrupts and serves on, so
    it is killed, and a run worker it started goes on to its run's end)."""
    with log.open("ab") as out:
        return subprocess.Popen(["setpriv", "--pdeathsig", dies_with.name.removeprefix("SIG"), *command],
                                cwd=PROJECT_DIR, env=environment,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(process: subprocess.Popen, grace_s: float = STOP_TIMEOUT_S) -> None:
    """Interrupt it (the daemon then stops its threads cleanly), and kill it after `grace_s`."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " / ".join(text[-lines:]) or "(it printed nothing)"
