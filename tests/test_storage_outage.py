"""An S3 storage root that stops answering mid-step (SeaweedFS stopped, then started again on its
data): the store says so in one sentence naming the root, a step asks again within its run and
goes on once the server is back, and one that outlasts the retries fails with that sentence
(assets/failure_policy.py). Nothing published before the outage is lost."""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import ClientError
from dagster import DagsterEventType, DagsterInstance, asset, materialize
from s3fs import S3FileSystem

import assets.failure_policy as policy
from assets.failure_policy import failure_policy
from datastore.seaweedfs import seaweedfs
from datastore.store import DatasetStore, StorageUnreachable, rows_to_table
from pipelines.logging import shown
from pipelines.run_failures import run_failures

ROW = {"stage": "rollouts", "seconds": 1.5, "started_at": None}


class Outage:
    """A store with one partition written, on a SeaweedFS server that is then stopped;
    `restart()` brings it back on the same data, serving until the test ends."""

    def __init__(self, directory, monkeypatch):
        S3FileSystem.clear_instance_cache()  # fsspec keeps a filesystem per arguments, not per endpoint
        self.directory, self.serving, self.stop = directory, threading.Event(), threading.Event()
        with seaweedfs(directory) as server:
            for key, value in server.environment().items():
                monkeypatch.setenv(key, value)
            monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries: seconds per call the tests need not wait
            self.store = DatasetStore(f"s3://{server.bucket}/crucible")
            self.file = self.store.write_partition("stages", "e", 1, rows_to_table("stages", [ROW]), part="rollouts")
        self.server = threading.Thread(target=self._serve)

    def _serve(self):
        with seaweedfs(self.directory):
            self.serving.set()
            self.stop.wait()

    def restart(self):
        self.server.start()
        assert self.serving.wait(60), "SeaweedFS did not start again"


@pytest.fixture
def outage(tmp_path, monkeypatch):
    down = Outage(tmp_path / "s3", monkeypatch)
    yield down
    down.stop.set()
    if down.server.is_alive():
        down.server.join()
    # fsspec keys its filesystems by their arguments, not the environment: one made here would
    # answer a later test's `s3://` with this stopped server's endpoint.
    S3FileSystem.clear_instance_cache()


def stored_stage(store: DatasetStore) -> float:
    return store.read_partition("stages", "e", 1, part="rollouts")["seconds"][0].as_py()


def test_a_store_whose_server_does_not_answer_names_the_root_in_one_sentence(outage):
    S3FileSystem.clear_instance_cache()  # nothing cached: every call asks the server
    store = DatasetStore(outage.store.uri)
    for call in (lambda: stored_stage(store), lambda: store.published("stages"),
                 lambda: store.read_files("stages", [outage.file]),  # through pyarrow's bridge to fsspec
                 lambda: store.write_partition("stages", "e", 2, rows_to_table("stages", [ROW]), part="rollouts"),
                 store.check):
        with pytest.raises(StorageUnreachable) as raised:
            call()
        assert str(raised.value).startswith(f"storage {store.uri} did not answer: EndpointConnectionError: ")
        assert raised.value.__cause__ is None and "\n" not in str(raised.value)


@pytest.mark.unit
def test_a_server_error_reply_is_an_outage_and_a_refusal_is_not():
    """s3fs turns botocore's reply into an OSError that keeps only its message; the reply is below it."""
    store = DatasetStore("s3://crucible/data")

    def replied(status: int, code: str) -> OSError:
        try:
            raise ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                              "GetObject")
        except ClientError as reply:
            try:
                raise OSError(121, "m") from reply
            except OSError as translated:
                return translated

    told = store._unusable(replied(500, "InternalError"))
    assert isinstance(told, StorageUnreachable)
    assert str(told) == ("storage s3://crucible/data answered with a server error: ClientError: An error occurred "
                         "(InternalError) when calling the GetObject operation: m")
    assert not isinstance(store._unusable(replied(403, "AccessDenied")), StorageUnreachable)


def test_a_step_that_meets_an_outage_goes_on_once_the_server_is_back(outage, monkeypatch):
    monkeypatch.setattr(policy, "STORAGE_RETRY_WAIT_S", 10)

    @asset
    def reads_the_store() -> float:
        with failure_policy(outage.store):
            return stored_stage(outage.store)

    with DagsterInstance.ephemeral() as instance:
        def restart_on_the_first_retry():
            while not any(instance.get_records_for_run(run.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY).records
                          for run in instance.get_runs()):
                time.sleep(0.2)
            outage.restart()

        threading.Thread(target=restart_on_the_first_retry, daemon=True).start()
        result = materialize([reads_the_store], instance=instance)
        assert result.success and result.output_for_node("reads_the_store") == 1.5
        retries = [shown(entry) for entry in instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY)]
    told = retries[0].split(" ", 1)[1]  # as `crucible run` shows it, after the time of day
    assert told.startswith(f"reads_the_store: storage {outage.store.uri} did not answer: ")
    assert told.endswith("resumes the experiment where it stopped; retried in 10 s")


def test_an_error_of_its_own_while_the_root_does_not_answer_is_the_outage(outage, monkeypatch):
    """What DuckDB or a client library raises says nothing of S3; the step asks the root."""
    monkeypatch.setattr(policy, "STORAGE_RETRIES", 1)
    monkeypatch.setattr(policy, "STORAGE_RETRY_WAIT_S", 0)

    @asset
    def queries_the_store() -> None:
        with failure_policy(outage.store):
            raise RuntimeError("IO Error: an error of the reader's own words")

    with DagsterInstance.ephemeral() as instance:
        result = materialize([queries_the_store], instance=instance, raise_on_error=False)
        assert not result.success
        [told] = run_failures(instance, result.run_id)
    assert told.startswith(f"storage {outage.store.uri} did not answer: EndpointConnectionError: Could not connect")
    assert told.endswith("(a step asks again up to 1 times, 0 s apart, before it fails): once it answers, "
                         "`crucible run` resumes the experiment where it stopped (the step met RuntimeError: IO Error: "
                         "an error of the reader's own words)")
    outage.restart()
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")  # a restarted server answers 500 until its volumes are up: retried
    S3FileSystem.clear_instance_cache()
    assert stored_stage(DatasetStore(outage.store.uri)) == 1.5  # published before the outage, there after it


def test_an_error_while_the_root_answers_is_the_steps_own_and_not_retried(tmp_path):
    @asset
    def queries_the_store() -> None:
        with failure_policy(DatasetStore(str(tmp_path))):
            raise RuntimeError("a bug")

    with DagsterInstance.ephemeral() as instance:
        result = materialize([queries_the_store], instance=instance, raise_on_error=False)
        assert run_failures(instance, result.run_id) == ["RuntimeError: a bug"]
        assert not instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY)
