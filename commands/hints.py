"""The `crucible` commands the CLI suggests, written as the user's shell runs them.

`make run` runs `.venv/bin/crucible`, which is seldom on PATH: a suggested `crucible sql …` would
fail as printed. A suggestion names this Crucible as the shell finds it: `crucible` where PATH
leads to this very script, else its path (relative to the working directory when under it), else
(a container with the sources on PYTHONPATH and no script) this Python running the CLI's module.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

SCRIPT = "crucible"  # pyproject.toml's console script
# Characters a double-quoted shell word still interprets: a word with none of them is
# double-quoted (SQL's single quotes stay readable), any other is quoted by shlex.
_SPECIAL_IN_DOUBLE_QUOTES = set('"$`\\!')


def crucible_command(*words: str) -> str:
    """`crucible WORDS…` as one line the user's shell runs as printed."""
    return " ".join([this_crucible(), *map(_shell_word, words)])


def this_crucible() -> str:
    """How the user's shell runs the Crucible this process is."""
    script = Path(sys.executable).parent / SCRIPT
    if not script.exists():
        return f"{shlex.quote(_as_typed(Path(sys.executable)))} -m pipelines.cli"
    on_path = shutil.which(SCRIPT)
    if on_path and Path(on_path).resolve() == script.resolve():
        return SCRIPT
    return shlex.quote(_as_typed(script))


def storage_words(storage: str | None) -> list[str]:
    """The `--storage` a suggestion repeats: the one the user gave, if any (otherwise the
    environment's, which the suggested command reads from the same environment)."""
    return ["--storage", storage] if storage else []


def _as_typed(path: Path) -> str:
    """`path` relative to the working directory when under it (as a path: ./ where it would read as
    a bare command name), else absolute."""
    if not path.is_relative_to(Path.cwd()):
        return str(path)
    relative = os.path.relpath(path)
    return relative if os.sep in relative else f".{os.sep}{relative}"


def _shell_word(word: str) -> str:
    if shlex.quote(word) == word or _SPECIAL_IN_DOUBLE_QUOTES & set(word):
        return shlex.quote(word)
    return f'"{word}"'
