"""Errors the command line reports without a traceback."""


class UserError(Exception):
    """A mistake the user can fix."""


class RunFailed(RuntimeError):
    """A Dagster run failed; the message carries its step failures."""
