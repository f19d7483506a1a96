"""An iteration through the Docker run launcher, as a cluster runs it: `crucible run` queues it on a
Postgres instance, the daemon launches it in a container of the project image, the datasets go to
the S3 server (SeaweedFS), and the run's sandboxes are Docker containers beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from dagster import DagsterInstance, DagsterRunStatus, materialize
from dagster_docker import DockerRunLauncher

from assets.partitions import experiments
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from datastore.store import DatasetStore
from pipelines.docker_run_launcher import RUN_LABEL
from pipelines.instance import POSTGRES_URL_ENV, prepare_instance
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from training.experiment import BasePolicySettings, ExperimentConfig
from training.policy.checkpoint import verify_checkpoint

from conftest import fresh_database
from dagster_server import dagster_dev

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parent.parent
# The container, S3 and Docker-sandbox path is what is proven here, not volume or learning: no warm-up.
TINY_BASE = BasePolicySettings(hidden_size=64, num_layers=2, sft_steps=0)


def crucible_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True, text=True,
                          timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, project_image, s3_server, postgres_server):
    """The environment of every process here: the instance in Postgres, the data on S3, runs in
    containers of the project image."""
    workdir = tmp_path_factory.mktemp("launcher")
    with fresh_database(postgres_server) as url, pytest.MonkeyPatch.context() as patch:
        environment = {**os.environ, **s3_server.environment(), POSTGRES_URL_ENV: url,
                       "DAGSTER_HOME": str(workdir / "dagster"),
                       "CRUCIBLE_STORAGE_ROOT": f"s3://{s3_server.bucket}/launcher-{workdir.name}",
                       "CRUCIBLE_CHECKPOINT_ROOT": str(workdir / "checkpoints"),
                       "CRUCIBLE_TASK_SETS": str(workdir / "task_sets"),
                       "CRUCIBLE_RUN_LAUNCHER": "docker", "CRUCIBLE_RUN_IMAGE": project_image, "HF_HUB_OFFLINE": "1"}
        for name in ("DAGSTER_HOME", "CRUCIBLE_STORAGE_ROOT", "CRUCIBLE_CHECKPOINT_ROOT", "CRUCIBLE_TASK_SETS",
                     "CRUCIBLE_RUN_LAUNCHER", "CRUCIBLE_RUN_IMAGE", POSTGRES_URL_ENV, *s3_server.environment()):
            patch.setenv(name, environment[name])
        yield environment, workdir
        with DagsterInstance.get() as instance:  # only this instance's runs: the daemon may run others'
            ours = [run.run_id for run in instance.get_runs()]
    daemon = docker.from_env()
    for run_id in ours:
        for container in daemon.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
            container.remove(force=True)


@pytest.fixture(scope="module")
def launched(cluster):
    """A tiny experiment's base policy, made here, then its first iteration by `crucible run`."""
    environment, workdir = cluster
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:6], *compose.eval()[:3]], workdir / "task_sets" / "mini")
    prepare_instance()
    crucible = CrucibleResource(storage_root=environment["CRUCIBLE_STORAGE_ROOT"],
                                checkpoint_root=environment["CRUCIBLE_CHECKPOINT_ROOT"],
                                task_sets=environment["CRUCIBLE_TASK_SETS"])
    crucible.save_experiment(ExperimentConfig(
        name="boxed", task_set="mini", tasks_per_iteration=2, samples_per_task=2, max_new_tokens=24, eval_tasks=3,
        eval_samples=1, refill_rounds=0, base=TINY_BASE, max_turns=1))
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(experiments.name, ["boxed"])
        assert materialize([base_policy], partition_key="boxed", instance=instance,
                           resources={"crucible": crucible, "training_step": TrainingStepClient()}).success
    with dagster_dev(environment, workdir / "dagster-dev.log"):
        finished = crucible_cli(environment, "run", "--experiment", "boxed", "--iterations", "1")
    return finished, crucible


def _iteration_run(instance: DagsterInstance):
    [run] = [run for run in instance.get_runs() if run.tags.get("dagster/partition") == "boxed|0001"]
    return run


def test_crucible_run_queues_the_iteration_and_follows_it_to_its_end(launched):
    finished, _ = launched
    assert finished.returncode == 0, finished.stderr[-4000:]
    assert "queued as run" in finished.stderr
    assert "checkpoint: step success" in finished.stderr  # the steps' progress, read back from the event log
    assert "experiment 'boxed'" in finished.stdout


def test_the_iteration_ran_in_a_container_of_the_project_image(launched, cluster, project_image):
    with DagsterInstance.get() as instance:
        assert isinstance(instance.run_launcher, DockerRunLauncher)
        run = _iteration_run(instance)
    assert run.status == DagsterRunStatus.SUCCESS
    container = docker.from_env().containers.get(run.tags["docker/container_id"])
    assert container.image.tags == [project_image] and container.labels[RUN_LABEL] == run.run_id
    assert container.attrs["State"]["ExitCode"] == 0


def test_its_datasets_are_on_s3_and_its_checkpoint_where_the_host_keeps_them(launched, cluster):
    _, crucible = launched
    environment, workdir = cluster
    store = DatasetStore(environment["CRUCIBLE_STORAGE_ROOT"])
    trajectories = store.read_partition("trajectories", "boxed", 1)
    assert trajectories.num_rows >= 4
    # Its sandboxes were Docker containers on the host's daemon, reached through the mounted socket.
    assert set(trajectories["sandbox_backend"].to_pylist()) == {"docker"}
    manifest = verify_checkpoint(workdir / "checkpoints" / "experiment=boxed" / "iteration=1")
    assert manifest["lineage"]["trajectories"] == store.partition_files("trajectories", "boxed", 1)
    assert store.read_partition("evaluations", "boxed", 1).num_rows > 0
