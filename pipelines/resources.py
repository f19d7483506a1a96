"""Resources per environment, chosen in one place (see pipelines/environment.py)."""

from __future__ import annotations

from assets.resources import CrucibleResource
from assets.step_outputs import STEP_OUTPUTS, step_outputs_dir
from assets.training_step import TrainingStepClient
from pipelines import environment


def crucible_resource() -> CrucibleResource:
    return CrucibleResource(
        storage_root=environment.storage_root(),
        checkpoint_root=environment.checkpoint_root(),
        sandbox_backend=environment.sandbox_backend(),
        grading_shards=environment.grading_shards(),
        train_launcher=environment.train_launcher(),
    )


def training_step_client() -> TrainingStepClient:
    return TrainingStepClient(client=environment.train_client(), image=environment.train_image(),
                              gpus=environment.train_gpus(), pod_template=environment.train_pod_template())


def run_config() -> dict:
    """Where this process keeps things, as the run config of a run it submits: a run launched by
    a daemon of another environment (a UI's) still reads and writes where this command was told."""
    storage = environment.storage_root()
    return {"resources": {
        "crucible": {"config": crucible_resource().model_dump(exclude_unset=True)},
        "io_manager": {"config": {"storage_root": storage}},
        STEP_OUTPUTS: {"config": {"base_dir": step_outputs_dir(storage)}},
    }}
