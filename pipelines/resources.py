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


# Where data lives, of the crucible resource's settings: what a run launched by another
# environment's daemon must still share with the command that submitted it (the Docker run
# launcher mounts these three at their paths). Built environments are each machine's own.
DATA_PLACES = ("storage_root", "checkpoint_root", "task_sets")


def run_config(settings: Settings) -> dict:
    """The data places of these settings, as the run config of a run submitted with them: a run
    launched by a daemon of another environment (a UI's) still reads and writes where the
    submitting command was told. How a run executes (sandbox backend, training step, executor)
    is the launching daemon's environment: a run container, say, grades in Docker whatever the
    submitter's backend; the daemon a command starts itself has the command's settings."""
    crucible = crucible_resource(settings).model_dump(include=set(DATA_PLACES))
    return {"resources": {
        "crucible": {"config": crucible},
        "io_manager": {"config": {"storage_root": settings.storage_root}},
        STEP_OUTPUTS: {"config": {"base_dir": step_outputs_dir(settings.storage_root)}},
    }}
