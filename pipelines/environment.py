"""Where this environment keeps things, from environment variables (light: no torch, no dagster).

CRUCIBLE_TASK_SETS        the imported task-set library (task_sets/loader.py; default ./.crucible/task_sets)

CRUCIBLE_STORAGE_ROOT     any fsspec URI for datasets (default ./.crucible/data)
CRUCIBLE_CHECKPOINT_ROOT  local directory for checkpoints (default ./.crucible/checkpoints)
CRUCIBLE_SANDBOX          sandbox backend (default local)
CRUCIBLE_DOCKER_HOSTS     the Docker daemons of the docker backend, URL=CAPACITY,... (sandbox/docker_hosts.py)
CRUCIBLE_TRAIN_LAUNCHER   what launches the training step (default: this Python; e.g. torchrun --standalone …)
CRUCIBLE_TRAIN_CLIENT     where the training step runs: subprocess (default), docker or kubernetes (assets/training_step.py)
CRUCIBLE_TRAIN_POD_TEMPLATE  the kubernetes training step's PodTemplate file (assets/training_pod.py)
CRUCIBLE_TRAIN_IMAGE      the docker (or kubernetes) training step's image (scripts/build-project-image prints its tag)
CRUCIBLE_TRAIN_GPUS       GPUs the docker training step asks its daemon for (default 0; -1: all)
CRUCIBLE_STEP_PROCESSES   processes a run's steps may use at once (default 1: all in the run's own; pipelines/executors.py)
CRUCIBLE_GRADING_SHARDS   slices of an iteration's rollouts graded by steps of their own (default 1; assets/verification.py)
CRUCIBLE_POSTGRES_URL     the instance's database, a libpq URL (pipelines/instance.py; default SQLite files)
CRUCIBLE_RUN_LAUNCHER     where the daemon launches runs: process (default) or docker (pipelines/docker_run_launcher.py)
CRUCIBLE_RUN_IMAGE        the docker run launcher's image (scripts/build-project-image prints its tag)
"""

from __future__ import annotations

import os
from pathlib import Path

from task_sets.loader import LIBRARY_ENV, library_dir

DEFAULT_HOME = Path(".crucible")


def _local_or_uri(value: str) -> str:
    """Relative local paths become absolute, so the UI and the CLI agree wherever they start."""
    return value if "://" in value else str(Path(value).resolve())


def use_storage(storage: str | None) -> None:
    """A command's --storage, when given, is this process's storage root."""
    if storage:
        os.environ["CRUCIBLE_STORAGE_ROOT"] = storage


def storage_root() -> str:
    return _local_or_uri(os.environ.get("CRUCIBLE_STORAGE_ROOT", str(DEFAULT_HOME / "data")))


def checkpoint_root() -> str:
    return _local_or_uri(os.environ.get("CRUCIBLE_CHECKPOINT_ROOT", str(DEFAULT_HOME / "checkpoints")))


def pin_locations() -> None:
    """Fix the storage and checkpoint roots and the task-set library as absolute paths in the
    environment, so that a
    process started from another folder (`dagster dev` runs from the project, its run workers,
    the training step) uses the ones this working directory means."""
    os.environ["CRUCIBLE_STORAGE_ROOT"] = storage_root()
    os.environ["CRUCIBLE_CHECKPOINT_ROOT"] = checkpoint_root()
    os.environ[LIBRARY_ENV] = str(library_dir().resolve())


def sandbox_backend() -> str:
    return os.environ.get("CRUCIBLE_SANDBOX", "local")


def train_launcher() -> str:
    return os.environ.get("CRUCIBLE_TRAIN_LAUNCHER", "")


def train_client() -> str:
    return os.environ.get("CRUCIBLE_TRAIN_CLIENT", "subprocess")


def train_image() -> str:
    return os.environ.get("CRUCIBLE_TRAIN_IMAGE", "")


def train_pod_template() -> str:
    return os.environ.get("CRUCIBLE_TRAIN_POD_TEMPLATE", "")


def train_gpus() -> int:
    return int(os.environ.get("CRUCIBLE_TRAIN_GPUS", "0"))


def step_processes() -> int:
    return _count("CRUCIBLE_STEP_PROCESSES", "processes")


def grading_shards() -> int:
    return _count("CRUCIBLE_GRADING_SHARDS", "shards")


def _count(variable: str, of: str) -> int:
    value = os.environ.get(variable, "1").strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{variable}={value!r}: a whole number of {of}, 1 or more")
    return int(value)
