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
- `shadows_runner_module`: a new module or package at the repository root is named like a
  standard-library module or part of pytest (json.py, _pytest/). `python -m pytest` puts the
  root first on sys.path, so such a file would run before the test runner could. Only the root
  is checked: deeper directories reach sys.path only through the task's own configuration.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

from task_sets.patches import changed_paths
from task_sets.schema import RUNNER_CONFIGURATION

RUNNER_MODULES = frozenset(sys.stdlib_module_names) | {
    "pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "pytest_session",
}


@dataclass(frozen=True)
class Guarded:
    files: dict[str, str]  # the tree to grade: submission, protected paths restored, hidden tests in
    tamper_flags: tuple[str, ...]
    touched: tuple[str, ...]  # the protected paths the submission changed, for the grade's messages
    sealed: tuple[str, ...]  # files of `files` the test run must not be able to change (Session.protect)


def matches(path: str, patterns: Iterable[str]) -> bool:
    name = PurePosixPath(path).name
    return any(fnmatchcase(path if "/" in pattern else name, pattern) for pattern in patterns)


def _shadows_runner_module(path: str) -> bool:
    parts = PurePosixPath(path).parts
    top = parts[0].removesuffix(".py") if len(parts) == 1 else parts[0]
    return (len(parts) > 1 or parts[0].endswith(".py")) and top in RUNNER_MODULES


def guard(
    pristine: Mapping[str, str], submitted: Mapping[str, str], patterns: Iterable[str], hidden_tests: Mapping[str, str],
) -> Guarded:
    patterns = tuple(patterns)
    files, flags, touched = dict(submitted), set(), []
    for path in sorted(changed_paths(pristine, submitted)):
        if not (path in hidden_tests or matches(path, patterns)):
            continue
        touched.append(path)
        if path in pristine:
            files[path] = pristine[path]
            flags.add("protected_path_modified")
        else:
            del files[path]
            flags.add("runner_config_added" if matches(path, RUNNER_CONFIGURATION) else "protected_path_modified")
    for path in sorted(submitted.keys() - pristine.keys()):
        if path in files and _shadows_runner_module(path):
            del files[path]
            touched.append(path)
            flags.add("shadows_runner_module")
    files.update(hidden_tests)
    sealed = tuple(sorted(path for path in files if path in hidden_tests or matches(path, patterns)))
    return Guarded(files, tuple(sorted(flags)), tuple(touched), sealed)
