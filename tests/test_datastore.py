"""Parquet partitions written atomically and read back through DuckDB views."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from datastore import catalog
from datastore.schema import DATASETS, SCHEMA_VERSION, schema_markdown
from datastore.store import DatasetStore, SchemaError, StorageUnavailable, rows_to_table


def trajectory_row(task_id: str = "t/1", sample_index: int = 0, reward: float = 1.0) -> dict:
    return {
        "task_id": task_id,
        "task_version": "abc",
        "split": "train",
        "difficulty": "easy",
        "family": "add_k",
        "group_id": f"{task_id}#g",
        "sample_index": sample_index,
        "policy_version": "p0",
        "policy_iteration": 0,
        "staleness": 0,
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [4, 5],
        "loss_mask": [1, 1],
        "behaviour_logprobs": [-0.5, -0.25],
        "response_text": "def f(x):\n    return x\n",
        "turns": [{"index": 0, "reply": "def f(x):\n    return x\n", "action": "submit", "detail": "",
                   "status": "submitted", "exit_code": None, "observation_excerpt": "", "generate_s": 0.1,
                   "exec_s": 0.0, "sampled_tokens": 2}],
        "patch": "def f(x):\n    return x\n",
        "test_results": [
            {"name": "test_a", "outcome": "passed", "message": ""},
            {"name": "test_b", "outcome": "passed" if reward == 1.0 else "failed", "message": ""},
        ],
        "reward_components": {"tests_passed_fraction": reward},
        "reward": reward,
        "reward_status": "scored",
        "reward_version": "tests-passed-fraction@5e1e1b606039",
        "passed": reward == 1.0,
        "tamper_flags": [],
        "failure_reason": None if reward == 1.0 else "tests_failed",
        "failure_detail": "" if reward == 1.0 else "1 of 2 expected tests failed; first: test_b",
        "exec_status": "OK",
        "timings": {"generate_s": 0.1, "queue_s": 0.0, "exec_s": 0.02, "verify_s": 0.03},
        "prompt_tokens": 3,
        "sampled_tokens": 2,
        "observation_tokens": 0,
        "finish_reason": "stop",
        "error_class": None,
        "sandbox_backend": "local",
        "sandbox_spec_hash": "s",
        "environment": None,
    }


def write_trajectories(store: DatasetStore, iteration: int, rewards: list[float]) -> None:
    rows = [trajectory_row(f"t/{i}", i, r) for i, r in enumerate(rewards)]
    store.write_partition("trajectories", "exp", iteration, rows_to_table("trajectories", rows))


def partition_listing(store: DatasetStore, iteration: int = 1) -> list[str]:
    """Every object in a trajectories partition, published or not."""
    store.fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[1] for p in store.fs.ls(store.partition_dir("trajectories", "exp", iteration)))


def test_partition_round_trips_through_parquet(storage_root):
    store = DatasetStore(storage_root)
    write_trajectories(store, 1, [1.0, 0.5])
    [uri] = store.partition_files("trajectories", "exp", 1)
    assert uri.startswith(store.uri_of(store.root) + "/trajectories/experiment=exp/iteration=1/data-")
    with store.fs.open(store.fs._strip_protocol(uri)) as f:
        parquet = pq.ParquetFile(f)
        assert parquet.metadata.num_rows == 2
        assert parquet.schema_arrow.metadata[b"crucible_schema_version"] == str(SCHEMA_VERSION).encode()
        assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    assert store.read_partition("trajectories", "exp", 1).column("reward").to_pylist() == [1.0, 0.5]
    manifest = json.loads(store.fs.cat_file(store.manifest_path("trajectories", "exp", 1)))
    assert manifest["rows"] == 2 and manifest["schema_version"] == SCHEMA_VERSION


def test_rewriting_an_iteration_replaces_it(storage_root):
    store = DatasetStore(storage_root)
    write_trajectories(store, 1, [1.0, 0.5, 0.0])
    write_trajectories(store, 1, [0.25])
    con = catalog.connect(storage_root)
    assert con.execute("SELECT count(*), sum(reward) FROM trajectories").fetchall() == [(1, 0.25)]
    assert len(store.dataset_files("trajectories")) == 1


def test_a_replaced_version_is_deleted_once_past_retention(storage_root):
    """Kept while a reader may still be on it; deleted by the next write after the retention time."""
    write_trajectories(DatasetStore(storage_root), 1, [1.0])
    write_trajectories(DatasetStore(storage_root), 1, [0.5])
    assert len(partition_listing(DatasetStore(storage_root))) == 3  # two versions and the manifest
    expired = DatasetStore(storage_root, retention_s=0)
    write_trajectories(expired, 1, [0.0])
    [current] = expired.partition_files("trajectories", "exp", 1)
    assert partition_listing(expired) == sorted(["data.manifest.json", current.rsplit("/", 1)[1]])


def test_a_version_just_replaced_is_kept_however_old_its_file(tmp_path):
    """Retention counts from the replacement: a reader that read the manifest a moment ago may
    be about to open the file it named."""
    store = DatasetStore(str(tmp_path))
    write_trajectories(store, 1, [1.0])
    [first] = store.partition_files("trajectories", "exp", 1)
    a_day_ago = time.time() - 86_400
    os.utime(first.removeprefix("file://"), (a_day_ago, a_day_ago))
    write_trajectories(store, 1, [0.5])
    assert first.rsplit("/", 1)[1] in partition_listing(store)
    manifest = json.loads(store.fs.cat_file(store.manifest_path("trajectories", "exp", 1)))
    assert [entry["file"] for entry in manifest["superseded"]] == [first.rsplit("/", 1)[1]]


def test_a_file_no_manifest_names_is_invisible(storage_root):
    store = DatasetStore(storage_root)
    write_trajectories(store, 1, [1.0])
    stray = f"{store.partition_dir('trajectories', 'exp', 1)}/data-{'0' * 32}.parquet"
    store.fs.pipe_file(stray, b"PAR1 half a file")
    assert catalog.connect(storage_root).execute("SELECT count(*) FROM trajectories").fetchone() == (1,)
    assert store.read_partition("trajectories", "exp", 1).num_rows == 1


def _write_and_die_before_publishing(root: str, environment: dict[str, str], publishing) -> None:
    """A writer whose data file is complete and whose manifest is never published: it stops,
    to be killed, exactly where a crash would leave debris."""
    os.environ.update(environment)

    def hang(self, path, manifest):
        publishing.set()
        time.sleep(3600)

    DatasetStore._publish = hang
    rows = [trajectory_row(f"t/{i}", i) for i in range(1000)]
    DatasetStore(root).write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))


def test_a_writer_killed_before_its_manifest_leaves_the_previous_version_and_invisible_debris(storage_root):
    store = DatasetStore(storage_root)
    write_trajectories(store, 1, [0.5])
    before = partition_listing(store)
    context = multiprocessing.get_context("spawn")
    publishing = context.Event()
    writer = context.Process(target=_write_and_die_before_publishing, args=(
        storage_root, {k: v for k, v in os.environ.items() if k.startswith("AWS_")}, publishing))
    writer.start()
    assert publishing.wait(120), "the writer never reached its manifest"
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    debris = sorted(set(partition_listing(store)) - set(before))
    assert len(debris) == 1 and debris[0].endswith(".parquet")  # the new data file, complete, named by nothing
    assert store.read_partition("trajectories", "exp", 1).num_rows == 1  # the previous version
    assert catalog.connect(storage_root).execute("SELECT count(*) FROM trajectories").fetchone() == (1,)
    # The next write, once the debris is past retention, sweeps it.
    write_trajectories(DatasetStore(storage_root, retention_s=0), 1, [1.0])
    assert debris[0] not in partition_listing(store) and len(partition_listing(store)) == 2


def test_a_store_that_cannot_be_reached_says_why_in_one_line(s3_root, tmp_path):
    with pytest.raises(StorageUnavailable, match=r"storage s3://no-such-bucket/x: no such bucket"):
        DatasetStore("s3://no-such-bucket/x").check()
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageUnavailable, match=f"storage {tmp_path}/file/data: {tmp_path}/file is not a directory"):
        DatasetStore(str(tmp_path / "file" / "data")).check()
    DatasetStore(str(tmp_path / "new" / "data")).check()  # created by the first write; nothing made before
    assert not (tmp_path / "new").exists()


def test_rows_missing_a_column_are_rejected_with_its_name():
    row = trajectory_row()
    del row["reward"]
    with pytest.raises(SchemaError, match=r"trajectories row 0: missing columns \['reward'\]"):
        rows_to_table("trajectories", [row])


def test_rows_with_a_wrong_type_are_rejected():
    row = trajectory_row()
    row["sample_index"] = "first"
    with pytest.raises(SchemaError, match="trajectories"):
        rows_to_table("trajectories", [row])


def test_every_view_answers_on_an_empty_store(storage_root):
    con = catalog.connect(str(storage_root))
    for view in catalog.VIEWS:
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,)


def test_iterations_view_summarises_rollouts_evaluation_and_stages(storage_root):
    store = DatasetStore(str(storage_root))
    write_trajectories(store, 1, [1.0, 0.0])
    write_trajectories(store, 2, [1.0, 1.0, 0.5, 1.0])
    evaluations = [
        {"task_id": f"e/{i}", "sample_index": 0, "difficulty": "easy", "family": "add_k", "policy_version": "p",
         "response_text": "", "reward": float(i % 2), "passed": bool(i % 2), "reward_status": "scored",
         "reward_version": "tests-passed-fraction@5e1e1b606039", "observations": "shown", "turns": []}
        for i in range(4)
    ]
    store.write_partition("evaluations", "exp", 2, rows_to_table("evaluations", evaluations))
    # The base policy's evaluation is iteration 0: two samples of one task, one passed.
    base = [{**evaluations[0], "sample_index": index, "passed": bool(index)} for index in range(2)]
    store.write_partition("evaluations", "exp", 0, rows_to_table("evaluations", base))
    started = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for stage, seconds in (("rollouts", 3.0), ("checkpoint", 5.0)):
        row = {"stage": stage, "seconds": seconds, "started_at": started}
        store.write_partition("stages", "exp", 2, rows_to_table("stages", [row]), part=stage)

    rows = catalog.connect(str(storage_root)).execute(
        "SELECT iteration, tasks, samples, pass_rate, reward_mean, sampled_tokens, "
        "eval_pass_rate, eval_stderr, rollouts, checkpoint FROM iterations"
    ).fetchall()
    assert rows[0] == (0, None, None, None, None, None, 0.5, 0.0, None, None)  # one task: no spread
    assert rows[1] == (1, 2, 2, 0.5, 0.5, 2.0, None, None, None, None)
    # Task rates 0, 1, 0, 1: sample std sqrt(1/3) over sqrt(4) tasks.
    assert rows[2][:7] == (2, 4, 4, 0.75, 0.875, 2.0, 0.5) and rows[2][8:] == (3.0, 5.0)
    assert rows[2][7] == pytest.approx((1 / 3) ** 0.5 / 2)


def test_test_results_view_has_one_row_per_test(storage_root):
    store = DatasetStore(str(storage_root))
    write_trajectories(store, 1, [1.0, 0.5])
    con = catalog.connect(str(storage_root))
    assert con.execute(
        "SELECT outcome, count(*) FROM test_results GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("failed", 1), ("passed", 3)]


def test_turns_view_has_one_row_per_episode_turn_with_its_fields(storage_root):
    store = DatasetStore(str(storage_root))
    write_trajectories(store, 1, [1.0, 0.5])
    rows = catalog.connect(str(storage_root)).execute(
        "SELECT task_id, sample_index, index, action, status, sampled_tokens FROM turns ORDER BY task_id").fetchall()
    assert rows == [("t/0", 0, 0, "submit", "submitted", 2), ("t/1", 1, 0, "submit", "submitted", 2)]


def test_rewards_view_has_one_row_per_reward_component(storage_root):
    store = DatasetStore(str(storage_root))
    rows = [trajectory_row("t/0", 0, 1.0), {**trajectory_row("t/1", 1, 0.5),
                                            "reward_components": {"tests_passed_fraction": 0.5, "compiles": 1.0}}]
    store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    assert catalog.connect(str(storage_root)).execute(
        "SELECT task_id, component, value, reward FROM rewards ORDER BY task_id, component").fetchall() == [
        ("t/0", "tests_passed_fraction", 1.0, 1.0), ("t/1", "compiles", 1.0, 0.5), ("t/1", "tests_passed_fraction", 0.5, 0.5)]


def test_every_dataset_has_a_documented_schema():
    for name, schema in DATASETS.items():
        undocumented = [f.name for f in schema if not (f.metadata or {}).get(b"doc")]
        assert not undocumented, f"{name}: {undocumented}"
    documented = (Path(__file__).parent.parent / "docs" / "schema.md").read_text()
    assert documented == schema_markdown(), "regenerate: python -m datastore.schema > docs/schema.md"


def test_rows_without_behaviour_logprobs_are_stored_but_never_trained_on():
    from training.rl.step import train_samples

    evaluated_only = trajectory_row("t/2") | {"behaviour_logprobs": None}  # a text-only HTTP engine's sample
    table = rows_to_table("trajectories", [trajectory_row("t/1"), evaluated_only])
    assert table["behaviour_logprobs"].null_count == 1
    assert [s.group_id for s in train_samples(table)] == ["t/1#g"]


@pytest.mark.parametrize(("column", "value"), [
    ("reward_status", "ok"), ("exec_status", "FAIL"), ("tamper_flags", ["wrote_outside_workspace"]),
    ("test_results", [{"name": "test_a", "outcome": "xfail", "message": ""}]), ("finish_reason", "max_steps"),
])
def test_a_status_outside_its_closed_set_is_refused_and_nothing_is_written(tmp_path, column, value):
    store = DatasetStore(str(tmp_path))
    table = rows_to_table("trajectories", [{**trajectory_row(), column: value}])
    with pytest.raises(SchemaError, match=f"column {column}"):
        store.write_partition("trajectories", "exp", 1, table)
    assert not store.has_partition("trajectories", "exp", 1) and not list(tmp_path.rglob("*.parquet"))


def test_a_replaced_version_that_lineage_names_is_never_swept(storage_root):
    store = DatasetStore(storage_root, retention_s=0)
    write_trajectories(store, 1, [1.0])
    [trained_on] = store.partition_files("trajectories", "exp", 1)
    for rewards in ([0.5], [0.0]):  # two re-runs, each past the retention time
        store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", [
            trajectory_row("t/0", 0, rewards[0])]), keep=[trained_on])
    assert store.read_files("trajectories", [trained_on])["reward"].to_pylist() == [1.0]
    assert store.read_partition("trajectories", "exp", 1)["reward"].to_pylist() == [0.0]
    assert len([name for name in partition_listing(store) if name.endswith(".parquet")]) == 2  # the 0.5 one swept
