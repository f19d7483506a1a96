"""A pytest plugin the grader loads into a repository task's test run (`-p pytest_session`).

It proves that the pytest session the report came from reached its end. The grader leaves a
random token in /report/session-token; this plugin reads and deletes it when pytest loads it,
which is before any conftest or code under test is imported, and keeps it only in a closure.
When the session finishes it writes /report/session.json with the token and pytest's exit
status. The grader then knows:
- no session.json: the run never finished its session (os._exit, a crash, a kill of pytest):
  an early exit, whatever report was left behind;
- a session.json without the token: someone else wrote it (a forged report).
Code under test runs in this process, so a submission that set out to dig the token out of
this module's closure could still forge a session; this stops exits and forgeries that do not
know how the grader works. One pytest session per grading: a second one finds no token.
"""

from __future__ import annotations

import json
import os

TOKEN_FILE = "/report/session-token"
SESSION_FILE = "/report/session.json"


def _arm():
    try:
        with open(TOKEN_FILE, encoding="ascii") as f:
            token = f.read().strip()
        os.unlink(TOKEN_FILE)
    except OSError:
        token = ""

    def pytest_sessionfinish(session, exitstatus):
        staging = SESSION_FILE + ".tmp"
        with open(staging, "w", encoding="ascii") as f:
            json.dump({"token": token, "exitstatus": int(exitstatus), "collected": session.testscollected}, f)
        os.replace(staging, SESSION_FILE)

    return pytest_sessionfinish


pytest_sessionfinish = _arm()
del _arm
