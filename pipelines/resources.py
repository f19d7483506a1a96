"""Resources, from the deployment's settings (commands/settings.py)."""

from __future__ import annotations

from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from commands.settings import Settings


def crucible_resource(settings: Settings) -> CrucibleResource:
    return CrucibleResource(
        storage_root=settings.storage_root,
        checkpoint_root=settings.checkpoint_root,
        task_sets=settings.task_sets,
        environments=settings.environments,
        sandbox_backend=settings.sandbox,
        docker_hosts=settings.docker_hosts,
        grading_shards=settings.grading_shards,
        train_launcher=settings.train_launcher,
    )


def training_step_client(settings: Settings) -> TrainingStepClient:
    return TrainingStepClient(client=settings.train_client, image=settings.train_image, gpus=settings.train_gpus,
                              pod_template=settings.train_pod_template)
