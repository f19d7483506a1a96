"""The run queue's lanes (pipelines/run_lanes.py): k+1 iterations of an experiment with
max_staleness k at once, one with k = 0 (and its base policy) one at a time."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.run_coordinator import SubmitRunContext
from dagster._core.utils import make_new_run_id

from assets.resources import CrucibleResource
from pipelines.run_lanes import LANE_TAG, lane
from training.experiment import ExperimentConfig

pytestmark = pytest.mark.unit
ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("pipelines.definitions"), "__repository__"),
                         "iteration")  # where a queued run's job is: the queue needs one


def _iteration(experiment: str, number: int) -> dict[str, str]:
    return {"dagster/partition/experiment": experiment, "dagster/partition/iteration": f"{number:04d}",
            "dagster/partition": f"{experiment}|{number:04d}"}


@pytest.mark.parametrize("number, expected", [(1, "fast/1"), (2, "fast/2"), (3, "fast/0"), (4, "fast/1")])
def test_an_experiment_with_max_staleness_k_has_k_plus_1_lanes_taken_in_turn(number, expected):
    assert lane(_iteration("fast", number), {"fast": 2}.__getitem__) == expected


@pytest.mark.parametrize("tags", [_iteration("serial", 1), _iteration("serial", 2), {"dagster/partition": "serial"}],
                         ids=["iteration 1", "iteration 2", "the base policy"])
def test_an_experiment_with_max_staleness_0_runs_in_one_lane_with_its_base_policy(tags):
    assert lane(tags, {"serial": 0}.__getitem__) == "serial/0"


def test_a_run_of_no_experiment_has_no_lane():
    assert lane({}, {}.__getitem__) is None


def test_a_queued_run_is_tagged_with_its_lane_from_the_experiments_stored_settings(tmp_path, monkeypatch):
    storage = tmp_path / "data"
    monkeypatch.setenv("CRUCIBLE_STORAGE_ROOT", str(storage))
    CrucibleResource(storage_root=str(storage), checkpoint_root=str(tmp_path / "ckpt")).save_experiment(
        ExperimentConfig(name="fast", max_staleness=1))
    overrides = {"run_coordinator": {"module": "pipelines.run_lanes", "class": "IterationLanes"}}
    launches = {"fast|0002": _iteration("fast", 2), "fast|0003": _iteration("fast", 3),
                "new|0001": _iteration("new", 1), "fast|0004 by hand": {**_iteration("fast", 4), LANE_TAG: "mine"},
                "analytics": {}}
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster"), overrides=overrides) as instance:
        lanes = {}
        for name, tags in launches.items():
            run = instance.add_run(DagsterRun(job_name="iteration", run_id=make_new_run_id(), tags=tags,
                                              remote_job_origin=ORIGIN))
            queued = instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
            assert queued.status == DagsterRunStatus.QUEUED
            lanes[name] = instance.get_run_by_id(run.run_id).tags.get(LANE_TAG)
    assert lanes == {"fast|0002": "fast/0", "fast|0003": "fast/1", "new|0001": "new/0", "fast|0004 by hand": "mine",
                     "analytics": None}


def test_a_run_whose_experiment_settings_cannot_be_read_fails_in_one_sentence_unqueued(tmp_path, monkeypatch):
    storage = tmp_path / "data"
    monkeypatch.setenv("CRUCIBLE_STORAGE_ROOT", str(storage))
    (storage / "experiments").mkdir(parents=True)
    (storage / "experiments" / "broken.json").write_text("{not json")
    (tmp_path / "dagster").mkdir()
    overrides = {"run_coordinator": {"module": "pipelines.run_lanes", "class": "IterationLanes"}}
    with DagsterInstance.local_temp(str(tmp_path / "dagster"), overrides=overrides) as instance:
        run = instance.add_run(DagsterRun(job_name="iteration", run_id=make_new_run_id(), tags=_iteration("broken", 1),
                                          remote_job_origin=ORIGIN))
        failed = instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
        assert failed.status == DagsterRunStatus.FAILURE and LANE_TAG not in failed.tags
        messages = [entry.message for entry in instance.all_logs(run.run_id)]
    assert any("the settings of experiment 'broken' could not be read to choose its lane" in m for m in messages)
