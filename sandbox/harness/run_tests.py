"""Run hidden tests against /workspace/solution.py and write a JUnit XML report.

Runs INSIDE the sandbox as `python3 -I -S /grader/run_tests.py [--tests DIR] [--report FILE]`,
so it uses the standard library only, and imports as little as it can (every millisecond of
start-up is paid once per grading). The tests of a file are its top-level `def test*`
functions (pytest's naming rule), found by parsing the file; the grader finds the expected
tests with the same `test_names`. They run in definition order. An AssertionError is a
failure, any other exception an error (SystemExit too: a solution calling sys.exit must not
pass), unittest.SkipTest / pytest's Skipped a skip. If a test module cannot be imported (e.g.
solution.py does not parse), each of its tests is reported as an error with the import message.

The submission never runs in this process. A child process (forked before anything of the
submission is loaded) imports solution.py and answers calls; the tests see a `solution` module
whose functions forward their arguments to the child and bring back the result, both as
marshal data: plain values only, so an object that claims to equal everything cannot come
back. This process makes itself non-dumpable, so the child (same uid) cannot open its file
descriptors through /proc, and only this process holds the real stdout, where the report is
written (`--report -`, the default); everything else printed goes to stderr. A submission can
therefore fail tests, crash or stall the run, but not write the report or choose the exit code.
Known limits: arguments are copied (a test cannot observe a function mutating its input), and
a solution's classes and other non-function objects are not reachable from the tests.

Exit code: 0 iff at least one test ran and every test passed, else 1 (2: bad usage). The
report is written last.
"""

from __future__ import annotations

# The C modules under ast, socket and ctypes: their Python layers cost ~20 ms of start-up.
import _ast
import _ctypes
import _socket
import builtins
import marshal
import os
import sys
import time
import types

WORKSPACE = "/workspace"
MAX_MESSAGE = 1000
MAX_DETAIL = 4000
SKIP_EXCEPTIONS = {"SkipTest", "Skipped"}
USAGE = "usage: run_tests.py [--tests DIR] [--report FILE|-] [--workspace DIR]"
PR_SET_DUMPABLE = 4
_FRAME_BYTES = 4  # a message is its length (big-endian) then its marshal data
_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST
# Characters XML 1.0 cannot carry: one stray byte in a message must not void the report.
_NOT_XML = dict.fromkeys([*range(9), 11, 12, *range(14, 32), *range(0xD800, 0xE000), 0xFFFE, 0xFFFF], "\ufffd")
_OUTCOME_TAG = {"failed": "failure", "error": "error", "skipped": "skipped"}


class Case:
    __slots__ = ("module", "name", "outcome", "message", "detail", "seconds")

    def __init__(self, module: str, name: str):
        self.module = module  # file stem, written as the JUnit classname
        self.name = name
        self.outcome = "passed"  # passed | failed | error | skipped
        self.message = ""
        self.detail = ""
        self.seconds = 0.0

    def set(self, outcome: str, exc: BaseException, prefix: str = "") -> None:
        self.outcome, self.message = outcome, prefix + _short(exc)
        self.detail = "" if outcome == "skipped" else _detail(exc)


def test_names(source: str, filename: str = "<tests>") -> list[str]:
    """Top-level `def test*` (sync or async) names in order; the first definition wins.

    Raises SyntaxError for a test file that does not parse (a broken task, not a bad answer).
    """
    tree = compile(source, filename, "exec", _ONLY_AST)
    names: dict[str, None] = {}
    for node in tree.body:
        if isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.setdefault(node.name)
    return list(names)


def _imported_names(source: str) -> set[str]:
    tree = compile(source, "<tests>", "exec", _ONLY_AST)
    found = set()
    for node in tree.body:
        if isinstance(node, _ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, _ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def _check_own_imports(source: str) -> None:
    """Raise ModuleNotFoundError for the first module the tests import (besides the solution)
    that cannot be found: only on the failure path, so its import costs nothing otherwise."""
    import importlib.util

    for name in sorted(_imported_names(source) - {"solution"}):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _short(exc: BaseException) -> str:
    said = _said(exc)
    return (f"{type(exc).__name__}: {said}" if said is not None else type(exc).__name__)[:MAX_MESSAGE]


def _said(exc: BaseException) -> str | None:
    """The exception's own message; None where its __str__ fails (a hostile one must not take the
    harness down)."""
    try:
        return str(exc)[:MAX_MESSAGE]
    except BaseException:
        return None


def _detail(exc: BaseException) -> str:
    try:
        import traceback  # only when something failed

        return "".join(traceback.format_exception(exc))[-MAX_DETAIL:]
    except BaseException:
        return ""


def _is_skip(exc: BaseException) -> bool:
    # Matched by name, so neither unittest nor pytest has to be imported.
    return any(cls.__name__ in SKIP_EXCEPTIONS for cls in type(exc).__mro__)


def _import_file(path: str, source: str) -> types.ModuleType:
    """Import a test file from its path, never through sys.path: a file the solution drops
    into /workspace (first on sys.path) must not stand in for a hidden test module."""
    name = os.path.splitext(os.path.basename(path))[0]
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


class SubmissionError(Exception):
    """The submission raised, or its answer cannot leave its process."""


class Submission:
    """The child process holding the submission, and a `solution` module that calls into it."""

    def __init__(self, workspace: str, keep_out: tuple[int, ...]):
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:
            ours.close()
            for fd in keep_out:
                os.close(fd)  # the report channel
            serve(theirs, workspace)  # never returns
        theirs.close()
        self.sock = ours

    def module(self) -> types.ModuleType:
        """The `solution` module the tests import; raises what importing solution.py raised."""
        kind, payload = self._ask(("names",))
        if kind != "names":
            raise SubmissionError(payload)
        module = types.ModuleType("solution")
        public, names = payload
        for name, value in names.items():
            setattr(module, name, self._function(name) if value == _CALLABLE_MARK else value)
        module.__all__ = list(public)
        return module

    def _function(self, name: str):
        def call(*args, **kwargs):
            kind, payload = self._ask(("call", name, args, kwargs))
            if kind == "ok":
                return payload
            raise _rebuilt(payload)

        call.__name__ = call.__qualname__ = name
        return call

    def _ask(self, request: tuple) -> tuple:
        try:
            _send(self.sock, request)
            return _receive(self.sock)
        except (OSError, EOFError, ValueError, TypeError) as e:
            raise SubmissionError(f"the submission process is gone ({type(e).__name__}: {e})") from None


_CALLABLE_MARK = "\x00crucible-callable"


def serve(sock: _socket.socket, workspace: str) -> None:
    """The child: import the submission, then answer the harness until it is done."""
    code = 0
    try:
        os.dup2(2, 1)  # the submission's prints go to stderr
        sys.path[:0] = [workspace]
        try:
            import solution

            failure = None
        except BaseException as e:  # SystemExit too: an import that exits is a failed import
            solution, failure = None, _short(e)
        while True:
            try:
                request = _receive(sock)
            except EOFError:
                break
            _send(sock, ("error", failure) if failure else _answer(solution, request))
    except BaseException:
        code = 1
    os._exit(code)


def _describe(module) -> tuple[list[str], dict]:
    names = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if callable(value):
            names[name] = _CALLABLE_MARK
        elif _portable(value):
            names[name] = value
    public = getattr(module, "__all__", None)
    if not (isinstance(public, (list, tuple)) and all(isinstance(n, str) for n in public)):
        public = [n for n in names if not n.startswith("_")]
    return [n for n in public if n in names], names


def _answer(module, request) -> tuple:
    if request[0] == "names":
        return "names", _describe(module)
    try:
        _, name, args, kwargs = request
        result = getattr(module, name)(*args, **kwargs)
    except BaseException as e:  # SystemExit included: the test sees an error, not an exit
        return "raise", (type(e).__name__, _said(e) or "")
    if not _portable(result):
        return "raise", ("TypeError", f"{name}() returned a {type(result).__name__}, which is not plain data")
    return "ok", result


def _portable(value) -> bool:
    try:
        marshal.dumps(value)
    except (ValueError, TypeError):
        return False
    return not isinstance(value, types.CodeType)


def _rebuilt(payload) -> BaseException:
    name, message = payload
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not AssertionError:
        try:
            return cls(message)
        except TypeError:  # a built-in exception that wants other arguments (UnicodeError's)
            return SubmissionError(f"{name}: {message}")
    return SubmissionError(f"{name}: {message}")  # the submission's own class, by name


def _send(sock: _socket.socket, message) -> None:
    data = marshal.dumps(message)
    sock.sendall(len(data).to_bytes(_FRAME_BYTES, "big") + data)


def _receive(sock: _socket.socket):
    size = int.from_bytes(_read_exactly(sock, _FRAME_BYTES), "big")
    return marshal.loads(_read_exactly(sock, size))


def _read_exactly(sock: _socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _make_undumpable() -> None:
    prctl = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
    if _ctypes.call_function(prctl, (PR_SET_DUMPABLE, 0, 0, 0, 0)) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE) failed")


def run_case(case: Case, func) -> None:
    start = time.perf_counter()
    try:
        if not callable(func):
            raise LookupError(f"{case.name} is not a function after import")
        result = func()
        if isinstance(result, types.CoroutineType):  # an async test
            import asyncio

            asyncio.run(result)
    except AssertionError as e:
        case.set("failed", e)
    except BaseException as e:  # SystemExit, KeyboardInterrupt too: they are not a pass
        case.set("skipped" if _is_skip(e) else "error", e)
    case.seconds = time.perf_counter() - start


def run_file(path: str, import_error: BaseException | None = None) -> list[Case]:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    cases = [Case(os.path.splitext(os.path.basename(path))[0], n) for n in test_names(source, path)]
    try:
        if import_error is not None and "solution" in _imported_names(source):
            _check_own_imports(source)  # a module the tests need and nobody installed is not the submission's fault
            raise import_error
        module = _import_file(path, source)
    except BaseException as e:  # a solution that does not import (or exits) fails every test
        for case in cases:
            case.set("error", e, prefix="import failed: ")
        return cases
    for case in cases:
        run_case(case, getattr(module, case.name, None))
    return cases


def _xml(text: str) -> str:
    text = text.translate(_NOT_XML)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def junit_xml(cases: list[Case], seconds: float) -> str:
    """The shape pytest's --junitxml writes: testsuites/testsuite/testcase."""
    count = {o: sum(c.outcome == o for c in cases) for o in ("failed", "error", "skipped")}
    lines = [
        '<?xml version="1.0" encoding="utf-8"?>',
        "<testsuites>",
        (
            f'<testsuite name="crucible" tests="{len(cases)}" failures="{count["failed"]}"'
            f' errors="{count["error"]}" skipped="{count["skipped"]}" time="{seconds:.3f}">'
        ),
    ]
    for c in cases:
        attrs = f'classname="{_xml(c.module)}" name="{_xml(c.name)}" time="{c.seconds:.3f}"'
        if c.outcome == "passed":
            lines.append(f"<testcase {attrs} />")
            continue
        tag = _OUTCOME_TAG[c.outcome]
        lines.append(f'<testcase {attrs}><{tag} message="{_xml(c.message)}">{_xml(c.detail)}</{tag}></testcase>')
    lines += ["</testsuite>", "</testsuites>", ""]
    return "\n".join(lines)


def write_report(path: str, text: str, report_fd: int) -> None:
    if path == "-":
        data = text.encode()
        while data:
            data = data[os.write(report_fd, data):]
        return
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # never a half-written report


def parse_args(argv: list[str]) -> dict[str, str]:
    # Hand-rolled: argparse alone takes ~19 ms to import.
    options = {"--tests": "/grader/tests", "--report": "-", "--workspace": WORKSPACE}
    if len(argv) % 2 or any(flag not in options for flag in argv[::2]):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    options.update(zip(argv[::2], argv[1::2], strict=True))
    return options


def main(argv: list[str]) -> int:
    options = parse_args(argv)
    tests_dir = options["--tests"]
    _make_undumpable()
    report_fd = os.dup(1)  # the report's only way out; stdout itself now goes to stderr
    os.dup2(2, 1)
    sys.path[:0] = [tests_dir]  # test helpers; never the workspace, whose code is untrusted
    if os.environ.get("CRUCIBLE_ENV"):  # the task's built environment (set by the grader, not the submission)
        sys.path.append(os.environ["CRUCIBLE_ENV"] + "/site-packages")
    sys.dont_write_bytecode = True
    start = time.perf_counter()
    submission = Submission(options["--workspace"], keep_out=(report_fd,))
    try:
        sys.modules["solution"] = submission.module()
    except SubmissionError as e:
        sys.modules.pop("solution", None)
        import_error = e
    else:
        import_error = None
    cases: list[Case] = []
    for name in sorted(os.listdir(tests_dir)):
        if name.startswith("test_") and name.endswith(".py"):
            cases += run_file(os.path.join(tests_dir, name), import_error)
    write_report(options["--report"], junit_xml(cases, time.perf_counter() - start), report_fd)
    return 0 if cases and all(c.outcome == "passed" for c in cases) else 1


def run() -> None:
    """Run as the program: grade, then leave without interpreter teardown."""
    code = main(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # the solution may have closed or replaced it
            pass
    # os._exit skips interpreter teardown, where a solution's atexit or __del__ hooks could
    # still run and change the exit code after the report was written.
    os._exit(code)


if __name__ == "__main__":
    run()
