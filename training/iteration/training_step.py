"""The training step's side of an iteration: the job (its stored trajectories, from the previous
checkpoint), and afterwards its health signals judged against the experiment's monitors and
stored as the `checkpoints` row. The step itself runs in a process of its own (training/rl/step.py)."""

from __future__ import annotations

from dataclasses import dataclass

from datastore import catalog, metrics
from training.evaluation.monitors import (
    SAMPLE_SIGNALS,
    TRAINER_SIGNALS,
    Verdict,
    blocking_failures,
    judge,
    weights_are_finite,
)
from training.iteration.context import Environment, IterationRef, Refused
from training.iteration.lineage import Checkpoints
from training.iteration.tasks import usable_task_set
from training.policy.checkpoint import verify_checkpoint
from training.policy.lineage import lineage
from training.rl.job import TrainJob

NOTHING_LEARNED = "0 optimizer steps (no group had a reward spread): checkpoint = parent, monitors skipped"


@dataclass(frozen=True)
class StepRecord:
    """What the training step left: its health signals, the monitors' verdicts on them, and the
    `checkpoints` row."""

    signals: dict[str, float | None]
    verdicts: list[Verdict]  # none when nothing was learned
    row: dict
    learned: bool  # an optimizer step ran: else the checkpoint is its parent


def train_job(ref: IterationRef, env: Environment) -> TrainJob:
    """The training step on the iteration's stored trajectories, from the previous checkpoint (which
    sampled them, or, within the experiment's max_staleness, an older one did)."""
    parent_dir, parent_hash = Checkpoints(env, ref.name).trained_from(ref.number)
    store, experiment = env.store(), ref.experiment
    # The exact files (datastore/store.py never rewrites one): what lineage names is what is read.
    trajectory_files = store.partition_files("trajectories", experiment.name, ref.number)
    return TrainJob(
        parent_dir=str(parent_dir), out_dir=str(env.checkpoint_dir(experiment.name, ref.number)),
        storage_root=env.storage_root, trajectory_files=trajectory_files, grpo=experiment.grpo,
        temperature=experiment.temperature,
        reference_dir=str(env.base_policy_dir(experiment.name)) if experiment.grpo.kl_coef else None,
        # Where the experiment reports its numbers changes no weight: not part of the settings' hash.
        lineage=lineage(parent_dir, parent_hash, trajectory_files, samplers(ref, env, trajectory_files, parent_hash),
                        usable_task_set(env, experiment).version,
                        experiment.model_dump(mode="json", exclude={"report_to"})),
    )


def samplers(ref: IterationRef, env: Environment, trajectory_files: list[str], parent_hash: str) -> list[dict]:
    """The checkpoints that sampled the trajectories ({iteration, content_hash}, oldest first),
    refused unless each is at most the experiment's max_staleness steps behind the checkpoint the
    step trains from (`parent_hash`, iteration N-1, whose lineage `trained_from` has checked), and
    is that checkpoint as it is now."""
    number, most = ref.number, ref.experiment.max_staleness
    table = env.store().read_files("trajectories", trajectory_files, ["policy_iteration", "policy_version"])
    # A row stored before rows named their sampler's iteration was sampled by the previous one.
    used = sorted({(number - 1 if iteration is None else iteration, str(version)) for iteration, version
                   in zip(table["policy_iteration"].to_pylist(), table["policy_version"].to_pylist())})
    checkpoints = Checkpoints(env, ref.name)
    for iteration, version in used:
        if not number - 1 - most <= iteration <= number - 1:
            raise Refused(f"iteration {number}'s trajectories were sampled by checkpoint {iteration}, "
                          f"{number - 1 - iteration} training steps behind checkpoint {number - 1} that it trains "
                          f"from, and the experiment's max_staleness is {most}: materialize iteration {number} again "
                          "from its rollouts.")
        now = parent_hash if iteration == number - 1 else checkpoints.hash_as_trained_from(iteration)
        if version != now:
            raise Refused(f"iteration {number}'s trajectories were sampled by {version[:12]}, not by checkpoint "
                          f"{iteration} as it is now ({now[:12]}): materialize iteration {number} again from its "
                          "rollouts.")
    return [{"iteration": iteration, "content_hash": version} for iteration, version in used]


def judge_step(ref: IterationRef, env: Environment, job: TrainJob) -> StepRecord:
    """The step's health signals (the trainer's metrics beside the `iteration_rewards` row of
    exactly the trajectory files it trained on), the monitors' verdicts, and the `checkpoints` row."""
    manifest = verify_checkpoint(job.out_dir)
    trained_on = catalog.connect(env.storage_root, pinned={"trajectories": job.trajectory_files})
    [rewards] = metrics.of_iteration(trained_on, "iteration_rewards", ref.name, ref.number)
    trainer = manifest["metrics"]
    signals = {**{key: None if trainer[key] is None else float(trainer[key]) for key in TRAINER_SIGNALS},
               **{key: rewards[key] for key in SAMPLE_SIGNALS}}
    # No optimizer step (no group had a reward spread): the checkpoint is its parent, and a
    # monitor would judge numbers nothing measured, so none runs.
    learned = trainer["optimizer_steps"] > 0
    verdicts = judge(signals, Checkpoints(env, ref.name).history(ref.number), weights_are_finite(job.out_dir),
                     ref.experiment.monitors) if learned else []
    parent = job.lineage["parent"]
    row = {
        "path": job.out_dir, "content_hash": manifest["content_hash"],
        "parent_path": parent["path"], "parent_hash": parent["content_hash"],
        "trajectories": job.trajectory_files, "samplers": job.lineage["samplers"],
        "task_set_version": job.lineage["task_set_version"],
        "config_hash": job.lineage["config_hash"], "code_version": job.lineage["code_version"],
        "global_step": manifest["global_step"], **signals,
        "train_tokens": trainer["tokens"], "tokens_per_s": trainer["tokens_per_s"],
        "logprob_mismatch": trainer.get("logprob_mismatch"),
        "blocked": bool(blocking_failures(verdicts)),
        "monitor_messages": [f"{v.check}: {'ok' if v.passed else v.severity}: {v.message}" for v in verdicts]
        if learned else [NOTHING_LEARNED],
    }
    return StepRecord(signals, verdicts, row, learned)
