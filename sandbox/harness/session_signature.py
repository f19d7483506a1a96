"""The signature on a pytest session record (harness/pytest_session.py writes it inside the
sandbox; grading/verdict.py checks it). Standard library only and Python 3.6 syntax: it runs on
both sides, inside in the task's own interpreter."""

import hashlib
import hmac


def signature(token, exitstatus, report_sha256, runner_intact, sealed_intact):
    # type: (str, int, str, bool, bool) -> str
    """An HMAC over the record's fields, keyed by the grading's secret token."""
    message = "{}:{}:{}:{}".format(exitstatus, report_sha256, int(runner_intact), int(sealed_intact)).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()
