"""Jobs: one RL iteration (partitioned by experiment and iteration), an experiment's base policy,
and the cross-iteration analytics."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job

ITERATION_ASSETS = ("task_set", "rollouts", "verified_rollouts", "trajectories", "iteration_rewards", "checkpoint",
                    "checkpoint_eval")

iteration_job = define_asset_job(
    "iteration",
    selection=AssetSelection.assets(*ITERATION_ASSETS),
    description="One RL iteration: sample, verify, store trajectories, judge their rewards, train, evaluate.",
)

evaluation_job = define_asset_job(
    "evaluation",
    selection=AssetSelection.assets("checkpoint_eval"),
    description="Evaluate an iteration's checkpoint on the held-out split again.",
)

base_policy_job = define_asset_job(
    "base_policy_job",
    selection=AssetSelection.assets("base_policy"),
    description="Build an experiment's model and warm it up on its train split's reference solutions.",
)

analytics_job = define_asset_job(
    "reward_analytics_job",
    selection=AssetSelection.assets("reward_analytics"),
    description="Summarise rewards across every iteration (DuckDB).",
)
