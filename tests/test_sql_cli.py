"""`crucible sql`: results as CSV, JSON lines or Parquet, a DuckDB file of the views, and the
errors a user can make, over a real store on disk and on the S3 server; which experiment
`crucible curve` plots."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import duckdb
import pyarrow.parquet as pq
import pytest

from datastore import catalog
from datastore.schema import DATASETS
from datastore.store import DatasetStore, rows_to_table
from pipelines.cli import main

STARTED = datetime(2026, 11, 30, tzinfo=timezone.utc)


@pytest.fixture
def storage(storage_root, monkeypatch) -> str:
    monkeypatch.delenv("CRUCIBLE_STORAGE_ROOT", raising=False)  # --storage sets it; undone after the test
    _write_stages(storage_root, iteration=1, seconds={"rollouts": 12.5, "checkpoint": 30.0})
    return storage_root


def _write_stages(root: str, iteration: int, seconds: dict[str, float], experiment: str = "exp",
                  started_at: datetime = STARTED) -> None:
    store = DatasetStore(root)
    for stage, spent in seconds.items():
        row = {"stage": stage, "seconds": spent, "started_at": started_at}
        store.write_partition("stages", experiment, iteration, rows_to_table("stages", [row]), part=stage)


def sql(storage: str, *args: str) -> int:
    return main(["sql", "--storage", storage, *args])


QUERY = "SELECT stage, seconds FROM stages ORDER BY stage"


def test_csv_and_json_lines_go_to_standard_output(storage, capfdbinary):
    assert sql(storage, QUERY, "--format", "csv") == 0
    assert capfdbinary.readouterr().out.decode().splitlines() == ['"stage","seconds"', '"checkpoint",30', '"rollouts",12.5']
    assert sql(storage, "SELECT stage, seconds, started_at FROM stages ORDER BY stage", "--format", "json") == 0
    rows = [json.loads(line) for line in capfdbinary.readouterr().out.decode().splitlines()]
    assert rows[0] == {"stage": "checkpoint", "seconds": 30.0, "started_at": "2026-11-30 00:00:00+00:00"}


def test_the_table_prints_values_as_they_are_never_as_markup(storage, capsys):
    assert sql(storage, "SELECT 'FAIL pick([#, #]): expected [bold]#[/bold]' AS failure") == 0
    assert "FAIL pick([#, #]): expected [bold]#[/bold]" in capsys.readouterr().out


def test_parquet_goes_to_a_file_that_keeps_the_types(storage, tmp_path):
    out = tmp_path / "stages.parquet"
    assert sql(storage, QUERY, "--format", "parquet", "--out", str(out)) == 0
    table = pq.read_table(out)
    assert table.column_names == ["stage", "seconds"] and table.column("seconds").to_pylist() == [30.0, 12.5]
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_exported_database_is_a_self_contained_snapshot_of_every_view(storage, tmp_path):
    exported = tmp_path / "crucible.duckdb"
    assert sql(storage, "--export-db", str(exported)) == 0
    _write_stages(storage, iteration=2, seconds={"rollouts": 14.0})  # after the export: not in it
    con = duckdb.connect(str(exported), read_only=True)  # no filesystem registered: reads nothing remote
    assert con.execute("SELECT iteration, count(*) FROM stages GROUP BY 1 ORDER BY 1").fetchall() == [(1, 2)]
    assert con.execute("SELECT count(*) FROM trajectories").fetchall() == [(0,)]  # typed, though nothing is stored
    tables = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    views = {name for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert tables == set(DATASETS)
    assert views == set(catalog.DERIVED_VIEWS)


@pytest.mark.parametrize("args, message", [
    (("SELECT 1", "--format", "parquet"), "parquet is binary: give --out FILE"),
    (("SELECT 1", "--out", "x.csv"), "--out needs --format csv, json or parquet"),
    (("SELECT 1", "--export-db", "x.duckdb"), "--export-db writes the views themselves"),
    ((), "give a query, or --export-db FILE.duckdb"),
    (("SELECT * FROM stagez", "--format", "csv"), "available views: trajectories"),
    (("SELECT [1, 2] AS pair", "--format", "csv"), "CSV has no place for column 'pair'"),
])
def test_user_mistakes_get_one_line_of_reason_and_exit_2(storage, capfd, args, message):
    assert sql(storage, *args) == 2
    assert message in capfd.readouterr().err


def test_a_failed_write_leaves_neither_the_file_nor_a_partial_one(storage, tmp_path, capfd):
    occupied = tmp_path / "out"
    occupied.mkdir()  # a directory where the result should go: the final rename fails
    (occupied / "keep").write_text("untouched")
    assert sql(storage, QUERY, "--format", "csv", "--out", str(occupied)) == 2
    assert "cannot write" in capfd.readouterr().err
    assert (occupied / "keep").read_text() == "untouched"
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_storage_that_cannot_be_reached_is_named_in_one_line_before_any_work(s3_root, monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("CRUCIBLE_STORAGE_ROOT", raising=False)
    assert main(["sql", "--storage", "s3://no-such-bucket/data", "SELECT 1"]) == 2
    assert main(["run", "--storage", "s3://no-such-bucket/data"]) == 2
    err = capfd.readouterr().err
    assert err.count("error: storage s3://no-such-bucket/data: no such bucket") == 2 and "Traceback" not in err


def test_a_corrupt_manifest_or_an_unknown_protocol_is_named_in_one_line(storage, capfd):
    store = DatasetStore(storage)
    store.fs.pipe_file(store.manifest_path("stages", "exp", 1, "rollouts"), b"{not json")
    assert sql(storage, QUERY) == 2
    assert main(["sql", "--storage", "s4://bucket/data", QUERY]) == 2
    err = capfd.readouterr().err
    assert "stages/experiment=exp/iteration=1/rollouts.manifest.json: not a readable manifest" in err
    assert "storage s4://bucket/data: Protocol not known: s4" in err and "Traceback" not in err
    assert sql(storage, "SELECT count(*) FROM checkpoints") == 0  # the other datasets still answer


def _damage(storage: str, how: str) -> str:
    """Iteration 2's rollouts stage, its file deleted or cut to half; the file's URI."""
    _write_stages(storage, iteration=2, seconds={"rollouts": 7.0})
    store = DatasetStore(storage)
    [uri] = store.partition_files("stages", "exp", 2, "rollouts")
    path = store.fs._strip_protocol(uri)
    if how == "missing":
        store.fs.rm_file(path)
    else:
        store.fs.pipe_file(path, store.fs.cat_file(path)[:100])
    return uri


@pytest.mark.parametrize(("how", "said"), [("missing", "is missing"), ("truncated", "has 100 bytes of the")])
def test_a_damaged_partition_fails_only_the_queries_that_read_it_and_names_it(storage, capfd, how, said):
    """Issue 40, problem 4: one manifest naming a missing file once failed every query."""
    uri = _damage(storage, how)
    assert sql(storage, "SELECT count(*) AS n FROM stages WHERE iteration = 1", "--format", "csv") == 0
    assert capfd.readouterr().out.splitlines() == ['"n"', "2"]
    assert sql(storage, "SELECT count(*) FROM stages") == 2
    err = capfd.readouterr().err
    assert f"stages, experiment exp iteration 2 (rollouts), is damaged: {uri} {said}" in err
    assert "crucible data check" in err and "Traceback" not in err


def test_data_check_lists_each_damaged_part_and_what_to_do_until_it_is_written_again(storage, capfd):
    _damage(storage, "missing")
    assert main(["data", "check", "--storage", storage]) == 1
    out = capfd.readouterr()
    assert "stages exp|0002 (rollouts): " in out.out and "is missing\n  what to do: materialize rollouts for " \
        "partition exp|0002 again" in out.out
    assert "1 damaged part in" in out.err
    _write_stages(storage, iteration=2, seconds={"rollouts": 7.0})  # what materializing it does
    assert main(["data", "check", "--storage", storage]) == 0
    assert sql(storage, "SELECT count(*) FROM stages") == 0


def curve(storage: str, *args: str) -> int:
    return main(["curve", "--storage", storage, *args])


def test_curve_plots_the_experiment_whose_latest_stage_started_last(storage, capfd):
    _write_stages(storage, iteration=1, seconds={"rollouts": 1.0}, experiment="newer",
                  started_at=STARTED + timedelta(hours=1))
    _write_stages(storage, iteration=2, seconds={"rollouts": 1.0}, started_at=STARTED + timedelta(hours=2))
    assert curve(storage) == 2  # none of them has evaluations: the error names the one it chose
    assert "experiment 'exp' has no scored evaluation of its base policy" in capfd.readouterr().err


def test_curve_of_an_unknown_experiment_lists_the_stored_ones_the_most_recent_first(storage, capfd):
    _write_stages(storage, iteration=1, seconds={"rollouts": 1.0}, experiment="newer",
                  started_at=STARTED + timedelta(hours=1))
    assert curve(storage, "--experiment", "default") == 2
    err = capfd.readouterr().err
    assert f"no experiment 'default' under {storage}; stored, the most recent first: newer, exp" in err
    assert "Traceback" not in err
