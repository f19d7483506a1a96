"""A console logger that prints the assets' own progress lines and failures, not every event."""

from __future__ import annotations

import logging
import sys

from dagster import Field, logger
from transformers.utils import logging as transformers_logging

# Per-file "Loading weights" bars drown the per-stage lines; stages report their own progress.
transformers_logging.disable_progress_bar()


class _ProgressFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", {}) or {}
        tags = meta.get("job_tags") or {}
        where = tags.get("dagster/partition") or meta.get("job_name") or ""
        step = meta.get("step_key") or ""
        message = meta.get("orig_message") or record.getMessage()
        return f"{self.formatTime(record, '%H:%M:%S')} {where} {step}: {message}"


class _UserMessagesOnly(logging.Filter):
    """Framework events (step started, output handled, …) carry a DagsterEvent; skip them unless
    they are failures, which the user must see."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, "dagster_event") or record.levelno >= logging.ERROR


@logger(
    config_schema={"log_level": Field(str, is_required=False, default_value="INFO")},
    description="Concise progress lines: the assets' own messages and errors.",
)
def progress_console(init_context) -> logging.Logger:
    log = logging.getLogger("crucible.progress")
    log.setLevel(init_context.logger_config["log_level"])
    log.propagate = False
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_ProgressFormatter())
        handler.addFilter(_UserMessagesOnly())
        log.addHandler(handler)
    return log
