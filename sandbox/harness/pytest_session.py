"""A pytest plugin the grader loads into a repository task's test run (`-p pytest_session`).

It vouches for the report of the session it ran in. The grader leaves a random token, and the
SHA-256 of every sealed file (hidden tests, protected paths), in /report/session-token-0; this
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
session; the grader's docstring says so.

A test command that runs pytest more than once (a Harbor test.sh, one run per test file) is
told so by its task: the grader then leaves one token per run (session-token-0, -1, ...), and
each session takes the lowest one left, writing junit-<n>.xml and session-<n>.json (the first
keeps junit.xml and session.json). Code under test in an earlier session can read the later
sessions' tokens, so for such tasks a submission written for it could forge a later session:
the known limit above, made easier; a task with one session has one token and no such file.
"""

from __future__ import annotations

import hashlib
import json
import os

import _pytest.junitxml
import _pytest.reports
import _pytest.runner
import pytest
from session_files import MAX_SESSIONS, session_files  # beside this file in the grader's directory
from session_signature import signature


def _claim() -> tuple[int, str | None]:
    """The lowest-numbered token the grader left (a test command may run pytest more than once:
    each session takes the next one), or none."""
    for number in range(MAX_SESSIONS):
        token_file = session_files(number)[0]
        if os.path.exists(token_file):
            return number, token_file
    return 0, None


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
    number, token_file = _claim()
    _, session_file, report_file = session_files(number)
    try:
        with open(token_file, encoding="ascii") as f:
            secret = json.load(f)
        os.unlink(token_file)
        token, sealed = str(secret["token"]), dict(secret["sealed"])
    except (OSError, ValueError, KeyError, TypeError):
        token, sealed = "", {}
    functions_at_load = _reporting_functions()
    altered = set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(config):
        if number and getattr(config.option, "xmlpath", None):  # before junitxml opens the first session's
            config.option.xmlpath = report_file

    def pytest_collectstart(collector):
        path = str(getattr(collector, "path", ""))
        if path in sealed and _sha256(path) != sealed[path]:
            altered.add(path)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session, exitstatus):
        report_sha256 = _sha256(report_file)
        intact = all(a is b for a, b in zip(functions_at_load, _reporting_functions()))
        altered.update(path for path, digest in sealed.items() if _sha256(path) != digest)
        record = {"exitstatus": int(exitstatus), "report_sha256": report_sha256, "runner_intact": intact,
                  "sealed_intact": not altered,
                  "signature": signature(token, int(exitstatus), report_sha256, intact, not altered)}
        staging = session_file + ".tmp"
        with open(staging, "w", encoding="ascii") as f:
            json.dump(record, f)
        os.replace(staging, session_file)

    return pytest_configure, pytest_collectstart, pytest_sessionfinish


pytest_configure, pytest_collectstart, pytest_sessionfinish = _arm()
del _arm
