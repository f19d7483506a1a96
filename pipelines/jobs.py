"""Jobs: one RL iteration (partitioned), the base policy, and the cross-iteration analytics."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job, in_process_executor

ITERATION_ASSETS = ("task_set", "rollouts", "verified_rollouts", "trajectories", "iteration_rewards", "checkpoint",
                    "checkpoint_eval")

iteration_job = define_asset_job(
    "iteration",
    selection=AssetSelection.assets(*ITERATION_ASSETS),
    description="One RL iteration: sample, verify, store trajectories, judge their rewards, train, evaluate.",
    # The steps form a chain and each loads torch: a process per step would only add start-up time.
    executor_def=in_process_executor,
)

base_policy_job = define_asset_job(
    "base_policy_job",
    selection=AssetSelection.assets("base_policy"),
    description="Build the default model and warm it up on the train split's reference solutions.",
)

analytics_job = define_asset_job(
    "reward_analytics_job",
    selection=AssetSelection.assets("reward_analytics"),
    description="Summarise rewards across every iteration (DuckDB).",
)
