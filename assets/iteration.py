"""One RL iteration as assets, partitioned by `<experiment>-<iteration>`.

    task_set -> rollouts -> verified_rollouts -> trajectories -> checkpoint -> checkpoint_eval

Iteration N samples from checkpoint N-1 (the base policy for N = 1). Dagster has no partition
mapping for "the previous dynamic partition", so the graph shows only the edge from base_policy;
checkpoint N-1 is resolved by path and its exact content hash is recorded in the metadata; the sensor only starts N+1 once checkpoint N exists.
"""

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Failure,
    MaterializeResult,
    MetadataValue,
    Output,
    asset,
)

from assets.partitions import iterations, parse_iteration_key
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.stages import timed_stage
from datastore.store import rows_to_table
from task_sets.grading import grade_solution, sandbox_spec
from task_sets.loader import load_task_set
from task_sets.reproducibility import agreement, regrade_sample
from task_sets.rewards import Process, RewardFunction
from task_sets.schema import TaskBase
from task_sets.separation import separation
from training.checkpoint import CheckpointError, verify_checkpoint
from training.engine import SamplingParams, open_engine
from training.episodes import EpisodeLimits, as_rollout, run_episodes
from training.experiment import ExperimentConfig
from training.rollout import Rollout, sample_rollouts
from training.trainer import train_policy
from training.trajectory import (
    VerifiedRollout,
    evaluation_row,
    train_samples,
    trajectory_row,
)

ITERATION = dict(partitions_def=iterations, group_name="iteration")


def _experiment(context: AssetExecutionContext, crucible: CrucibleResource) -> tuple[ExperimentConfig, int]:
    name, iteration = parse_iteration_key(context.partition_key)
    return crucible.experiment(name), iteration


def _policy(crucible: CrucibleResource, experiment: str, iteration: int) -> tuple[Path, str]:
    """The checkpoint iteration `iteration` samples from, verified, and its content hash."""
    policy_dir = crucible.checkpoint_dir(experiment, iteration - 1)
    try:
        return policy_dir, verify_checkpoint(policy_dir)["content_hash"]
    except CheckpointError as error:
        raise Failure(
            f"iteration {iteration} samples from checkpoint {iteration - 1}, which is not usable: "
            f"{error}. Materialize iteration {iteration - 1} (or base_policy) first."
        ) from None


def _grade_all(
    context: AssetExecutionContext, crucible: CrucibleResource, work: list[tuple[TaskBase, Rollout]],
    reward: RewardFunction,
) -> list[VerifiedRollout]:
    """Grade every (task, rollout) in its own fresh sandbox session, through the sandbox pool
    (admission by CPU slots, retries of infrastructure failures on a fresh sandbox), and score
    it with the task set's reward function."""

    def verify(sandbox, item: tuple[TaskBase, Rollout]) -> VerifiedRollout:
        task, rollout = item
        started = time.perf_counter()
        process = Process(turns=max(1, len(rollout.turns)), tokens=rollout.sampled_tokens)
        grade = grade_solution(task, rollout.solution, sandbox, reward, process)
        return VerifiedRollout(rollout, task, grade, verify_s=time.perf_counter() - started)

    step = max(1, len(work) // 5)
    verified = []
    with crucible.sandbox_pool(is_infra_failure=lambda v: v.grade.reward_status == "infra_error") as pool:
        results = pool.map(lambda item: sandbox_spec(item[0]), verify, work)
        for done, result in enumerate(results, start=1):
            verified.append(result)
            if done % step == 0 or done == len(work):
                context.log.info(f"graded {done}/{len(work)}")
    if pool.retries or pool.quarantined:
        context.log.warning(f"sandbox pool: {pool.retries} retries, quarantined: {pool.quarantined}")
    return verified


@asset(
    **ITERATION,
    check_specs=[AssetCheckSpec("eval_split_held_out", asset="task_set",
                                description="no sampled task is from the eval split or an exact copy of one")],
)
def task_set(
    context: AssetExecutionContext, crucible: CrucibleResource
) -> Iterator[Output[list[TaskBase]] | AssetCheckResult]:
    """The train tasks this iteration samples (a seeded subset when the experiment asks for one);
    the asset check `eval_split_held_out` proves none of them belongs to, or copies, the eval split."""
    experiment, iteration = _experiment(context, crucible)
    full_set = load_task_set(experiment.task_set)
    tasks = full_set.train()
    if experiment.tasks_per_iteration and experiment.tasks_per_iteration < len(tasks):
        tasks = random.Random(experiment.seed * 100_003 + iteration).sample(tasks, experiment.tasks_per_iteration)
    by_difficulty = {d: sum(t.difficulty == d for t in tasks) for d in ("easy", "medium", "hard")}
    yield Output(tasks, metadata={"tasks": len(tasks), **{f"tasks/{d}": n for d, n in by_difficulty.items()}})
    split = separation(full_set)
    sampled = {task.id for task in tasks}
    not_train = sorted(task.id for task in tasks if task.split != "train")
    leaked = sorted({train_id for train_id, _ in split.exact_duplicates} & sampled)
    yield AssetCheckResult(
        check_name="eval_split_held_out",
        passed=not not_train and not leaked,
        metadata={"eval_tasks_sampled": ", ".join(not_train) or "none",
                  "copies_of_eval_prompts_sampled": ", ".join(leaked) or "none",
                  "near_duplicate_pairs_in_set": len(split.near_duplicates)},
    )


def _sample(context, crucible: CrucibleResource, experiment: ExperimentConfig, engine, tasks, params,
            group_prefix: str) -> list[Rollout]:
    if experiment.max_turns == 1:
        return sample_rollouts(engine, engine.tokenizer, tasks, params, group_prefix,
                               progress=lambda done, total: context.log.info(f"sampled {done}/{total} tasks"))
    limits = EpisodeLimits(max_turns=experiment.max_turns, max_tokens=experiment.episode_max_tokens,
                           command_timeout_s=experiment.command_timeout_s)
    episodes = run_episodes(engine, engine.tokenizer, tasks, params, limits, crucible.open_session, group_prefix,
                            progress=lambda turn, turns: context.log.info(f"episodes: turn {turn}/{turns} done"))
    return [as_rollout(episode, engine.tokenizer) for episode in episodes]


@asset(**ITERATION, deps=[base_policy], kinds={"pytorch"})
def rollouts(
    context: AssetExecutionContext, crucible: CrucibleResource, task_set: list[TaskBase]
) -> Output[list[Rollout]]:
    """K samples per task from the previous iteration's checkpoint, with behaviour log-probs:
    single replies, or multi-turn episodes in sandbox sessions when the experiment allows turns."""
    experiment, iteration = _experiment(context, crucible)
    with timed_stage(crucible.store(), experiment.name, iteration, "rollouts"):
        policy_dir, policy_version = _policy(crucible, experiment.name, iteration)
        engine = open_engine(experiment.engine, policy_dir, policy_version)
        params = SamplingParams(
            n=experiment.samples_per_task,
            max_new_tokens=experiment.max_new_tokens,
            temperature=experiment.temperature,
            seed=experiment.seed * 100_003 + iteration,
        )
        samples = _sample(context, crucible, experiment, engine, task_set, params, context.partition_key)
    tokens = sum(r.sampled_tokens for r in samples)
    seconds = sum(r.generate_s for r in samples)
    return Output(
        samples,
        metadata={
            "policy": MetadataValue.path(str(policy_dir)),
            "policy_version": policy_version,
            "samples": len(samples),
            "generated_tokens": tokens,
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
            "truncated": sum(r.finish_reason == "length" for r in samples),
            "finish_reasons": MetadataValue.json(dict(Counter(r.finish_reason for r in samples))),
            "mean_turns": sum(max(1, len(r.turns)) for r in samples) / len(samples),
            "example": MetadataValue.md(f"```python\n{samples[0].response_text}\n```"),
        },
    )


@asset(
    **ITERATION,
    check_specs=[AssetCheckSpec("verdicts_reproducible", asset="verified_rollouts",
                                description="a re-graded sample of the submissions gets the same verdicts")],
)
def verified_rollouts(
    context: AssetExecutionContext,
    crucible: CrucibleResource,
    task_set: list[TaskBase],
    rollouts: list[Rollout],
) -> Iterator[Output[list[VerifiedRollout]] | AssetCheckResult]:
    """Every sample graded in a fresh sandbox against its task's hidden tests; a sample of them
    graded again to check that verdicts are reproducible (asset check `verdicts_reproducible`)."""
    experiment, iteration = _experiment(context, crucible)
    tasks = {task.id: task for task in task_set}
    work = [(tasks[r.task_id], r) for r in rollouts]
    reward = load_task_set(experiment.task_set).reward
    with timed_stage(crucible.store(), experiment.name, iteration, "verified_rollouts"):
        verified = _grade_all(context, crucible, work, reward)
        sample = regrade_sample(len(work), experiment.regrade_fraction, experiment.seed * 100_003 + iteration)
        again = _grade_all(context, crucible, [work[i] for i in sample], reward) if sample else []
    repeat = agreement([work[i][0].id for i in sample], [verified[i].grade for i in sample], [v.grade for v in again])
    if repeat.disagreeing_task_ids:
        context.log.warning(f"verdicts changed on a second grading for: {', '.join(repeat.disagreeing_task_ids)}")
    scored = [v for v in verified if v.grade.reward_status == "scored"]
    yield Output(
        verified,
        metadata={
            "samples": len(verified),
            "pass_rate": sum(v.passed for v in verified) / len(verified),
            "mean_reward": sum(v.grade.reward for v in scored) / max(len(scored), 1),
            "infra_errors": sum(v.grade.reward_status == "infra_error" for v in verified),
            "invalid": sum(v.grade.reward_status == "invalid" for v in verified),
            "regraded": repeat.sampled,
            "regrade_agreement": repeat.rate,
            "reward_function": reward.version,
        },
    )
    yield AssetCheckResult(
        check_name="verdicts_reproducible",
        passed=not repeat.disagreeing_task_ids,
        severity=AssetCheckSeverity.WARN,
        metadata={"regraded": repeat.sampled, "agreement": repeat.rate,
                  "disagreeing_tasks": ", ".join(repeat.disagreeing_task_ids) or "none"},
    )


@asset(**ITERATION, kinds={"parquet"})
def trajectories(
    context: AssetExecutionContext, crucible: CrucibleResource, verified_rollouts: list[VerifiedRollout]
) -> MaterializeResult:
    """The iteration's samples as one atomically written Parquet partition."""
    experiment, iteration = _experiment(context, crucible)
    store = crucible.store()
    with timed_stage(store, experiment.name, iteration, "trajectories"):
        table = rows_to_table("trajectories", [trajectory_row(v) for v in verified_rollouts])
        path = store.write_partition("trajectories", experiment.name, iteration, table)
    return MaterializeResult(
        metadata={"path": MetadataValue.path(store.uri_of(path)), "rows": table.num_rows}
    )


@asset(**ITERATION, deps=[trajectories], kinds={"pytorch"})
def checkpoint(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """One GRPO step on this iteration's trajectories, starting from the policy that sampled them."""
    experiment, iteration = _experiment(context, crucible)
    store = crucible.store()
    with timed_stage(store, experiment.name, iteration, "checkpoint"):
        parent_dir, parent_hash = _policy(crucible, experiment.name, iteration)
        table = store.read_partition("trajectories", experiment.name, iteration)
        out_dir = crucible.checkpoint_dir(experiment.name, iteration)
        # Log-probs are recomputed at the temperature the samples were drawn at.
        grpo = dataclasses.replace(experiment.grpo, temperature=experiment.temperature)
        metrics = train_policy(
            parent_dir, train_samples(table), out_dir, grpo,
            progress=lambda step, total, loss: context.log.info(f"train step {step}/{total}: loss {loss:.4f}"),
            lineage={
                "parent": {"path": str(parent_dir), "content_hash": parent_hash},
                "trajectories": store.uri_of(store.partition_file("trajectories", experiment.name, iteration)),
                "experiment": experiment.model_dump(mode="json"),
            },
        )
        manifest = verify_checkpoint(out_dir)
        row = {
            "path": str(out_dir),
            "content_hash": manifest["content_hash"],
            "parent_path": str(parent_dir),
            "parent_hash": parent_hash,
            "loss": metrics["loss"],
            "clip_fraction": metrics["clip_fraction"],
            "grad_norm": metrics["grad_norm"],
            "train_tokens": metrics["tokens"],
            "tokens_per_s": metrics["tokens_per_s"],
        }
        store.write_partition("checkpoints", experiment.name, iteration, rows_to_table("checkpoints", [row]))
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(out_dir)),
            "content_hash": manifest["content_hash"],
            "parent_hash": parent_hash,
            **{key: value for key, value in metrics.items() if isinstance(value, (int, float))},
        }
    )


@asset(**ITERATION, deps=[checkpoint])
def checkpoint_eval(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Greedy pass rate of the new checkpoint on the held-out split, with its standard error."""
    experiment, iteration = _experiment(context, crucible)
    store = crucible.store()
    with timed_stage(store, experiment.name, iteration, "checkpoint_eval"):
        policy_dir = crucible.checkpoint_dir(experiment.name, iteration)
        engine = open_engine(experiment.engine, policy_dir, verify_checkpoint(policy_dir)["content_hash"])
        full_set = load_task_set(experiment.task_set)
        tasks = full_set.eval()[: experiment.eval_tasks]
        params = SamplingParams(n=1, max_new_tokens=experiment.max_new_tokens, temperature=0.0)
        samples = _sample(context, crucible, experiment, engine, tasks, params, f"{context.partition_key}/eval")
        graded = _grade_all(context, crucible, list(zip(tasks, samples)), full_set.reward)
        rows = [evaluation_row(v) for v in graded]
        store.write_partition("evaluations", experiment.name, iteration, rows_to_table("evaluations", rows))
    pass_rate = sum(row["passed"] for row in rows) / len(rows)
    stderr = (pass_rate * (1 - pass_rate) / len(rows)) ** 0.5
    return MaterializeResult(
        metadata={"eval_pass_rate": pass_rate, "eval_stderr": stderr, "eval_tasks": len(rows)}
    )
