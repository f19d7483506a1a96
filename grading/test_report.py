"""Parse a JUnit XML report (ours from harness/run_tests.py, or pytest --junitxml) into outcomes.

The report is written inside the sandbox, so it is untrusted input: size is capped, DTDs
(entity expansion) are refused, and anything off-shape raises ReportError.
"""

from __future__ import annotations

import os
import stat
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from statuses import Outcome

__test__ = False  # not a pytest module, despite the name

MAX_REPORT_BYTES = 16 << 20
MAX_DETAILS = 4000


# When a testcase carries several result children (pytest: a failure plus a teardown error),
# the first listed here wins.
_CHILD_OUTCOME = (("error", Outcome.ERROR), ("failure", Outcome.FAILED), ("skipped", Outcome.SKIPPED))


class ReportError(ValueError):
    """The report is missing, too large, not XML, or not shaped like JUnit XML."""


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False

    name: str
    outcome: Outcome  # never MISSING: that is the grader's verdict on a test the report lacks
    message: str
    seconds: float
    classname: str = ""  # our harness: the test file's stem; pytest: the dotted module path
    details: str = ""  # the result element's text: pytest's traceback, our harness's (capped)


def read_report(path: Path) -> list[TestOutcome]:
    """Read and parse a report file the sandbox wrote."""
    return parse_junit(read_untrusted(path, MAX_REPORT_BYTES))


def read_untrusted(path: Path, limit: int) -> bytes:
    """A file the sandbox wrote, refusing symlinks, non-regular files and more than `limit`
    bytes: the sandbox could plant a link to a host file or a FIFO that would block us forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ReportError(f"cannot open {path}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ReportError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise ReportError(f"{path} is {info.st_size} bytes (limit {limit})")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ReportError(f"{path} grew past {limit} bytes")
    return data


def parse_junit(data: str | bytes) -> list[TestOutcome]:
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"report is {len(raw)} bytes (limit {MAX_REPORT_BYTES})")
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        raise ReportError("report declares a DTD; JUnit reports have none")
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as e:
        raise ReportError(f"report is not well-formed XML: {e}") from e
    return [_testcase(case) for suite in _suites(root) for case in suite.iter("testcase")]


def _suites(root: ET.Element) -> list[ET.Element]:
    if root.tag == "testsuite":  # older pytest (and some tools) write a bare testsuite
        return [root]
    if root.tag == "testsuites":
        return root.findall("testsuite")
    raise ReportError(f"report root is <{root.tag}>, expected <testsuites> or <testsuite>")


SESSION = "(test session)"  # the name of pytest's error collecting the session itself, which has none


def _testcase(case: ET.Element) -> TestOutcome:
    name = case.get("name")
    if not name:
        # pytest reports an error collecting the session itself (a conftest.py it loads while
        # collecting that does not import) as a nameless testcase; any other is a broken report.
        error = case.find("error")
        if error is None or error.get("message") != "collection failure" or case.get("classname"):
            raise ReportError("a <testcase> has no name")
        name = SESSION
    outcome, message, details = Outcome.PASSED, "", ""
    for tag, label in _CHILD_OUTCOME:
        child = case.find(tag)
        if child is not None:
            details = (child.text or "").strip()[-MAX_DETAILS:]  # a traceback's end says the most
            outcome, message = label, child.get("message") or details[:1000]
            break
    return TestOutcome(name, outcome, message, _seconds(case), case.get("classname", ""), details)


def _seconds(case: ET.Element) -> float:
    try:
        return float(case.get("time", "0") or 0)
    except ValueError as e:
        raise ReportError(f"testcase {case.get('name')!r} has a bad time {case.get('time')!r}") from e
