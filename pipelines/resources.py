"""Resources and their run config, from the deployment's settings (pipelines/settings.py)."""

from __future__ import annotations

from assets.resources import CrucibleResource
from assets.step_outputs import STEP_OUTPUTS, step_outputs_dir
from assets.training_step import TrainingStepClient
from pipelines.settings import Settings


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


def run_config(settings: Settings) -> dict:
    """These settings' resources, as the run config of a run submitted with them: a run launched
    by a daemon of another environment (a UI's) still reads and writes where the submitting
    command was told, and trains where it was told. The executor (step_processes) is the code
    location's, the launching daemon's setting."""
    return {"resources": {
        "crucible": {"config": crucible_resource(settings).model_dump(exclude_unset=True)},
        "training_step": {"config": training_step_client(settings).model_dump(exclude_unset=True)},
        "io_manager": {"config": {"storage_root": settings.storage_root}},
        STEP_OUTPUTS: {"config": {"base_dir": step_outputs_dir(settings.storage_root)}},
    }}
