"""The harness as the grader ships it into the sandbox: a two-line launcher, the harness module,
and its byte code compiled in advance.

Compiling the ~400-line harness costs the sandbox's interpreter about 10 ms on every grading,
a sixth of a grading's time. So the launcher imports the harness as a module, for which Python
reads byte code from __pycache__; the byte code is compiled once per process, on the host, by the
interpreter the sandbox runs (/usr/bin/python3, the same Debian build as the Docker image's), as
an unchecked-hash .pyc (valid whatever the file's timestamps). An interpreter with another cache
tag ignores the .pyc and compiles the source: slower, never wrong.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from sandbox.interpreter import SANDBOX_PYTHON

HARNESS = Path(__file__).parent / "run_tests.py"
LAUNCHER = 'import sys\nsys.path.insert(0, "/grader/harness")\nimport run_tests\nrun_tests.run()\n'
_COMPILE = """\
import py_compile, sys
py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
print(sys.implementation.cache_tag)
"""


@cache
def harness_files() -> dict[str, str | bytes]:
    """Files of the grader directory that run the harness (launcher at run_tests.py); read
    once per process, since every grading ships them. Callers must not change the dict."""
    files: dict[str, str | bytes] = {"run_tests.py": LAUNCHER, "harness/run_tests.py": HARNESS.read_text()}
    compiled = _byte_code()
    if compiled is not None:
        tag, code = compiled
        files[f"harness/__pycache__/run_tests.{tag}.pyc"] = code
    return files


def runs_builtin_harness(command: list[str], trees: Mapping[str, Mapping[str, bytes]], path: str) -> bool:
    """Whether `command` runs this harness as the grader ships it: the sandbox's interpreter
    (by name on `path`, the sandbox's PATH, whose folders it shares with this host) on the
    launcher of a tree shown at `<dir>`, whose harness/run_tests.py is this one."""
    if len(command) < 4 or command[1:3] != ["-I", "-S"]:
        return False
    found = shutil.which(command[0], path=path)
    if found is None or os.path.realpath(found) != os.path.realpath(SANDBOX_PYTHON):
        return False
    folder, _, launcher = command[3].rpartition("/")
    tree = trees.get(folder, {})
    return (launcher == "run_tests.py" and tree.get("run_tests.py") == LAUNCHER.encode()
            and tree.get("harness/run_tests.py") == _harness_bytes())


@cache
def _harness_bytes() -> bytes:
    return HARNESS.read_bytes()


@cache
def _byte_code() -> tuple[str, bytes] | None:
    """(cache tag, .pyc bytes) from the sandbox's interpreter; None where it cannot compile."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "run_tests.pyc"
        try:
            done = subprocess.run([SANDBOX_PYTHON, "-I", "-S", "-c", _COMPILE, str(HARNESS), str(target)],
                                  capture_output=True, text=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip(), target.read_bytes()
