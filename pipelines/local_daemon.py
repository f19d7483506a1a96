"""The Dagster daemon that takes a command's queued runs off the instance's queue and launches them.

Where the instance already has a daemon (`crucible ui`, `dagster dev`, a deployment's), its runs
go to that one. Where it has none, the command starts one for its own duration, as `dagster dev`
does: a code server that imports the code location once, on a socket of its own, and
`dagster-daemon run` on a workspace that points at it. Runs are submitted through the same
socket (pipelines/run_submission.py), so a submission does not import the project again.

Commands on one machine share the daemon one of them started: the starter holds a lock in
DAGSTER_HOME while its daemon lives, and the others leave the launching to it. When the starter
ends it stops its daemon, wipes its heartbeat (a stopped daemon's would look alive for a minute)
and lets go of the lock; a command still waiting for runs then starts its own (`ensure`, called
while a run waits). The code server stops last, once the runs it launched have ended: a run's
worker is its child.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from pipelines.errors import RunFailed

PROJECT_DIR = Path(__file__).resolve().parent.parent
LOCATION = "pipelines.definitions"  # workspace.yaml's code location: the UI lists the runs under it
DEQUEUER = "QUEUED_RUN_COORDINATOR"  # the daemon that takes runs off the queue
# The daemon heartbeats every 30 s: one silent for longer than two beats and a margin is gone.
HEARTBEAT_FRESH_S = 75.0
START_TIMEOUT_S = 600.0  # importing the code location on a loaded 2-core machine
STOP_TIMEOUT_S = 60.0
POLL_S = 1.0
UNFINISHED = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def daemon_heartbeating(instance: DagsterInstance) -> bool:
    """Whether a daemon takes runs off this instance's queue now."""
    beat = instance.get_daemon_heartbeats().get(DEQUEUER)
    return beat is not None and time.time() - beat.timestamp < HEARTBEAT_FRESH_S


class LocalDaemon:
    """The daemon a command relies on: `ensure()` before it queues a run and while one waits,
    `close()` when it ends. `workspace` is what submissions load the code location from."""

    def __init__(self, instance: DagsterInstance, settings: dict[str, str]):
        """`settings`: the variables the processes it starts read the deployment's settings from."""
        self.instance = instance
        self.environment = {**os.environ, **settings}
        self.workspace = PROJECT_DIR / "workspace.yaml"
        self._lock = (Path(instance.root_directory) / ".local-daemon.lock").open("a")
        self._folder: Path | None = None  # our code server's socket, workspace file and logs
        self._code_server: subprocess.Popen | None = None
        self._daemon: subprocess.Popen | None = None

    def __enter__(self) -> LocalDaemon:
        self.ensure()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ensure(self) -> None:
        """Start a daemon unless one takes runs off the queue, or another command here starts one."""
        if self._daemon is not None:
            self._check_alive()
            return
        if self._code_server is None:
            self._start_code_server()  # used for submissions whoever launches them
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another command on this machine runs (or is starting) the daemon
        if daemon_heartbeating(self.instance):
            fcntl.flock(self._lock, fcntl.LOCK_UN)  # the instance's own daemon
            return
        self._start_daemon()

    def close(self) -> None:
        """Stop what this command started: the daemon first (no more launches), then, once the
        runs it launched have ended, the code server."""
        if self._daemon is not None:
            _stop(self._daemon)
            self._daemon = None
            self.instance.wipe_daemon_heartbeats()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
        if self._code_server is not None:
            self._wait_for_launched_runs()
            _stop(self._code_server)
            self._code_server = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _start_code_server(self) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="crucible-"))  # short: a socket path has 107 bytes
        socket = self._folder / "code.sock"
        self._code_server = _start(
            [console_script("dagster"), "api", "grpc", "--module-name", LOCATION, "--working-directory",
             str(PROJECT_DIR), "--location-name", LOCATION, "--socket", str(socket)],
            self._folder / "code-server.log", self.environment)
        self.workspace = self._folder / "workspace.yaml"
        self.workspace.write_text(yaml.safe_dump(
            {"load_from": [{"grpc_server": {"socket": str(socket), "location_name": LOCATION}}]}))
        self._wait_for(socket.exists, "the code server", self._code_server, self._folder / "code-server.log")

    def _start_daemon(self) -> None:
        log = self._folder / "daemon.log"
        self._daemon = _start([console_script("dagster-daemon"), "run", "-w", str(self.workspace)], log,
                              self.environment)
        self._wait_for(lambda: daemon_heartbeating(self.instance), "the Dagster daemon", self._daemon, log)

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
        socket = str(self._folder / "code.sock")
        while any(socket in run.tags.get("dagster/grpc_info", "")
                  for run in self.instance.get_runs(RunsFilter(statuses=UNFINISHED))):
            time.sleep(POLL_S)


def console_script(name: str) -> str:
    """A console script of this Python's environment (the venv's, not whatever PATH finds first)."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


def _start(command: list[str], log: Path, environment: dict[str, str]) -> subprocess.Popen:
    """A service process that ends with this one however it ends (the kernel sends it SIGTERM)."""
    with log.open("ab") as out:
        return subprocess.Popen(["setpriv", "--pdeathsig", "TERM", *command], cwd=PROJECT_DIR, env=environment,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)  # both shut down cleanly on an interrupt
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " / ".join(text[-lines:]) or "(it printed nothing)"
