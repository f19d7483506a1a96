"""The metrics of datastore/metrics.py, against hand-computed values: tasks are the unit of a
held-out pass rate, improvements are paired by task, infrastructure errors are kept apart from
failures, and a group without a reward spread carries no signal."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from test_datastore import trajectory_row

from datastore import catalog, metrics
from datastore import store as store_module
from datastore.schema import CLOSED_SETS, DATASETS
from datastore.store import DatasetStore, rows_to_table
from statuses import RewardStatus


def _evaluation(task_id: str, passed: bool, status: str = "scored") -> dict:
    return {"task_id": task_id, "sample_index": 0, "difficulty": "easy", "family": "f", "policy_version": "p",
            "response_text": "", "reward": (1.0 if passed else 0.0) if status == "scored" else None,
            "passed": passed, "reward_status": status, "reward_version": "r@1", "observations": "shown", "turns": []}


def _held_out(tmp_path, evaluations: dict[int, list[tuple]]) -> dict[int, dict]:
    store = DatasetStore(str(tmp_path))
    for iteration, results in evaluations.items():
        rows = [_evaluation(*result) for result in results]
        store.write_partition("evaluations", "exp", iteration, rows_to_table("evaluations", rows))
    rows = metrics.records(catalog.connect(str(tmp_path)), "SELECT * FROM held_out ORDER BY iteration")
    return {row["iteration"]: row for row in rows}


def test_held_out_pass_rate_treats_tasks_as_the_unit(tmp_path):
    # Task rates 1, 0.5, 0 (a task's two samples are not two independent tasks): mean 0.5,
    # sample std 0.5, standard error 0.5 / sqrt(3).
    results = [("a", True), ("a", True), ("b", True), ("b", False), ("c", False), ("c", False)]
    [base] = _held_out(tmp_path, {0: results}).values()
    assert (base["pass_rate"], base["tasks"], base["samples"]) == (pytest.approx(0.5), 3, 6)
    assert base["stderr"] == pytest.approx(0.5 / math.sqrt(3))


def test_greedy_pass_rate_stderr_is_the_binomial_one_with_bessel_correction(tmp_path):
    [base] = _held_out(tmp_path, {0: [(f"t{i}", i < 2) for i in range(8)]}).values()  # 2 of 8
    assert base["stderr"] == pytest.approx(math.sqrt(0.25 * 0.75 / 8 * 8 / 7))


def test_improvement_is_paired_over_the_tasks_both_evaluated(tmp_path):
    base = [("a", False), ("b", False), ("c", True), ("d", False), ("gone", True)]
    new = [("a", True), ("b", True), ("c", True), ("d", False), ("new", True)]
    gain = _held_out(tmp_path, {0: base, 3: new})[3]
    # differences 1, 1, 0, 0: mean 0.5, sample std sqrt(1/3), stderr sqrt(1/3) / 2
    assert gain["paired_tasks"] == 4 and gain["improvement"] == pytest.approx(0.5)
    assert gain["improvement_stderr"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert gain["improvement_in_stderrs"] == pytest.approx(0.5 / (math.sqrt(1 / 3) / 2))


def test_an_improvement_of_every_task_by_the_same_amount_is_infinitely_many_stderrs(tmp_path):
    assert _held_out(tmp_path, {0: [("a", False)], 1: [("a", True)]})[1]["improvement_in_stderrs"] == math.inf


def test_an_infrastructure_error_is_neither_a_pass_nor_a_failure(tmp_path):
    results = [("a", True), ("a", False, "infra_error"), ("b", False), ("c", False, "infra_error")]
    [base] = _held_out(tmp_path, {0: results}).values()
    assert (base["pass_rate"], base["tasks"], base["samples"]) == (0.5, 2, 2)  # "c" was never judged

    store = DatasetStore(str(tmp_path))
    rows = [trajectory_row("t/0", 0, 1.0), trajectory_row("t/0", 1, 0.0),
            {**trajectory_row("t/0", 2, 0.0), "reward": None, "passed": False, "reward_status": "infra_error"}]
    store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    [stats] = metrics.records(catalog.connect(str(tmp_path)), "SELECT * FROM iteration_rewards")
    assert (stats["samples"], stats["scored"], stats["pass_rate"], stats["reward_mean"]) == (3, 2, 0.5, 0.5)
    assert stats["infra_error_rate"] == pytest.approx(1 / 3)


def test_a_group_carries_a_learning_signal_only_with_two_scored_rewards_that_differ(tmp_path):
    def group(name: str, rewards: list[float | None]) -> list[dict]:
        rows = [{**trajectory_row(name, i, reward or 0.0), "group_id": name} for i, reward in enumerate(rewards)]
        for row, reward in zip(rows, rewards):
            if reward is None:
                row.update(reward=None, passed=False, reward_status="infra_error")
        return rows

    rows = (group("spread", [1.0, 0.0]) + group("flat", [0.5, 0.5]) + group("lone", [1.0, None])
            + group("lost", [None, None]))
    DatasetStore(str(tmp_path)).write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    [stats] = metrics.records(catalog.connect(str(tmp_path)), "SELECT * FROM iteration_rewards")
    assert (stats["groups"], stats["zero_variance_groups"], stats["zero_variance_fraction"]) == (4, 3, 0.75)


def test_pinned_files_are_measured_as_they_were_when_a_step_read_them(tmp_path):
    store = DatasetStore(str(tmp_path))

    def write(rewards: list[float]) -> None:
        rows = [trajectory_row(f"t/{i}", i, r) for i, r in enumerate(rewards)]
        store.write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))

    write([1.0, 0.0])
    trained_on = store.partition_files("trajectories", "exp", 1)
    write([1.0, 1.0, 1.0])  # a re-run replaced the partition while the step was training
    query = "SELECT samples, pass_rate FROM iteration_rewards"
    assert catalog.connect(str(tmp_path)).execute(query).fetchall() == [(3, 1.0)]
    assert catalog.connect(str(tmp_path), pinned={"trajectories": trained_on}).execute(query).fetchall() == [(2, 0.5)]


def test_evaluations_stored_before_they_had_observations_are_the_shown_evaluation(tmp_path, monkeypatch):
    """Every evaluation stored under schema 8 (no observations, no turns columns): the views still
    bind, the missing columns read as null, and the held-out pass rate counts those samples."""
    old = pa.schema([field for field in DATASETS["evaluations"] if field.name not in ("observations", "turns")])
    rows = [{key: value for key, value in _evaluation(task, passed).items() if key in old.names}
            for task, passed in (("t/1", True), ("t/2", False))]
    with monkeypatch.context() as schema_8:
        schema_8.setitem(DATASETS, "evaluations", old)
        schema_8.setitem(CLOSED_SETS, "evaluations", {"reward_status": RewardStatus})
        schema_8.setattr(store_module, "SCHEMA_VERSION", 8)
        DatasetStore(str(tmp_path)).write_partition("evaluations", "exp", 0, pa.Table.from_pylist(rows, schema=old))
    con = catalog.connect(str(tmp_path))
    [held_out] = metrics.records(con, "SELECT tasks, pass_rate FROM held_out")
    assert held_out == {"tasks": 2, "pass_rate": 0.5}
    assert con.execute("SELECT count(*) FROM evaluations WHERE observations IS NULL AND turns IS NULL").fetchone() == (2,)
    assert metrics.records(con, "SELECT * FROM feedback_value") == []


def test_rewards_per_staleness_count_samples_stored_before_rows_named_their_sampler_as_fresh(tmp_path):
    store = DatasetStore(str(tmp_path))
    rows = [{**trajectory_row(f"t/{i}", i, reward), "staleness": staleness}
            for i, (reward, staleness) in enumerate([(1.0, 0), (0.0, 1), (1.0, 1), (0.0, None)])]
    store.write_partition("trajectories", "exp", 2, rows_to_table("trajectories", rows))
    query = "SELECT staleness, samples, reward_mean FROM staleness_rewards ORDER BY staleness"
    assert catalog.connect(str(tmp_path)).execute(query).fetchall() == [(0, 2, 0.5), (1, 2, 0.5)]


def test_the_logprob_mismatch_views_weight_samples_by_their_tokens_and_name_their_staleness(tmp_path):
    store = DatasetStore(str(tmp_path))
    rows = [{**trajectory_row(f"t/{i}", i, 1.0), "group_id": f"g{i}", "sample_index": 0, "staleness": staleness}
            for i, staleness in enumerate([0, 1, 1])]
    store.write_partition("trajectories", "exp", 2, rows_to_table("trajectories", rows))
    measured = [{"group_id": f"g{i}", "sample_index": 0, "tokens": tokens, "mean_diff": diff, "mean_abs_diff": abs(diff),
                 "max_abs_diff": top, "max_at": 0, "max_token": "x"}
                for i, (tokens, diff, top) in enumerate([(4, 0.1, 0.2), (1, -0.5, 0.5), (3, 0.3, 2.0)])]
    checkpoint = {field.name: None for field in DATASETS["checkpoints"]}
    store.write_partition("checkpoints", "exp", 2, rows_to_table("checkpoints", [
        {**checkpoint, "path": "ckpt/2", "logprob_mismatch": measured}]))
    con = catalog.connect(str(tmp_path))
    assert con.execute("SELECT task_id, staleness FROM logprob_mismatch ORDER BY max_abs_diff DESC LIMIT 1").fetchall() == [
        ("t/2", 1)]
    query = "SELECT staleness, samples, tokens, mean_diff, mean_abs_diff, max_abs_diff FROM logprob_mismatch_by_staleness"
    by_staleness = {row[0]: row[1:] for row in con.execute(query).fetchall()}
    assert by_staleness[0] == (1, 4, pytest.approx(0.1), pytest.approx(0.1), 0.2)
    assert by_staleness[1] == (2, 4, pytest.approx((-0.5 + 0.9) / 4), pytest.approx((0.5 + 0.9) / 4), 2.0)
