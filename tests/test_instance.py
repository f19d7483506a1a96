"""The instance every command shares: SQLite files by default, PostgreSQL when
CRUCIBLE_POSTGRES_URL is set (a real server, scripts/postgres-server), a clear sentence for a
server that is down; and its pools: one step of a pool at a time across runs."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
import yaml
from dagster import DagsterInstance, asset, materialize
from patience import PATIENCE_S

from commands.errors import UserError
from pipelines.instance import POSTGRES_URL_ENV, prepare_instance

ROOT = Path(__file__).parent.parent


@asset
def answer() -> int:
    return 42


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    return tmp_path / "dagster"


def _materialize_once() -> str:
    with DagsterInstance.get() as instance:
        result = materialize([answer], instance=instance)
    assert result.success
    return result.run_id


def test_without_a_postgres_url_runs_are_kept_in_sqlite_files_in_dagster_home(home):
    prepare_instance()
    run_id = _materialize_once()
    with sqlite3.connect(home / "history" / "runs.db") as runs:
        assert runs.execute("SELECT count(*) FROM runs WHERE run_id = ?", (run_id,)).fetchone() == (1,)


def test_a_postgres_url_puts_runs_events_and_schedules_in_that_database(home, postgres_url, monkeypatch):
    monkeypatch.setenv(POSTGRES_URL_ENV, postgres_url)
    prepare_instance()
    run_id = _materialize_once()
    with psycopg2.connect(postgres_url) as database, database.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM runs WHERE run_id = %s", (run_id,))
        assert cursor.fetchone() == (1,)
        cursor.execute("SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
                       (run_id,))
        assert cursor.fetchone() == (1,)
        cursor.execute("SELECT to_regclass('job_ticks') IS NOT NULL")  # the schedule storage's table
        assert cursor.fetchone() == (True,)
    assert not (home / "history").exists()


def test_the_url_stays_out_of_the_file_and_a_command_whose_environment_differs_does_not_switch_the_instance(
        home, postgres_url, monkeypatch):
    """A shell without the URL beside a UI with it would split the runs between two instances:
    switching takes removing the file."""
    monkeypatch.setenv(POSTGRES_URL_ENV, postgres_url)
    prepare_instance()
    text = (home / "dagster.yaml").read_text()
    assert yaml.safe_load(text)["storage"] == {"postgres": {"postgres_url": {"env": POSTGRES_URL_ENV}}}
    assert "@" not in text  # the password is read from the environment, never written down
    monkeypatch.delenv(POSTGRES_URL_ENV)
    with pytest.raises(UserError, match="keeps its runs in Postgres, and CRUCIBLE_POSTGRES_URL is not set here"):
        prepare_instance()
    assert (home / "dagster.yaml").read_text() == text
    (home / "dagster.yaml").unlink()
    prepare_instance()
    assert "storage" not in yaml.safe_load((home / "dagster.yaml").read_text())


# A step of the training pool that says when it started, then waits (up to 5 s) for the other
# run's step to start: with the pool's one slot it never does, and the two never overlap.
POOL_STEP = """
import sys, time
from pathlib import Path
from dagster import DagsterInstance, asset, materialize
from assets.pools import TRAINING

me, other = Path(sys.argv[1]), Path(sys.argv[2])

@asset(pool=TRAINING)
def hold_the_trainer() -> None:
    start = time.time()
    me.write_text(f"{start}")
    while not other.exists() and time.time() < start + 5:
        time.sleep(0.05)
    me.write_text(f"{start} {time.time()}")

with DagsterInstance.get() as instance:
    assert materialize([hold_the_trainer], instance=instance).success
"""


def test_two_runs_never_hold_the_training_pool_at_once(home, tmp_path, postgres_url, monkeypatch):
    """On the Postgres instance, where runs may run side by side. (Dagster's slot claim on SQLite
    is not atomic across processes: two runs starting steps of a pool at once can both take it.)"""
    monkeypatch.setenv(POSTGRES_URL_ENV, postgres_url)
    prepare_instance()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    marks = [tmp_path / "first", tmp_path / "second"]
    runs = [subprocess.Popen([sys.executable, "-c", POOL_STEP, str(me), str(other)], env=env, cwd=tmp_path)
            for me, other in (marks, marks[::-1])]
    assert [run.wait(timeout=PATIENCE_S) for run in runs] == [0, 0]
    (a_start, a_end), (b_start, b_end) = sorted(tuple(map(float, mark.read_text().split())) for mark in marks)
    assert a_end <= b_start


def test_a_dagster_yaml_of_the_operators_own_is_used_as_it_is(home):
    home.mkdir()
    own = "telemetry:\n  enabled: false\n"
    (home / "dagster.yaml").write_text(own)
    prepare_instance()
    assert (home / "dagster.yaml").read_text() == own


def test_a_url_that_is_not_libpq_is_refused_in_one_sentence(home, monkeypatch):
    monkeypatch.setenv(POSTGRES_URL_ENV, "mysql://crucible@127.0.0.1/crucible")
    with pytest.raises(UserError, match="not a libpq URL"):
        prepare_instance()


def test_a_postgres_server_that_is_down_stops_crucible_run_with_one_line_and_no_password(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"),
           POSTGRES_URL_ENV: "postgresql://crucible:s3cret@127.0.0.1:1/crucible"}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "x", "--iterations", "1"],
                          env=env, capture_output=True, text=True, timeout=PATIENCE_S, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.startswith("error: the Postgres instance postgresql://crucible@127.0.0.1:1/crucible")
    assert "does not answer" in done.stderr and "Traceback" not in done.stderr and "s3cret" not in done.stderr


def test_the_docker_run_launcher_setting_puts_dagsters_docker_launcher_in_the_instance(home, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_RUN_LAUNCHER", "docker")
    monkeypatch.setenv("CRUCIBLE_RUN_IMAGE", "crucible-project:any")
    prepare_instance()
    with DagsterInstance.get() as instance:
        assert type(instance.run_launcher).__name__ == "CrucibleDockerRunLauncher"
        assert instance.run_launcher.image == "crucible-project:any"  # read from the environment, not the file
    assert "crucible-project:any" not in (home / "dagster.yaml").read_text()


@pytest.mark.parametrize("settings, refusal", [
    ({"CRUCIBLE_RUN_LAUNCHER": "dokcer"}, "CRUCIBLE_RUN_LAUNCHER='dokcer': choose one of process, docker"),
    ({"CRUCIBLE_RUN_LAUNCHER": "docker"}, "CRUCIBLE_RUN_LAUNCHER=docker needs CRUCIBLE_RUN_IMAGE"),
])
def test_a_run_launcher_setting_that_cannot_work_is_refused_in_one_sentence(home, monkeypatch, settings, refusal):
    monkeypatch.delenv("CRUCIBLE_RUN_IMAGE", raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=refusal):
        prepare_instance()


@pytest.mark.parametrize("first, then, refusal", [
    ("docker", "process", "launches its runs in Docker containers, and CRUCIBLE_RUN_LAUNCHER is not docker here"),
    ("process", "docker", "launches its runs in processes on this machine, and CRUCIBLE_RUN_LAUNCHER=docker is set"),
])
def test_a_command_whose_launcher_setting_differs_does_not_switch_the_instance(home, monkeypatch, first, then, refusal):
    monkeypatch.setenv("CRUCIBLE_RUN_IMAGE", "crucible-project:any")
    monkeypatch.setenv("CRUCIBLE_RUN_LAUNCHER", first)
    prepare_instance()
    written = (home / "dagster.yaml").read_text()
    monkeypatch.setenv("CRUCIBLE_RUN_LAUNCHER", then)
    with pytest.raises(UserError, match=refusal):
        prepare_instance()
    assert (home / "dagster.yaml").read_text() == written
