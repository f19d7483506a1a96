"""Which tasks an iteration may use and which it samples: the experiment's set as imported, its
tasks proven gradable on this backend (grading/gradability.py), and a seeded subset of its train
split."""

from __future__ import annotations

import random
from pathlib import Path

from grading.gradability import ProofLedger, prove, unproven, with_proofs
from grading.verdict import GradeResult
from task_sets.loader import TaskSet, load_task_set
from task_sets.schema import TaskBase
from training.experiment import ExperimentConfig
from training.iteration.context import Environment, IterationRef, Log


def loaded_task_set(env: Environment, experiment: ExperimentConfig) -> TaskSet:
    """The experiment's set as its files have it, every task included."""
    return load_task_set(experiment.task_set, Path(env.task_sets))


def usable_task_set(env: Environment, experiment: ExperimentConfig) -> TaskSet:
    """The set iterations sample and evaluate (see `usable`)."""
    return usable(env, loaded_task_set(env, experiment))


def usable(env: Environment, task_set: TaskSet) -> TaskSet:
    """`task_set` with its tasks not proven gradable on this backend left out of its splits
    (`prove_unproven` first)."""
    return with_proofs(task_set, env.sandbox_backend, ProofLedger(env.environment_store()))


def prove_unproven(env: Environment, task_set: TaskSet, log: Log) -> int:
    """Prove the set's tasks that have no proof on this backend yet: their reference and wrong
    submissions graded in their built environments. How many there were."""
    ledger = ProofLedger(env.environment_store())
    pending = unproven(task_set, env.sandbox_backend, ledger)
    if pending:
        log(f"proving {len(pending)} task(s) of {task_set.name!r} gradable on the {env.sandbox_backend} backend: "
            "reference and wrong submissions")
        with env.sandbox_pool(is_infra_failure=GradeResult.infra_failed) as pool:
            prove(pending, env.sandbox_backend, pool, ledger, progress=log)
    return len(pending)


def sample_tasks(ref: IterationRef, task_set: TaskSet) -> list[TaskBase]:
    """The train tasks the iteration samples: a seeded subset when the experiment asks for one."""
    tasks = ref.experiment.rl_tasks(task_set)
    wanted = ref.experiment.tasks_per_iteration
    return random.Random(ref.seed).sample(tasks, wanted) if wanted and wanted < len(tasks) else tasks


def task_rows(task_set: TaskSet, sampled: list[TaskBase]) -> list[dict]:
    """The `tasks` dataset: every task of the set, train and eval, as the iteration saw it."""
    chosen = {task.id for task in sampled}
    return [{"task_id": task.id, "task_version": task.version, "task_set": task_set.name,
             "task_set_version": task_set.version, "kind": task.kind, "split": task.split,
             "difficulty": task.difficulty, "family": task.family, "domain": task.domain, "prompt": task.prompt,
             "starting_files": sorted(task.files), "network": task.network, "wall_s": task.limits.wall_s,
             "sampled": task.id in chosen} for task in task_set]
