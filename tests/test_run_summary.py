"""What `crucible run` prints when it ends: the summary table, which fits 100 columns, and the
commands to go on with, which run as printed."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from patience import PATIENCE_S
from rich.console import Console
from test_datastore import trajectory_row

from commands import reports
from datastore.store import DatasetStore, rows_to_table
from pipelines import cli

PROJECT = Path(__file__).parent.parent
SYSTEM_PATH = "/usr/bin:/bin"
# The widest values a row can hold: a long run, slow stages, negative rewards, long samples.
WIDE_ROW = {"iteration": 100, "pass_rate": 1.0, "reward_mean": -0.125, "sampled_tokens": 12345.6,
            "eval_pass_rate": 0.339, "eval_stderr": 0.047, "eval_blanked_pass_rate": 0.0, "rollouts": 12345.0,
            "verified_rollouts": 22.6, "trajectories": 0.1, "checkpoint": 70.0, "checkpoint_eval": 64.2}
BASE_ROW = {**dict.fromkeys(WIDE_ROW), "iteration": 0, "eval_pass_rate": 0.31, "eval_stderr": 0.041,
            "eval_blanked_pass_rate": 0.0}


@pytest.fixture(autouse=True)
def run_from_the_project(monkeypatch):
    """As `make run` runs: from the project folder, the virtualenv not on PATH."""
    monkeypatch.chdir(PROJECT)
    monkeypatch.setenv("PATH", SYSTEM_PATH)


@pytest.fixture
def storage(tmp_path, monkeypatch) -> str:
    """A store holding iteration 1 of experiment 'exp': two samples, one passed, and two stages."""
    monkeypatch.delenv("CRUCIBLE_STORAGE_ROOT", raising=False)
    root, store = str(tmp_path / "data"), DatasetStore(str(tmp_path / "data"))
    samples = [trajectory_row("t/1", 0, 1.0), trajectory_row("t/1", 1, 0.0)]
    store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", samples))
    for stage, seconds in {"rollouts": 12.5, "checkpoint": 30.0}.items():
        row = {"stage": stage, "seconds": seconds, "started_at": datetime(2026, 11, 30, tzinfo=timezone.utc)}
        store.write_partition("stages", "exp", 1, rows_to_table("stages", [row]), part=stage)
    return root


def rendered(table, width: int = 100) -> list[str]:
    console = Console(width=width, record=True)
    console.print(table)
    return console.export_text().splitlines()


def test_the_summary_fits_100_columns_with_every_header_whole_and_a_line_per_row():
    lines = rendered(reports.summary_table("repair", [BASE_ROW, WIDE_ROW]))
    header = next(line for line in lines if "iter" in line)
    assert all(f" {name} " in header for name in reports.SUMMARY_COLUMNS)
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 2 and "0.339 ± 0.047" in body[1] and "sampling 12345s" in body[1]
    assert max(map(len, lines)) <= 100


def test_the_summary_reads_the_stored_iterations_and_names_the_query_for_every_column(storage, monkeypatch):
    monkeypatch.setattr(reports, "console", Console(width=100, record=True))
    reports.print_summary(storage, "exp", storage)
    printed = reports.console.export_text()
    assert "│    1 │      0.500 │  0.500 │             2 │               │         │      42 │  training 30s │" in printed
    assert f"sql --storage {storage} \"SELECT * FROM iterations WHERE experiment = 'exp'\"" in printed


def test_the_commands_printed_after_a_run_run_as_printed_without_the_virtualenv_on_path(storage):
    commands = {label: line.split(": ", 1)[1] for label, line in cli.run_hints("exp", storage)}
    assert commands["Curve"].endswith(f"curve --storage {storage} --experiment exp")
    query = subprocess.run(commands["Query"], shell=True, cwd=PROJECT, env={**os.environ, "PATH": SYSTEM_PATH},
                           capture_output=True, text=True, timeout=PATIENCE_S)
    assert query.returncode == 0, query.stderr
    assert "avg(reward)" in query.stdout  # the table of the experiment's rewards (none stored here)
