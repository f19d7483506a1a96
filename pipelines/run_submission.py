"""Submit a run to the instance's queue and follow it to its end, as the UI's Launch button would.

The run is submitted with `dagster job launch` on the workspace the daemon loads
(pipelines/local_daemon.py), so the daemon finds the job where it looks for it and the UI lists
the run under its job. Its progress is read back from the instance's event log, one line a step
and the steps' own messages (pipelines/logging.py chooses which).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from itertools import takewhile
from pathlib import Path

import psutil
from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunRecord, RunsFilter

from assets.step_outputs import RETRY_TAG, WILL_RETRY_TAG
from pipelines.errors import RunFailed
from pipelines.local_daemon import GRPC_INFO_TAG, PROJECT_DIR, LocalDaemon, console_script, launched_here
from pipelines.logging import shown

POLL_S = 0.5  # a step's lines show within half a second; a query of the run's new events is cheap
EVENTS_PER_READ = 1000
DAEMON_CHECK_POLLS = 20  # while a run is followed, that a daemon is still there: every 10 s
RETRY_WAIT_S = 300.0  # the retry daemon's ticks are seconds apart; one that declines says nothing here
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failure|Interrupt)(:|$)")  # a traceback's last line
_RPC_FIELD = re.compile(r"^(status|details) = ")  # a gRPC error's message, on the lines below its name
WAITING = [DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def unfinished_runs(instance: DagsterInstance, tags: dict[str, str]) -> list[RunRecord]:
    """Runs with these tags (a partition's) that are queued or under way, from anywhere, in the
    order they were created. Not those never submitted (NOT_STARTED): nothing would start them."""
    return sorted(instance.get_run_records(RunsFilter(tags=tags, statuses=WAITING)), key=lambda r: r.storage_id)


def submit(daemon: LocalDaemon, job_name: str, tags: dict[str, str]) -> str:
    """Queue a run of `job_name` with `tags` on the daemon's workspace; its run id. Its resources
    are the code location's, made where the run executes from that environment's settings (the
    daemon a command starts has the command's)."""
    daemon.ensure()
    run_id = str(uuid.uuid4())
    launched = subprocess.run(
        [console_script("dagster"), "job", "launch", "-w", str(daemon.workspace), "-j", job_name,
         "--tags", json.dumps(tags), "--run-id", run_id],
        cwd=PROJECT_DIR, env=daemon.environment, capture_output=True, text=True,
    )
    if launched.returncode != 0:
        raise RunFailed(f"{job_name} could not be queued: {_why(launched.stderr)}")
    return run_id


def _why(stderr: str) -> str:
    """The line of a failed command's output that says why: the last exception a traceback names
    (Dagster's errors carry another process's traceback inside their message), else its last line
    but for a traceback's `^^^^` markers."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    raised = [at for at, line in enumerate(lines) if _EXCEPTION.match(line)]
    if raised:  # with the lines of its message below it (gRPC's: the status and what failed)
        said = lines[raised[-1]:]
        return " ".join(said[:1] + list(takewhile(_RPC_FIELD.match, said[1:])))
    said = [line for line in lines if set(line) - set("^~ ")]
    return said[-1] if said else "(no output)"


def follow(instance: DagsterInstance, daemon: LocalDaemon, run_id: str, say: Callable[[str], None]) -> DagsterRun:
    """Wait for the run to end, saying meanwhile what its steps log and when each starts and ends;
    the finished run, or, when the instance's run retries launch it again, the retry's. A daemon
    is kept there meanwhile (one that stops, another command's, is replaced)."""
    while True:
        run = _follow(instance, daemon, run_id, say)
        retry = _retry(instance, daemon, run)
        if retry is None:
            return run
        say(f"run {run.run_id[:8]} failed; Dagster's run retries launch it again as run {retry[:8]}")
        run_id = retry


def _retry(instance: DagsterInstance, daemon: LocalDaemon, run: DagsterRun) -> str | None:
    """The id of the run that retries a failed `run`, once the daemon has made it; None when none
    will. Dagster tags a failed run with whether it will be retried just after it fails."""
    if run.status != DagsterRunStatus.FAILURE or not instance.run_retries_enabled:
        return None
    deadline = time.monotonic() + RETRY_WAIT_S
    while time.monotonic() < deadline:
        tags = instance.get_run_by_id(run.run_id).tags
        if tags.get(RETRY_TAG) is not None or tags.get(WILL_RETRY_TAG) == "false":
            return tags.get(RETRY_TAG)
        daemon.ensure()
        time.sleep(POLL_S)
    return None  # the retry daemon declined, or never came: the failure stands


def _follow(instance: DagsterInstance, daemon: LocalDaemon, run_id: str, say: Callable[[str], None]) -> DagsterRun:
    cursor, status, polls = None, None, 0
    while True:
        run = instance.get_run_by_id(run_id)
        changed, status = run.status != status, run.status
        if changed and not run.is_finished:
            say(f"run {run_id[:8]}: {status.value.lower()}")
        if polls % DAEMON_CHECK_POLLS == 0:  # queued, it waits for one; under way, run monitoring watches it
            daemon.ensure()
            if status == DagsterRunStatus.STARTED and (gone := worker_gone(instance, run)) and \
                    instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTED:  # not ended meanwhile
                # As run monitoring does for a run it fails: its pool slots go back at once (its
                # retry waits for a pool's), and Dagster's run retries resume it from
                # its failure, skipping the steps that succeeded.
                say(f"run {run_id[:8]}: {gone}")
                instance.report_run_failed(run, gone)
                instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        records = instance.get_records_for_run(run_id, cursor=cursor, limit=EVENTS_PER_READ)
        for record in records.records:
            if line := shown(record.event_log_entry):
                say(line)
        cursor, polls = records.cursor, polls + 1
        if run.is_finished and not records.has_more:
            say(f"run {run_id[:8]}: {status.value.lower()}")
            return run
        time.sleep(0 if records.has_more else POLL_S)


def worker_gone(instance: DagsterInstance, run: DagsterRun) -> str | None:
    """Why a started run's worker is known to be gone, if it is: launched on this machine by a
    command's code server that no longer answers on its socket, its process is no more (killed
    with the command that started them both, or by a restart of the machine, which may also have
    emptied the temporary folder the socket was in). Run monitoring cannot tell: Dagster's default
    run launcher learns of a dead worker only from the code server that started it."""
    socket_path = json.loads(run.tags.get(GRPC_INFO_TAG, "{}")).get("socket") or ""
    if not launched_here(socket_path):
        return None  # another machine's, or a code server that reports its workers' ends itself
    started = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_START, limit=1).records
    if not started:
        return None
    pid, at = started[0].event_log_entry.dagster_event.pid, started[0].event_log_entry.timestamp
    restarted = psutil.boot_time() > at  # and the pid, if taken, is another process's
    if Path(socket_path).exists() and _listening(socket_path):
        return None  # its code server is there to report the worker's end
    if not Path(socket_path).exists() and not restarted:
        return None  # not this machine's after all (its name is another's too): only a restart deletes it here
    try:
        alive = not restarted and psutil.Process(pid).create_time() <= at + 1
    except psutil.AccessDenied:  # there, but not ours to see
        alive = True
    except psutil.Error:
        alive = False
    return None if alive else (f"its worker (pid {pid}) and the code server that started it ({socket_path}) "
                               f"are gone: {'the machine restarted' if restarted else 'killed'}")


def _listening(path: str) -> bool:
    """Whether a server answers on the Unix socket (a killed one leaves the file behind)."""
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True
