"""The Dagster code location: its graph, partitions and the advance_iterations sensor."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Failure,
    build_schedule_context,
    build_sensor_context,
    evaluate_automation_conditions,
    materialize,
)
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from held_runs import run_under_way

from assets.datasets import SHOWN
from assets.partitions import (
    add_iteration,
    experiment_of_run,
    experiments,
    iteration_key,
    iterations,
    parse_iteration_key,
    refuse_beside_other_writers,
)
from assets.resources import CrucibleResource
from assets.rollouts import refuse_without_a_parent_on_the_way
from commands.settings import load_settings
from datastore.schema import WRITTEN_BY
from pipelines.definitions import defs
from pipelines.jobs import ITERATION_ASSETS
from pipelines.resources import crucible_resource
from pipelines.sensors import advance_iterations, evaluate_latest_checkpoints
from training.experiment import ExperimentConfig
from training.iteration.context import SamplingPolicy

SNAPSHOT = Path(__file__).with_name("definitions_snapshot.json")


def definitions_snapshot() -> dict:
    """Everything about the code location that a review should see change: every asset (its
    dependencies, partitions, group, kinds, pool, retry policy, checks with their blocking flag), every
    job (its assets, executor, partitions, tags), every sensor and schedule."""
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys()):
        definition = defs.resolve_assets_def(key)
        node = graph.get(key)
        ops = list(definition.node_def.iterate_op_defs()) if definition.is_executable else []
        retry = ops[0].retry_policy if len(ops) == 1 else None
        assets[key.to_user_string()] = {
            "deps": sorted(parent.to_user_string() for parent in node.parent_keys),
            "partitions": str(node.partitions_def) if node.partitions_def else None,
            "group": node.group_name, "kinds": sorted(node.kinds), "materializable": node.is_materializable,
            "retries": retry.max_retries if retry else 0,
            # A graph-backed asset's ops (a fan-out) each by its pool.
            "pool": ops[0].pool if len(ops) == 1 else {op.name: op.pool for op in ops} or None,
            "automation": str(node.automation_condition) if node.automation_condition else None,
            "checks": {check.name: {"blocking": graph.get_check_spec(check).blocking} for check in
                       sorted(node.check_keys, key=lambda check: check.name)},
        }
    jobs = {job.name: {"assets": sorted(key.to_user_string() for key in job.asset_layer.executable_asset_keys),
                       "executor": job.executor_def.name,
                       "partitions": str(job.partitions_def) if job.partitions_def else None,
                       "tags": dict(job.tags)}
            for job in sorted(defs.resolve_all_job_defs(), key=lambda job: job.name) if not job.name.startswith("__")}
    sensors = {sensor.name: {"job": sensor.job_name if sensor.has_jobs else None,
                             "default_status": sensor.default_status.value,
                             "minimum_interval_s": sensor.minimum_interval_seconds} for sensor in defs.sensors}
    schedules = {schedule.name: {"job": schedule.job_name, "cron": schedule.cron_schedule}
                 for schedule in defs.schedules or []}
    return {"assets": assets, "jobs": jobs, "sensors": sensors, "schedules": schedules}


def test_the_definitions_match_their_reviewed_snapshot():
    """Regenerate after an intended change: python tests/test_pipeline_definitions.py."""
    assert definitions_snapshot() == json.loads(SNAPSHOT.read_text())


def test_iteration_assets_are_partitioned_by_experiment_and_iteration():
    graph = defs.resolve_asset_graph()
    for key in ITERATION_ASSETS:
        assert graph.get(AssetKey(key)).partitions_def == iterations
    assert graph.get(AssetKey("base_policy")).partitions_def == experiments  # one base policy per experiment
    # The reward analytics' blocking checks stand between the trajectories and the training step, and
    # the wait for checkpoint N-1 (outside the training pool) right before it.
    assert graph.get(AssetKey("checkpoint")).parent_keys == {AssetKey("trajectories"), AssetKey("iteration_rewards"),
                                                             AssetKey("parent_checkpoint")}
    assert graph.get(AssetKey("parent_checkpoint")).parent_keys == {AssetKey("iteration_rewards")}
    checks = graph.get(AssetKey("iteration_rewards")).check_keys
    assert {key.name for key in checks if graph.get_check_spec(key).blocking} == {
        "infra_errors_within_limit", "env_errors_within_limit", "tampering_within_limit"}
    assert graph.get(AssetKey("rollouts")).parent_keys == {AssetKey("task_set"), AssetKey("base_policy")}


def test_the_datasets_written_beside_assets_are_declared_downstream_of_their_writers():
    """Problem 8 of issue 16: four datasets were side effects that Dagster's lineage never showed."""
    graph = defs.resolve_asset_graph()
    for dataset in SHOWN:
        node = graph.get(AssetKey(["datasets", dataset]))
        assert node.parent_keys == {AssetKey(WRITTEN_BY[dataset])} and node.partitions_def == iterations


def test_every_launch_runs_in_one_process():
    """Problem 8 of issue 16: launches from the asset graph ran a process per step."""
    assert {job.executor_def.name for job in defs.resolve_all_job_defs()} == {"in_process"}


def test_iteration_keys_round_trip():
    key = iteration_key("default", 3)
    assert key == "default|0003" and key.keys_by_dimension == {"experiment": "default", "iteration": "0003"}
    assert parse_iteration_key(key) == ("default", 3)
    assert parse_iteration_key("my-exp|0012") == ("my-exp", 12)
    for malformed in ("default", "tinyc-7", "tinyc|7", "a|b|0001"):
        with pytest.raises(ValueError, match="'<experiment>|<iteration>'"):
            parse_iteration_key(malformed)


def test_the_experiment_of_a_run_comes_from_its_partition_tags():
    assert experiment_of_run({"dagster/partition": "exp|0002", "dagster/partition/experiment": "exp",
                              "dagster/partition/iteration": "0002"}) == "exp"
    assert experiment_of_run({"dagster/partition": "exp"}) == "exp"  # a base policy's run
    assert experiment_of_run({}) is None  # the analytics


@pytest.fixture
def instance(tmp_path):
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def crucible(tmp_path):
    resource = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    resource.save_experiment(ExperimentConfig(name="exp", iterations=2, continuous=True))
    return resource


def _evaluate(instance, crucible):
    with build_sensor_context(instance=instance, resources={"crucible": crucible}) as context:
        return advance_iterations(context)


def _evaluated(instance, *keys: str) -> None:
    for key in keys:
        instance.report_runless_asset_event(AssetMaterialization("checkpoint_eval", partition=key))


def test_sensor_starts_the_next_iteration_once_the_last_is_evaluated(instance, crucible):
    _evaluated(instance, "exp|0001")
    result = _evaluate(instance, crucible)
    assert [request.partition_key for request in result.run_requests] == ["exp|0002"]
    assert [request.run_key for request in result.run_requests] == ["exp|0002"]
    added = {request.partitions_def_name: request.partition_keys for request in result.dynamic_partitions_requests}
    assert added == {"experiments": ["exp"], "iteration_numbers": ["0002"]}


def test_sensor_starts_an_experiment_only_once_its_base_policy_exists(instance, crucible):
    assert "exp: it has no base policy yet" in _evaluate(instance, crucible).skip_message
    instance.report_runless_asset_event(AssetMaterialization("base_policy", partition="exp"))
    assert [request.partition_key for request in _evaluate(instance, crucible).run_requests] == ["exp|0001"]


def test_sensor_continues_only_the_experiments_switched_on(instance, crucible):
    """Problem 6 of issue 16: switching the sensor on launched every experiment, abandoned ones too."""
    crucible.save_experiment(ExperimentConfig(name="abandoned", iterations=9))
    _evaluated(instance, "exp|0001", "abandoned|0001")
    result = _evaluate(instance, crucible)
    assert [request.partition_key for request in result.run_requests] == ["exp|0002"]
    crucible.save_experiment(ExperimentConfig(name="exp", iterations=2, continuous=False))
    assert "abandoned: continuous training is off" in _evaluate(instance, crucible).skip_message


def test_sensor_never_launches_an_experiment_with_a_run_in_flight(instance, crucible):
    """An iteration launched by hand is not launched again behind it."""
    _evaluated(instance, "exp|0001")
    instance.add_run(DagsterRun(job_name="iteration", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition/experiment": "exp", "dagster/partition": "exp|0002"}))
    assert "exp: a run of it is queued or in progress" in _evaluate(instance, crucible).skip_message


def _under_way(instance, key: str, status=DagsterRunStatus.STARTED) -> None:
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("pipelines.definitions"),
                                                    "__repository__"), "iteration")  # a queued run needs one
    experiment, number = key.split("|")
    instance.add_run(DagsterRun(job_name="iteration", status=status, remote_job_origin=origin, tags={
        "dagster/partition/experiment": experiment, "dagster/partition/iteration": number, "dagster/partition": key}))


def test_sensor_keeps_max_staleness_plus_one_iterations_of_an_experiment_in_flight(instance, crucible):
    """With max_staleness 1, iteration 3 starts beside 2 (which samples 1's checkpoint, or the base
    policy's), and 4 waits until fewer than two are queued or under way."""
    crucible.save_experiment(ExperimentConfig(name="exp", iterations=5, continuous=True, max_staleness=1))
    _evaluated(instance, "exp|0001")
    _under_way(instance, "exp|0002")
    assert [request.partition_key for request in _evaluate(instance, crucible).run_requests] == ["exp|0003"]
    _under_way(instance, "exp|0003", DagsterRunStatus.QUEUED)
    assert "exp: 2 runs of it are queued or in progress, max_staleness 1 + 1" in _evaluate(
        instance, crucible).skip_message


def test_sensor_holds_an_experiment_whose_iteration_failed_while_a_later_one_runs(instance, crucible):
    """With max_staleness 1, iteration 3 may fail while 4 is under way: 5 would train on what 3 did
    not make, so nothing more starts until 3 is launched again by hand."""
    crucible.save_experiment(ExperimentConfig(name="exp", iterations=9, continuous=True, max_staleness=1))
    _evaluated(instance, "exp|0001", "exp|0002")
    _under_way(instance, "exp|0003", DagsterRunStatus.FAILURE)
    _under_way(instance, "exp|0004")
    assert "exp: the last run of exp|0003 failed" in _evaluate(instance, crucible).skip_message


def test_sensor_starts_no_iteration_beyond_the_limit_counting_those_in_flight(instance, crucible):
    crucible.save_experiment(ExperimentConfig(name="exp", iterations=2, continuous=True, max_staleness=1))
    _evaluated(instance, "exp|0001")
    _under_way(instance, "exp|0002")
    assert "exp: reached its limit of 2 iterations" in _evaluate(instance, crucible).skip_message


@pytest.mark.parametrize("max_staleness, others, refusal", [
    (0, [2], r"\(iteration, exp\|0002\): launch"), (1, [2], None), (1, [4], None),
    (1, [2, 4], r"\(iteration, exp\|000[24]\) and 1 more, beyond the 1 max_staleness allows beside it"),
    (1, [3], r"\(iteration, exp\|0003\), the same iteration"),
    (1, [1], r"\(iteration, exp\|0001\), more than max_staleness 1 iterations from 3")])
def test_iteration_3_runs_beside_at_most_max_staleness_others_of_its_experiment_each_within_it(
        instance, max_staleness, others, refusal):
    for number in others:
        _under_way(instance, f"exp|{number:04d}")
    if refusal is None:
        refuse_beside_other_writers(instance, "mine", "exp", 3, max_staleness)
        return
    with pytest.raises(Failure, match=r"experiment 'exp' is being written by run \S+ " + refusal):
        refuse_beside_other_writers(instance, "mine", "exp", 3, max_staleness)


def test_an_iteration_never_runs_beside_its_experiments_base_policy_run(instance):
    instance.add_run(DagsterRun(job_name="base_policy_job", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition": "exp"}))
    with pytest.raises(Failure, match=r"being written by run \S+ \(base_policy_job, exp\)"):
        refuse_beside_other_writers(instance, "mine", "exp", 2, max_staleness=3)


def test_sampling_an_older_checkpoint_is_refused_unless_a_run_is_making_the_parent(instance):
    """max_staleness lets iteration 3 sample checkpoint 1 while 2 trains; with no run making 2,
    it would sample and grade, then be refused at its training step."""
    older = SamplingPolicy(1, (Path("ckpt/1"), "1" * 64))
    with pytest.raises(Failure, match="iteration 3 trains from checkpoint 2, which has not finished its training "
                                      "step, and no run of iteration 2 is queued or under way"):
        refuse_without_a_parent_on_the_way(instance, "exp", 3, older)
    instance.add_run(DagsterRun(job_name="iteration", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition/experiment": "exp", "dagster/partition": "exp|0002"}))
    refuse_without_a_parent_on_the_way(instance, "exp", 3, older)  # 2 is on its way
    refuse_without_a_parent_on_the_way(instance, "exp", 4, SamplingPolicy(3, (Path("ckpt/3"), "3" * 64)))


def test_sensor_stops_at_the_experiment_iteration_limit(instance, crucible):
    _evaluated(instance, "exp|0001", "exp|0002")
    assert "exp: reached its limit of 2 iterations" in _evaluate(instance, crucible).skip_message


def test_a_malformed_partition_key_is_skipped_and_the_sensor_still_advances(instance, crucible):
    _evaluated(instance, "exp|0001", "tinyc|7")  # the second added by hand
    result = _evaluate(instance, crucible)
    assert [request.partition_key for request in result.run_requests] == ["exp|0002"]


def test_the_periodic_evaluation_requests_each_continued_experiments_latest_checkpoint(tmp_path, crucible):
    instance = DagsterInstance.local_temp(str(tmp_path))  # schedules need a persistent one
    crucible.save_experiment(ExperimentConfig(name="paused", iterations=5))  # not continued
    for key in ("exp|0001", "exp|0002", "paused|0001"):
        instance.report_runless_asset_event(AssetMaterialization("checkpoint", partition=key))
    with build_schedule_context(instance=instance, resources={"crucible": crucible},
                                scheduled_execution_time=datetime(2026, 12, 1, 6, tzinfo=timezone.utc)) as context:
        requests = evaluate_latest_checkpoints(context)
    assert [(request.partition_key, request.run_key) for request in requests] == [
        ("exp|0002", "exp|0002@2026-12-01T06:00:00+00:00")]
    assert {s.name: s.default_status.value for s in defs.schedules} == {"evaluate_latest_checkpoints": "STOPPED"}


@pytest.mark.filterwarnings("ignore:Parameter `include_sources`")  # inside Dagster's own evaluation helper
def test_reward_analytics_is_refreshed_once_an_iteration_is_evaluated(instance):
    """Problem 8 of issue 16: reward_analytics refreshed only at the end of `crucible run`."""
    add_iteration(instance, "exp", 1)
    first = evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.total_requested == 0  # nothing new
    instance.report_runless_asset_event(AssetMaterialization("checkpoint_eval", partition="exp|0001"))
    after = evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert after.get_requested_partitions(AssetKey("reward_analytics")) == {None}
    assert {sensor.name: sensor.default_status.value for sensor in defs.sensors}["keep_analytics_current"] == "RUNNING"


def test_settings_made_in_one_folder_hold_in_a_process_started_in_another(tmp_path, monkeypatch):
    """`crucible ui` and `crucible run` start Dagster's processes from the project folder with
    their settings as variables (problem 7 of issue 16: the UI showed one folder's runs and wrote
    another folder's data)."""
    for name in ("CRUCIBLE_STORAGE_ROOT", "CRUCIBLE_CHECKPOINT_ROOT", "CRUCIBLE_TASK_SETS"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    variables = load_settings().environment()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.storage_root == str(tmp_path / ".crucible" / "data")
    assert settings.checkpoint_root == str(tmp_path / ".crucible" / "checkpoints")
    assert crucible_resource(settings).storage_root == str(tmp_path / ".crucible" / "data")
    assert settings.task_sets == str(tmp_path / ".crucible" / "task_sets")


def test_a_base_policy_is_not_rebuilt_while_an_iteration_of_its_experiment_is_under_way(instance, crucible):
    """The queue's lanes keep an experiment's base-policy run and its iterations apart, but not a
    run executed outside the queue (`materialize()`): the base policy refuses, naming the run,
    before it writes anything."""
    from assets.policy import base_policy
    from assets.training_step import TrainingStepClient

    with run_under_way(instance, "an_iteration_under_way", add_iteration(instance, "exp", 1)):
        refusal = r"experiment 'exp' is being written by run \S+ \(__ephemeral_asset_job__, exp\|0001\)"
        with pytest.raises(Failure, match=refusal):
            materialize([base_policy], instance=instance, partition_key="exp",
                        resources={"crucible": crucible, "training_step": TrainingStepClient()})
    assert not Path(crucible.base_policy_dir("exp")).exists()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent.parent))
    SNAPSHOT.write_text(json.dumps(definitions_snapshot(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
