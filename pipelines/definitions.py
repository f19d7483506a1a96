"""The Dagster code location: `dagster dev -w workspace.yaml` and `crucible run` both load this."""

from __future__ import annotations

from dagster import Definitions, FilesystemIOManager

from assets.analytics import iteration_rewards, reward_analytics
from assets.datasets import DATASET_ASSETS
from assets.io_manager import DatasetIOManager
from assets.iteration import checkpoint, checkpoint_eval, parent_checkpoint, task_set, trajectories
from assets.policy import base_policy
from assets.regrades import regrades
from assets.rollouts import rollouts
from assets.step_outputs import STEP_OUTPUTS, step_outputs_dir
from assets.verification import verified_rollouts
from commands.settings import load_settings
from pipelines.executors import step_executor
from pipelines.jobs import analytics_job, base_policy_job, create_experiment, evaluation_job, iteration_job
from pipelines.resources import crucible_resource, training_step_client
from pipelines.sensors import advance_iterations, evaluate_latest_checkpoints, keep_analytics_current

settings = load_settings()
defs = Definitions(
    assets=[base_policy, task_set, rollouts, verified_rollouts, trajectories, iteration_rewards, parent_checkpoint,
            checkpoint, checkpoint_eval, reward_analytics, regrades, *DATASET_ASSETS],
    jobs=[iteration_job, evaluation_job, base_policy_job, analytics_job, create_experiment],
    schedules=[evaluate_latest_checkpoints],
    sensors=[advance_iterations, keep_analytics_current],
    resources={"crucible": crucible_resource(settings), "training_step": training_step_client(settings),
               "io_manager": DatasetIOManager(storage_root=settings.storage_root),
               STEP_OUTPUTS: FilesystemIOManager(base_dir=step_outputs_dir(settings.storage_root))},
    # One executor for every launch, the UI's asset graph included (pipelines/executors.py).
    executor=step_executor(settings.step_processes),
)
