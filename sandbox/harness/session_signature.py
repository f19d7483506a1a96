"""The signature on a pytest session record (harness/pytest_session.py writes it inside the
sandbox; sandbox/verdict.py checks it). Standard library only: it runs on both sides."""

from __future__ import annotations

import hashlib
import hmac


def signature(token: str, exitstatus: int, report_sha256: str, runner_intact: bool, sealed_intact: bool) -> str:
    """An HMAC over the record's fields, keyed by the grading's secret token."""
    message = f"{exitstatus}:{report_sha256}:{int(runner_intact)}:{int(sealed_intact)}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()
