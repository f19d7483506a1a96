"""The wait of iteration N for checkpoint N-1 made beside it (assets/parent_wait.py): it ends when
the run making N-1 has trained it, not on a record an earlier run left, and is refused rather than
waiting for what no run will make, or for a run the queue has no room to start."""

from __future__ import annotations

import threading

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Failure
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from held_runs import run_under_way
from patience import PATIENCE_S

from assets.parent_wait import wait_for_parent
from assets.partitions import add_iteration, runs_making
from assets.resources import CrucibleResource
from assets.step_outputs import WILL_RETRY_TAG
from datastore.schema import DATASETS
from datastore.store import rows_to_table
from training.iteration.lineage import Checkpoints

ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("pipelines.definitions"), "__repository__"),
                         "iteration")  # a queued run needs one
FAST = dict(poll_s=0.05, queued_patience_s=PATIENCE_S)


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def checkpoints(tmp_path) -> Checkpoints:
    return Checkpoints(CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt")),
                       "exp")


def _recorded(checkpoints: Checkpoints, iteration: int) -> None:
    row = {**{field.name: None for field in DATASETS["checkpoints"]}, "path": f"ckpt/{iteration}"}
    checkpoints.env.store().write_partition("checkpoints", "exp", iteration, rows_to_table("checkpoints", [row]))


def _run_of(instance, iteration: int, status: DagsterRunStatus, **tags: str) -> DagsterRun:
    return instance.add_run(DagsterRun(job_name="iteration", status=status, remote_job_origin=ORIGIN, tags={
        "dagster/partition/experiment": "exp", "dagster/partition/iteration": f"{iteration:04d}",
        "dagster/partition": f"exp|{iteration:04d}", **tags}))


def test_the_first_iteration_waits_for_nothing(instance, checkpoints):
    assert wait_for_parent(instance, checkpoints, 1, **FAST) == pytest.approx(0.0, abs=0.5)


def test_a_parent_on_record_with_no_run_making_it_is_taken_at_once(instance, checkpoints):
    _recorded(checkpoints, 1)
    assert wait_for_parent(instance, checkpoints, 2, **FAST) < PATIENCE_S


def test_a_parent_without_a_record_or_a_run_making_it_is_refused(instance, checkpoints):
    with pytest.raises(Failure, match="iteration 2 trains from checkpoint 1, which has no training step on record, "
                                      "and no run of iteration 1 is queued or under way"):
        wait_for_parent(instance, checkpoints, 2, **FAST)


def test_a_parent_being_made_again_is_waited_for_though_an_earlier_run_left_its_record(instance, checkpoints):
    _recorded(checkpoints, 1)  # the first run of iteration 1; a second is training it again now
    with run_under_way(instance, "checkpoint", add_iteration(instance, "exp", 1)):
        waiting = threading.Thread(target=wait_for_parent, args=(instance, checkpoints, 2), kwargs=FAST)
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive()  # the record there is the replaced checkpoint's
    waiting.join(timeout=PATIENCE_S)  # the run has materialized its checkpoint
    assert not waiting.is_alive()


def test_a_parent_whose_run_stays_queued_is_refused_rather_than_holding_a_slot(instance, checkpoints):
    _run_of(instance, 1, DagsterRunStatus.QUEUED)
    with pytest.raises(Failure, match=r"iteration 2 has waited \d+ s for iteration 1, whose run \S+ is still queued"):
        wait_for_parent(instance, checkpoints, 2, poll_s=0.05, queued_patience_s=0.2)


def test_a_failed_run_that_dagster_will_retry_is_still_making_its_iteration(instance):
    retried = _run_of(instance, 1, DagsterRunStatus.FAILURE, **{WILL_RETRY_TAG: "true"})
    _run_of(instance, 2, DagsterRunStatus.FAILURE, **{WILL_RETRY_TAG: "false"})
    assert [run.run_id for run in runs_making(instance, "exp", 1)] == [retried.run_id]
    assert runs_making(instance, "exp", 2) == []
