"""The `crucible` commands the CLI suggests name this Crucible as the user's shell finds it
(commands/hints.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from commands.hints import crucible_command, this_crucible

SCRIPT = Path(sys.executable).parent / "crucible"  # what `pip install -e .` made beside this Python
SYSTEM_PATH = "/usr/bin:/bin"


def test_a_crucible_that_path_finds_is_suggested_by_name(monkeypatch):
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}{os.pathsep}{SYSTEM_PATH}")
    assert this_crucible() == "crucible"


def test_off_path_it_is_suggested_by_its_path_from_the_working_directory(monkeypatch):
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    monkeypatch.chdir(SCRIPT.parent.parent.parent)  # the folder holding the virtualenv, as for `make run`
    assert this_crucible() == f"{SCRIPT.parent.parent.name}/bin/crucible"


def test_another_crucible_on_path_is_not_taken_for_this_one(monkeypatch, tmp_path):
    other = tmp_path / "bin" / "crucible"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{SYSTEM_PATH}")
    monkeypatch.chdir(tmp_path)  # not under the virtualenv's folder: the path is absolute
    assert this_crucible() == str(SCRIPT)


def test_a_query_keeps_its_single_quotes_readable_inside_double_quotes(monkeypatch):
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}{os.pathsep}{SYSTEM_PATH}")
    assert (crucible_command("sql", "--storage", "/tmp/my data", "SELECT * FROM iterations WHERE experiment = 'x'")
            == "crucible sql --storage \"/tmp/my data\" \"SELECT * FROM iterations WHERE experiment = 'x'\"")


def test_a_python_with_no_script_beside_it_runs_the_cli_module(monkeypatch, tmp_path):
    python = tmp_path / "python3"  # a container's: the sources on PYTHONPATH, nothing installed
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.chdir(tmp_path)
    assert this_crucible() == "./python3 -m pipelines.cli"
