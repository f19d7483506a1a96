"""Parsing Python into an AST from any thread.

CPython 3.11 builds Python AST objects under one recursion counter per interpreter; two
threads building at once corrupt it, and one of them fails with `SystemError: AST constructor
recursion depth mismatch` (cpython gh-106905). Grading parses tests and submissions on the
sandbox pool's threads, so every host-side parse takes this lock. The warnings compiling
someone else's code raises ("invalid escape sequence '\\d'") are theirs to see, not ours: they
are silenced here.
"""

from __future__ import annotations

import ast
import threading
import warnings

AST_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    with AST_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        return ast.parse(source, filename)
