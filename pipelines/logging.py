"""What a command following a run shows of its event log: the assets' own progress lines, the
steps' starts, ends, retries and failures, and not every framework event nor Dagster Pipes' plumbing."""

from __future__ import annotations

import logging
import time

from dagster import DagsterEventType, EventLogEntry

from pipelines.run_failures import reason

# Dagster Pipes notes its own session with the training step's process in lines that start so
# ("successfully opened dagster pipes"): plumbing. Not its warnings ("did not receive any
# messages"), nor the step's own lines, which reach the run's log through that session.
PIPES_PREFIX = "[pipes] "
STEP_EVENTS = (DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE,
               DagsterEventType.STEP_UP_FOR_RETRY)


def shown(entry: EventLogEntry) -> str | None:
    """The line an operator watching the run reads for this event, or None to skip it."""
    event = entry.dagster_event
    if event is not None:
        if event.event_type not in STEP_EVENTS:
            return None
        text = event.event_type.value.lower().replace("_", " ")
        if event.event_type == DagsterEventType.STEP_UP_FOR_RETRY and event.step_retry_data.error:
            retry = event.step_retry_data
            text = f"{reason(retry.error)}; retried in {retry.seconds_to_wait or 0:g} s"
    elif entry.level < logging.INFO or entry.level < logging.WARNING and entry.user_message.startswith(PIPES_PREFIX):
        return None
    else:
        text = entry.user_message
    return f"{time.strftime('%H:%M:%S', time.localtime(entry.timestamp))} {entry.step_key or ''}: {text}"
