"""The Python interpreters this host has, by version: what an environment that names its Python
("3.9") is built and run with.

Looked for where the usual tools install them, in this order: pyenv (`$PYENV_ROOT/versions`,
default ~/.pyenv), uv (`$UV_PYTHON_INSTALL_DIR`, default ~/.local/share/uv/python), then
`/usr/local/bin` and `/usr/bin` (`python3.9`). An interpreter counts only if it runs, says the
version its place claims, and can make a virtual environment with pip (`venv` and `ensurepip`:
Debian's own python3 lacks ensurepip unless python3-venv is installed). The newest patch
release of a version wins.

An interpreter is used in place, never copied: the local backend shows its prefix read-only
at the same path inside the sandbox (a pyenv build finds its libpython there), and a Docker
environment image gets the prefix at the same path (environments/build.py).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

VERSION = re.compile(r"(\d+)\.(\d+)")
_PROBE = ("import sys, venv, ensurepip; "
          "print('%d.%d.%d' % sys.version_info[:3]); print(sys.base_prefix)")
PROBE_TIMEOUT_S = 30


@dataclass(frozen=True)
class Interpreter:
    version: str  # "3.9.18"
    executable: Path  # /root/.pyenv/versions/3.9.18/bin/python3.9
    prefix: Path  # sys.base_prefix: what a sandbox must see at the same path

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


class NoInterpreter(LookupError):
    """No interpreter of the version asked for; the message says which ones there are."""


def minor_version(requested: str) -> str:
    """ "3.9" of "3.9", "3.9.18" or "python3.9"; ValueError for anything else."""
    found = VERSION.search(requested)
    if not found or not requested.removeprefix("python").startswith(found.group(0)):
        raise ValueError(f"{requested!r} is not a Python version (like 3.9)")
    return found.group(0)


def find(requested: str) -> Interpreter:
    """The interpreter for `requested` ("3.9"), or NoInterpreter in one sentence:
    "needs Python 3.5; available: 3.6, 3.9, 3.11"."""
    minor = minor_version(requested)
    found = available().get(minor)
    if found is None:
        have = ", ".join(sorted(available(), key=lambda v: tuple(map(int, v.split("."))))) or "none"
        raise NoInterpreter(f"needs Python {minor}; available: {have}")
    return found


@cache
def available() -> dict[str, Interpreter]:
    """Every usable interpreter of this host, one per minor version (the newest patch release)."""
    best: dict[str, Interpreter] = {}
    for candidate in _candidates():
        interpreter = _probe(candidate)
        if interpreter is None:
            continue
        current = best.get(interpreter.minor)
        if current is None or _patch(interpreter) > _patch(current):
            best[interpreter.minor] = interpreter
    return best


def _patch(interpreter: Interpreter) -> tuple[int, ...]:
    return tuple(int(part) for part in interpreter.version.split(".") if part.isdigit())


def _candidates() -> list[Path]:
    home = Path.home()
    pyenv = Path(os.environ.get("PYENV_ROOT") or home / ".pyenv") / "versions"
    uv = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or home / ".local" / "share" / "uv" / "python")
    found = []
    for root in (pyenv, uv):
        if root.is_dir():
            for version_dir in sorted(root.iterdir()):
                found += sorted((version_dir / "bin").glob("python3.[0-9]*"))
    for folder in (Path("/usr/local/bin"), Path("/usr/bin")):
        found += sorted(folder.glob("python3.[0-9]*"))
    return [path for path in found if re.fullmatch(r"python3\.\d+", path.name) and os.access(path, os.X_OK)]


def _probe(executable: Path) -> Interpreter | None:
    try:
        done = subprocess.run([str(executable), "-I", "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return None  # no venv or ensurepip
    interpreter = Interpreter(version=lines[0], executable=executable, prefix=Path(lines[1]))
    return interpreter if f"python{interpreter.minor}" == executable.name else None  # a link to another version
