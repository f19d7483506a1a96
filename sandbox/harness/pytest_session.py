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
session; docs/grading.md says so.

A conftest.py that pytest loads before the session (the root's, those of the paths it is given)
and that does not import ends pytest at once, with a usage error, before the JUnit plugin is
even configured: no report, no session. For that case this plugin writes the report itself, one
collection error for that conftest.py with its traceback in pytest's short style, and a record
vouching for it, as at the end of a session; the grader then reads the import error like any
other collection error (grading/diagnosis.py decides whether the environment is to blame).

For a run killed at a limit it leaves what it was doing: /report/progress.json says what it is
collecting or which test is running, rewritten at each step, and where the interpreter has
os.register_at_fork (3.7+; without it a forked child that exits normally would wait forever on
the watchdog thread it never had), faulthandler's watchdog dumps every thread's stack into
/report/stacks.txt whenever no step came for a while (the grader says how long), so the grader
can say where a run stood still. Neither is evidence of anything: only words for the detail.

A test command that runs pytest more than once (a Harbor test.sh, one run per test file) is
told so by its task: the grader then leaves one token per run (session-token-0, -1, ...), and
each session takes the lowest one left, writing junit-<n>.xml and session-<n>.json (the first
keeps junit.xml and session.json). Code under test in an earlier session can read the later
sessions' tokens, so for such tasks a submission written for it could forge a later session:
the known limit above, made easier; a task with one session has one token and no such file.

It runs in the task's own interpreter and pytest, which for an old repository are old: Python
3.6 syntax (no `from __future__ import annotations`, annotations only in comments), and hooks
and attributes pytest 5.4 has (a collector's `fspath` where it has no `path`).
"""

import faulthandler
import hashlib
import importlib
import json
import os
import re
import sys
import time
import traceback
from xml.sax.saxutils import escape, quoteattr

import _pytest
import _pytest.config
import _pytest.junitxml
import _pytest.reports
import _pytest.runner
import pluggy
import pytest
from session_files import MAX_SESSIONS, progress_files, session_files  # beside this file in the grader's directory
from session_signature import signature

USAGE_ERROR = 4  # pytest's exit status when a conftest.py it loads before the session does not import
MAX_WHERE = 1000  # characters of the node id in the progress record


def _runner_dirs():  # type: () -> tuple
    """The folders of the frames pytest leaves out of a conftest.py's traceback (its own, pluggy's,
    py's where it is a package, not pytest 7's py.py) and of importlib's."""
    modules = [_pytest, pluggy, importlib]
    py = sys.modules.get("py")  # pytest < 7 imports it; never imported here (the repository may have a py.py)
    if py is not None and os.path.basename(getattr(py, "__file__", None) or "") == "__init__.py":
        modules.append(py)
    return tuple(os.path.dirname(module.__file__) + os.sep for module in modules)


_RUNNER_DIRS = _runner_dirs()
_NOT_XML = re.compile(u"[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _claim():  # type: () -> tuple
    """The lowest-numbered token the grader left (a test command may run pytest more than once:
    each session takes the next one), or none."""
    for number in range(MAX_SESSIONS):
        token_file = session_files(number)[0]
        if os.path.exists(token_file):
            return number, token_file
    return 0, None


def _reporting_functions():  # type: () -> tuple
    functions = (_pytest.reports.TestReport.from_item_and_call, _pytest.runner.call_and_report,
                 _pytest.runner.runtestprotocol, _pytest.junitxml.LogXML.pytest_runtest_logreport,
                 _pytest.junitxml.LogXML.pytest_sessionfinish)
    return tuple(getattr(f, "__func__", f) for f in functions)  # a classmethod is rebound on each access


def _sha256(path):  # type: (str) -> str
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def _relative(path):  # type: (str) -> str
    """A file as pytest prints it in a traceback: relative to the working directory inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def _conftest_report(failure):  # type: (Exception) -> str
    """A JUnit report of one collection error: the conftest.py that did not import (pytest's
    ConftestImportFailure: `cause` from pytest 8, `excinfo` before), with its traceback as
    pytest's short style prints it, pytest's and pluggy's own frames left out."""
    cause = getattr(failure, "cause", None)
    if isinstance(cause, BaseException):
        tb = cause.__traceback__
    else:
        excinfo = getattr(failure, "excinfo", None) or (type(failure), failure, failure.__traceback__)
        cause, tb = excinfo[1], excinfo[2]
    path = str(getattr(failure, "path", "conftest.py"))
    lines = ["ImportError while loading conftest '{}'.".format(path)]
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith("<") or frame.filename.startswith(_RUNNER_DIRS):
            continue
        lines.append("{}:{}: in {}".format(_relative(frame.filename), frame.lineno, frame.name))
        if frame.line:
            lines.append("    " + frame.line)
    error = "".join(traceback.format_exception_only(type(cause), cause))
    lines += ["E   " + line for line in error.splitlines()]
    name = os.path.splitext(_relative(path))[0].replace(os.sep, ".").lstrip(".")
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="0" '
            'skipped="0" tests="1" time="0.000"><testcase classname="" name={} time="0.000"><error '
            'message="collection failure">{}</error></testcase></testsuite></testsuites>'
            ).format(quoteattr(_NOT_XML.sub("?", name)), escape(_NOT_XML.sub("?", "\n".join(lines))))


def _progress_writer(path):  # type: (str) -> object
    """A function that says, in `path`, what the session is doing: one pwrite of JSON padded
    with spaces over the last (valid JSON whenever the run is killed; no file is opened or
    renamed per step: a test costs a few microseconds)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return lambda stage, where: None
    written = [0]

    def write(stage, where):
        data = json.dumps({"stage": stage, "where": where[:MAX_WHERE]}).encode("ascii")
        try:
            os.pwrite(fd, data.ljust(written[0]), 0)
        except OSError:
            return
        written[0] = max(written[0], len(data))

    return write


def _watchdog(path, interval):  # type: (str, float) -> object
    """A function that restarts faulthandler's watchdog: every `interval` seconds without a
    restart it writes every thread's stack to `path`, emptied at each restart. A restart within
    half an interval of the last is skipped (each costs a thread): a dump still comes only after
    half an interval without one, and none older than the last restart is left. Nothing (a
    function that does nothing) where the interpreter cannot keep it out of forked children."""
    if interval <= 0 or not hasattr(os, "register_at_fork"):
        return lambda: None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return lambda: None
    last = [0.0]

    def arm():
        faulthandler.dump_traceback_later(interval, repeat=True, file=fd)

    def restart():
        now = time.monotonic()
        if now - last[0] < interval / 2:
            return
        last[0] = now
        faulthandler.cancel_dump_traceback_later()
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:  # the old dumps stay: the grader reads the last one, which is still the newest
            pass
        arm()

    # A forked child inherits the armed state but not the thread: exiting, it would wait for it forever.
    os.register_at_fork(before=faulthandler.cancel_dump_traceback_later, after_in_parent=arm)
    arm()
    return restart


def _arm():
    number, token_file = _claim()
    _, session_file, report_file = session_files(number)
    progress_file, stacks_file = progress_files(number)
    try:
        with open(token_file, encoding="ascii") as f:
            secret = json.load(f)
        os.unlink(token_file)
        token, sealed = str(secret["token"]), dict(secret["sealed"])
        watchdog_s = float(secret.get("watchdog_s", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        token, sealed, watchdog_s = "", {}, 0.0
    functions_at_load = _reporting_functions()
    altered = set()
    write_progress = _progress_writer(progress_file) if token else (lambda stage, where: None)
    restart_watchdog = _watchdog(stacks_file, watchdog_s) if token else (lambda: None)

    def progress(stage, where=""):
        """Say what the session is doing now (only in a grading: there is a token)."""
        write_progress(stage, str(where))
        restart_watchdog()

    def vouch(exitstatus):
        """Write the signed record of the report as it stands."""
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

    @pytest.hookimpl(hookwrapper=True)
    def pytest_load_initial_conftests(early_config):
        outcome = yield
        failure = outcome.excinfo[1] if outcome.excinfo else None
        conftest_failure = getattr(_pytest.config, "ConftestImportFailure", ())
        asked = getattr(early_config, "known_args_namespace", None)
        if (token and isinstance(failure, conftest_failure) and not getattr(asked, "help", False)
                and not getattr(asked, "version", False)):  # pytest ends here, with a usage error
            try:
                with open(report_file, "w", encoding="utf-8", errors="replace") as f:
                    f.write(_conftest_report(failure))
                vouch(USAGE_ERROR)
            except OSError:
                pass  # no report, no record: the grader sees a session that never ended

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(config):
        if number and getattr(config.option, "xmlpath", None):  # before junitxml opens the first session's
            config.option.xmlpath = report_file

    def pytest_collectstart(collector):
        path = str(getattr(collector, "path", None) or getattr(collector, "fspath", ""))  # fspath: pytest < 7
        if path in sealed and _sha256(path) != sealed[path]:
            altered.add(path)
        if collector.nodeid:
            progress("collecting", collector.nodeid)

    def pytest_runtest_logstart(nodeid):
        progress("running", nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session, exitstatus):
        progress("finishing")
        vouch(exitstatus)

    progress("starting")
    return (pytest_load_initial_conftests, pytest_configure, pytest_collectstart, pytest_runtest_logstart,
            pytest_sessionfinish)


(pytest_load_initial_conftests, pytest_configure, pytest_collectstart, pytest_runtest_logstart,
 pytest_sessionfinish) = _arm()
del _arm
