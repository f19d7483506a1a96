"""Submit a run to the instance's queue and follow it to its end, as the UI's Launch button would:
for instances whose runs are launched by the daemon somewhere else (a container per run).

The run is submitted with `dagster job launch` on the project's workspace.yaml, the code location
the daemon and the UI load, so the daemon finds the job where it looks for it. Its progress is read
back from the instance's event log, one line a step.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, EventLogEntry, RunRecord, RunsFilter
from dagster._daemon.controller import get_daemon_statuses

from pipelines.errors import RunFailed, UserError
from pipelines.hints import crucible_command

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEQUEUER = "QUEUED_RUN_COORDINATOR"  # the daemon that takes runs off the queue and launches them
STEP_EVENTS = (DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE)
POLL_S = 2.0
EVENTS_PER_READ = 1000
DAEMON_CHECK_POLLS = 15  # while a run is queued, that a daemon still heartbeats: every 30 s


def require_daemon(instance: DagsterInstance) -> None:
    """Queued runs start only while a daemon takes them off the queue: refuse to queue one that
    would wait for ever."""
    if not get_daemon_statuses(instance, [DEQUEUER], ignore_errors=True)[DEQUEUER].healthy:
        raise UserError(f"the instance in {instance.root_directory} launches its runs from the daemon "
                        f"({type(instance.run_launcher).__name__}), and no daemon is running: start it with "
                        f"`{crucible_command('ui')}` (or `dagster-daemon run -w workspace.yaml` in the project folder)")


def unfinished_runs(instance: DagsterInstance, tags: dict[str, str]) -> list[RunRecord]:
    """Runs with these tags (a partition's) that are queued or under way, from anywhere, in the
    order they were created. Not those never submitted (NOT_STARTED): nothing would start them."""
    waiting = [DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    return sorted(instance.get_run_records(RunsFilter(tags=tags, statuses=waiting)), key=lambda r: r.storage_id)


def submit(job_name: str, tags: dict[str, str]) -> str:
    """Queue a run of `job_name` with `tags`; its run id."""
    run_id = str(uuid.uuid4())
    launched = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "launch", "-w", "workspace.yaml", "-j", job_name,
         "--tags", json.dumps(tags), "--run-id", run_id],
        cwd=PROJECT_DIR, env=os.environ, capture_output=True, text=True,
    )
    if launched.returncode != 0:
        last = (launched.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RunFailed(f"{job_name} could not be queued: {last}")
    return run_id


def follow(instance: DagsterInstance, run_id: str, say: Callable[[str], None]) -> DagsterRun:
    """Wait for the run to end, saying meanwhile what its steps log and when each starts and ends,
    as `crucible run` shows a run it executes itself; the finished run. A queued run is waited
    for only while a daemon is there to start it."""
    cursor, status, polls = None, None, 0
    while True:
        run = instance.get_run_by_id(run_id)
        if run.status != status:
            status = run.status
            say(f"run {run_id[:8]}: {status.value.lower()}")
        if status == DagsterRunStatus.QUEUED and polls % DAEMON_CHECK_POLLS == 0:
            require_daemon(instance)
        records = instance.get_records_for_run(run_id, cursor=cursor, limit=EVENTS_PER_READ)
        for record in records.records:
            if line := _shown(record.event_log_entry):
                say(line)
        cursor, polls = records.cursor, polls + 1
        if run.is_finished and not records.has_more:
            return run
        time.sleep(0 if records.has_more else POLL_S)


def _shown(entry: EventLogEntry) -> str | None:
    """What an operator watching the run reads of an event: the steps' own messages, and the
    steps' starts, ends and failures."""
    event = entry.dagster_event
    if event is None:
        return f"{entry.step_key or ''}  {entry.user_message}" if entry.level >= logging.INFO else None
    if event.event_type in STEP_EVENTS:
        return f"{event.step_key}  {event.event_type.value.lower().replace('_', ' ')}"
    return None
