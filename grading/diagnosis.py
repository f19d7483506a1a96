"""Why a grading did not pass: one reason from a closed set and a one-line detail, for every
result line, validation finding and trajectory row; and the environment errors among them.

An environment error is a suite the task's environment cannot run, whatever the submission did:
a module the tests import is not installed, the test command's program is missing, or it needed
the network. Its grade is unscored (RewardStatus "env_error"), like an infrastructure error, so
a broken environment never teaches the policy. Each is decided on evidence the grader has
independently of what the run printed (`Evidence`), since a submission may print anything:
- a missing module: the environment does not install it (the grader lists the interpreter's
  modules and the built environment's site-packages, editable installs included), the
  repository cannot provide it, and the import was the tests' own (our harness: a module the
  hidden tests import; pytest: made while collecting, a conftest.py that pytest loads before the
  session included, by a file of the pristine repository the submission did not change).
  "Cannot provide it": the repository has no module of that name, or has one only where nothing
  of the pristine repository puts it on sys.path (a src/ layout the environment does not
  install): none of its files is at the root, in a folder on PYTHONPATH (the environment's, the
  test command's), in a folder an installed .pth file names, or in a folder pytest puts on
  sys.path for a test file or conftest.py of its; no conftest.py or test file of the pristine
  repository touches sys.path; the submission removed none of its files; and the file that
  failed to import it imports it at its top level. A submission that deletes or moves the
  package, or edits the conftest.py (restored and flagged anyway), is graded, not excused;
- a missing program or the network, when pytest never started (the token the grader leaves is
  still there, exactly: the plugin takes it before any code under test runs): the program is
  named by the grader's own test command or files and is not on the sandbox's PATH, or those
  fetch from the network (curl, uv, pip install, ...) and the output says the network failed;
- never for a run with a tamper flag, or whose reports a session record does not vouch for.
A test that fails because it needed the network (a download: "Temporary failure in name
resolution", "Network is unreachable", socket.gaierror, urllib's URLError, requests'
ConnectionError) is labelled "network_unavailable", naming the test and its error, but stays
scored: the code under test runs in the test's process and can open sockets (or raise their
errors) itself, so nothing the grader holds tells the tests' own download from the
submission's, and excusing such failures would pay a policy for making them. Only where the
evidence does not depend on the submission (the grader's own command fetching before pytest
started, above) is it an environment error; a reference solution failing so is what marks an
instance unusable for the network (task validation grades it).
A run killed at a limit says what it was doing when killed, from what the pytest plugin left
(harness/pytest_session.py: the file it was collecting or the test it was running, and where
the interpreter stood), since pytest holds back the output of what it is collecting or running.
Known limits: on the Docker backend the interpreter's module list is read off this host's; and a
traceback is the run's own text, so code under test written to fake one (raising the error from
code compiled under a pristine file's name) could pass its failure off as the environment's.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from grading.test_report import TestOutcome
from sandbox import python_ast
from sandbox.interpreter import importable_modules
from sandbox.result import ExecResult
from statuses import ExecStatus, FailureReason, Outcome
from task_sets.schema import NETWORK_FETCH

SUBMISSION_IMPORT_FAILED = "import failed: SubmissionError: "  # our harness, when solution.py does not import
DETAIL_CHARS = 500  # of the one-line detail
EXCERPT_CHARS = 2000  # of each output stream, in result lines

_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '?([\w.]+)'?")
_FRAME = re.compile(r"^(?:/workspace/)?([^\s:][^:\n]*\.py):\d+: in ", re.M)  # pytest's "path.py:12: in <module>"
_NETWORK = re.compile(r"Could not resolve host|Temporary failure in name resolution|Network is unreachable|"
                      r"Failed to establish a new connection|nodename nor servname|Name or service not known")
_NOT_FOUND = re.compile(r"([^\s:'\"]+): (?:command )?not found\s*$", re.M)
# What a test's failure says when it needed the network the sandbox does not have: the resolver's
# errors (getaddrinfo's negative errno: -2 no such name, -3 try again, -5 no address), an
# unreachable network or host; urllib's URLError and requests' ConnectionError carry them.
_NO_NETWORK = re.compile(r"Temporary failure in name resolution|Name or service not known|No address associated "
                         r"with hostname|nodename nor servname|Network is unreachable|No route to host|Could not "
                         r"resolve host|getaddrinfo failed|\bgaierror\b|\[Errno -[235]\]")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|error|Failure|Warning)\b")
_STACK_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')  # faulthandler's frame lines
SANDBOX_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclass(frozen=True)
class Diagnosis:
    reason: FailureReason
    detail: str

    @staticmethod
    def of(reason: FailureReason, detail: str) -> Diagnosis:
        return Diagnosis(reason, " ".join(detail.split())[:DETAIL_CHARS])


KILLS = {ExecStatus.TO: (FailureReason.TIMEOUT, "wall-clock"), ExecStatus.ML: (FailureReason.MEMORY_LIMIT, "memory"),
         ExecStatus.OL: (FailureReason.OUTPUT_LIMIT, "output")}


def killed(result: ExecResult, wall_limit_s: float, doing: str = "") -> Diagnosis:
    """A kill at a limit, with what the run was doing (`doing`, from `what_it_was_doing`: "while
    collecting tests/test_x.py (at tests/test_x.py:3 in <module>)") and its last output."""
    reason, limit = KILLS[result.status]
    extra = f" after {result.wall_s:.1f} s (limit {wall_limit_s:g} s)" if result.status is ExecStatus.TO else ""
    doing = f" {doing}" if doing else ""
    return Diagnosis.of(reason, f"killed at the {limit} limit{extra}{doing}; last output: {tail(result)}")


_STAGES = {"starting": "while pytest was starting (loading plugins and conftest.py files)",
           "collecting": "while collecting {}", "running": "while running {}",
           "finishing": "after pytest's session had ended (its last plugins, exit handlers, threads)"}


def what_it_was_doing(progress: Mapping | None, stacks: str, workspace: Sequence[str] = ("/workspace",)) -> str:
    """What a killed pytest session was doing, from the plugin's progress record (its stage and
    node id) and the last of faulthandler's stack dumps (`stacks`): the innermost frame of the
    repository's (a path under `workspace`, shown relative) and, where it differs, the innermost
    of all. "" when the plugin left neither. Words for a detail only: the run may have written
    both files itself."""
    phrase = ""
    if isinstance(progress, Mapping) and isinstance(progress.get("stage"), str):
        template = _STAGES.get(progress["stage"], "")
        where = str(progress.get("where", ""))[:200]
        phrase = template.format(where) if "{}" not in template or where else ""
    frames = _last_stack(stacks)
    if not frames:
        return phrase
    def shown(frame: tuple[str, str, str], inside: bool) -> str:
        path, line, function = frame
        return f"{_inside(path, workspace) if inside else PurePosixPath(path).name}:{line} in {function}"
    own = next((frame for frame in frames if _inside(frame[0], workspace)), None)
    at = [shown(own, True)] if own else []
    if frames[0] is not own:
        at.append(f"inside {shown(frames[0], False)}" if own else shown(frames[0], False))
    return f"{phrase} (at {', '.join(at)})".strip()


def _last_stack(stacks: str) -> list[tuple[str, str, str]]:
    """The frames, innermost first, of the last thread (the main thread: faulthandler lists the
    newest first) of the last dump in faulthandler's text."""
    dump = stacks.rsplit("Timeout (", 1)[-1]
    threads = re.split(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+.*$", dump, flags=re.M)
    for thread in reversed(threads):
        frames = [match.groups() for match in map(_STACK_FRAME.match, thread.splitlines()) if match]
        if frames:
            return frames
    return []


def _inside(path: str, workspace: Sequence[str]) -> str:
    """`path` relative to the workspace it lies in (by any of its names), else ""."""
    for root in workspace:
        if root and path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1:]
    return ""


@dataclass(frozen=True)
class Evidence:
    """What the grader knows of a run independently of anything the run printed."""

    changed: Collection[str]  # paths the submission changed (a function task's solution.py)
    repository: Collection[str]  # paths of the pristine starting files
    installed: Collection[str]  # top-level modules the sandbox's interpreter and environment provide
    grader_text: str  # the test command and the grader's own files (a Harbor test.sh), never the submission's
    tests_import: Collection[str] | None = None  # our harness: the top-level modules the hidden tests import
    # The tree the run started with (submission applied, protected paths restored, hidden tests in): an
    # unchanged file's text is the pristine one. None: unknown, and no repository module is ever excused.
    files: Mapping[str, str | bytes] | None = None
    import_roots: Collection[str] = ("",)  # folders of the repository on sys.path before any of its code runs
    workspace: Sequence[str] = ("/workspace",)  # the names the repository has in the sandbox (a task's workdir)


def environment_problem(report: Sequence[TestOutcome] | None, result: ExecResult, pytest_started: bool,
                        evidence: Evidence) -> Diagnosis | None:
    """The environment error this run shows, if any (see the module docstring)."""
    for case in collection_failures(report or []):
        module = missing_module(case.details or case.message)
        if module and _missing_for_the_tests(module, case, evidence):
            importer = importing_file(case.details) or "the hidden tests"
            own = ", and the repository has it only where nothing puts it on sys.path (a src/ layout)" \
                if _provides(evidence.repository, module) else ""
            return Diagnosis.of(FailureReason.MISSING_MODULE, f"the tests import {module!r}, which the environment "
                                f"does not install{own} ({importer}): {last_line(case.details or case.message)}")
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
    installed nor one the repository can provide, and the import was the tests' (our harness: a
    module the hidden tests import; pytest: a file the submission did not change). See the
    module docstring for "can provide"."""
    top = module.split(".")[0]
    if top in evidence.installed:
        return False
    if evidence.tests_import is not None:
        return top in evidence.tests_import and not _provides(evidence.repository, module)
    importer = importing_file(case.details)
    if importer is None or importer not in evidence.repository or importer in evidence.changed:
        return False
    return not _provides(evidence.repository, module) or _out_of_reach(top, importer, evidence)


def _out_of_reach(top: str, importer: str, evidence: Evidence) -> bool:
    """Whether the repository's module `top`, which `importer` (a pristine file) failed to import,
    is where nothing of the pristine repository puts it on sys.path, all of it still there."""
    files = evidence.files
    if files is None or importer not in files:
        return False
    command_roots = _command_roots(evidence.grader_text, evidence.workspace)
    if command_roots is None:
        return False
    roots = {*evidence.import_roots, *_pytest_roots(evidence.repository), *command_roots}
    if any(_provides_at(evidence.repository, top, root) for root in roots):
        return False
    own = [path for path in evidence.repository if top in PurePosixPath(path).parts[:-1]
           or PurePosixPath(path).stem == top]
    if any(path not in files for path in own):  # deleted or moved by the submission
        return False
    steering = [path for path in evidence.repository if _collected_by_pytest(path) and path not in evidence.changed]
    if any(b"sys.path" in _bytes(files.get(path, "")) for path in steering):
        return False  # the repository's own conftest.py or tests move sys.path: no telling statically
    return top in top_level_imports(files[importer])


def _pytest_roots(repository: Collection[str]) -> set[str]:
    """The folders pytest (its default "prepend" import mode) puts on sys.path to import the
    repository's test files and conftest.py files: each one's first folder up without an
    __init__.py."""
    present = set(repository)
    roots = set()
    for path in filter(_collected_by_pytest, repository):
        folder = PurePosixPath(path).parent
        while str(folder) != "." and str(folder / "__init__.py") in present:
            folder = folder.parent
        roots.add("" if str(folder) == "." else str(folder))
    return roots


def _collected_by_pytest(path: str) -> bool:
    name = PurePosixPath(path).name
    return name == "conftest.py" or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))


def _command_roots(grader_text: str, workspace: Sequence[str]) -> set[str] | None:
    """Folders of the repository the grader's own command puts on sys.path (PYTHONPATH=src) or
    runs in (cd src: `python -m` puts the working directory first); None where one cannot be
    told ($(pwd)/src, ../lib), so that nothing is excused."""
    found = set()
    for value in re.findall(r"PYTHONPATH=[\"']?([^\s\"';&|]+)", grader_text):
        found.update(value.split(":"))
    found.update(re.findall(r"\bcd\s+[\"']?([^\s\"';&|]+)", grader_text))
    roots = set()
    for folder in found:
        folder = re.sub(r"\$\{?PWD\}?", workspace[0] if workspace else "/workspace", folder)
        if folder.startswith("/"):
            if not _inside(folder.rstrip("/") + "/", workspace) and folder.rstrip("/") not in workspace:
                continue  # elsewhere in the sandbox: not the repository's
            folder = _inside(folder.rstrip("/") + "/", workspace).rstrip("/")
        path = PurePosixPath(folder)
        if ".." in path.parts or "$" in folder or "`" in folder or "~" in folder:
            return None
        roots.add("" if str(path) == "." else str(path))
    return roots


def _provides_at(repository: Collection[str], top: str, root: str) -> bool:
    """Whether the repository has a module or package `top` directly in the folder `root`."""
    for path in repository:
        pure = PurePosixPath(path)
        if root:
            if not pure.is_relative_to(root):
                continue
            pure = pure.relative_to(root)
        if (len(pure.parts) > 1 and pure.parts[0] == top) or (len(pure.parts) == 1 and pure.name.split(".")[0] == top
                                                               and pure.suffix in (".py", ".so", ".pyd", ".pyc")):
            return True
    return False


def top_level_imports(source: str | bytes) -> set[str]:
    """The top-level modules a Python file imports unconditionally (statements of its body, not
    under an if, a try or a function); none where it does not parse."""
    try:
        tree = python_ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def _bytes(content: str | bytes) -> bytes:
    return content.encode(errors="replace") if isinstance(content, str) else content


def site_packages(overlay: str) -> list[Path]:
    """The built environment's site-packages folders: pip's --target tree, or its virtual
    environment's."""
    if not overlay:
        return []
    return [path for path in (Path(overlay, "site-packages"), *Path(overlay).glob("venv/lib/python*/site-packages"))
            if path.is_dir()]


@cache
def installed_modules(overlay: str) -> frozenset[str]:
    """The top-level modules a sandbox's python3 finds without the workspace: the interpreter's
    own and those of the built environment at `overlay` (its site-packages: every entry's name,
    the modules each distribution lists in top_level.txt, those an editable install's finder maps).
    Read once per process and environment: a built environment never changes."""
    extra = set()
    for site in site_packages(overlay):
        for path in site.iterdir():
            extra.add(path.name.split(".", 1)[0])
            if path.name.endswith(".dist-info") or path.name.endswith(".egg-info"):
                extra.update(_read(path / "top_level.txt").split())
            elif path.name.startswith("__editable__") and path.name.endswith("finder.py"):
                mapping = re.search(r"MAPPING[^=]*=\s*(\{[^}]*\})", _read(path))
                extra.update(re.findall(r"['\"]([\w.]+)['\"]\s*:", mapping.group(1)) if mapping else ())
    return importable_modules() | {name.split(".")[0] for name in extra}


@cache
def installed_roots(overlay: str, workspace: tuple[str, ...] = ("/workspace",)) -> frozenset[str]:
    """Folders of the workspace the built environment puts on sys.path: the lines of its .pth
    files that name one (an editable install: /workspace/src). Read once, like installed_modules."""
    roots = set()
    for site in site_packages(overlay):
        for pth in site.glob("*.pth"):
            for line in _read(pth).splitlines():
                inside = _inside(line.strip(), workspace) if not line.startswith(("import ", "import\t")) else ""
                if inside or line.strip().rstrip("/") in workspace:
                    roots.add(inside.rstrip("/"))
    return frozenset(roots)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[:1 << 20]
    except OSError:
        return ""


def missing_program(output: str) -> str | None:
    """The program a shell could not find: "sh: 1: tox: not found", "line 3: uvx: command not found"."""
    found = _NOT_FOUND.search(output)
    return found.group(1) if found else None


def _on_path(program: str) -> bool:
    return any(os.access(os.path.join(folder, program), os.X_OK) for folder in SANDBOX_PATH)


def diagnose(outcomes: dict[str, Outcome], messages: dict[str, str], details: dict[str, str],
             report: Sequence[TestOutcome] | None, result: ExecResult, flags: Sequence[str], wall_limit_s: float,
             doing: str = "") -> Diagnosis | None:
    """Why a scored grading did not pass (None when every expected test passed, unflagged);
    `doing`: what a killed run was doing (`what_it_was_doing`)."""
    if result.status in KILLS:
        return killed(result, wall_limit_s, doing)
    if report is None:
        return Diagnosis.of(FailureReason.NO_REPORT, f"the suite left no report (exit {result.exit_code}); "
                            f"last output: {tail(result)}")
    collection = collection_failures(report)
    if collection:
        case = collection[0]
        module = missing_module(case.details or case.message)
        if not module and _needed_the_network(case.message, case.details):
            return Diagnosis.of(FailureReason.NETWORK_UNAVAILABLE, f"{case.name} could not be collected: it needed "
                                f"the network, which the sandbox does not have: "
                                f"{_network_error(case.message, case.details)}")
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
    offline = [test for test in failed if _needed_the_network(messages.get(test, ""), details.get(test, ""))]
    if offline:
        first = offline[0]
        return Diagnosis.of(FailureReason.NETWORK_UNAVAILABLE, f"{first} needed the network, which the sandbox does "
                            f"not have: {_network_error(messages.get(first, ''), details.get(first, ''))}; {len(failed)} of "
                            f"{len(outcomes)} expected tests did not pass, {len(offline)} of them for the network")
    if failed:
        first = failed[0]
        return Diagnosis.of(FailureReason.TESTS_FAILED, f"{len(failed)} of {len(outcomes)} expected tests "
                            f"{outcomes[first].value if len(failed) == 1 else 'did not pass'}; first: {first}: "
                            f"{_what_failed(messages.get(first, ''), details.get(first, ''))}")
    if missing:
        return Diagnosis.of(FailureReason.TESTS_MISSING, f"{len(missing)} of {len(outcomes)} expected tests never "
                            f"ran (the report has {len(report)} tests); first: {missing[0]}")
    return None


def _needed_the_network(message: str, traceback: str) -> bool:
    """Whether a test's failure is the resolver's or the network's error (in its message or an
    error line of its traceback: never the test's own source that pytest quotes, which may name
    socket.gaierror in a `pytest.raises`)."""
    return bool(_NO_NETWORK.search(message)) or any(map(_NO_NETWORK.search, _error_lines(traceback)))


def _error_lines(traceback: str) -> list[str]:
    """The lines of a traceback that state an exception: pytest's "E   ..." lines, or a plain
    traceback's "package.SomeError: ..." lines."""
    return [line.removeprefix("E").strip() for line in traceback.splitlines()
            if line.startswith("E ") or _EXCEPTION_LINE.match(line)]


def _network_error(message: str, traceback: str) -> str:
    """The line of a test's failure that says the network failed: its message where that says
    so, else the traceback's last error line that does (requests' ConnectionError wraps the
    resolver's error deep in a long message)."""
    if _NO_NETWORK.search(message):
        return message
    lines = [line for line in _error_lines(traceback) if _NO_NETWORK.search(line)]
    return lines[-1] if lines else message


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
