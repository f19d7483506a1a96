"""training/policy/writer_lock.py: one writer of an experiment's checkpoints at a time, across
processes (problem 2 of issue 16: `crucible run` and a UI run wrote the same checkpoint folder)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, materialize
from dagster._core.storage.tags import MAX_RETRIES_TAG

from assets.iteration import task_set
from assets.partitions import add_iteration
from assets.resources import CrucibleResource
from pipelines.experiment_runner import innermost, run_failures
from pipelines.instance import POSTGRES_URL_ENV, prepare_instance
from training.experiment import ExperimentConfig
from training.policy.writer_lock import ExperimentBusy, writer_lock

HOLD = """
import sys, time
from training.policy.writer_lock import writer_lock
with writer_lock(sys.argv[1], "the other writer", **{mode: True for mode in sys.argv[3:]}):  # lends, shared
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    print("releasing", flush=True)
"""


def hold_in_another_process(folder: Path, seconds: float, *modes: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds), *modes],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_process_is_refused_with_the_holder_named(tmp_path):
    holder = hold_in_another_process(tmp_path, 30)
    try:
        with pytest.raises(ExperimentBusy, match=rf"the other writer \(pid {holder.pid} on .*, since "):
            with writer_lock(tmp_path, "me"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(tmp_path, "me"):  # a killed holder's lock is released by the kernel
        pass


@pytest.mark.parametrize("lends, purpose, shared", [
    (True, "the other writer", False),  # the same purpose, not asking for a share (a second `crucible run`)
    (True, "another run", True),  # a share of another run's hold
    (False, "the other writer", True),  # a share of a sibling step's hold, which is not lent
])
def test_only_a_share_of_a_lent_hold_for_the_same_purpose_goes_on_under_it(tmp_path, lends, purpose, shared):
    holder = hold_in_another_process(tmp_path, 30, *["lends"] * lends)
    try:
        if lends:
            with writer_lock(tmp_path, "the other writer", shared=True):  # a step of the holder's run
                pass
        with pytest.raises(ExperimentBusy):
            with writer_lock(tmp_path, purpose, shared=shared):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_step_that_outlives_its_lending_run_keeps_the_next_writer_out_until_it_ends(tmp_path):
    lender = hold_in_another_process(tmp_path, 60, "lends")
    step = hold_in_another_process(tmp_path, 60, "shared")
    lender.kill()  # the run's process dies; its step, not its child, goes on
    lender.wait()
    try:
        with pytest.raises(ExperimentBusy, match=rf"the steps of the other writer \(pid {lender.pid} .*\), which go on"):
            with writer_lock(tmp_path, "the next run", lends=True):
                pass
        with pytest.raises(ExperimentBusy, match=rf"the steps of the other writer \(pid {lender.pid} "):
            with writer_lock(tmp_path, "the next run"):  # still told of the same holder
                pass
    finally:
        step.kill()
        step.wait()
    with writer_lock(tmp_path, "the next run"):
        pass


def test_a_waiting_writer_is_told_who_holds_the_lock_and_goes_on_once_released(tmp_path):
    holder = hold_in_another_process(tmp_path, 1.5)
    told = []
    with writer_lock(tmp_path, "me", wait=told.append):
        # it only got the lock once the holder was done with it
        assert select.select([holder.stdout], [], [], 0)[0] and holder.stdout.readline().strip() == "releasing"
    holder.wait()
    assert len(told) == 1 and "the other writer" in told[0]


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    with writer_lock(tmp_path, "outer"), writer_lock(tmp_path, "inner"):
        holder = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path), "0"], capture_output=True, text=True,
                                cwd=Path(__file__).parent.parent, timeout=60)
        assert "ExperimentBusy" in holder.stderr and "outer" in holder.stderr
    with writer_lock(tmp_path, "again"):  # fully released after the outer exit
        pass


def test_a_dagster_run_of_a_busy_experiment_fails_with_one_sentence(tmp_path):
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    crucible.save_experiment(ExperimentConfig(name="exp"))
    holder = hold_in_another_process(crucible.experiment_dir("exp"), 60)
    try:
        with DagsterInstance.ephemeral() as instance:
            key = add_iteration(instance, "exp", 1)
            result = materialize([task_set], partition_key=key, instance=instance, resources={"crucible": crucible},
                                 raise_on_error=False)
        assert not result.success
        [failure] = [event for event in result.all_events if event.is_failure]
        message = innermost(failure.event_specific_data.error).message
        assert "experiment 'exp' is being written by the other writer" in message
        assert "launch it again once that one has finished" in message
    finally:
        holder.kill()
        holder.wait()


def test_a_run_with_a_process_per_step_of_a_busy_experiment_fails_before_any_step_and_is_not_retried(
        tmp_path, monkeypatch):
    environment = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STEP_PROCESSES": "2",
                   "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"), "CRUCIBLE_CHECKPOINT_ROOT": str(tmp_path / "ckpt")}
    environment.pop(POSTGRES_URL_ENV, None)
    monkeypatch.setenv("DAGSTER_HOME", environment["DAGSTER_HOME"])
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    prepare_instance()  # run retries on, as every Crucible instance has them
    crucible = CrucibleResource(storage_root=environment["CRUCIBLE_STORAGE_ROOT"],
                                checkpoint_root=environment["CRUCIBLE_CHECKPOINT_ROOT"])
    crucible.save_experiment(ExperimentConfig(name="exp"))
    with DagsterInstance.get() as instance:
        add_iteration(instance, "exp", 1)
    holder = hold_in_another_process(crucible.experiment_dir("exp"), 120)
    try:
        done = subprocess.run([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "pipelines.definitions",
                               "--select", "task_set", "--partition", "exp|0001"], cwd=Path(__file__).parent.parent,
                              env=environment, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0
    with DagsterInstance.get() as instance:
        [run] = instance.get_runs()
        assert not instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)
        assert run.tags[MAX_RETRIES_TAG] == "0"
        [why] = run_failures(instance, run.run_id)
    assert why.startswith("experiment 'exp' is being written by the other writer (pid ")
