"""The grading protocol: run a task's hidden tests against one submission in a fresh sandbox and
turn the run into a reward.

`grade` runs the built-in harness (function tasks); `grade_test_command` a repository task's own
test command under our pytest plugin, which vouches for its report. Both apply the same rules, in
order; the rule numbers in comments below are those of docs/grading.md, which states each rule
and why it is so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from grading.diagnosis import (
    Diagnosis,
    Evidence,
    diagnose,
    environment_problem,
    installed_modules,
    installed_roots,
    top_level_imports,
    what_it_was_doing,
)
from grading.test_report import MAX_REPORT_BYTES, ReportError, TestOutcome, parse_junit, read_untrusted
from sandbox.base import WORKSPACE, Mount, Sandbox, write_read_only_tree
from sandbox.harness.bundle import HARNESS, harness_files
from sandbox.harness.run_tests import test_names
from sandbox.harness.session_files import progress_files, session_files
from sandbox.harness.session_signature import signature
from sandbox.python_ast import AST_LOCK
from sandbox.result import ExecResult
from statuses import ExecStatus, FailureReason, Outcome, RewardStatus, TamperFlag

HARNESS_IN_SANDBOX = "/grader/run_tests.py"
DEFAULT_COMMAND = ["/usr/bin/python3", "-I", "-S", HARNESS_IN_SANDBOX]
REPORT_NAME = "junit.xml"
PLUGIN = HARNESS.with_name("pytest_session.py")
PLUGIN_FILES = (PLUGIN, *(HARNESS.with_name(name) for name in ("session_signature.py", "session_files.py")))
PLUGIN_DIR = "/grader"
# xunit1 keeps pytest's classname as the dotted module (and class) path of each test.
PYTEST_OPTIONS = (f"--junitxml=/report/{REPORT_NAME} -o junit_family=xunit1 -p no:cacheprovider "
                  f"-p {PLUGIN.stem}")
KILLED = (ExecStatus.TO, ExecStatus.ML, ExecStatus.OL)
STACKS_TAIL_BYTES = 64 << 10  # of the plugin's stack dumps: the last one is what counts
_SEVERITY = {Outcome.PASSED: 0, Outcome.SKIPPED: 1, Outcome.FAILED: 2, Outcome.ERROR: 3}


@dataclass(frozen=True)
class GradeResult:
    """One graded submission. `reward` is None unless reward_status is "scored"."""

    outcomes: dict[str, Outcome]  # "file.py::test_name" -> its outcome
    tests_expected: int
    tests_collected: int  # testcases in the report (0 without one)
    suite_ran: bool  # a report was read
    tamper_flags: tuple[TamperFlag, ...]
    reward_components: dict[str, float]
    reward: float | None
    reward_status: RewardStatus
    exec: ExecResult
    messages: dict[str, str] = field(default_factory=dict)  # short failure message per test
    reward_version: str = ""  # the reward function that set `reward` (task_sets/rewards.py)
    failure: Diagnosis | None = None  # why it did not pass (grading/diagnosis.py); None when it passed

    def __post_init__(self) -> None:
        """Statuses come from their closed sets: a value outside one is refused here."""
        object.__setattr__(self, "reward_status", RewardStatus(self.reward_status))
        if self.failure is not None:
            object.__setattr__(self, "failure", Diagnosis(FailureReason(self.failure.reason), self.failure.detail))
        object.__setattr__(self, "tamper_flags", tuple(TamperFlag(flag) for flag in self.tamper_flags))
        object.__setattr__(self, "outcomes", {name: Outcome(o) for name, o in self.outcomes.items()})

    @property
    def gated(self) -> bool:
        """Rules 5-7 zeroed the reward, whatever the tests say."""
        return bool(self.tamper_flags) or not self.suite_ran or self.exec.status in KILLED

    @property
    def passed(self) -> bool:
        """Rule 9: scored, not gated (no tamper flag, not killed, a report) and every expected
        test passed. Every count of passes, anywhere, is a count of this."""
        return (self.reward_status is RewardStatus.SCORED and not self.gated and self.tests_expected > 0
                and len(self.outcomes) == self.tests_expected
                and all(outcome is Outcome.PASSED for outcome in self.outcomes.values()))

    @staticmethod
    def infra_failed(grade: GradeResult) -> bool:
        """A grading the sandbox, not the submission, ended: what a sandbox pool retries on a fresh one."""
        return grade.reward_status is RewardStatus.INFRA_ERROR

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "outcomes": {name: outcome.value for name, outcome in self.outcomes.items()},
            "tests_expected": self.tests_expected,
            "tests_collected": self.tests_collected,
            "suite_ran": self.suite_ran,
            "tamper_flags": [flag.value for flag in self.tamper_flags],
            "reward_components": dict(self.reward_components),
            "reward": self.reward,
            "reward_status": self.reward_status.value,
            "exec": self.exec.to_dict(),
            "messages": dict(self.messages),
            "reward_version": self.reward_version,
            "failure_reason": self.failure.reason.value if self.failure else None,
            "failure_detail": self.failure.detail if self.failure else "",
        }


def expected_tests(tests: Mapping[str, str]) -> list[str]:
    """Node ids ("test_x.py::test_name") of every expected test, in file then definition order.

    Raises SyntaxError if a test file does not parse."""
    found = []
    for filename in sorted(tests):
        if _is_test_file(filename):
            found += [f"{filename}::{name}" for name in _test_names(tests[filename], filename)]
    return found


@lru_cache(maxsize=4096)  # a task's tests are graded once per submission: parsed once
def _test_names(source: str, filename: str) -> tuple[str, ...]:
    with AST_LOCK:  # test_names builds an AST; this runs on the pool's threads
        return tuple(test_names(source, filename))


def grade(
    sandbox: Sandbox,
    workspace_files: dict[str, str],
    tests: dict[str, str],
    command: list[str] | None = None,
) -> GradeResult:
    """Grade one submission with the built-in harness in a fresh sandbox run, by the rules
    of docs/grading.md."""
    try:
        expected, invalid = expected_tests(tests), "no test functions in the tests"
    except SyntaxError as e:
        expected, invalid = [], f"test file does not parse: {e}"
    command = list(command or DEFAULT_COMMAND)
    # The built-in harness writes its report to stdout unless it is told a file.
    report_on_stdout = HARNESS_IN_SANDBOX in command and "--report" not in command
    grader = {**harness_files(), **{f"tests/{name}": source for name, source in tests.items()}}
    with _grading_dirs(sandbox, {}, report=not report_on_stdout) as dirs:
        result = sandbox.run(command, workspace_files, dirs.mounts, trees={"/grader": grader})
        report = _parse(result.stdout if report_on_stdout else _read_small(dirs.report / REPORT_NAME, MAX_REPORT_BYTES)
                        or b"")
    if not expected:
        return _unscored(RewardStatus.INVALID, result, invalid, expected)
    if result.status is ExecStatus.XX:
        return _unscored(RewardStatus.INFRA_ERROR, result, result.error or "", expected)
    if report_on_stdout and result.stdout_truncated:  # only the harness writes there: our limit, not theirs
        return _unscored(RewardStatus.INFRA_ERROR, result, "the report did not fit the sandbox's stdout excerpt "
                         "(raise Limits.excerpt_bytes)", expected)
    evidence = Evidence(changed=(), repository=workspace_files.keys(), installed=installed_modules(sandbox.spec.overlay),
                        grader_text="", tests_import=_imports_of(tests))
    problem = environment_problem(report, result, pytest_started=True, evidence=evidence)
    if problem is not None:
        return _unscored(RewardStatus.ENV_ERROR, result, problem.detail, expected, problem)
    runner_passed = result.exit_code == 0
    return score(expected, report, result, _harness_node_id, runner_passed, ran_exactly_the_expected=True,
                 wall_limit_s=sandbox.spec.limits.wall_s)


def grade_test_command(
    sandbox: Sandbox,
    workspace_files: Mapping[str, str | bytes],
    expected: Sequence[str],
    test_command: str,
    grader_files: Mapping[str, str] = MappingProxyType({}),
    verdict_file: str | None = None,
    tamper_flags: Sequence[TamperFlag] = (),
    sealed: Sequence[str] = (),
    changed: Collection[str] = (),
    repository: Collection[str] = (),
    pytest_sessions: int = 1,
) -> GradeResult:
    """Grade a repository with its own test command (run by /bin/sh in the repository root).

    pytest, wherever the command starts it, writes a JUnit report to /report through
    PYTEST_ADDOPTS. `grader_files` are shown read-only at /tests. The runner's own verdict is
    its exit code, or the number it writes to `verdict_file` (1 = pass, as Harbor's
    reward.txt); either must agree with the report: pass iff no collected test failed.
    `tamper_flags` found before the run (protected paths) set the reward to 0. `sealed` files
    (hidden tests, protected paths) cannot be changed by the run (Session.protect). `changed`
    (the paths the submission changed) and `repository` (the pristine repository's paths) tell
    an environment error from the submission's own (grading/diagnosis.py). A command that runs
    pytest `pytest_sessions` times has each session vouched for; their reports are read together."""
    python_path = ":".join([PLUGIN_DIR, *(value for key, value in sandbox.spec.env if key == "PYTHONPATH")])
    command = ["/usr/bin/env", f"PYTEST_ADDOPTS={PYTEST_OPTIONS}", f"PYTHONPATH={python_path}",
               "PYTHONDONTWRITEBYTECODE=1", "/bin/sh", "-c", test_command]
    verdict_dir = str(PurePosixPath(verdict_file).parent) if verdict_file else None
    plugin = _plugin_files()
    tokens = [secrets.token_hex(16) for _ in range(pytest_sessions)]
    # The plugin dumps its threads' stacks after this long without progress: ten times in a stalled run.
    watchdog_s = min(30.0, max(1.0, sandbox.spec.limits.wall_s / 10))
    with _grading_dirs(sandbox, {"/tests": grader_files, PLUGIN_DIR: plugin}, verdict_dir) as dirs:
        sealed_sha256 = {f"{WORKSPACE}/{path}": hashlib.sha256(_bytes(workspace_files[path])).hexdigest()
                         for path in sealed}
        secrets_ = [json.dumps({"token": token, "sealed": sealed_sha256, "watchdog_s": watchdog_s})
                    for token in tokens]
        for number, secret in enumerate(secrets_):
            _write_private(dirs.report / PurePosixPath(session_files(number)[0]).name, secret, sandbox)
        result = sandbox.run(command, workspace_files, dirs.mounts, protected=sealed)
        runs = [_session_run(dirs.report, number, secret) for number, secret in enumerate(secrets_)]
        verdict = _read_verdict(dirs.verdict / PurePosixPath(verdict_file).name) if dirs.verdict else None
    # The plugin takes a token when pytest loads it; no submission knows a token to put it back.
    pytest_started = any(run.started for run in runs)
    reports = [run.report for run in runs if run.report is not None]
    report = [case for cases in reports for case in cases] if reports else None
    if not expected:
        return _unscored(RewardStatus.INVALID, result, "the task names no test to run", [])
    if result.status is ExecStatus.XX:
        return _unscored(RewardStatus.INFRA_ERROR, result, result.error or "", list(expected))
    session_flag = _sessions_problem(runs, tokens) if report is not None and result.status not in KILLED else None
    workspace = (WORKSPACE, *filter(None, [sandbox.spec.workspace_alias]))
    # Sealed files (hidden tests, protected paths) are the grader's: as pristine as the repository's.
    evidence = Evidence(changed=changed, repository={*repository, *sealed},
                        installed=installed_modules(sandbox.spec.overlay),
                        grader_text="\n".join([test_command, *grader_files.values()]), files=workspace_files,
                        import_roots=_import_roots(sandbox, workspace), workspace=workspace)
    problem = environment_problem(report, result, pytest_started, evidence)
    # Only a run the submission did not flag, with reports its sessions vouch for, can blame the environment.
    if problem is not None and result.status not in KILLED and not tamper_flags and session_flag is None:
        return _unscored(RewardStatus.ENV_ERROR, result, problem.detail, list(expected), problem)
    tamper_flags = [*tamper_flags, session_flag] if session_flag else tamper_flags
    runner_passed = verdict if verdict_file else result.exit_code == 0
    by_junit_key = {_junit_key(node_id): node_id for node_id in expected}

    def node_id(t: TestOutcome) -> str | None:
        return (by_junit_key.get((t.classname, t.name)) or by_junit_key.get((t.classname, _cut(t.name)))
                or by_junit_key.get((t.classname, _shortened(t.name))))

    doing = next((what_it_was_doing(run.progress, run.stacks, workspace) for run in reversed(runs) if run.progress),
                 "") if result.status in KILLED else ""
    return score(list(expected), report, result, node_id, runner_passed, ran_exactly_the_expected=False,
                 flags=tamper_flags, wall_limit_s=sandbox.spec.limits.wall_s, doing=doing)


def score(
    expected: list[str],
    report: list[TestOutcome] | None,
    result: ExecResult,
    node_id: Callable[[TestOutcome], str | None],
    runner_passed: bool | None,
    ran_exactly_the_expected: bool,
    flags: Sequence[TamperFlag] = (),
    wall_limit_s: float = 0.0,
    doing: str = "",
) -> GradeResult:
    """Rules 4-8 (docs/grading.md), for a run that happened (status is not XX).

    `runner_passed` is the runner's own verdict (None: it gave none). With
    `ran_exactly_the_expected` (our harness) it must equal "every expected test passed";
    otherwise (a test command that may run more tests) "no collected test failed". `doing`:
    what a killed run was doing, for its failure's detail."""
    outcomes, messages, details = _outcomes(expected, report or [], node_id)
    passed = sum(o is Outcome.PASSED for o in outcomes.values())
    all_passed = passed == len(expected)
    components = {"tests_passed_fraction": passed / len(expected), "all_passed": float(all_passed)}
    flags = list(flags)
    killed = result.status in KILLED
    if report is None and not killed:
        flags.append(TamperFlag.NO_REPORT)
    elif report is not None and not killed:
        report_passed = all_passed if ran_exactly_the_expected else _no_failures(report)
        if runner_passed is None:
            flags.append(TamperFlag.NO_VERDICT)
        elif runner_passed != report_passed:
            flags.append(TamperFlag.EXIT_CODE_DISAGREES)
    reward = 0.0 if report is None or flags or killed else components["tests_passed_fraction"]
    return GradeResult(
        outcomes=outcomes, tests_expected=len(expected), tests_collected=len(report or []),
        suite_ran=report is not None, tamper_flags=tuple(flags), reward_components=components,
        reward=reward, reward_status=RewardStatus.SCORED, exec=result, messages=messages,
        failure=diagnose(outcomes, messages, details, report, result, [flag.value for flag in flags], wall_limit_s,
                         doing),
    )


@cache
def _plugin_files() -> dict[str, str]:
    return {path.name: path.read_text() for path in PLUGIN_FILES}


@dataclass(frozen=True)
class _SessionRun:
    started: bool  # pytest took this session's token
    report_bytes: bytes | None
    report: list[TestOutcome] | None
    record: dict | None
    progress: dict | None = None  # what the plugin said it was doing last (words only: the run can write it)
    stacks: str = ""  # the end of the plugin's stack dumps


def _sessions_problem(runs: list[_SessionRun], tokens: list[str]) -> TamperFlag | None:
    """The first session that does not vouch for its report; a session that started and left
    no report or no record never reached its end (early exit)."""
    for run, token in zip(runs, tokens):
        if run.report is not None:
            problem = _session_problem(run.record, token, run.report_bytes)
            if problem:
                return problem
        elif run.started:
            return TamperFlag.EARLY_EXIT
    return None


def _imports_of(tests: Mapping[str, str]) -> set[str]:
    """The top-level modules the hidden test files import (our harness's tests)."""
    return {module for source in tests.values() for module in _top_level_imports(source)}


@lru_cache(maxsize=4096)
def _top_level_imports(source: str) -> frozenset[str]:
    return frozenset(top_level_imports(source))


def _import_roots(sandbox: Sandbox, workspace: Sequence[str]) -> set[str]:
    """Folders of the repository on sys.path before any of its code runs: its root, those on the
    sandbox's PYTHONPATH (a task environment's python_path: src), those the environment's .pth
    files name (an editable install)."""
    roots = {"", *installed_roots(sandbox.spec.overlay, workspace)}
    for key, value in sandbox.spec.env:
        for folder in value.split(":") if key == "PYTHONPATH" else ():
            for name in workspace:
                if PurePosixPath(folder).is_relative_to(name):
                    relative = str(PurePosixPath(folder).relative_to(name))
                    roots.add("" if relative == "." else relative)
    return roots


def _session_run(report_dir: Path, number: int, secret: str) -> _SessionRun:
    token_file, record_file, report_file = (PurePosixPath(path).name for path in session_files(number))
    progress_file, stacks_file = (PurePosixPath(path).name for path in progress_files(number))
    report_bytes = _read_small(report_dir / report_file, MAX_REPORT_BYTES)
    return _SessionRun(started=_read_small(report_dir / token_file, 4096) != secret.encode(), report_bytes=report_bytes,
                       report=_parse(report_bytes) if report_bytes is not None else None,
                       record=_read_small_json(report_dir / record_file),
                       progress=_read_small_json(report_dir / progress_file),
                       stacks=_read_tail(report_dir / stacks_file, STACKS_TAIL_BYTES))


def _bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else content


def _session_problem(session: dict | None, token: str, report_bytes: bytes) -> TamperFlag | None:
    """What the plugin's session record says of the report: None (it vouches for it),
    "early_exit" (no record: the session never ended), "forged_output", or
    "protected_path_modified" (a sealed file changed during the run)."""
    if session is None:
        return TamperFlag.EARLY_EXIT
    try:
        exitstatus, report_sha256 = int(session["exitstatus"]), str(session["report_sha256"])
        intact, sealed_intact = session["runner_intact"] is True, session["sealed_intact"] is True
        claimed = str(session["signature"])
    except (KeyError, TypeError, ValueError):
        return TamperFlag.FORGED_OUTPUT
    genuine = hmac.compare_digest(claimed, signature(token, exitstatus, report_sha256, intact, sealed_intact))
    if not (genuine and intact and report_sha256 == hashlib.sha256(report_bytes).hexdigest()):
        return TamperFlag.FORGED_OUTPUT
    return None if sealed_intact else TamperFlag.PROTECTED_PATH_MODIFIED


def _no_failures(report: list[TestOutcome]) -> bool:
    return bool(report) and not any(t.outcome in (Outcome.FAILED, Outcome.ERROR) for t in report)


def _harness_node_id(t: TestOutcome) -> str:
    return f"{t.classname.rsplit('.', 1)[-1]}.py::{t.name}"


def _cut(name: str) -> str:
    """A test's name up to its first whitespace: the id SWE-bench's log parser records for a
    test whose parameters hold a space (`test_make_error[required-Missing data for ...]`)."""
    return name.split(maxsplit=1)[0] if name.strip() else name


_OPTION = re.compile(r"(.*?)\[(.*)\]")


def _shortened(name: str) -> str:
    """A test's name as SWE-bench's option-aware log parser records it (requests, pylint,
    pydicom): a parameter that is an absolute path keeps only its last component
    (`test_x[/tmp/abc/data.txt]` -> `test_x[/data.txt]`), so such ids in FAIL_TO_PASS match."""
    found = _OPTION.fullmatch(name)
    if not found:
        return name
    main, option = found.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def _junit_key(node_id: str) -> tuple[str, str]:
    """pytest's JUnit (classname, name) for a node id: "a/test_b.py::C::t[x]" -> ("a.test_b.C",
    "t[x]"). Parameters may hold "::" themselves, so they are set aside first."""
    base, bracket, parameters = node_id.partition("[")
    path, *scopes = base.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    name = (scopes[-1] if scopes else "") + bracket + parameters
    return ".".join([module, *scopes[:-1]]), name


def _outcomes(expected: list[str], report: list[TestOutcome], node_id
              ) -> tuple[dict[str, Outcome], dict[str, str], dict[str, str]]:
    """Each expected test's outcome (the worst of its entries), short message and traceback."""
    worst: dict[str, TestOutcome] = {}
    for t in report:
        key = node_id(t)
        if key is not None and (key not in worst or _SEVERITY[t.outcome] > _SEVERITY[worst[key].outcome]):
            worst[key] = t
    outcomes, messages, details = {}, {}, {}
    for test in expected:
        found = worst.get(test)
        outcomes[test] = found.outcome if found else Outcome.MISSING
        if found and found.message:
            messages[test] = found.message
        if found and found.details:
            details[test] = found.details
    return outcomes, messages, details


def _parse(data: str | bytes) -> list[TestOutcome] | None:
    try:
        return parse_junit(data)
    except ReportError:
        return None


def _read_verdict(path: Path) -> bool | None:
    """A verdict file's number >= 1 is a pass; missing, odd, infinite or huge: no verdict. A
    `.json` verdict (Harbor's reward.json) is an object of numbers, one per metric: a pass iff
    every one is >= 1."""
    if path.suffix == ".json":
        metrics = _read_small_json(path) or {}
        numbers = [v for v in metrics.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not numbers or len(numbers) != len(metrics) or not all(math.isfinite(v) for v in numbers):
            return None  # not an object of numbers: no verdict
        return all(v >= 1.0 for v in numbers)
    try:
        number = float((_read_small(path, 64) or b"").decode().strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return number >= 1.0 if math.isfinite(number) else None


def _read_small_json(path: Path) -> dict | None:
    try:
        document = json.loads(_read_small(path, 4096) or b"null")
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _read_tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of a text file the sandbox wrote; "" if missing, a link or a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return ""
        f.seek(max(0, info.st_size - limit))
        return f.read(limit).decode(errors="replace")


def _read_small(path: Path, limit: int) -> bytes | None:
    """A file the sandbox wrote; None if missing, a link, a FIFO or over `limit` bytes."""
    try:
        return read_untrusted(path, limit)
    except ReportError:
        return None


def _write_private(path: Path, text: str, sandbox: Sandbox) -> None:
    """A file only the sandbox user (and root) can read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chown(path, sandbox.spec.uid, sandbox.spec.gid)


_UNSCORED_REASON = {RewardStatus.INFRA_ERROR: FailureReason.INFRASTRUCTURE, RewardStatus.INVALID: FailureReason.INVALID_TASK}


def _unscored(status: RewardStatus, exec_result: ExecResult, message: str, expected: list,
              failure: Diagnosis | None = None) -> GradeResult:
    return GradeResult(
        outcomes={}, tests_expected=len(expected), tests_collected=0, suite_ran=False, tamper_flags=(),
        reward_components={}, reward=None, reward_status=status, exec=exec_result,
        messages={"_": message} if message else {},
        failure=failure or Diagnosis.of(_UNSCORED_REASON[status], message or "(no message)"),
    )


@dataclass(frozen=True)
class _GradingDirs:
    mounts: list[Mount]
    report: Path | None
    verdict: Path | None


@contextmanager
def _grading_dirs(
    sandbox: Sandbox, trees: Mapping[str, Mapping[str, str | bytes]], verdict_at: str | None = None,
    report: bool = True,
) -> Iterator[_GradingDirs]:
    """Fresh directories in the sandbox's scratch space: each tree of grader files (root-owned
    and world-readable, so the sandbox user can read but not change them) shown at its path,
    and report/ (unless the report comes on stdout; plus a verdict directory when asked) owned
    by the sandbox user. None at all when none is asked for."""
    if not (trees or report or verdict_at):
        yield _GradingDirs([], None, None)
        return
    root = Path(tempfile.mkdtemp(prefix="crucible-grade-", dir=sandbox.scratch_dir))
    try:
        mounts = []
        for number, (sandbox_path, files) in enumerate(trees.items()):
            tree = root / f"grader-{number}"
            write_read_only_tree(tree, files)
            mounts.append(Mount(tree, sandbox_path))
        report_dir = root / "report" if report else None
        verdict = root / "verdict" if verdict_at else None
        for private in filter(None, (report_dir, verdict)):
            private.mkdir(mode=0o700)
            os.chown(private, sandbox.spec.uid, sandbox.spec.gid)
        if report_dir is not None:
            mounts.append(Mount(report_dir, "/report", writable=True))
        if verdict is not None:
            mounts.append(Mount(verdict, verdict_at, writable=True))
        yield _GradingDirs(mounts, report_dir, verdict)
    finally:
        shutil.rmtree(root)


def _is_test_file(filename: str) -> bool:
    path = PurePosixPath(filename)
    return len(path.parts) == 1 and path.name.startswith("test_") and path.suffix == ".py"

