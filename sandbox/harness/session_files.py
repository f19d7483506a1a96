"""Where a pytest session of a grading keeps its files in /report, for the grader and for the
plugin (harness/pytest_session.py) alike; standard library only, and Python 3.6 syntax (the
plugin runs in the task's own interpreter, which may be that old)."""

REPORT_DIR = "/report"
MAX_SESSIONS = 8  # pytest runs one test command may make


def session_files(number):  # type: (int) -> tuple
    """Session `number`'s token, record and JUnit report (the first keeps the plain names)."""
    suffix = "" if number == 0 else "-{}".format(number)
    return ("{}/session-token-{}".format(REPORT_DIR, number), "{}/session{}.json".format(REPORT_DIR, suffix),
            "{}/junit{}.xml".format(REPORT_DIR, suffix))


def progress_files(number):  # type: (int) -> tuple
    """Session `number`'s progress (what it is collecting or running, as JSON) and the stacks of
    its threads when it last made no progress for a while (faulthandler's text): read by the
    grader only to say what a run killed at a limit was doing."""
    suffix = "" if number == 0 else "-{}".format(number)
    return "{}/progress{}.json".format(REPORT_DIR, suffix), "{}/stacks{}.txt".format(REPORT_DIR, suffix)
