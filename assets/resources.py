"""Resources: where data lives, how code is sandboxed. Chosen per environment in pipelines/."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import fsspec
from dagster import ConfigurableResource
from pydantic import Field

from datastore.store import DatasetStore
from environments.store import EnvironmentStore
from sandbox.backends import BACKENDS, open_sandbox
from sandbox.base import Session
from sandbox.docker_hosts import DockerHost, parse_hosts
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.schema import Task
from training.agent.sessions import episode_session
from training.experiment import ExperimentConfig, experiment_from


class CrucibleResource(ConfigurableResource):
    """Storage root (any fsspec URI), local checkpoint directory and sandbox settings."""

    storage_root: str = ".crucible/data"
    checkpoint_root: str = ".crucible/checkpoints"
    task_sets: str = Field(".crucible/task_sets", description="the imported task-set library")
    environments: str = Field(".crucible/environments", description="where task environments are built")
    sandbox_backend: str = "local"
    docker_hosts: str = Field("", description="the docker backend's daemons, URL=CAPACITY,…; empty: DOCKER_HOST's")
    # A fresh sandbox's start is partly kernel latency (namespaces, mounts), so one grade more
    # than the cores keeps them busy: on 2 cores 200 grades took 30 ms each with 3 workers, 38 ms
    # with 2, 31 ms with 4; a repair iteration's 1,024 took 35-49 s instead of 45-50.
    grading_workers: int = Field(default_factory=lambda: len(os.sched_getaffinity(0)) + 1, ge=1)
    grading_shards: int = Field(1, ge=1, description="slices of an iteration's rollouts graded by steps of their own "
                                "(assets/verification.py), side by side where the executor allows, each with its "
                                "share of grading_workers")
    train_launcher: str = Field("", description="what runs the training step's module (`-m assets.train_process`"
                                " follows): empty is this Python; e.g. 'torchrun --standalone --nproc-per-node 8' for "
                                "8 data parallel ranks")

    def train_launcher_command(self) -> list[str]:
        """The launcher (or this Python) under setpriv's parent-death signal: a training step
        whose run died without a word (SIGKILL, the OOM killer) dies with it, rather than going on
        writing the checkpoint that the run, started again, trains too."""
        return ["setpriv", "--pdeathsig", "KILL", *(shlex.split(self.train_launcher) or [sys.executable])]

    def store(self) -> DatasetStore:
        return DatasetStore(self.storage_root)

    def sandbox_pool(self, is_infra_failure: Callable[[object], bool], shares: int = 1) -> SandboxPool:
        """Jobs run `grading_workers` at a time on the configured backend (divided among `shares`
        pools at work at once, each at least one); a job whose result `is_infra_failure` is retried
        on a fresh sandbox."""
        if self.sandbox_backend not in BACKENDS:
            raise ValueError(f"sandbox backend {self.sandbox_backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
        return SandboxPool(
            lambda spec: open_sandbox(self.sandbox_backend, spec, self.hosts(), warm_workers=True),
            PoolConfig(cpu_slots=max(1, self.grading_workers // shares)),
            is_infra_failure=is_infra_failure,
        )

    def open_session(self, task: Task, previous: Session | None = None, /) -> Session:
        """A session for an episode on `task`, holding its starting files (see
        training/agent/sessions.py: `previous`, reset, where it can serve)."""
        return episode_session(self.sandbox_backend, task, previous, store=self.environment_store(),
                               hosts=self.hosts())

    def environment_store(self) -> EnvironmentStore:
        return EnvironmentStore(self.environments)

    def hosts(self) -> tuple[DockerHost, ...]:
        """The docker backend's daemons; none configured, open_sandbox uses DOCKER_HOST's."""
        return parse_hosts(self.docker_hosts) if self.docker_hosts else ()

    def _experiments_dir(self) -> str:
        return f"{self.storage_root.rstrip('/')}/experiments"

    def _experiment_path(self, name: str) -> str:
        return f"{self._experiments_dir()}/{name}.json"

    def experiment_names(self) -> list[str]:
        """Every experiment with stored settings."""
        fs, fs_path = fsspec.core.url_to_fs(self._experiments_dir())
        return sorted(path.rsplit("/", 1)[1].removesuffix(".json") for path in fs.glob(f"{fs_path}/*.json"))

    def experiment_exists(self, name: str) -> bool:
        fs, fs_path = fsspec.core.url_to_fs(self._experiment_path(name))
        return fs.exists(fs_path)

    def experiment(self, name: str) -> ExperimentConfig:
        """The stored settings of an experiment, or the defaults for a new one."""
        path = self._experiment_path(name)
        fs, fs_path = fsspec.core.url_to_fs(path)
        if not fs.exists(fs_path):
            return ExperimentConfig(name=name)
        with fs.open(fs_path) as f:
            return experiment_from(json.load(f), path)

    def save_experiment(self, config: ExperimentConfig) -> None:
        fs, fs_path = fsspec.core.url_to_fs(self._experiment_path(config.name))
        fs.makedirs(fs_path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(fs_path, "w") as f:
            f.write(config.model_dump_json(indent=2))

    def experiment_dir(self, experiment: str) -> Path:
        """The experiment's checkpoints, its base policy's included."""
        return Path(self.checkpoint_root) / f"experiment={experiment}"

    def base_policy_dir(self, experiment: str) -> Path:
        return self.experiment_dir(experiment) / "base"

    def checkpoint_dir(self, experiment: str, iteration: int) -> Path:
        """Policy after `iteration` training steps; iteration 0 is the base policy."""
        if iteration == 0:
            return self.base_policy_dir(experiment)
        return self.experiment_dir(experiment) / f"iteration={iteration}"
