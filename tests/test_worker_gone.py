"""How `crucible run` tells that a started run's worker is gone (pipelines/run_submission.py's
worker_gone): only for a run a command's code server on this machine launched, whose socket no
longer answers; then by its worker's process, which a restart of the machine ends too, even when
the restart emptied the temporary folder the socket was in. (Killed for real: tests/test_faults.py.)"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import psutil
import pytest
from dagster import DagsterEventType, DagsterInstance, asset, materialize

from pipelines import run_submission
from pipelines.local_daemon import GRPC_INFO_TAG, MACHINE
from pipelines.run_submission import worker_gone


@asset
def one() -> int:
    return 1


@pytest.fixture
def started_run():
    """A run that started in this process (its worker pid is ours, alive), with its instance."""
    with DagsterInstance.ephemeral() as instance:
        run_id = materialize([one], instance=instance).run_id
        [start] = instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_START).records
        yield instance, instance.get_run_by_id(run_id), start.event_log_entry.timestamp


def launched_from(run, folder: str | Path):
    """The run as if the code server on `folder`/code.sock had launched it (in /tmp: a socket gone)."""
    return run.with_tags({**run.tags, GRPC_INFO_TAG: json.dumps({"socket": f"{Path('/tmp', folder)}/code.sock"})})


def test_a_run_whose_worker_lives_is_not_gone_though_its_code_server_is(started_run, tmp_path):
    instance, run, _ = started_run
    folder = tmp_path / f"crucible-{MACHINE}-abc123"
    folder.mkdir()
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(folder / "code.sock"))  # a killed code server's socket file: nothing listens
    assert worker_gone(instance, launched_from(run, folder)) is None
    assert worker_gone(instance, launched_from(run, f"crucible-{MACHINE}-gone12")) is None  # not here: not ours


def test_a_run_another_machine_launched_is_never_judged_here(started_run, monkeypatch):
    instance, run, started_at = started_run
    other = "0" * 8 if MACHINE != "0" * 8 else "1" * 8
    monkeypatch.setattr(psutil, "boot_time", lambda: started_at + 60)
    assert worker_gone(instance, launched_from(run, f"crucible-{other}-abc123")) is None
    assert worker_gone(instance, launched_from(run, "dagster-dev-abc123")) is None  # not a command's code server


def test_a_run_started_before_the_machine_restarted_is_gone_though_its_pid_is_taken(started_run, monkeypatch):
    instance, run, started_at = started_run
    # A restart cannot happen in a test: the machine's boot time moves past the run's start instead.
    monkeypatch.setattr(run_submission.psutil, "boot_time", lambda: started_at + 60)
    socket = f"/tmp/crucible-{MACHINE}-abc123/code.sock"
    assert worker_gone(instance, launched_from(run, f"crucible-{MACHINE}-abc123")) == (
        f"its worker (pid {psutil.Process().pid}) and the code server that started it ({socket}) are gone: "
        "the machine restarted")
