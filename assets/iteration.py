"""One RL iteration as assets, partitioned by experiment and iteration number (assets/partitions.py):
thin functions over training/iteration/, which holds the rules, a module per stage (`rollouts` and
`verified_rollouts`, fan-outs over shards, are in assets/rollouts.py and assets/verification.py).

    base_policy[experiment] -> task_set -> rollouts -> verified_rollouts -> trajectories -> iteration_rewards
                                           -> parent_checkpoint -> checkpoint -> checkpoint_eval

Iteration N samples from checkpoint N-1 (the experiment's base policy for N = 1), or, with
`max_staleness` k, from the newest of N-1-k … N-1 trained when it starts; it always trains from
N-1. Dagster maps a partition to an earlier one only on a time dimension, so those edges are not
drawn: the data path checks them instead (training/iteration/lineage.py refuses a checkpoint whose
lineage does not hold), and the run queue's lanes run one iteration of an experiment at a time, or
k+1 (pipelines/run_lanes.py).
"""

import math
from collections import Counter
from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Failure,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    Output,
    RetryPolicy,
    asset,
)

from assets.datasets import report_stored
from assets.failure_policy import STORAGE_RETRIES, STORAGE_RETRY_WAIT_S, failure_policy
from assets.lineage_check import LINEAGE_CHECK, LINEAGE_CHECK_DESCRIPTION, report_off_lineage
from assets.parent_wait import POLL_S, wait_for_parent
from assets.partitions import iterations, parse_iteration_key, refuse_beside_other_writers
from assets.policy import stored_experiment
from assets.pools import SAMPLING, TRAINING
from assets.resources import CrucibleResource
from assets.stages import timed_stage
from assets.step_messages import step_messages
from assets.trackers import report_to_trackers
from assets.training_step import TrainingStepClient
from datastore.charts import eval_curve_png, markdown_table, png_markdown
from datastore.schema import TRAINING_STEPS
from datastore.store import rows_to_table
from grading.gradability import build_environments, needs_proof
from task_sets.loader import TaskSet
from task_sets.schema import TaskBase
from task_sets.separation import separation
from training.agent.trajectory import VerifiedRollout, trajectory_row
from training.evaluation.monitors import Verdict
from training.inference.engines import gpu_released
from training.iteration import held_out, tasks
from training.iteration.context import IterationRef
from training.iteration.held_out import Evaluation
from training.iteration.lineage import Checkpoints
from training.iteration.training_step import NOTHING_LEARNED, judge_step, train_job
from training.rl.job import STEP_STATS

ITERATION = dict(partitions_def=iterations, group_name="iteration")


def this_iteration(context: AssetExecutionContext | OpExecutionContext, crucible: CrucibleResource) -> IterationRef:
    """The partition's iteration, with the experiment's stored settings."""
    try:
        name, number = parse_iteration_key(context.partition_key)
    except ValueError as error:
        raise Failure(str(error), allow_retries=False) from None
    with failure_policy(crucible.store()):
        experiment = stored_experiment(crucible, name)
    if number > experiment.iterations:
        raise Failure(f"iteration {number} is beyond experiment {name!r}'s limit of {experiment.iterations}: raise it "
                      f"first (`crucible run --experiment {name} --iterations {number}`, or the create_experiment job "
                      f"with iterations = {number})", allow_retries=False)
    return IterationRef(experiment, number)


def check_result(verdict: Verdict) -> AssetCheckResult:
    """A monitor's verdict as an asset check result: an error blocks what depends on the asset."""
    return AssetCheckResult(check_name=verdict.check, passed=verdict.passed, description=verdict.message,
                            severity=AssetCheckSeverity.ERROR if verdict.severity == "error" else AssetCheckSeverity.WARN,
                            metadata={"detail": verdict.message})


@asset(
    **ITERATION,
    check_specs=[AssetCheckSpec("eval_split_held_out", asset="task_set",
                                description="no sampled task is from the eval split or a copy of one (the same "
                                            "prompt and workspace, or the same workspace and tests)")],
)
def task_set(
    context: AssetExecutionContext, crucible: CrucibleResource
) -> Iterator[Output[list[TaskBase]] | AssetCheckResult]:
    """The train tasks this iteration samples (a seeded subset when the experiment asks for one);
    the asset check `eval_split_held_out` proves none of them belongs to, or copies, the eval split."""
    iteration = this_iteration(context, crucible)
    refuse_beside_other_writers(context.instance, context.run_id, iteration.name, iteration.number,
                                iteration.experiment.max_staleness)
    backend = crucible.sandbox_backend
    loaded = tasks.loaded_task_set(crucible, iteration.experiment)
    proven = tasks.prove_unproven(crucible, loaded, context.log.info)
    usable = tasks.usable(crucible, loaded)
    # Every environment the usable tasks declare (the held-out tasks' too), built once for this backend.
    failed = build_environments([t for t in usable if t.id not in usable.unusable], backend, crucible.environment_store(),
                                progress=context.log.info)
    if failed:
        raise Failure(next(iter(failed.values())))
    if needs_proof(usable) and not usable.train():
        raise Failure(f"no train task of {usable.name!r} is proven gradable on the {backend} backend, so there is "
                      f"nothing to sample: {len(usable.unusable)} left out (crucible tasks list --task-set "
                      f"{usable.name} says why)")
    sampled = tasks.sample_tasks(iteration, usable)
    store, name, number = crucible.store(), iteration.name, iteration.number
    with failure_policy(store):
        store.write_partition("tasks", name, number, rows_to_table("tasks", tasks.task_rows(usable, sampled)))
        report_stored(context, store, "tasks", name, number)
    by_difficulty = Counter(task.difficulty for task in sampled)
    digests = sorted({t.environment.digest[:16] for t in loaded if t.environment})
    yield Output(sampled, metadata={"tasks": len(sampled), "environments": ", ".join(digests)
                                    or "none (the sandbox image as it is)",
                                    **{f"tasks/{d}": by_difficulty[d] for d in ("easy", "medium", "hard")},
                                    **_gradability_metadata(usable, proven)})
    yield eval_split_held_out(usable, sampled)


def eval_split_held_out(task_set: TaskSet, sampled: list[TaskBase]) -> AssetCheckResult:
    """Passed when no sampled task is an eval task or a copy of one: the same prompt and
    workspace, or the same workspace and tests (task_sets/separation.py)."""
    split, sampled_ids = separation(task_set), {task.id for task in sampled}
    not_train = sorted(task.id for task in sampled if task.split != "train")
    copies = [row for row in split.exact_duplicates if row[0] in sampled_ids]
    return AssetCheckResult(
        check_name="eval_split_held_out",
        passed=not not_train and not copies,
        metadata={"eval_tasks_sampled": ", ".join(not_train) or "none",
                  "copies_of_eval_tasks_sampled": MetadataValue.md(markdown_table(
                      [{"train task": a, "eval task": b, "same": same} for a, b, same in copies],
                      ("train task", "eval task", "same"))) if copies else "none",
                  "near_duplicate_pairs_in_set": len(split.near_duplicates)},
    )


def _gradability_metadata(task_set: TaskSet, proven_now: int) -> dict:
    """How many tasks may be sampled and evaluated, and why the others may not."""
    if not needs_proof(task_set):
        return {"tasks/gradable": "all (a built-in set, proven by the test suite)"}
    rows = [{"task": task_id, "why it is left out": reason} for task_id, reason in sorted(task_set.unusable.items())]
    return {"tasks/usable": len(task_set) - len(rows), "tasks/unusable": len(rows), "tasks/proven_this_run": proven_now,
            "unusable_tasks": MetadataValue.md(markdown_table(rows, ("task", "why it is left out")) if rows else "none")}


@asset(**ITERATION, kinds={"parquet"})
def trajectories(
    context: AssetExecutionContext, crucible: CrucibleResource, verified_rollouts: list[VerifiedRollout]
) -> MaterializeResult:
    """The iteration's samples as one atomically written Parquet partition."""
    iteration = this_iteration(context, crucible)
    name, number, store = iteration.name, iteration.number, crucible.store()
    with failure_policy(store), timed_stage(store, name, number, "trajectories"):
        table = rows_to_table("trajectories", [trajectory_row(v, iteration.number) for v in verified_rollouts])
        # A re-run replaces the partition, but never deletes what a checkpoint's lineage names.
        path = store.write_partition("trajectories", name, number, table,
                                     keep=Checkpoints(crucible, name).trained_on(number))
    return MaterializeResult(
        metadata={"path": MetadataValue.path(store.uri_of(path)), "rows": table.num_rows}
    )


@asset(**ITERATION, deps=["iteration_rewards"])
def parent_checkpoint(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Checkpoint N-1, the one iteration N trains from, once its training step has ended: where
    iterations overlap (`max_staleness` ≥ 1) another run is making it beside this one, and this
    step waits for it outside the `training` pool (assets/parent_wait.py)."""
    iteration = this_iteration(context, crucible)
    name, number, store = iteration.name, iteration.number, crucible.store()
    with failure_policy(store), timed_stage(store, name, number, "parent_checkpoint"):
        waited = wait_for_parent(context.instance, Checkpoints(crucible, name), number)
    if waited >= POLL_S:
        context.log.info(f"waited {waited:.0f} s for checkpoint {number - 1}'s training step")
    return MaterializeResult(metadata={"parent_iteration": number - 1, "waited_s": round(waited, 1)})


STABILITY_CHECKS = {
    "training_finite": ("loss, gradients and weights are finite; otherwise no iteration samples from "
                        "this checkpoint", True),
    "training_not_diverged": ("the step moved the policy at most monitors.max_step_kl from the one that "
                              "sampled its data; otherwise no iteration samples from this checkpoint", True),
    "entropy_not_collapsed": ("mean token entropy stays above monitors.min_entropy_ratio of the first "
                              "iteration's", False),
    "tamper_rate_not_rising": ("the share of tampered submissions rises at most monitors.max_tamper_rise", False),
    LINEAGE_CHECK: (LINEAGE_CHECK_DESCRIPTION, False),  # assets/lineage_check.py
}


def not_judged() -> list[Verdict]:
    """The stability checks of a step that took no optimizer step. A step reporting through Pipes
    must yield a result for every check it declares (Dagster's typed event stream), so each says
    it was not run rather than leaving the UI's "skipped"."""
    return [Verdict(name, "warn", True, f"not run: {NOTHING_LEARNED}")
            for name in STABILITY_CHECKS if name != LINEAGE_CHECK]


@asset(
    # iteration_rewards (assets/analytics.py) judges the samples first: its failed error checks stop the step.
    **ITERATION, deps=[trajectories, "iteration_rewards", parent_checkpoint], kinds={"pytorch"}, pool=TRAINING,
    # Retried when its job died or lost a connection (assets/training_step.py), resuming from its saved
    # progress; as patient as any step with storage that does not answer (assets/failure_policy.py).
    retry_policy=RetryPolicy(max_retries=STORAGE_RETRIES, delay=STORAGE_RETRY_WAIT_S),
    check_specs=[AssetCheckSpec(name, asset="checkpoint", description=text, blocking=blocking)
                 for name, (text, blocking) in STABILITY_CHECKS.items()],
)
def checkpoint(
    context: AssetExecutionContext, crucible: CrucibleResource, training_step: TrainingStepClient
) -> MaterializeResult:
    """The training step on this iteration's trajectories, from the policy that sampled them, in
    a process or container of its own (assets/train_process.py, through the Dagster Pipes client
    of assets/training_step.py); then the stability monitors, as asset checks, on the new
    checkpoint."""
    iteration = this_iteration(context, crucible)
    name, number, store = iteration.name, iteration.number, crucible.store()
    checkpoints = Checkpoints(crucible, name)
    with failure_policy(store):  # read before the step writes anything
        replaced = checkpoints.recorded_hash(number)  # None: a first training step
        later = checkpoints.later_trained(number)
    with failure_policy(store), timed_stage(store, name, number, "checkpoint"):
        job = train_job(iteration, crucible)
        with gpu_released():
            invocation = training_step.run(context, crucible, extras={"job": job.model_dump(mode="json")})
        steps = step_messages(invocation.get_custom_messages())
        reported = invocation.get_materialize_result().metadata or {}
        record = judge_step(iteration, crucible, job)
        if not record.learned:
            context.log.info(NOTHING_LEARNED)
        store.write_partition("checkpoints", name, number, rows_to_table("checkpoints", [record.row]))
        step_rows = [{**{key: m[key] for key in TRAINING_STEPS.names}, "tokens": int(m["tokens"])} for m in steps]
        store.write_partition("training_steps", name, number, rows_to_table("training_steps", step_rows))
        for dataset in ("checkpoints", "training_steps"):
            report_stored(context, store, dataset, name, number)
    if replaced not in (None, record.row["content_hash"]):
        report_off_lineage(context.instance, name, f"the re-run of iteration {number}", number + 1, later)
    return MaterializeResult(
        metadata={
            **reported,
            "path": MetadataValue.path(job.out_dir),
            "parent_hash": job.lineage["parent"]["content_hash"],
            "lineage": MetadataValue.json({k: v for k, v in job.lineage.items() if k != "settings"}),
            "signals": MetadataValue.md(markdown_table([record.signals], tuple(record.signals))),
            "steps": MetadataValue.md(markdown_table(step_rows, STEP_STATS) if step_rows else "no optimizer step"),
        },
        check_results=[*(check_result(v) for v in record.verdicts or not_judged()), AssetCheckResult(
            check_name=LINEAGE_CHECK, passed=True, severity=AssetCheckSeverity.WARN,
            description=f"trained from checkpoint {number - 1} as it is now ({job.lineage['parent']['content_hash'][:12]})")],
    )


@asset(**ITERATION, deps=[checkpoint], pool=SAMPLING)
def checkpoint_eval(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Pass rate of the new checkpoint on the held-out split, with its standard error, against
    the base policy's on the same tasks (stored as iteration 0, evaluated again after a rebuild),
    and the curve across iterations; then the experiment's trackers (`report_to`) are told."""
    iteration = this_iteration(context, crucible)
    store, name, number = crucible.store(), iteration.name, iteration.number
    with failure_policy(store):
        with timed_stage(store, name, number, "checkpoint_eval"):
            evaluated = Evaluation(iteration, crucible, context.log.info).run()
        report_stored(context, store, "evaluations", name, number)
        curve = held_out.held_out_curve(iteration, crucible.storage_root)
        blanked = held_out.feedback_curve(iteration, crucible.storage_root)
    now, gain = curve[-1], curve[-1]["improvement_in_stderrs"]
    context.log.info(f"held-out pass rate {now['pass_rate']:.3f} ± {now['stderr']:.3f} "
                     f"({now['improvement']:+.3f} over the base policy, {gain:+.1f} standard errors)")
    blind = blanked[-1] if blanked and blanked[-1]["iteration"] == number else None
    if blind:
        context.log.info(f"with observations blanked: {blind['blanked_pass_rate']:.3f}; what feedback is worth: "
                         f"{blind['feedback_gap']:+.3f} ± {blind['feedback_gap_stderr']:.3f}")
    report_to_trackers(context, crucible, iteration.experiment)
    return MaterializeResult(
        metadata={
            "eval_pass_rate": now["pass_rate"], "eval_stderr": now["stderr"], "eval_tasks": now["tasks"],
            "eval_samples": sum(row["observations"] == "shown" for row in evaluated), "eval_samples_scored": now["samples"], "base_pass_rate": curve[0]["pass_rate"],
            "improvement": now["improvement"], "improvement_stderr": now["improvement_stderr"],
            "improvement_in_stderrs": gain if math.isfinite(gain) else MetadataValue.text(
                f"{gain} (every task moved by the same amount)"),
            **(_feedback_metadata(blind) if blind else {}),
            "curve": MetadataValue.md(png_markdown("held-out pass rate", eval_curve_png(
                iteration.experiment.name, [(p["iteration"], p["pass_rate"], p["stderr"]) for p in curve],
                [(p["iteration"], p["blanked_pass_rate"], p["blanked_stderr"]) for p in blanked]))),
        }
    )


def _feedback_metadata(blind: dict) -> dict:
    """The blanked evaluation of this iteration, beside the normal one: what feedback is worth."""
    gap = blind["feedback_gap_in_stderrs"]
    return {"blanked_pass_rate": blind["blanked_pass_rate"], "feedback_gap": blind["feedback_gap"],
            "feedback_gap_stderr": blind["feedback_gap_stderr"],
            "feedback_gap_in_stderrs": gap if math.isfinite(gap) else MetadataValue.text(f"{gap} (every task moved "
                                                                                            "by the same amount)")}
