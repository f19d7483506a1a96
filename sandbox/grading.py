"""The grading protocol: run hidden tests against one submission and turn the run into a reward.

Where things are during a grading (each grading is a fresh sandbox run with fresh directories):
  /workspace            the submission (`workspace_files`, e.g. solution.py); never the tests
  /grader/run_tests.py  the harness, read-only
  /grader/tests/        the hidden tests, read-only
  /report/              private and writable, created for this grading only: where a custom
                        command (pytest --junitxml) writes its report. The built-in harness
                        writes its report to its own stdout instead, which the submission
                        cannot reach (it runs in a child process; see harness/run_tests.py).
The expected tests are found here, outside the sandbox, by parsing the test files (the
harness's `test_names`: top-level `def test*`), so the submission cannot change which tests
count.

Rules, in the order they apply:
 1. No expected test (or a test file that does not parse) -> "invalid", reward None: the task
    is broken. The command still runs, so that `exec` is always a real ExecResult.
 2. The sandbox failed (exec status XX) -> "infra_error", reward None. Not the model's fault:
    the sample is dropped, not scored.
 3. Every other outcome is "scored". A test's outcome is read from the report. An expected
    test absent from the report is "missing"; skipped, error and missing count as failed.
    Duplicate entries for a test: the worst outcome counts. Tests in the report that are not
    expected are ignored (but counted in tests_collected).
 4. The command ran but the report is missing or unparsable -> the suite did not run: every
    test "missing", reward 0, tamper flag "no_report" (unless a timeout/memory/output kill
    explains it). Why scored 0 and not dropped: the report is the only evidence that tests
    passed, and a submission can suppress it (os._exit(0) in solution.py, killing the
    harness); dropping such samples would teach the policy that suppressing the report
    avoids negative reward. The harness itself always writes a report, which task validation
    checks by grading the reference solution.
 5. Timeout, memory limit or output limit (TO/ML/OL) -> reward 0, even for tests that passed
    before the kill; components are still recorded.
 6. The exit code must agree with the report: exit code 0 iff every expected test passed.
    Otherwise tamper flag "exit_code_disagrees" and reward 0 (e.g. a report claiming passes
    while the harness failed, or a harness killed after the report was written).
 7. Otherwise reward = fraction of expected tests passed; with binary=True it is all_passed.
    reward_components always holds {"tests_passed_fraction": x, "all_passed": 0 or 1}.
A submission that is not valid Python imports with an error, so every test is "error" and the
reward is a scored 0 (rules 3 and 7), never a crash of the grader.

With the built-in harness the submission cannot forge the report: it runs in a process of its
own, and the report leaves through a stream only the harness holds. A report truncated by the
sandbox's stdout excerpt is an infrastructure error (our limit), never a 0. With a custom
command the report is a file in /report, which the submission could write: rules 4 and 6
stop only the cheap forgeries there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from sandbox.base import Mount, Sandbox
from sandbox.harness.run_tests import test_names
from sandbox.result import ExecResult, ExecStatus
from sandbox.test_report import ReportError, TestOutcome, parse_junit, read_report

HARNESS = Path(__file__).parent / "harness" / "run_tests.py"
HARNESS_IN_SANDBOX = "/grader/run_tests.py"
DEFAULT_COMMAND = ["/usr/bin/python3", "-I", "-S", HARNESS_IN_SANDBOX]
REPORT_NAME = "junit.xml"
KILLED = (ExecStatus.TO, ExecStatus.ML, ExecStatus.OL)
_SEVERITY = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}

RewardStatus = Literal["scored", "invalid", "infra_error"]


@dataclass(frozen=True)
class GradeResult:
    """One graded submission. `reward` is None unless reward_status is "scored"."""

    outcomes: dict[str, str]  # "file.py::test_name" -> passed | failed | error | skipped | missing
    tests_expected: int
    tests_collected: int  # testcases in the report (0 without one)
    suite_ran: bool  # a report was read
    tamper_flags: tuple[str, ...]
    reward_components: dict[str, float]
    reward: float | None
    reward_status: RewardStatus
    exec: ExecResult
    messages: dict[str, str] = field(default_factory=dict)  # short failure message per test

    def to_dict(self) -> dict:
        return {
            "outcomes": dict(self.outcomes),
            "tests_expected": self.tests_expected,
            "tests_collected": self.tests_collected,
            "suite_ran": self.suite_ran,
            "tamper_flags": list(self.tamper_flags),
            "reward_components": dict(self.reward_components),
            "reward": self.reward,
            "reward_status": self.reward_status,
            "exec": self.exec.to_dict(),
            "messages": dict(self.messages),
        }


def expected_tests(tests: Mapping[str, str]) -> list[tuple[str, str]]:
    """(file stem, test name) of every expected test, in file then definition order.

    Raises SyntaxError if a test file does not parse."""
    found = []
    for filename in sorted(tests):
        if _is_test_file(filename):
            found += [(PurePosixPath(filename).stem, name) for name in test_names(tests[filename], filename)]
    return found


def grade(
    sandbox: Sandbox,
    workspace_files: dict[str, str],
    tests: dict[str, str],
    command: list[str] | None = None,
    binary: bool = False,
) -> GradeResult:
    """Grade one submission with a fresh sandbox run; see the module docstring for the rules."""
    try:
        expected, invalid = expected_tests(tests), "no test functions in the tests"
    except SyntaxError as e:
        expected, invalid = [], f"test file does not parse: {e}"
    command = list(command or DEFAULT_COMMAND)
    # The built-in harness writes its report to stdout unless it is told a file.
    report_on_stdout = HARNESS_IN_SANDBOX in command and "--report" not in command
    with _grading_dirs(tests, sandbox) as (grader_dir, report_dir):
        mounts = [Mount(grader_dir, "/grader"), Mount(report_dir, "/report", writable=True)]
        result = sandbox.run(command, workspace_files, mounts)
        try:
            report = parse_junit(result.stdout) if report_on_stdout else read_report(report_dir / REPORT_NAME)
        except ReportError:
            report = None
    if not expected:
        return _unscored("invalid", result, invalid, expected)
    if result.status is ExecStatus.XX:
        return _unscored("infra_error", result, result.error or "", expected)
    if report_on_stdout and result.stdout_truncated:  # only the harness writes there: our limit, not theirs
        return _unscored("infra_error", result, "the report did not fit the sandbox's stdout excerpt "
                         "(raise Limits.excerpt_bytes)", expected)
    return score(expected, report, result, binary)


def score(
    expected: list[tuple[str, str]],
    report: list[TestOutcome] | None,
    result: ExecResult,
    binary: bool = False,
) -> GradeResult:
    """Rules 3-7 of the module docstring, for a run that happened (status is not XX)."""
    outcomes, messages = _outcomes(expected, report or [])
    passed = sum(o == "passed" for o in outcomes.values())
    all_passed = passed == len(expected)
    components = {"tests_passed_fraction": passed / len(expected), "all_passed": float(all_passed)}
    flags = []
    if report is None and result.status not in KILLED:
        flags.append("no_report")
    elif report is not None and result.status not in KILLED and (result.exit_code == 0) != all_passed:
        flags.append("exit_code_disagrees")
    if report is None or flags or result.status in KILLED:
        reward = 0.0
    else:
        reward = components["all_passed"] if binary else components["tests_passed_fraction"]
    return GradeResult(
        outcomes=outcomes, tests_expected=len(expected), tests_collected=len(report or []),
        suite_ran=report is not None, tamper_flags=tuple(flags), reward_components=components,
        reward=reward, reward_status="scored", exec=result, messages=messages,
    )


def _outcomes(expected, report: list[TestOutcome]) -> tuple[dict[str, str], dict[str, str]]:
    worst: dict[tuple[str, str], TestOutcome] = {}
    for t in report:
        key = (t.classname.rsplit(".", 1)[-1], t.name)  # pytest's classname is a dotted path
        if key not in worst or _SEVERITY.get(t.outcome, 3) > _SEVERITY.get(worst[key].outcome, 3):
            worst[key] = t
    outcomes, messages = {}, {}
    for stem, name in expected:
        node_id = f"{stem}.py::{name}"
        found = worst.get((stem, name))
        outcomes[node_id] = found.outcome if found else "missing"
        if found and found.message:
            messages[node_id] = found.message
    return outcomes, messages


def _unscored(status: RewardStatus, exec_result: ExecResult, message: str, expected: list) -> GradeResult:
    return GradeResult(
        outcomes={}, tests_expected=len(expected), tests_collected=0, suite_ran=False, tamper_flags=(),
        reward_components={}, reward=None, reward_status=status, exec=exec_result,
        messages={"_": message} if message else {},
    )


@contextmanager
def _grading_dirs(tests: Mapping[str, str], sandbox: Sandbox) -> Iterator[tuple[Path, Path]]:
    """A fresh directory in the sandbox's scratch space with grader/ (harness + tests:
    root-owned and world-readable, so the sandbox user can read but not change them) and
    report/ (the sandbox user's)."""
    root = Path(tempfile.mkdtemp(prefix="crucible-grade-", dir=sandbox.scratch_dir))
    try:
        grader, report = root / "grader", root / "report"
        (grader / "tests").mkdir(parents=True)
        shutil.copyfile(HARNESS, grader / "run_tests.py")
        for filename, source in tests.items():
            target = grader / "tests" / _safe_name(filename)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source)
        for path in [grader, *grader.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        report.mkdir(mode=0o700)
        os.chown(report, sandbox.spec.uid, sandbox.spec.gid)
        yield grader, report
    finally:
        shutil.rmtree(root)


def _is_test_file(filename: str) -> bool:
    path = PurePosixPath(filename)
    return len(path.parts) == 1 and path.name.startswith("test_") and path.suffix == ".py"


def _safe_name(filename: str) -> PurePosixPath:
    path = PurePosixPath(filename)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"test file name must be a relative path inside the tests: {filename!r}")
    return path
