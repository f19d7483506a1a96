"""Why a run failed, in the sentences its steps said: what `crucible run` prints of a failed run
and of a step's retry (pipelines/logging.py)."""

from __future__ import annotations

from dagster import DagsterEventType, DagsterInstance, EventLogEntry
from dagster_shared.error import SerializableErrorInfo


def innermost(error: SerializableErrorInfo) -> SerializableErrorInfo:
    """The error at the bottom of a chain: Dagster wraps what a resource or an asset raised
    ("Error executing resource_fn …"), and that is the sentence that says what happened."""
    while error.cause is not None:
        error = error.cause
    return error


def reason(error: SerializableErrorInfo) -> str:
    """What a failed step says: an asset's deliberate Failure by its own sentence, any other
    error as Python prints it (its class, then its message)."""
    error = innermost(error)
    message = error.message.strip()
    return message.split(": ", 1)[1] if error.cls_name == "Failure" and ": " in message else message


def run_failures(instance: DagsterInstance, run_id: str) -> list[str]:
    """Why a run that ended elsewhere failed: its steps' reasons, else the run's own (a worker that
    never started, a run the monitoring cancelled)."""
    steps = [reason(entry.dagster_event.step_failure_data.error)
             for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
             if entry.dagster_event.step_failure_data.error]
    if steps:
        return steps
    ended = instance.all_logs(run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED})
    return [_run_reason(entry) for entry in ended] or ["(no reason recorded)"]


def _run_reason(entry: EventLogEntry) -> str:
    """A run's failure: the error raised outside its steps (the executor's), else Dagster's word."""
    event = entry.dagster_event
    error = event.job_failure_data.error if event.event_type == DagsterEventType.RUN_FAILURE else None
    return reason(error) if error else event.message or entry.user_message
