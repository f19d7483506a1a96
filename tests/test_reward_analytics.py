"""Reward analytics: the `iteration_rewards` asset judges an iteration's stored samples in a real
Dagster run (its failed error checks keep the training step from running), and
`reward_analytics` summarises every iteration with tables and plots."""

from __future__ import annotations

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    materialize,
)
from test_datastore import trajectory_row

import math

from assets.analytics import ITERATION_MEASURES, iteration_rewards, reward_analytics
from datastore.charts import TRAINING_PANELS, markdown_table, significant, training_figure
from assets.iteration import checkpoint
from assets.partitions import add_iteration, iteration_key, parse_iteration_key
from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from datastore import catalog, metrics
from datastore.store import rows_to_table
from training.evaluation.monitors import SAMPLE_CHECKS
from training.experiment import ExperimentConfig

RESOURCES = {"training_step": TrainingStepClient()}


def _samples(infra_errors: int = 0, tampered: int = 0) -> list[dict]:
    """Two tasks of four samples: t/0 all passed (a flat group), t/1 (hard) half passed, one
    truncated; the first `infra_errors` samples of t/1 lost to the infrastructure, the last
    `tampered` of t/0 caught forging their report (reward 0, not passed, whatever the tests said)."""
    rows = [trajectory_row("t/0", i, 1.0) for i in range(4)] + [trajectory_row("t/1", i, float(i % 2)) for i in range(4)]
    rows[7]["finish_reason"] = "length"
    for row in rows[4 - tampered:4]:
        row.update(tamper_flags=["forged_output"], reward=0.0, passed=False)
    for row in rows[4:]:
        row["difficulty"] = "hard"
    for row in rows[4:4 + infra_errors]:
        row.update(reward=None, passed=False, reward_status="infra_error", error_class="SandboxUnavailable")
    return rows


@pytest.fixture
def crucible(storage_root, tmp_path, monkeypatch) -> CrucibleResource:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    resource = CrucibleResource(storage_root=storage_root, checkpoint_root=str(tmp_path / "checkpoints"))
    resource.save_experiment(ExperimentConfig(name="exp", samples_per_task=4))
    return resource


def _store(crucible: CrucibleResource, iteration: int, infra_errors: int = 0, tampered: int = 0) -> str:
    crucible.store().write_partition("trajectories", "exp", iteration,
                                     rows_to_table("trajectories", _samples(infra_errors, tampered)))
    return iteration_key("exp", iteration)


def _check(instance, name: str):
    [record] = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey("iteration_rewards"), name), limit=1)
    return record.event.dagster_event.event_specific_data


def _materialize(crucible: CrucibleResource, key: str) -> tuple[dict, dict]:
    """iteration_rewards materialized for `key`: its metadata and every check's evaluation."""
    with DagsterInstance.get() as instance:
        add_iteration(instance, *parse_iteration_key(key))
        materialize([iteration_rewards], partition_key=key, instance=instance,
                    resources={"crucible": crucible, **RESOURCES}, raise_on_error=False)
        metadata = instance.get_latest_materialization_event(AssetKey("iteration_rewards")).asset_materialization.metadata
        return metadata, {name: _check(instance, name) for name in SAMPLE_CHECKS}


def test_healthy_samples_are_summarised_per_task_and_pass_every_check(crucible):
    metadata, checks = _materialize(crucible, _store(crucible, 1))
    assert all(check.passed for check in checks.values())
    assert "truncation_rate 0.125 (limit 0.5)" in checks["truncation_within_limit"].description
    assert metadata["pass_rate"].value == 0.75 and metadata["zero_variance_fraction"].value == 0.5
    assert metadata["truncation_rate"].value == 0.125 and metadata["tamper_rate"].value == 0.0
    assert metadata["sandbox_s"].value == pytest.approx(0.03)  # grading 0.03 s, no episode commands
    tasks = {row.data["task_id"]: row.data for row in metadata["tasks_table"].value.records}
    assert tasks["t/1"]["pass_rate"] == 0.5 and tasks["t/1"]["zero_variance_groups"] == 0
    assert tasks["t/0"]["zero_variance_groups"] == 1 and tasks["t/1"]["difficulty"] == "hard"
    assert metadata["tamper_flags"].value.records == []
    assert "data:image/png;base64," in metadata["reward_distribution"].value


def test_metadata_monitors_and_sql_read_the_same_numbers(crucible):
    key = _store(crucible, 1, infra_errors=1, tampered=1)
    metadata, checks = _materialize(crucible, key)
    [view] = metrics.records(catalog.connect(crucible.storage_root),
                             "SELECT * FROM iteration_rewards WHERE experiment = 'exp' AND iteration = 1")
    # The metadata reads the view's numbers to three significant digits.
    assert {name: metadata[name].value for name in ITERATION_MEASURES} == {
        name: significant(view[name]) if isinstance(view[name], float) else view[name] for name in ITERATION_MEASURES}
    for check, (measure, _, _) in SAMPLE_CHECKS.items():
        assert checks[check].description.startswith(f"{measure} {view[measure]:.3f} ")
    assert view["pass_rate"] == pytest.approx(5 / 7)  # 7 scored: t/0's 3 honest passes, t/1's 2 of 3


def test_an_iteration_of_an_experiment_never_created_fails_instead_of_guessing_its_settings(crucible):
    """Issue 16, problem 5: a partition added in the UI for a new experiment ran on defaults."""
    crucible.store().write_partition("trajectories", "guessed", 1, rows_to_table("trajectories", _samples()))
    with DagsterInstance.get() as instance:
        key = add_iteration(instance, "guessed", 1)
        result = materialize([iteration_rewards], partition_key=key, instance=instance,
                             resources={"crucible": crucible, **RESOURCES}, raise_on_error=False)
    [failure] = [event for event in result.all_events if event.is_step_failure]
    assert "experiment 'guessed' has no stored settings" in failure.step_failure_data.error.message
    assert "create it with the create_experiment job" in failure.step_failure_data.error.message


def test_infrastructure_errors_above_the_limit_keep_the_training_step_from_running(crucible):
    key = _store(crucible, 1, infra_errors=2)  # 2 of 8 samples: 25%, over the 20% limit
    with DagsterInstance.get() as instance:
        add_iteration(instance, *parse_iteration_key(key))
        result = materialize([iteration_rewards, checkpoint], partition_key=key, instance=instance,
                             resources={"crucible": crucible, **RESOURCES}, raise_on_error=False)
        infra, tampering = _check(instance, "infra_errors_within_limit"), _check(instance, "tampering_within_limit")
        trained = instance.get_latest_materialization_event(AssetKey("checkpoint"))
    assert not result.success and not infra.passed and infra.severity.value == "ERROR" and tampering.passed
    assert "infra_error_rate 0.250 (limit 0.2)" in infra.description
    started = {event.step_key for event in result.all_events if event.event_type_value == "STEP_START"}
    assert started == {"iteration_rewards"} and trained is None  # the training step never started


def test_an_iteration_lost_to_the_infrastructure_fails_its_check_instead_of_crashing(crucible):
    rows = _samples()
    for row in rows:  # every sample, so no reward was scored at all
        row.update(reward=None, passed=False, reward_status="infra_error", error_class="SandboxUnavailable")
    crucible.store().write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    metadata, checks = _materialize(crucible, iteration_key("exp", 1))
    infra = checks["infra_errors_within_limit"]
    assert not infra.passed and "infra_error_rate 1.000" in infra.description
    assert metadata["reward_mean"].value is None and metadata["infra_error_rate"].value == 1.0


def test_tampering_above_the_limit_fails_its_check_and_names_the_flags(crucible):
    metadata, checks = _materialize(crucible, _store(crucible, 1, tampered=2))  # 25%, over the 10% limit
    tampering = checks["tampering_within_limit"]
    assert not tampering.passed and "tamper_rate 0.250 (limit 0.1)" in tampering.description
    assert [row.data for row in metadata["tamper_flags"].value.records] == [
        {"flag": "forged_output", "samples": 2}]


def test_reward_analytics_tables_and_plots_every_iteration(crucible):
    for iteration, infra_errors in ((1, 0), (2, 1)):
        _store(crucible, iteration, infra_errors)
    with DagsterInstance.get() as instance:
        assert materialize([reward_analytics], instance=instance, resources={"crucible": crucible}).success
        metadata = instance.get_latest_materialization_event(AssetKey("reward_analytics")).asset_materialization.metadata
    rows = [row.data for row in metadata["summary"].value.records]
    assert [(row["iteration"], row["samples"], row["infra_error_rate"]) for row in rows] == [(1, 8, 0.0), (2, 8, 0.125)]
    assert metadata["iterations"].value == 2
    for plot in ("reward_curve", "pass_rate_by_difficulty"):
        assert "data:image/png;base64," in metadata[plot].value


def test_reward_analytics_shows_each_experiment_at_a_glance(crucible):
    for iteration in (1, 2):
        _store(crucible, iteration, infra_errors=iteration - 1)
    with DagsterInstance.get() as instance:
        assert materialize([reward_analytics], instance=instance, resources={"crucible": crucible}).success
        metadata = instance.get_latest_materialization_event(AssetKey("reward_analytics")).asset_materialization.metadata
    latest = metadata["exp/latest"].value
    assert latest.startswith("**exp**, iteration 2") and len(latest) < 1000  # short enough to show inline
    # Iteration 2 lost t/1's first sample (a failure) to the infrastructure: 6 of 7 scored passed, 6 of 8 before.
    assert f"| train pass rate | {6 / 7:.3f} | {6 / 7 - 0.75:+.3f} |" in latest
    assert "data:image/png;base64," in metadata["exp/training"].value


def test_the_training_figure_has_a_panel_per_measure_over_every_iteration(crucible):
    _store(crucible, 1)
    rows = metrics.records(catalog.connect(crucible.storage_root), "SELECT * FROM iterations ORDER BY iteration")
    figure = training_figure("exp", rows)
    assert [axis.get_title() for axis in figure.axes] == list(TRAINING_PANELS)
    [train_line] = figure.axes[1].get_lines()
    assert list(train_line.get_xdata()) == [1] and list(train_line.get_ydata()) == [0.75]


@pytest.mark.parametrize(("value", "shown"), [
    (0.0003, 0.0003), (4.5e-4, 0.00045), (0.123456, 0.123), (1234.5678, 1230.0), (0.0, 0.0), (-0.98765, -0.988),
])
def test_metadata_numbers_keep_three_significant_digits(value, shown):
    assert significant(value) == shown
    assert markdown_table([{"lr": value}], ("lr",)).splitlines()[-1] == f"| {shown:g} |"


def test_infinities_and_nan_are_shown_as_they_are():
    assert significant(math.inf) == math.inf and math.isnan(significant(math.nan))
