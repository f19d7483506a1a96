"""Resources: where data lives, how code is sandboxed. Chosen per environment in pipelines/."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
from dagster import ConfigurableResource

from datastore.store import DatasetStore
from sandbox.local import LocalSandbox
from training.experiment import ExperimentConfig


class CrucibleResource(ConfigurableResource):
    """Storage root (any fsspec URI), local checkpoint directory and sandbox settings."""

    storage_root: str = ".crucible/data"
    checkpoint_root: str = ".crucible/checkpoints"
    sandbox_backend: str = "local"
    grading_workers: int = 2

    def store(self) -> DatasetStore:
        return DatasetStore(self.storage_root)

    def sandbox(self) -> LocalSandbox:
        if self.sandbox_backend != "local":
            raise ValueError(f"sandbox backend {self.sandbox_backend!r} is not available; use 'local'")
        return LocalSandbox()

    def _experiment_path(self, name: str) -> str:
        return f"{self.storage_root.rstrip('/')}/experiments/{name}.json"

    def experiment(self, name: str) -> ExperimentConfig:
        """The stored settings of an experiment, or the defaults for a new one."""
        path = self._experiment_path(name)
        fs, fs_path = fsspec.core.url_to_fs(path)
        if not fs.exists(fs_path):
            return ExperimentConfig(name=name)
        with fs.open(fs_path) as f:
            return ExperimentConfig.model_validate(json.load(f))

    def save_experiment(self, config: ExperimentConfig) -> None:
        fs, fs_path = fsspec.core.url_to_fs(self._experiment_path(config.name))
        fs.makedirs(fs_path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(fs_path, "w") as f:
            f.write(config.model_dump_json(indent=2))

    def base_policy_dir(self) -> Path:
        return Path(self.checkpoint_root) / "base"

    def checkpoint_dir(self, experiment: str, iteration: int) -> Path:
        """Policy after `iteration` training steps; iteration 0 is the base policy."""
        if iteration == 0:
            return self.base_policy_dir()
        return Path(self.checkpoint_root) / f"experiment={experiment}" / f"iteration={iteration}"
