"""The Dagster code location: `dagster dev -w workspace.yaml` and `crucible run` both load this."""

from __future__ import annotations

from dagster import Definitions, PipesSubprocessClient

from assets.analytics import iteration_rewards, reward_analytics
from assets.iteration import (
    checkpoint,
    checkpoint_eval,
    rollouts,
    task_set,
    trajectories,
    verified_rollouts,
)
from assets.policy import base_policy
from pipelines.jobs import analytics_job, base_policy_job, iteration_job
from pipelines.logging import progress_console
from pipelines.resources import crucible_resource
from pipelines.sensors import advance_iteration

defs = Definitions(
    assets=[base_policy, task_set, rollouts, verified_rollouts, trajectories, iteration_rewards, checkpoint,
            checkpoint_eval, reward_analytics],
    jobs=[iteration_job, base_policy_job, analytics_job],
    sensors=[advance_iteration],
    resources={"crucible": crucible_resource(), "pipes_subprocess_client": PipesSubprocessClient()},
    loggers={"console": progress_console},
)
