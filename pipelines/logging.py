"""A console logger that prints the assets' own progress lines and failures, not every event
nor Dagster Pipes' plumbing."""

from __future__ import annotations

import logging
import sys

from dagster import Field, logger
from transformers.utils import logging as transformers_logging

# Per-file "Loading weights" bars drown the per-stage lines; stages report their own progress.
transformers_logging.disable_progress_bar()


# Dagster Pipes notes its own session with the training step's process in lines that start so
# ("successfully opened dagster pipes"): plumbing. Not its warnings ("did not receive any
# messages"), nor the step's own lines, which reach the run's log through that session.
PIPES_PREFIX = "[pipes] "


def _message(record: logging.LogRecord) -> str:
    """The message as the asset (or Dagster) wrote it, without the run's prefixes."""
    meta = getattr(record, "dagster_meta", {}) or {}
    return meta.get("orig_message") or record.getMessage()


class _ProgressFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", {}) or {}
        tags = meta.get("job_tags") or {}
        where = tags.get("dagster/partition") or meta.get("job_name") or ""
        step = meta.get("step_key") or ""
        return f"{self.formatTime(record, '%H:%M:%S')} {where} {step}: {_message(record)}"


class _UserMessagesOnly(logging.Filter):
    """Framework events (step started, output handled, …) carry a DagsterEvent, and Pipes notes
    its plumbing in plain messages; skip both unless they are failures (events) or warnings (Pipes),
    which the user must see."""

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "dagster_event"):
            return record.levelno >= logging.ERROR
        return record.levelno >= logging.WARNING or not _message(record).startswith(PIPES_PREFIX)


class _ConsoleHandler(logging.StreamHandler):
    def __init__(self):
        super().__init__(sys.stderr)
        self.setFormatter(_ProgressFormatter())
        self.addFilter(_UserMessagesOnly())


@logger(
    config_schema={"log_level": Field(str, is_required=False, default_value="INFO")},
    description="Concise progress lines: the assets' own messages and errors.",
)
def progress_console(init_context) -> logging.Logger:
    log = logging.getLogger("crucible.progress")
    log.setLevel(init_context.logger_config["log_level"])
    log.propagate = False
    # Ours, not just any: others attach handlers to non-propagating loggers (pytest's log capture
    # does), and one of theirs would leave the console silent.
    if not any(isinstance(handler, _ConsoleHandler) for handler in log.handlers):
        log.addHandler(_ConsoleHandler())
    return log
