"""One RL iteration as assets, partitioned by `<experiment>-<iteration>`.

    task_set -> rollouts -> verified_rollouts -> trajectories -> checkpoint -> checkpoint_eval

Iteration N samples from checkpoint N-1 (the base policy for N = 1). Dagster has no partition
mapping for "the previous dynamic partition", so the graph shows only the edge from base_policy;
checkpoint N-1 is resolved by path and its exact content hash is recorded in the metadata; the sensor only starts N+1 once checkpoint N exists.
"""

import math
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
    PipesSubprocessClient,
    RetryPolicy,
    asset,
)

from assets.charts import eval_curve_png, markdown_table, png_markdown
from assets.partitions import iterations, parse_iteration_key
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.stages import timed_stage
from assets.train_process import STEP_MESSAGE
from datastore import catalog
from datastore.schema import TRAINING_STEPS
from datastore.store import rows_to_table
from sandbox.verdict import RewardStatus
from task_sets.loader import TaskSet, load_task_set
from task_sets.reproducibility import agreement, regrade_sample
from task_sets.rewards import Process, RewardFunction
from task_sets.schema import TaskBase
from task_sets.separation import separation
from task_sets.submission import grade_solution, sandbox_spec
from training.agent.dynamic_sampling import Refilled, refill
from training.agent.episodes import EpisodeLimits, as_rollout, run_episodes
from training.agent.rollout import Rollout, sample_rollouts
from training.agent.trajectory import (
    VerifiedRollout,
    evaluation_row,
    trajectory_row,
)
from training.evaluation.monitors import (
    SAMPLE_SIGNALS,
    TRAINER_SIGNALS,
    Verdict,
    blocking_failures,
    judge,
    weights_are_finite,
)
from training.experiment import ExperimentConfig
from training.inference.engine import SamplingParams
from training.inference.engines import open_engine
from training.policy.checkpoint import CheckpointError, verify_checkpoint
from training.policy.lineage import lineage
from training.rl.step import TrainJob
from training.rl.trainer import STEP_STATS

ITERATION = dict(partitions_def=iterations, group_name="iteration")


def partition_experiment(context: AssetExecutionContext, crucible: CrucibleResource) -> tuple[ExperimentConfig, int]:
    name, iteration = parse_iteration_key(context.partition_key)
    return crucible.experiment(name), iteration


def check_result(verdict: Verdict) -> AssetCheckResult:
    """A monitor's verdict as an asset check result: an error blocks what depends on the asset."""
    return AssetCheckResult(check_name=verdict.check, passed=verdict.passed, description=verdict.message,
                            severity=AssetCheckSeverity.ERROR if verdict.severity == "error" else AssetCheckSeverity.WARN,
                            metadata={"detail": verdict.message})


def _policy(crucible: CrucibleResource, experiment: str, iteration: int) -> tuple[Path, str]:
    """The checkpoint iteration `iteration` samples from, verified, and its content hash."""
    policy_dir = crucible.checkpoint_dir(experiment, iteration - 1)
    try:
        content_hash = verify_checkpoint(policy_dir)["content_hash"]
    except CheckpointError as error:
        raise Failure(
            f"iteration {iteration} samples from checkpoint {iteration - 1}, which is not usable: "
            f"{error}. Materialize iteration {iteration - 1} (or base_policy) first."
        ) from None
    store = crucible.store()
    if iteration > 1 and store.has_partition("checkpoints", experiment, iteration - 1):
        [record] = store.read_partition("checkpoints", experiment, iteration - 1).to_pylist()
        if record["blocked"] and record["content_hash"] == content_hash:
            failed = [m for m in record["monitor_messages"] if ": error: " in m]
            raise Failure(f"iteration {iteration} would sample from checkpoint {iteration - 1}, which failed its "
                          f"stability checks ({'; '.join(failed)}). Change the settings and materialize "
                          f"iteration {iteration - 1} again.")
    return policy_dir, content_hash


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
        return VerifiedRollout(rollout, task, grade, verify_s=time.perf_counter() - started,
                               queue_s=started - handed_over)

    step = max(1, len(work) // 5)
    verified = []
    handed_over = time.perf_counter()
    with crucible.sandbox_pool(is_infra_failure=lambda v: v.grade.reward_status is RewardStatus.INFRA_ERROR) as pool:
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
    experiment, iteration = partition_experiment(context, crucible)
    full_set = load_task_set(experiment.task_set)
    tasks = full_set.train()
    if experiment.tasks_per_iteration and experiment.tasks_per_iteration < len(tasks):
        tasks = random.Random(experiment.seed * 100_003 + iteration).sample(tasks, experiment.tasks_per_iteration)
    by_difficulty = {d: sum(t.difficulty == d for t in tasks) for d in ("easy", "medium", "hard")}
    crucible.store().write_partition("tasks", experiment.name, iteration,
                                     rows_to_table("tasks", _task_rows(full_set, {task.id for task in tasks})))
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


def _task_rows(full_set: TaskSet, sampled: set[str]) -> list[dict]:
    """The `tasks` dataset: every task of the set, train and eval, as this iteration saw it."""
    return [{"task_id": task.id, "task_version": task.version, "task_set": full_set.name,
             "task_set_version": full_set.version, "kind": task.kind, "split": task.split,
             "difficulty": task.difficulty, "family": task.family, "domain": task.domain, "prompt": task.prompt,
             "starting_files": sorted(task.files), "network": task.network, "wall_s": task.limits.wall_s,
             "sampled": task.id in sampled} for task in full_set]


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


def _rollout_params(experiment: ExperimentConfig, iteration: int) -> SamplingParams:
    return SamplingParams(n=experiment.samples_per_task, max_new_tokens=experiment.max_new_tokens,
                          temperature=experiment.temperature, seed=experiment.seed * 100_003 + iteration)


@asset(**ITERATION, deps=[base_policy], kinds={"pytorch"})
def rollouts(
    context: AssetExecutionContext, crucible: CrucibleResource, task_set: list[TaskBase]
) -> Output[list[Rollout]]:
    """K samples per task from the previous iteration's checkpoint, with behaviour log-probs:
    single replies, or multi-turn episodes in sandbox sessions when the experiment allows turns."""
    experiment, iteration = partition_experiment(context, crucible)
    with timed_stage(crucible.store(), experiment.name, iteration, "rollouts"):
        policy_dir, policy_version = _policy(crucible, experiment.name, iteration)
        engine = open_engine(experiment.engine, policy_dir, policy_version)
        samples = _sample(context, crucible, experiment, engine, task_set, _rollout_params(experiment, iteration),
                          context.partition_key)
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
    experiment, iteration = partition_experiment(context, crucible)
    tasks = {task.id: task for task in task_set}
    work = [(tasks[r.task_id], r) for r in rollouts]
    full_set = load_task_set(experiment.task_set)
    reward = full_set.reward
    with timed_stage(crucible.store(), experiment.name, iteration, "verified_rollouts"):
        verified = _grade_all(context, crucible, work, reward)
        refilled = _refill(context, crucible, experiment, iteration, full_set, task_set, verified)
        verified = refilled.graded
        sample = regrade_sample(len(work), experiment.regrade_fraction, experiment.seed * 100_003 + iteration)
        again = _grade_all(context, crucible, [work[i] for i in sample], reward) if sample else []
    repeat = agreement([work[i][0].id for i in sample], [verified[i].grade for i in sample], [v.grade for v in again])
    if repeat.disagreeing_task_ids:
        context.log.warning(f"verdicts changed on a second grading for: {', '.join(repeat.disagreeing_task_ids)}")
    yield Output(
        verified,
        metadata={
            "samples": len(verified),
            "groups": refilled.groups,
            "informative_groups": refilled.informative,
            "refill_rounds": refilled.rounds,
            "infra_errors": sum(v.grade.reward_status is RewardStatus.INFRA_ERROR for v in verified),
            "invalid": sum(v.grade.reward_status is RewardStatus.INVALID for v in verified),
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


def _refill(context, crucible: CrucibleResource, experiment: ExperimentConfig, iteration: int, full_set,
            sampled: list[TaskBase], verified: list[VerifiedRollout]) -> Refilled[VerifiedRollout]:
    """Dynamic sampling: more train tasks, from the same policy, while too few groups have a
    reward spread (training/agent/dynamic_sampling.py)."""
    taken = {task.id for task in sampled}
    reserve = [task for task in full_set.train() if task.id not in taken]
    random.Random(experiment.seed * 100_003 + iteration).shuffle(reserve)
    engine = None

    def sample_and_grade(tasks: list[TaskBase], round_: int) -> list[VerifiedRollout]:
        nonlocal engine
        context.log.info(f"dynamic sampling round {round_}: {len(tasks)} more tasks")
        if engine is None:
            engine = open_engine(experiment.engine, *_policy(crucible, experiment.name, iteration))
        samples = _sample(context, crucible, experiment, engine, tasks, _rollout_params(experiment, iteration),
                          f"{context.partition_key}/refill{round_}")
        by_id = {task.id: task for task in tasks}
        return _grade_all(context, crucible, [(by_id[s.task_id], s) for s in samples], full_set.reward)

    def group_reward(v: VerifiedRollout) -> tuple[str, float] | None:
        return (v.rollout.group_id, v.grade.reward) if v.grade.reward_status is RewardStatus.SCORED else None

    target = len(sampled) if experiment.refill_rounds else 0
    return refill(verified, reserve, sample_and_grade, group_reward, target, experiment.refill_rounds)


@asset(**ITERATION, kinds={"parquet"})
def trajectories(
    context: AssetExecutionContext, crucible: CrucibleResource, verified_rollouts: list[VerifiedRollout]
) -> MaterializeResult:
    """The iteration's samples as one atomically written Parquet partition."""
    experiment, iteration = partition_experiment(context, crucible)
    store = crucible.store()
    with timed_stage(store, experiment.name, iteration, "trajectories"):
        table = rows_to_table("trajectories", [trajectory_row(v) for v in verified_rollouts])
        path = store.write_partition("trajectories", experiment.name, iteration, table)
    return MaterializeResult(
        metadata={"path": MetadataValue.path(store.uri_of(path)), "rows": table.num_rows}
    )


STABILITY_CHECKS = {
    "training_finite": ("loss, gradients and weights are finite; otherwise no iteration samples from "
                        "this checkpoint", True),
    "training_not_diverged": ("the step moved the policy at most monitors.max_step_kl from the one that "
                              "sampled its data; otherwise no iteration samples from this checkpoint", True),
    "entropy_not_collapsed": ("mean token entropy stays above monitors.min_entropy_ratio of the first "
                              "iteration's", False),
    "tamper_rate_not_rising": ("the share of tampered submissions rises at most monitors.max_tamper_rise", False),
}


@asset(
    # iteration_rewards (assets/analytics.py) judges the samples first: its failed error checks stop the step.
    **ITERATION, deps=[trajectories, "iteration_rewards"], kinds={"pytorch"},
    retry_policy=RetryPolicy(max_retries=2),  # a retried step resumes from its saved progress
    check_specs=[AssetCheckSpec(name, asset="checkpoint", description=text, blocking=blocking)
                 for name, (text, blocking) in STABILITY_CHECKS.items()],
)
def checkpoint(
    context: AssetExecutionContext, crucible: CrucibleResource, pipes_subprocess_client: PipesSubprocessClient
) -> MaterializeResult:
    """The training step on this iteration's trajectories, from the policy that sampled them, in
    a process of its own (assets/train_process.py, through Dagster Pipes); then the stability
    monitors, as asset checks, on the new checkpoint."""
    experiment, iteration = partition_experiment(context, crucible)
    store = crucible.store()
    with timed_stage(store, experiment.name, iteration, "checkpoint"):
        parent_dir, parent_hash = _policy(crucible, experiment.name, iteration)
        out_dir = crucible.checkpoint_dir(experiment.name, iteration)
        # The exact files (datastore/store.py never rewrites one): what lineage names is what is read.
        trajectory_files = store.partition_files("trajectories", experiment.name, iteration)
        settings = experiment.model_dump(mode="json")
        job = TrainJob(
            parent_dir=str(parent_dir), out_dir=str(out_dir), storage_root=crucible.storage_root,
            trajectory_files=trajectory_files,
            grpo=experiment.grpo, temperature=experiment.temperature,
            reference_dir=str(crucible.base_policy_dir()) if experiment.grpo.kl_coef else None,
            lineage=lineage(parent_dir, parent_hash, trajectory_files,
                            load_task_set(experiment.task_set).version, settings),
        )
        invocation = pipes_subprocess_client.run(
            command=[*crucible.train_launcher_command(), "-m", "assets.train_process"],
            context=context, extras={"job": job.model_dump(mode="json")},
        )
        steps = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and m.get("kind") == STEP_MESSAGE]
        reported = invocation.get_materialize_result().metadata or {}
        manifest = verify_checkpoint(out_dir)
        signals = _signals(manifest["metrics"], _iteration_rewards(crucible, experiment.name, iteration))
        verdicts = judge(signals, _history(store, experiment.name, iteration), weights_are_finite(out_dir),
                         experiment.monitors)
        row = {
            "path": str(out_dir), "content_hash": manifest["content_hash"],
            "parent_path": str(parent_dir), "parent_hash": parent_hash,
            "trajectories": trajectory_files, "task_set_version": job.lineage["task_set_version"],
            "config_hash": job.lineage["config_hash"], "code_version": job.lineage["code_version"],
            "global_step": manifest["global_step"], **signals,
            "train_tokens": manifest["metrics"]["tokens"], "tokens_per_s": manifest["metrics"]["tokens_per_s"],
            "blocked": bool(blocking_failures(verdicts)),
            "monitor_messages": [f"{v.check}: {'ok' if v.passed else v.severity}: {v.message}" for v in verdicts],
        }
        store.write_partition("checkpoints", experiment.name, iteration, rows_to_table("checkpoints", [row]))
        step_rows = [{**{name: m[name] for name in TRAINING_STEPS.names}, "tokens": int(m["tokens"])} for m in steps]
        store.write_partition("training_steps", experiment.name, iteration, rows_to_table("training_steps", step_rows))
    return MaterializeResult(
        metadata={
            **reported,
            "path": MetadataValue.path(str(out_dir)),
            "parent_hash": parent_hash,
            "lineage": MetadataValue.json({k: v for k, v in job.lineage.items() if k != "settings"}),
            "signals": MetadataValue.md(markdown_table([signals], tuple(signals))),
            "steps": MetadataValue.md(markdown_table(step_rows, STEP_STATS) if step_rows else "no optimizer step"),
        },
        check_results=[check_result(v) for v in verdicts],
    )


def _iteration_rewards(crucible: CrucibleResource, experiment: str, iteration: int) -> dict:
    [row] = catalog.records(catalog.connect(crucible.storage_root),
                            "SELECT * FROM iteration_rewards WHERE experiment = ? AND iteration = ?",
                            [experiment, iteration])
    return row


def _signals(metrics: dict, rewards: dict) -> dict[str, float]:
    """This iteration's health signals (monitors.SIGNALS): the trainer's, and the samples' from
    their `iteration_rewards` row (datastore/metrics.py)."""
    return {**{key: float(metrics[key]) for key in TRAINER_SIGNALS}, **{key: rewards[key] for key in SAMPLE_SIGNALS}}


def _history(store, experiment: str, iteration: int) -> list[dict]:
    """The signals of the experiment's earlier iterations, oldest first."""
    return [store.read_partition("checkpoints", experiment, earlier).to_pylist()[0]
            for earlier in range(1, iteration) if store.has_partition("checkpoints", experiment, earlier)]


@asset(**ITERATION, deps=[checkpoint])
def checkpoint_eval(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Pass rate of the new checkpoint on the held-out split, with its standard error, against
    the base policy's on the same tasks (evaluated once per experiment and stored as iteration 0),
    and the curve across iterations."""
    experiment, iteration = partition_experiment(context, crucible)
    store = crucible.store()
    with timed_stage(store, experiment.name, iteration, "checkpoint_eval"):
        if not store.has_partition("evaluations", experiment.name, 0):
            context.log.info("evaluating the base policy first (iteration 0), the baseline of every iteration")
            _evaluate(context, crucible, experiment, 0)
        rows = _evaluate(context, crucible, experiment, iteration)
    curve = catalog.records(catalog.connect(crucible.storage_root), "SELECT * FROM held_out WHERE experiment = ? "
                            "AND iteration <= ? ORDER BY iteration", [experiment.name, iteration])
    if curve[-1]["iteration"] != iteration:
        raise Failure(f"no held-out sample of iteration {iteration} was scored ({len(rows)} evaluated): see the "
                      "evaluations' reward_status")
    now, gain = curve[-1], curve[-1]["improvement_in_stderrs"]
    context.log.info(f"held-out pass rate {now['pass_rate']:.3f} ± {now['stderr']:.3f} "
                     f"({now['improvement']:+.3f} over the base policy, {gain:+.1f} standard errors)")
    return MaterializeResult(
        metadata={
            "eval_pass_rate": now["pass_rate"], "eval_stderr": now["stderr"], "eval_tasks": now["tasks"],
            "eval_samples": now["samples"], "base_pass_rate": curve[0]["pass_rate"],
            "improvement": now["improvement"], "improvement_stderr": now["improvement_stderr"],
            "improvement_in_stderrs": gain if math.isfinite(gain) else MetadataValue.text(
                f"{gain} (every task moved by the same amount)"),
            "curve": MetadataValue.md(png_markdown("held-out pass rate", eval_curve_png(
                experiment.name, [(p["iteration"], p["pass_rate"], p["stderr"]) for p in curve]))),
        }
    )


def _evaluate(context, crucible: CrucibleResource, experiment: ExperimentConfig, iteration: int) -> list[dict]:
    """Checkpoint `iteration` (0: the base policy) on the held-out tasks: greedily, or
    `eval_samples` samples per task at the rollout temperature; stored as that evaluations partition."""
    policy_dir = crucible.checkpoint_dir(experiment.name, iteration)
    engine = open_engine(experiment.engine, policy_dir, verify_checkpoint(policy_dir)["content_hash"])
    full_set = load_task_set(experiment.task_set)
    tasks = full_set.eval()[: experiment.eval_tasks]
    greedy = experiment.eval_samples == 1
    params = SamplingParams(n=experiment.eval_samples, max_new_tokens=experiment.max_new_tokens,
                            temperature=0.0 if greedy else experiment.temperature, seed=experiment.seed)
    samples = _sample(context, crucible, experiment, engine, tasks, params, f"{experiment.name}/eval/{iteration}")
    by_id = {task.id: task for task in tasks}
    graded = _grade_all(context, crucible, [(by_id[s.task_id], s) for s in samples], full_set.reward)
    rows = [evaluation_row(v) for v in graded]
    crucible.store().write_partition("evaluations", experiment.name, iteration, rows_to_table("evaluations", rows))
    return rows
