"""The Python interpreter commands run with in the sandbox: Debian's /usr/bin/python3 (the local
backend binds the host's /usr; the Docker image is the same Debian release)."""

from __future__ import annotations

import subprocess
import sys
from functools import cache

SANDBOX_PYTHON = "/usr/bin/python3"
_LIST_MODULES = "import pkgutil, sys; print('\\n'.join([*sys.builtin_module_names, *(m.name for m in pkgutil.iter_modules())]))"


@cache
def importable_modules() -> frozenset[str]:
    """Top-level names the sandbox's interpreter imports before a workspace's own (standard
    library, built-ins, installed packages such as pytest and its dependencies). Falls back to
    this interpreter's standard library where the sandbox's cannot be asked."""
    try:
        listed = subprocess.run([SANDBOX_PYTHON, "-I", "-c", _LIST_MODULES], capture_output=True, text=True,
                                timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    return frozenset(sys.stdlib_module_names) | frozenset(listed)
