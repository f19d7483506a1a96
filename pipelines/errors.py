"""What the Dagster side of the command line reports without a traceback (pipelines/cli.py)."""


class RunFailed(RuntimeError):
    """A Dagster run failed, or the daemon a command started could not run it; the message says why."""
