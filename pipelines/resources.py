"""Resources per environment, chosen in one place (see pipelines/environment.py)."""

from __future__ import annotations

from assets.resources import CrucibleResource
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
