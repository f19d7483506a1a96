"""Protected paths: what a repository submission may not change, restored before grading.

A pattern without "/" matches a file name at any depth ("conftest.py" guards every conftest);
one with "/" matches the whole path, "*" crossing directories (".github/*"). Hidden test files
are always protected. A submission that touches a protected path is graded on the restored
tree, where those files are sealed (root's, read-only, in directories it cannot rename), so that
code run by the tests cannot rewrite them either; and the touch is a tamper flag:

- `protected_path_modified`: a protected file of the repository was edited or deleted, or a
  file was added where a hidden test goes;
- `runner_config_added`: a new file that steers the test runner (a conftest.py, pytest.ini,
  sitecustomize.py, a .pth file...) appeared anywhere;
- `shadows_runner_module`: a new module or package at the repository root is named like one
  the sandbox's interpreter would otherwise import (the standard library, pytest and its
  dependencies, the grader's own modules: json.py, attr/, _pytest/, a .pyc or .so of such a
  name). `python -m pytest` puts the root first on sys.path, so such a file would run before the
  test runner could. The root is checked, and every folder the task's environment puts on
  PYTHONPATH (`python_path`, a repository's src/): deeper folders reach sys.path only through
  the task's own configuration.

A submitted file that would sit where a protected file's folder must be, or inside a protected
file's path, is dropped and flagged `protected_path_modified` as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

from grading.verdict import PLUGIN_FILES
from sandbox.interpreter import importable_modules
from statuses import TamperFlag
from task_sets.patches import changed_paths
from task_sets.schema import RUNNER_CONFIGURATION

MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pyd")
# Every module the grader's plugin and harness import by name from /grader.
GRADER_MODULES = frozenset({path.stem for path in PLUGIN_FILES} | {"run_tests"})


@dataclass(frozen=True)
class Guarded:
    files: dict[str, str]  # the tree to grade: submission, protected paths restored, hidden tests in
    tamper_flags: tuple[TamperFlag, ...]
    touched: tuple[str, ...]  # the protected paths the submission changed, for the grade's messages
    sealed: tuple[str, ...]  # files of `files` the test run must not be able to change (Session.protect)


def matches(path: str, patterns: Iterable[str]) -> bool:
    name = PurePosixPath(path).name
    return any(fnmatchcase(path if "/" in pattern else name, pattern) for pattern in patterns)


def _shadows_runner_module(path: str, import_roots: Iterable[str] = ("",), more: frozenset[str] = frozenset()) -> bool:
    """`path` is a module or package, at the root or in a folder on sys.path (`import_roots`,
    relative to the root), named like one the test run imports (`more`: the task environment's)."""
    return any(_shadows_at(path, root, more) for root in import_roots)


def _shadows_at(path: str, root: str, more: frozenset[str]) -> bool:
    pure = PurePosixPath(path)
    if root:
        if not pure.is_relative_to(root):
            return False
        pure = pure.relative_to(root)
    parts = pure.parts
    if len(parts) == 1:  # a module file at the root: json.py, json.cpython-311.pyc, json.so
        is_module = parts[0].endswith(MODULE_SUFFIXES)
    else:  # a package at the root: attr/__init__.py
        is_module = len(parts) == 2 and parts[1].startswith("__init__.")
    name = parts[0].split(".", 1)[0]
    return is_module and (name in importable_modules() or name in GRADER_MODULES or name in more)


def _in_the_way(path: str, protected: Iterable[str]) -> bool:
    """`path` is a folder of a protected file, or lies inside one's path."""
    return any(other.startswith(path + "/") or path.startswith(other + "/") for other in protected)


def guard(
    pristine: Mapping[str, str], submitted: Mapping[str, str], patterns: Iterable[str], hidden_tests: Mapping[str, str],
    import_roots: Iterable[str] = ("",), environment_modules: Iterable[str] = (),
) -> Guarded:
    """`import_roots`: the folders (relative to the root, "" the root itself) the test run puts
    on sys.path before the standard library; `environment_modules`: the top-level modules the
    task's environment installs."""
    patterns, import_roots, more = tuple(patterns), tuple(import_roots), frozenset(environment_modules)
    files, flags, touched = dict(submitted), set(), []
    for path in sorted(changed_paths(pristine, submitted)):
        if not (path in hidden_tests or matches(path, patterns)):
            continue
        touched.append(path)
        if path in pristine:
            files[path] = pristine[path]
            flags.add(TamperFlag.PROTECTED_PATH_MODIFIED)
        else:
            del files[path]
            flags.add(TamperFlag.RUNNER_CONFIG_ADDED if matches(path, RUNNER_CONFIGURATION)
                      else TamperFlag.PROTECTED_PATH_MODIFIED)
    for path in sorted(submitted.keys() - pristine.keys()):
        if path in files and _shadows_runner_module(path, import_roots, more):
            del files[path]
            touched.append(path)
            flags.add(TamperFlag.SHADOWS_RUNNER_MODULE)
    protected = {*hidden_tests, *(p for p in files if matches(p, patterns))}
    for path in sorted(p for p in files if _in_the_way(p, protected)):
        del files[path]
        touched.append(path)
        flags.add(TamperFlag.PROTECTED_PATH_MODIFIED)
    files.update(hidden_tests)
    sealed = tuple(sorted(path for path in files if path in hidden_tests or matches(path, patterns)))
    return Guarded(files, tuple(sorted(flags)), tuple(touched), sealed)
