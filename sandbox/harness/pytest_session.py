"""A pytest plugin the grader loads into a repository task's test run (`-p pytest_session`).

It vouches for the report of the session it ran in. The grader leaves a random token, and the
SHA-256 of every sealed file (hidden tests, protected paths), in /report/session-token; this
plugin reads and deletes it when pytest loads it, before any conftest or code under test is
imported, and keeps it only in a closure. It checks each sealed test module just before pytest
imports it, and every sealed file at the end. After every other plugin has finished the session
(so after the JUnit report is written), it writes /report/session.json: pytest's exit status,
the SHA-256 of the JUnit report as it stands, whether pytest's reporting functions are still
the ones it found at load, and whether the sealed files stayed as sealed, all signed with an
HMAC keyed by the token (the token itself is never written). The grader then knows:
- no session record: the session never reached its end (os._exit, a crash, a kill): an
  early exit, whatever report was left behind;
- a record whose signature does not verify, whose report hash is not the report's (a report
  rewritten afterwards, by an atexit hook say), or that says the reporting functions were
  replaced: a forged report;
- a record that says a sealed file changed: tampering with the tests, caught even where the
  sandbox cannot make them read-only (Docker).
Code under test runs in this process, so a submission written to dig the token out of this
closure, or to patch pytest more deeply than the functions checked here, could still forge a
session; the grader's docstring says so. One pytest session per grading: a second one finds no
token.
"""

from __future__ import annotations

import hashlib
import json
import os

import _pytest.junitxml
import _pytest.reports
import _pytest.runner
import pytest
from session_signature import signature  # beside this file in the grader's directory

TOKEN_FILE = "/report/session-token"
SESSION_FILE = "/report/session.json"
REPORT_FILE = "/report/junit.xml"


def _reporting_functions() -> tuple:
    functions = (_pytest.reports.TestReport.from_item_and_call, _pytest.runner.call_and_report,
                 _pytest.runner.runtestprotocol, _pytest.junitxml.LogXML.pytest_runtest_logreport,
                 _pytest.junitxml.LogXML.pytest_sessionfinish)
    return tuple(getattr(f, "__func__", f) for f in functions)  # a classmethod is rebound on each access


def _sha256(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def _arm():
    try:
        with open(TOKEN_FILE, encoding="ascii") as f:
            secret = json.load(f)
        os.unlink(TOKEN_FILE)
        token, sealed = str(secret["token"]), dict(secret["sealed"])
    except (OSError, ValueError, KeyError, TypeError):
        token, sealed = "", {}
    functions_at_load = _reporting_functions()
    altered = set()

    def pytest_collectstart(collector):
        path = str(getattr(collector, "path", ""))
        if path in sealed and _sha256(path) != sealed[path]:
            altered.add(path)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session, exitstatus):
        report_sha256 = _sha256(REPORT_FILE)
        intact = all(a is b for a, b in zip(functions_at_load, _reporting_functions()))
        altered.update(path for path, digest in sealed.items() if _sha256(path) != digest)
        record = {"exitstatus": int(exitstatus), "report_sha256": report_sha256, "runner_intact": intact,
                  "sealed_intact": not altered,
                  "signature": signature(token, int(exitstatus), report_sha256, intact, not altered)}
        staging = SESSION_FILE + ".tmp"
        with open(staging, "w", encoding="ascii") as f:
            json.dump(record, f)
        os.replace(staging, SESSION_FILE)

    return pytest_collectstart, pytest_sessionfinish


pytest_collectstart, pytest_sessionfinish = _arm()
del _arm
