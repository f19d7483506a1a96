"""Each run in a container of the project image: Dagster's DockerRunLauncher, told where Crucible
keeps things.

Selected by CRUCIBLE_RUN_LAUNCHER=docker (pipelines/instance.py writes it into the instance's
dagster.yaml, pipelines/dagster-docker.yaml), with the image CRUCIBLE_RUN_IMAGE names
(scripts/build-project-image prints its tag). The daemon launches the runs the queue lets
through, on the Docker daemon of its own DOCKER_HOST. What the launching process knows, its run
container knows too:

- its environment: Crucible's settings, S3's and Hugging Face's, DAGSTER_HOME and the
  Postgres URL (the instance the run worker reports to), and the files those name (a CA bundle);
- its files, mounted at the same paths: the checkpoint root, a local storage root, the task-set
  library, and DAGSTER_HOME (a SQLite instance lives in its files);
- its network (the host's: an S3 endpoint or a Postgres server on loopback answers inside too);
- its user, so that checkpoints stay the operator's.

A run container has no kernel namespaces of its own to spare, so its sandboxes are Docker
containers beside it, on the daemon whose socket it is given (sandbox/docker_fleet.py copies
grading's files to them: that daemon does not see the container's files).
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import DagsterRun
from dagster_docker import DockerRunLauncher
from dagster_docker.container_context import DockerContainerContext

from assets.training_step import container_environment, passed_files
from commands.settings import Settings, load_settings
from sandbox.docker_hosts import docker_host_default, parse_hosts

RUN_LABEL = "crucible.run"  # on every run container: its run id


class CrucibleDockerRunLauncher(DockerRunLauncher):
    """DockerRunLauncher whose containers get the places, environment and user described above,
    over whatever the instance's config adds."""

    def get_container_context(self, dagster_run: DagsterRun) -> DockerContainerContext:
        settings = load_settings()  # the launching daemon's
        ours = DockerContainerContext(env_vars=[f"{key}={value}" for key, value in run_environment(settings).items()],
                                      container_kwargs=run_container_kwargs(settings, dagster_run.run_id))
        return ours.merge(super().get_container_context(dagster_run))


def run_environment(settings: Settings) -> dict[str, str]:
    """The training step's variables, the instance's and the daemon's, the settings (their paths
    absolute), and a sandbox backend that works in a container."""
    here = {key: os.environ[key] for key in ("DAGSTER_HOME", "DOCKER_HOST") if key in os.environ}
    return {**container_environment(), **settings.environment(), **here, "CRUCIBLE_SANDBOX": "docker",
            "HOME": "/tmp"}


def shared_paths(settings: Settings) -> list[Path]:
    """What a run reads and writes as files, as the launching process names them."""
    paths = [Path(settings.checkpoint_root), Path(os.environ["DAGSTER_HOME"]).resolve(), Path(settings.task_sets)]
    if "://" not in settings.storage_root:
        paths.append(Path(settings.storage_root))
    return paths


def docker_sockets(settings: Settings) -> list[Path]:
    """The unix sockets of the sandbox daemons and of this launcher's: mounted, they answer inside."""
    sandboxes = parse_hosts(settings.docker_hosts) if settings.docker_hosts else ()
    urls = [host.url for host in (*sandboxes, *docker_host_default())]
    return sorted({Path(url.removeprefix("unix://")) for url in urls if url.startswith("unix://")})


def run_container_kwargs(settings: Settings, run_id: str) -> dict:
    for path in shared_paths(settings):
        path.mkdir(parents=True, exist_ok=True)
    volumes = {str(path): {"bind": str(path), "mode": "rw"} for path in [*shared_paths(settings), *docker_sockets(settings)]}
    volumes |= passed_files()
    return {"volumes": volumes, "network_mode": "host", "user": f"{os.getuid()}:{os.getgid()}",
            "group_add": _socket_groups(settings), "working_dir": "/opt/crucible/src", "labels": {RUN_LABEL: run_id}}


def _socket_groups(settings: Settings) -> list[str]:
    """The groups that own the Docker sockets: a user who is not root reaches them through those."""
    return sorted({str(path.stat().st_gid) for path in docker_sockets(settings) if path.exists()})
