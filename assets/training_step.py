"""Where the training jobs run (the `checkpoint` asset's training step and the `base_policy`
asset's warm-up: assets/train_process.py): the Dagster Pipes client, chosen by a setting.

- `subprocess` (default): a process on this machine, under the crucible resource's launcher
  (this Python, or e.g. `torchrun --standalone --nproc-per-node 8`), which dies with its run.
- `docker`: a container of the project image (`scripts/build-project-image`) on the Docker
  daemon of DOCKER_HOST, through Dagster's PipesDockerClient. The checkpoint root, and the
  storage root where it is a local directory, are mounted at the same paths, so the training job
  names the same files inside as outside; the container shares the host's network (an S3
  endpoint on loopback included) and runs as this process's user, so checkpoints stay its own.
  `gpus` asks the daemon for that many GPUs (-1: all), which needs the NVIDIA container toolkit.
- `kubernetes`: a pod of the operator's PodTemplate (`pod_template`) on the cluster of the
  kubeconfig (or the one this runs in), through Dagster's PipesK8sClient: assets/training_pod.py.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from pathlib import Path

import docker
import docker.errors
from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    DagsterEventType,
    Failure,
    PipesClientCompletedInvocation,
    PipesSubprocessClient,
    PreviewWarning,
)
from dagster_docker import PipesDockerClient
from docker.types import DeviceRequest

from assets.partitions import experiment_of_run
from assets.resources import CrucibleResource
from assets.training_label import step_labels
from commands.settings import TrainClient

# Dagster's own Pipes code calls one of its preview functions, and a deprecated property, on every
# training step: warnings about Dagster's internals that its users can do nothing about.
warnings.filterwarnings("ignore", message="Function `PipesMessageReader.expected_writer_count`",
                        category=PreviewWarning)
warnings.filterwarnings("ignore", message="AssetExecutionContext.run_id is deprecated", category=DeprecationWarning)

TRAIN_MODULE = ["-m", "assets.train_process"]
# What a second attempt can outlive: a connection lost (to a peer rank, the S3 endpoint, the
# Docker daemon) or a timeout, anywhere in the chain of the error the job raised. Anything else
# it raised fails the same way again (a full disk, a corrupt input, a bug), so it is not retried;
# a job that died without raising (killed, out of memory) is, and resumes from its progress.
TRANSIENT_ERRORS = frozenset({
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError", "BrokenPipeError",
    "TimeoutError", "DistError", "DistNetworkError", "DistStoreError", "DistBackendError", "EndpointConnectionError",
    "ConnectTimeoutError", "ReadTimeoutError", "StorageUnreachable",
})
PIPES_CLOSED_WITH_ERROR = "[pipes] external process pipes closed with exception"  # Dagster's engine event
# What the step needs of this process's environment inside a container: S3 credentials and
# endpoint, Crucible's own settings, Hugging Face's cache and offline switches.
PASSED_ENV_PREFIXES = ("AWS_", "CRUCIBLE_", "HF_", "FSSPEC_")


class TrainingStepClient(ConfigurableResource):
    """The Pipes client that runs the training jobs (see the module docstring)."""

    client: TrainClient = "subprocess"
    image: str = ""  # docker: the project image's tag (scripts/build-project-image prints it)
    gpus: int = 0  # docker: GPUs to ask the daemon for (-1: all)
    pod_template: str = ""  # kubernetes: the PodTemplate file (deploy/kubernetes/training-step.yaml)

    def run(self, context: AssetExecutionContext, crucible: CrucibleResource,
            extras: dict) -> PipesClientCompletedInvocation:
        """The job run to its end; a failure carries the error the job raised, as Pipes passed it
        back, and may be retried only when that error is transient (TRANSIENT_ERRORS)."""
        before = _last_event(context)
        try:
            return self._launch(context, crucible, extras)
        except Failure:
            raise
        except Exception:
            error = _job_error(context, before)
            if error is None:
                raise  # died without raising: retried
            raise Failure(f"the training job failed: {_described(error)}",
                          allow_retries=any(link.cls_name in TRANSIENT_ERRORS for link in _chain(error))) from None

    def _launch(self, context: AssetExecutionContext, crucible: CrucibleResource,
                extras: dict) -> PipesClientCompletedInvocation:
        if self.client == "subprocess":
            command = [*crucible.train_launcher_command(), *TRAIN_MODULE]
            return PipesSubprocessClient().run(command=command, context=context, extras=extras)
        if self.client == "kubernetes":
            from assets.training_pod import run_pod  # kubernetes' client loads only where it is used

            experiment = experiment_of_run(context.run.tags) or context.partition_key
            return run_pod(context, crucible, self.pod_template, self.image, self.step_command(crucible), experiment,
                           extras)
        return self._run_in_docker(context, crucible, extras)

    @staticmethod
    def step_command(crucible: CrucibleResource) -> list[str]:
        """The step in a container: the launcher (or the image's Python) and the module."""
        return [*(shlex.split(crucible.train_launcher) or ["python"]), *TRAIN_MODULE]

    def _run_in_docker(self, context: AssetExecutionContext, crucible: CrucibleResource,
                       extras: dict) -> PipesClientCompletedInvocation:
        if not self.image:
            raise Failure("the docker training step needs an image (CRUCIBLE_TRAIN_IMAGE): build the project's "
                          "with scripts/build-project-image", allow_retries=False)
        daemon = docker.from_env()
        try:
            daemon.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise Failure(f"no image {self.image!r} on the Docker daemon: build it with scripts/build-project-image",
                          allow_retries=False) from None
        except docker.errors.DockerException as e:  # retried: the daemon may be back by then
            raise Failure(f"the Docker daemon does not answer ({e}); start it with scripts/docker-daemon") from None
        experiment = experiment_of_run(context.run.tags) or context.partition_key
        # The queue runs one run of an experiment at a time: a step container of it still there is
        # one whose run died without a word (PipesDockerClient stops its container only when it can).
        labels = step_labels(experiment, str(Path(crucible.checkpoint_root).resolve()))
        _remove_step_containers(daemon, labels)
        try:
            return PipesDockerClient(env=container_environment()).run(
                context=context, image=self.image, command=self.step_command(crucible), extras=extras,
                container_kwargs=self._container_kwargs(crucible, labels))
        finally:
            _remove_step_containers(daemon, labels)

    def _container_kwargs(self, crucible: CrucibleResource, labels: dict[str, str]) -> dict:
        shared = [crucible.checkpoint_root] + ([] if "://" in crucible.storage_root else [crucible.storage_root])
        volumes = {str(Path(path).resolve()): {"bind": str(Path(path).resolve()), "mode": "rw"} for path in shared}
        for path in volumes:
            Path(path).mkdir(parents=True, exist_ok=True)
        volumes |= passed_files()
        requests = [DeviceRequest(count=self.gpus, capabilities=[["gpu"]])] if self.gpus else []
        return dict(volumes=volumes, network_mode="host", user=f"{os.getuid()}:{os.getgid()}",
                    environment={"HOME": "/tmp"}, device_requests=requests, labels=labels)


def _last_event(context: AssetExecutionContext) -> int:
    records = context.instance.get_records_for_run(context.run_id, limit=1, ascending=False).records
    return records[0].storage_id if records else 0


def _job_error(context: AssetExecutionContext, after: int):
    """The error the job raised in this attempt, as Dagster recorded it from the Pipes session."""
    step = context.get_step_execution_context().step.key
    records = context.instance.get_records_for_run(context.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    for record in reversed(records):
        entry = record.event_log_entry
        if record.storage_id > after and entry.step_key == step and entry.message == PIPES_CLOSED_WITH_ERROR:
            return entry.dagster_event.engine_event_data.error
    return None


def _chain(error):
    while error is not None:
        yield error
        error = error.cause or error.context


def _described(error) -> str:
    """`Class: message`, the class without its module path (`OSError: [Errno 28] …`)."""
    return re.sub(rf"^[\w.]*\.(?={re.escape(error.cls_name or '')}:)", "", error.message.strip())


def _remove_step_containers(daemon: docker.DockerClient, labels: dict[str, str]) -> None:
    selector = [f"{key}={value}" for key, value in labels.items()]
    for container in daemon.containers.list(all=True, filters={"label": selector}):
        container.remove(force=True)


def container_environment() -> dict[str, str]:
    """The variables of this process that a container working for it needs (a run's too)."""
    return {key: value for key, value in os.environ.items() if key.startswith(PASSED_ENV_PREFIXES)}


def passed_files() -> dict[str, dict[str, str]]:
    """Read-only mounts, at their own paths, of the files those variables name (AWS_CA_BUNDLE,
    AWS_SHARED_CREDENTIALS_FILE, …): the container's image has none of this host's."""
    files = {value for value in container_environment().values() if value.startswith("/") and Path(value).is_file()}
    return {path: {"bind": path, "mode": "ro"} for path in sorted(files)}
