"""Run hidden tests against /workspace/solution.py and write a JUnit XML report.

Runs INSIDE the sandbox as `python3 -I -S /grader/run_tests.py [--tests DIR] [--report FILE]`,
so it uses the standard library only, and imports as little as it can (every millisecond of
start-up is paid once per grading). The tests of a file are its top-level `def test*`
functions (pytest's naming rule), found by parsing the file; the grader finds the expected
tests with the same `test_names`. They run in definition order. An AssertionError is a
failure, any other exception an error (SystemExit too: a solution calling sys.exit must not
pass), unittest.SkipTest / pytest's Skipped a skip. If a test module cannot be imported (e.g.
solution.py does not parse), each of its tests is reported as an error with the import message.

Exit code: 0 iff at least one test ran and every test passed, else 1 (2: bad usage). The
report is written last, atomically; a solution that ends the process itself (os._exit)
leaves no report, which the grader scores as a suite that did not run.
"""

from __future__ import annotations

import _ast  # the C parser nodes: `import ast` costs ~10 ms more at start-up
import os
import sys
import time
import types

WORKSPACE = "/workspace"
MAX_MESSAGE = 1000
MAX_DETAIL = 4000
SKIP_EXCEPTIONS = {"SkipTest", "Skipped"}
USAGE = "usage: run_tests.py [--tests DIR] [--report FILE] [--workspace DIR]"
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


def _short(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # a hostile __str__ must not take the harness down
        text = type(exc).__name__
    return text[:MAX_MESSAGE]


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


def run_file(path: str) -> list[Case]:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    cases = [Case(os.path.splitext(os.path.basename(path))[0], n) for n in test_names(source, path)]
    try:
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


def write_report(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # never a half-written report


def parse_args(argv: list[str]) -> dict[str, str]:
    # Hand-rolled: argparse alone takes ~19 ms to import.
    options = {"--tests": "/grader/tests", "--report": "/report/junit.xml", "--workspace": WORKSPACE}
    if len(argv) % 2 or any(flag not in options for flag in argv[::2]):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    options.update(zip(argv[::2], argv[1::2], strict=True))
    return options


def main(argv: list[str]) -> int:
    options = parse_args(argv)
    tests_dir = options["--tests"]
    sys.path[:0] = [options["--workspace"], tests_dir]  # the solution first, then test helpers
    sys.dont_write_bytecode = True
    start = time.perf_counter()
    cases: list[Case] = []
    for name in sorted(os.listdir(tests_dir)):
        if name.startswith("test_") and name.endswith(".py"):
            cases += run_file(os.path.join(tests_dir, name))
    write_report(options["--report"], junit_xml(cases, time.perf_counter() - start))
    return 0 if cases and all(c.outcome == "passed" for c in cases) else 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # the solution may have closed or replaced it
            pass
    # os._exit skips interpreter teardown, where a solution's atexit or __del__ hooks could
    # still run and change the exit code after the report was written.
    os._exit(code)
