"""Jobs: one RL iteration (partitioned by experiment and iteration), its evaluation alone, an
experiment's base policy, the cross-iteration analytics, and creating an experiment."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job, job

from assets.experiments import store_experiment

ITERATION_ASSETS = ("task_set", "rollouts", "verified_rollouts", "trajectories", "iteration_rewards",
                    "parent_checkpoint", "checkpoint", "checkpoint_eval")

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


@job(description="Create (or lengthen) an experiment from its settings, given as TOML in the run config.")
def create_experiment():
    store_experiment()
