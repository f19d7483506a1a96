"""Where a pytest session of a grading keeps its files in /report, for the grader and for the
plugin (harness/pytest_session.py) alike; standard library only."""

REPORT_DIR = "/report"
MAX_SESSIONS = 8  # pytest runs one test command may make


def session_files(number: int) -> tuple[str, str, str]:
    """Session `number`'s token, record and JUnit report (the first keeps the plain names)."""
    suffix = "" if number == 0 else f"-{number}"
    return (f"{REPORT_DIR}/session-token-{number}", f"{REPORT_DIR}/session{suffix}.json",
            f"{REPORT_DIR}/junit{suffix}.xml")
