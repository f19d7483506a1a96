"""The Dagster code location: `dagster dev -w workspace.yaml` and `crucible run` both load this."""

from __future__ import annotations


from dagster import Definitions, in_process_executor

from assets.analytics import iteration_rewards, reward_analytics
from assets.datasets import DATASET_ASSETS
from assets.io_manager import DatasetIOManager
from assets.iteration import (
    checkpoint,
    checkpoint_eval,
    rollouts,
    task_set,
    trajectories,
    verified_rollouts,
)
from assets.policy import base_policy
from assets.regrades import regrades
from pipelines import environment
from pipelines.jobs import analytics_job, base_policy_job, create_experiment, evaluation_job, iteration_job
from pipelines.logging import progress_console
from pipelines.resources import crucible_resource, training_step_client
from pipelines.sensors import advance_iterations, evaluate_latest_checkpoints, keep_analytics_current


defs = Definitions(
    assets=[base_policy, task_set, rollouts, verified_rollouts, trajectories, iteration_rewards, checkpoint,
            checkpoint_eval, reward_analytics, regrades, *DATASET_ASSETS],
    jobs=[iteration_job, evaluation_job, base_policy_job, analytics_job, create_experiment],
    schedules=[evaluate_latest_checkpoints],
    sensors=[advance_iterations, keep_analytics_current],
    resources={"crucible": crucible_resource(), "training_step": training_step_client(),
               "io_manager": DatasetIOManager(storage_root=environment.storage_root())},
    loggers={"console": progress_console},
    # One executor for every launch, the UI's asset graph included: an iteration's steps form a
    # chain and each loads torch, so a process per step would only add start-up time (and a run's
    # resources, its experiment's writer lock among them, live as long as the run).
    executor=in_process_executor,
)
