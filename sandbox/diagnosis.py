"""Why a grading did not pass: one reason from a closed set and a one-line detail, for every
result line, validation finding and trajectory row; and the environment errors among them.

An environment error is a suite the task's environment cannot run, whatever the submission did:
a module the tests import is not installed, the test command's program is missing, or it needed
the network. Its grade is unscored (RewardStatus "env_error"), like an infrastructure error, so
a broken environment never teaches the policy. Each is decided on evidence the grader has
independently of what the run printed (`Evidence`), since a submission may print anything:
- a missing module: the environment does not install it (the grader lists the interpreter's
  modules and the built environment's site-packages), the repository has no module of that
  name, and the import was the tests' own (our harness: a module the hidden tests import;
  pytest: made while collecting, by a file of the pristine repository the submission did not
  change);
- a missing program or the network, when pytest never started (the token the grader leaves is
  still there, exactly: the plugin takes it before any code under test runs): the program is
  named by the grader's own test command or files and is not on the sandbox's PATH, or those
  fetch from the network (curl, uv, pip install, ...) and the output says the network failed;
- never for a run with a tamper flag, or whose reports a session record does not vouch for.
Known limit: on the Docker backend the interpreter's module list is read off this host's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandbox.closed_set import ClosedSet
from sandbox.interpreter import importable_modules
from sandbox.result import ExecResult, ExecStatus
from sandbox.test_report import Outcome, TestOutcome

SUBMISSION_IMPORT_FAILED = "import failed: SubmissionError: "  # our harness, when solution.py does not import
DETAIL_CHARS = 500  # of the one-line detail
EXCERPT_CHARS = 2000  # of each output stream, in result lines

_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '?([\w.]+)'?")
_FRAME = re.compile(r"^(?:/workspace/)?([^\s:][^:]*\.py):\d+: in ", re.M)  # pytest's "path.py:12: in <module>"
_NETWORK = re.compile(r"Could not resolve host|Temporary failure in name resolution|Network is unreachable|"
                      r"Failed to establish a new connection|nodename nor servname|Name or service not known")
_NOT_FOUND = re.compile(r"([^\s:'\"]+): (?:command )?not found\s*$", re.M)
NETWORK_FETCH = re.compile(r"\b(curl|wget)\b|astral\.sh|\b(pip3?|uv) install\b|\buvx\b|\buv run\b|"
                           r"apt(-get)? (update|install)|\bnpm (install|ci)\b|git clone|urlopen|requests\.get")
SANDBOX_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


class FailureReason(ClosedSet):
    """Why a grading did not pass (null when it passed)."""

    DIFF_DOES_NOT_APPLY = "diff_does_not_apply", "the submitted diff does not apply to the repository"
    COLLECTION_ERROR = "collection_error", "a test module could not be imported or collected"
    MISSING_MODULE = "missing_module", "an import failed: a module is not installed or was removed"
    MISSING_COMMAND = "missing_command", "the test command runs a program the environment does not have"
    NETWORK_UNAVAILABLE = "network_unavailable", "the test command needed the network, which the task does not have"
    TESTS_FAILED = "tests_failed", "the suite ran and an expected test failed, errored or was skipped"
    TESTS_MISSING = "tests_missing", "the suite ran but an expected test never ran (renamed, deleted, not collected)"
    TIMEOUT = "timeout", "the run was killed at the wall-clock limit"
    MEMORY_LIMIT = "memory_limit", "the run was killed at the memory limit"
    OUTPUT_LIMIT = "output_limit", "the run was killed for writing more output than allowed"
    NO_REPORT = "no_report", "the suite left no readable report and nothing explains why"
    TAMPERED = "tampered", "a tamper flag was raised (TamperFlag says which)"
    INFRASTRUCTURE = "infrastructure", "the sandbox itself failed"
    INVALID_TASK = "invalid_task", "the task is broken (no expected test, a test file that does not parse)"


@dataclass(frozen=True)
class Diagnosis:
    reason: FailureReason
    detail: str

    @staticmethod
    def of(reason: FailureReason, detail: str) -> Diagnosis:
        return Diagnosis(reason, " ".join(detail.split())[:DETAIL_CHARS])


KILLS = {ExecStatus.TO: (FailureReason.TIMEOUT, "wall-clock"), ExecStatus.ML: (FailureReason.MEMORY_LIMIT, "memory"),
         ExecStatus.OL: (FailureReason.OUTPUT_LIMIT, "output")}


def killed(result: ExecResult, wall_limit_s: float) -> Diagnosis:
    reason, limit = KILLS[result.status]
    extra = f" after {result.wall_s:.1f} s (limit {wall_limit_s:g} s)" if result.status is ExecStatus.TO else ""
    return Diagnosis.of(reason, f"killed at the {limit} limit{extra}; last output: {tail(result)}")


@dataclass(frozen=True)
class Evidence:
    """What the grader knows of a run independently of anything the run printed."""

    changed: Collection[str]  # paths the submission changed (a function task's solution.py)
    repository: Collection[str]  # paths of the pristine starting files
    installed: Collection[str]  # top-level modules the sandbox's interpreter and environment provide
    grader_text: str  # the test command and the grader's own files (a Harbor test.sh), never the submission's
    tests_import: Collection[str] | None = None  # our harness: the top-level modules the hidden tests import


def environment_problem(report: Sequence[TestOutcome] | None, result: ExecResult, pytest_started: bool,
                        evidence: Evidence) -> Diagnosis | None:
    """The environment error this run shows, if any (see the module docstring)."""
    for case in collection_failures(report or []):
        module = missing_module(case.details or case.message)
        if module and _missing_for_the_tests(module, case, evidence):
            importer = importing_file(case.details) or "the hidden tests"
            return Diagnosis.of(FailureReason.MISSING_MODULE, f"the tests import {module!r}, which the environment "
                                f"does not install ({importer}): {last_line(case.details or case.message)}")
    if report is not None or pytest_started:
        return None
    output = f"{result.stderr}\n{result.stdout}"
    if _NETWORK.search(output) and NETWORK_FETCH.search(evidence.grader_text):
        return Diagnosis.of(FailureReason.NETWORK_UNAVAILABLE, f"the test command needed the network: {tail(result)}")
    program = missing_program(output)
    if program and program in evidence.grader_text.split() and not _on_path(program):
        return Diagnosis.of(FailureReason.MISSING_COMMAND, f"the test command runs {program}, which the environment "
                            f"does not have: {tail(result)}")
    module = missing_module(output)
    if module and module.split(".")[0] not in evidence.installed and module in evidence.grader_text:
        return Diagnosis.of(FailureReason.MISSING_MODULE, f"the test command needs {module!r}, which the "
                            f"environment does not install: {tail(result)}")
    return None


def _missing_for_the_tests(module: str, case: TestOutcome, evidence: Evidence) -> bool:
    """Whether a failed import of `module` is the environment's doing: the module is neither
    installed nor the repository's own, and the import was the tests' (our harness: a module the
    hidden tests import; pytest: a file the submission did not change)."""
    top = module.split(".")[0]
    if top in evidence.installed or _provides(evidence.repository, module):
        return False
    if evidence.tests_import is not None:
        return top in evidence.tests_import
    importer = importing_file(case.details)
    return importer is not None and importer in evidence.repository and importer not in evidence.changed


def installed_modules(overlay: str) -> frozenset[str]:
    """The top-level modules a sandbox's python3 finds without the workspace: the interpreter's
    own and those of the built environment at `overlay` (its site-packages)."""
    site = Path(overlay, "site-packages") if overlay else None
    extra = {path.name.split(".", 1)[0] for path in site.iterdir()} if site and site.is_dir() else set()
    return importable_modules() | extra


def missing_program(output: str) -> str | None:
    """The program a shell could not find: "sh: 1: tox: not found", "line 3: uvx: command not found"."""
    found = _NOT_FOUND.search(output)
    return found.group(1) if found else None


def _on_path(program: str) -> bool:
    return any(os.access(os.path.join(folder, program), os.X_OK) for folder in SANDBOX_PATH)


def diagnose(outcomes: dict[str, Outcome], messages: dict[str, str], details: dict[str, str],
             report: Sequence[TestOutcome] | None, result: ExecResult, flags: Sequence[str], wall_limit_s: float
             ) -> Diagnosis | None:
    """Why a scored grading did not pass (None when every expected test passed, unflagged)."""
    if result.status in KILLS:
        return killed(result, wall_limit_s)
    if report is None:
        return Diagnosis.of(FailureReason.NO_REPORT, f"the suite left no report (exit {result.exit_code}); "
                            f"last output: {tail(result)}")
    collection = collection_failures(report)
    if collection:
        case = collection[0]
        module = missing_module(case.details or case.message)
        reason = FailureReason.MISSING_MODULE if module else FailureReason.COLLECTION_ERROR
        return Diagnosis.of(reason, f"{case.name} could not be collected: {last_line(case.details or case.message)}")
    if flags:
        return Diagnosis.of(FailureReason.TAMPERED, f"tamper flags: {', '.join(flags)}")
    failed = [test for test, outcome in outcomes.items() if outcome not in (Outcome.PASSED, Outcome.MISSING)]
    missing = [test for test, outcome in outcomes.items() if outcome is Outcome.MISSING]
    if failed and all(messages.get(test, "").startswith(SUBMISSION_IMPORT_FAILED) for test in failed):
        message = messages[failed[0]].removeprefix(SUBMISSION_IMPORT_FAILED)
        reason = FailureReason.MISSING_MODULE if missing_module(message) else FailureReason.COLLECTION_ERROR
        return Diagnosis.of(reason, f"the submission does not import: {message}")
    if failed:
        first = failed[0]
        return Diagnosis.of(FailureReason.TESTS_FAILED, f"{len(failed)} of {len(outcomes)} expected tests "
                            f"{outcomes[first].value if len(failed) == 1 else 'did not pass'}; first: {first}: "
                            f"{_what_failed(messages.get(first, ''), details.get(first, ''))}")
    if missing:
        return Diagnosis.of(FailureReason.TESTS_MISSING, f"{len(missing)} of {len(outcomes)} expected tests never "
                            f"ran (the report has {len(report)} tests); first: {missing[0]}")
    return None


def _what_failed(message: str, traceback: str) -> str:
    """The test's message, with the failing line of its traceback where the message alone is
    bare (a plain `assert` under our harness says only "AssertionError:")."""
    if message.rstrip().endswith(":") or not message.strip():
        lines = [line.strip() for line in traceback.splitlines() if line.strip()]
        source = [line for line in lines[:-1] if not line.startswith(("File ", "Traceback", "^", "~"))]
        if source:
            return f"{message.strip()} {source[-1]}".strip()
    return message


def collection_failures(report: Sequence[TestOutcome]) -> list[TestOutcome]:
    """Test modules that could not be collected: pytest reports each as an error with no class;
    our harness reports each of the module's tests as "import failed" (a failed import of the
    submission itself is a SubmissionError, not a collection failure of the tests)."""
    return [case for case in report if case.outcome is Outcome.ERROR and (
        (case.classname == "" and "collection failure" in case.message)
        or (case.message.startswith("import failed: ") and "SubmissionError" not in case.message))]


def missing_module(text: str) -> str | None:
    found = _MISSING_MODULE.findall(text)
    return found[-1] if found else None


def importing_file(traceback: str) -> str | None:
    """The last workspace file of a pytest traceback (the one whose import failed)."""
    frames = [path for path in _FRAME.findall(traceback) if not path.startswith("/")]
    return frames[-1] if frames else None


def _provides(repository: Collection[str], module: str) -> bool:
    """Whether the repository has a module or package of that top-level name, at any depth (a
    src/ layout included)."""
    top = module.split(".")[0]
    return any(top in PurePosixPath(path).parts[:-1] or PurePosixPath(path).stem == top for path in repository)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("E ").strip() if lines else ""


def tail(result: ExecResult, chars: int = 300) -> str:
    text = (result.stderr.strip() or result.stdout.strip() or result.error or "(none)")
    return text[-chars:]


def excerpt(text: str) -> str:
    """A capped excerpt of one output stream: its head and its tail, where most is said."""
    if len(text) <= EXCERPT_CHARS:
        return text
    half = EXCERPT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - EXCERPT_CHARS} characters ...]\n{text[-half:]}"
