"""One RL iteration's rules, without Dagster: the assets (assets/iteration.py) load their inputs,
call these, and attach metadata.

- Iteration N samples from checkpoint N-1 (the base policy for N = 1), verified by its content
  hash. Refused: a checkpoint whose blocking stability checks failed, one that is not what
  iteration N-1's training step recorded (another run replaced it), and one whose lineage no
  longer holds: some training step before it started from a checkpoint since replaced (a re-run
  of an earlier iteration, a rebuilt base policy) (`policy`). The training step refuses
  trajectories another policy sampled (`train_job`), and the evaluation a checkpoint other than
  the one its training step recorded, or off its lineage (`evaluate`).
- Every random choice of an iteration comes from one seed (`seed`): which train tasks it
  samples, the rollouts, the order of dynamic sampling's reserve, the re-graded share.
  Evaluation samples with the experiment's seed alone, so every checkpoint meets the same draws.
- Every sample is graded in a fresh sandbox through the sandbox pool (`grade`); dynamic sampling
  refills the batch while too few groups carry a learning signal, and a share of the
  submissions is graded twice to measure how reproducible verdicts are (`verify`).
- After the training step, its health signals are the trainer's metrics beside the iteration's
  sample metrics (datastore/metrics.py), judged against the experiment's monitors
  (`judge_step`), and stored as the `checkpoints` row.
- Held-out evaluation covers the base policy (iteration 0) first, again whenever the stored
  one evaluated another base policy than the one on disk (`evaluate`).
- Re-grading stores a past iteration's trained-on submissions graded by today's verifier
  beside the original verdicts (`regrade`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Protocol

import torch

from datastore import catalog
from datastore.schema import Observations
from datastore.store import DatasetStore, rows_to_table
from environments.store import EnvironmentStore
from grading.gradability import ProofLedger, prove, unproven, with_proofs
from grading.reproducibility import Agreement, agreement, regrade_sample
from grading.rewards import Process
from grading.submission import grade_solution, sandbox_spec
from grading.verdict import GradeResult
from sandbox.base import Session
from sandbox.pool import SandboxPool
from statuses import RewardStatus
from task_sets.loader import TaskSet, load_task_set
from task_sets.schema import Task, TaskBase
from training.agent.dynamic_sampling import Refilled, refill
from training.agent.episodes import MAX_LIVE, EpisodeLimits, as_rollout, run_episodes
from training.agent.rollout import TASKS_PER_CALL, Rollout, sample_rollouts
from training.agent.trajectory import VerifiedRollout, evaluation_row, regrade_row
from training.evaluation.monitors import (
    SAMPLE_SIGNALS,
    TRAINER_SIGNALS,
    Verdict,
    blocking_failures,
    judge,
    weights_are_finite,
)
from training.experiment import ExperimentConfig
from training.inference.engine import InferenceEngine, SamplingParams
from training.inference.engines import open_engine
from training.policy.checkpoint import CheckpointError, verify_checkpoint
from training.policy.lineage import lineage
from training.progress import ProgressLines
from training.rl.step import TrainJob

NOTHING_LEARNED = "0 optimizer steps (no group had a reward spread): checkpoint = parent, monitors skipped"
SEED_STRIDE = 100_003  # a prime: experiments' seeds never collide for the first 100k iterations


class Refused(Exception):
    """The iteration cannot go on; the message says why in one sentence, and what to do."""


class Environment(Protocol):
    """Where an experiment's data and checkpoints live and how its code is sandboxed (the
    `crucible` resource is one)."""

    storage_root: str
    task_sets: str  # the imported task-set library
    sandbox_backend: str  # where tasks are graded: what their proofs of gradability are for

    def store(self) -> DatasetStore: ...
    def sandbox_pool(self, is_infra_failure: Callable[[object], bool], shares: int = 1) -> SandboxPool: ...
    def open_session(self, task: Task, previous: Session | None = None, /) -> Session: ...
    def checkpoint_dir(self, experiment: str, iteration: int) -> Path: ...
    def environment_store(self) -> EnvironmentStore: ...
    def base_policy_dir(self, experiment: str) -> Path: ...


@dataclass(frozen=True)
class Graded:
    grade: GradeResult
    verify_s: float  # grading wall time: sandbox set-up, tests, report parsing
    queue_s: float  # from handing it to the sandbox pool until the grading that counted began


@dataclass(frozen=True)
class Regrade:
    reward_version: str
    rows: list[dict]  # of the `regrades` dataset
    verdicts_changed: int  # samples whose `passed` differs from the original grading's


def slices(items: list, count: int) -> list[list]:
    """`items` in `count` contiguous slices (fewer if there are fewer items), as even as they
    allow; none is empty."""
    count = min(count, len(items))
    bounds = [len(items) * i // count for i in range(count + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(count)]


@dataclass(frozen=True)
class Verification:
    graded: Refilled[VerifiedRollout]
    regraded: Agreement


@dataclass(frozen=True)
class StepRecord:
    """What the training step left: its health signals, the monitors' verdicts on them, and the
    `checkpoints` row."""

    signals: dict[str, float | None]
    verdicts: list[Verdict]  # none when nothing was learned
    row: dict
    learned: bool  # an optimizer step ran: else the checkpoint is its parent


@dataclass
class Iteration:
    env: Environment
    experiment: ExperimentConfig
    number: int
    log: Callable[[str], None] = print

    @property
    def seed(self) -> int:
        return self.experiment.seed * SEED_STRIDE + self.number

    @property
    def group_prefix(self) -> str:
        """What the iteration's group ids start with (`<experiment>-<NNNN>`)."""
        return f"{self.experiment.name}-{self.number:04d}"

    @cached_property
    def ledger(self) -> ProofLedger:
        """The proofs of gradability of the environment store tasks are built in."""
        return ProofLedger(self.env.environment_store())

    @cached_property
    def loaded_task_set(self) -> TaskSet:
        """The experiment's set as its files have it, every task included."""
        return load_task_set(self.experiment.task_set, Path(self.env.task_sets))

    @cached_property
    def task_set(self) -> TaskSet:
        """The set iterations sample and evaluate: its tasks not proven gradable on this
        backend are left out of its splits (grading/gradability.py; `prove_unproven` first)."""
        return with_proofs(self.loaded_task_set, self.env.sandbox_backend, self.ledger)

    def prove_unproven(self) -> int:
        """Prove the set's tasks that have no proof on this backend yet: their reference and
        wrong submissions graded in their built environments. How many there were."""
        pending = unproven(self.loaded_task_set, self.env.sandbox_backend, self.ledger)
        if pending:
            self.log(f"proving {len(pending)} task(s) of {self.loaded_task_set.name!r} gradable on the "
                     f"{self.env.sandbox_backend} backend: reference and wrong submissions")
            with self.env.sandbox_pool(is_infra_failure=lambda g: g.reward_status is RewardStatus.INFRA_ERROR) as pool:
                prove(pending, self.env.sandbox_backend, pool, self.ledger, progress=self.log)
        return len(pending)

    def sample_tasks(self) -> list[TaskBase]:
        """The train tasks this iteration samples: a seeded subset when the experiment asks for one."""
        tasks = self.experiment.rl_tasks(self.task_set)
        wanted = self.experiment.tasks_per_iteration
        return random.Random(self.seed).sample(tasks, wanted) if wanted and wanted < len(tasks) else tasks

    def task_rows(self, sampled: list[TaskBase]) -> list[dict]:
        """The `tasks` dataset: every task of the set, train and eval, as this iteration saw it."""
        chosen = {task.id for task in sampled}
        return [{"task_id": task.id, "task_version": task.version, "task_set": self.task_set.name,
                 "task_set_version": self.task_set.version, "kind": task.kind, "split": task.split,
                 "difficulty": task.difficulty, "family": task.family, "domain": task.domain, "prompt": task.prompt,
                 "starting_files": sorted(task.files), "network": task.network, "wall_s": task.limits.wall_s,
                 "sampled": task.id in chosen} for task in self.task_set]

    def policy(self) -> tuple[Path, str]:
        """The checkpoint this iteration samples from, verified, and its content hash."""
        number = self.number
        policy_dir, content_hash = self._checkpoint(number - 1, f"iteration {number} samples from")
        record = self._trained(number - 1, content_hash, f"iteration {number} would sample from it")
        self._lineage_holds(number - 1)
        if record and record["blocked"]:
            failed = [m for m in record["monitor_messages"] if ": error: " in m]
            raise Refused(f"iteration {number} would sample from checkpoint {number - 1}, which failed its "
                          f"stability checks ({'; '.join(failed)}). Change the settings and materialize "
                          f"iteration {number - 1} again.")
        return policy_dir, content_hash

    def _checkpoint(self, iteration: int, use: str) -> tuple[Path, str]:
        """Checkpoint `iteration` (0: the base policy), verified, and its content hash."""
        directory = self.env.checkpoint_dir(self.experiment.name, iteration)
        try:
            return directory, verify_checkpoint(directory)["content_hash"]
        except CheckpointError as error:
            raise Refused(f"{use} checkpoint {iteration}, which is not usable: {error}. Materialize iteration "
                          f"{iteration} (or the experiment's base_policy) first.") from None

    def _lineage_holds(self, last: int) -> None:
        """Refused unless every training step up to checkpoint `last` started from the checkpoint
        before it as that one now is (its recorded hash; the base policy's on disk): a re-run of an
        earlier iteration, or a rebuilt base policy, leaves the later checkpoints on another
        lineage, and sampling from or evaluating them would mix the two."""
        _, expected = self._checkpoint(0, f"checkpoint {last} descends from")
        for iteration in range(1, last + 1):
            record = self._record(iteration, f"checkpoint {last} descends from it")
            if record["parent_hash"] != expected:
                raise Refused(f"checkpoint {iteration} was trained from checkpoint {iteration - 1} as it was "
                              f"({str(record['parent_hash'])[:12]}), which has since been replaced ({expected[:12]}): "
                              f"materialize iterations {iteration} to {self.number} again, in order.")
            expected = record["content_hash"]

    def _record(self, iteration: int, use: str) -> dict:
        """The `checkpoints` row of `iteration`'s training step."""
        store, experiment = self.env.store(), self.experiment.name
        if not store.has_partition("checkpoints", experiment, iteration):
            raise Refused(f"checkpoint {iteration} has no record of the training step that made it (its "
                          f"stability checks never ran), and {use}: materialize iteration {iteration}'s checkpoint "
                          "again.")
        [record] = store.read_partition("checkpoints", experiment, iteration).to_pylist()
        return record

    def recorded_hash(self) -> str | None:
        """The content hash this iteration's last training step recorded, if it has one."""
        store, experiment = self.env.store(), self.experiment.name
        if not store.has_partition("checkpoints", experiment, self.number):
            return None
        files = store.partition_files("checkpoints", experiment, self.number)
        return store.read_files("checkpoints", files, ["content_hash"])["content_hash"][0].as_py()

    def _trained(self, iteration: int, content_hash: str, use: str) -> dict | None:
        """The `checkpoints` row of `iteration`'s training step (None for the base policy),
        refused unless it names the checkpoint `content_hash` that is on disk now."""
        if iteration == 0:
            return None
        record = self._record(iteration, use)
        if record["content_hash"] != content_hash:
            raise Refused(f"checkpoint {iteration} on disk is {content_hash[:12]}, not {str(record['content_hash'])[:12]} "
                          f"that iteration {iteration}'s training step recorded (another run, or a failed attempt, "
                          f"replaced it), and {use}: materialize iteration {iteration}'s checkpoint again.")
        return record

    def engine(self, checkpoint: tuple[Path, str] | None = None, threads: int | None = None) -> InferenceEngine:
        """The experiment's engine, sampling `checkpoint` (directory, content hash; default: the
        policy this iteration samples from), on `threads` CPU threads (None: every core)."""
        policy_dir, content_hash = checkpoint or self.policy()
        experiment = self.experiment
        return open_engine(experiment.engine, policy_dir, content_hash, server=experiment.server,
                           vllm=experiment.vllm, max_model_len=experiment.episode_max_tokens,
                           observation_role=experiment.observation_role, threads=threads, log=self.log)

    def rollout_params(self) -> SamplingParams:
        return SamplingParams(n=self.experiment.samples_per_task, max_new_tokens=self.experiment.max_new_tokens,
                              temperature=self.experiment.temperature, seed=self.seed)

    def sample(self, engine: InferenceEngine, tasks: list[TaskBase], params: SamplingParams,
               group_prefix: str, blanked: bool = False) -> list[Rollout]:
        """Single replies, or multi-turn episodes in sandbox sessions when the experiment allows
        turns (`blanked`: their observations hidden from the policy)."""
        experiment = self.experiment
        if experiment.max_turns == 1:
            return sample_rollouts(engine, engine.chat, tasks, params, group_prefix,
                                   progress=ProgressLines(self.log, "sampled {done}/{total} tasks"),
                                   system=self.task_set.system_message)
        limits = EpisodeLimits(max_turns=experiment.max_turns, max_tokens=experiment.episode_max_tokens,
                               command_timeout_s=experiment.command_timeout_s)
        episodes = run_episodes(engine, engine.chat, tasks, params, limits, self.env.open_session, group_prefix,
                                progress=ProgressLines(self.log, "episodes: {done}/{total} ended"),
                                system=self.task_set.system_message, blanked=blanked)
        return [as_rollout(episode, engine.chat) for episode in episodes]

    def shards(self, tasks: list[TaskBase]) -> list[list[TaskBase]]:
        """The sampled tasks in `rollout_shards` slices (a task's group stays in one)."""
        return slices(tasks, self.experiment.rollout_shards)

    def sample_shard(self, tasks: list[TaskBase], shard: int, shards: int,
                     checkpoint: tuple[Path, str]) -> list[Rollout]:
        """Shard `shard` of `shards`: its samples from `checkpoint` (directory, content hash), by an
        engine of its own. With several shards each samples on its share of the cores, however
        many run at once, so its samples do not depend on that; one samples as an unsharded
        iteration does."""
        if shards == 1:
            return self.sample(self.engine(checkpoint), tasks, self.rollout_params(), self.group_prefix)
        threads, before = max(1, len(os.sched_getaffinity(0)) // shards), torch.get_num_threads()
        self.log(f"shard {shard + 1}/{shards}: {len(tasks)} tasks on {threads} of the CPU threads")
        try:
            engine = self.engine(checkpoint, threads=threads)
            return self.sample(engine, tasks, self.rollout_params(), self.group_prefix)
        finally:  # the process's later steps (in one process, all of a run's) keep their threads
            torch.set_num_threads(before)

    def grade(self, work: list[tuple[TaskBase, Rollout]], shares: int = 1) -> list[VerifiedRollout]:
        """Every (task, rollout) graded in its own fresh sandbox (see `grade_submissions`); `shares`:
        this is one of that many slices graded at once, each with its share of the sandbox slots."""
        submissions = [(task, rollout.solution, Process(turns=max(1, len(rollout.turns)), tokens=rollout.sampled_tokens))
                       for task, rollout in work]
        return [VerifiedRollout(rollout, task, graded.grade, verify_s=graded.verify_s, queue_s=graded.queue_s)
                for (task, rollout), graded in zip(work, self.grade_submissions(submissions, shares))]

    def grade_submissions(self, work: list[tuple[TaskBase, str, Process]], shares: int = 1) -> list[Graded]:
        """Every (task, submission, how it was made) graded in its own fresh sandbox through the
        sandbox pool (admission by CPU slots, retries of infrastructure failures on a fresh
        sandbox), scored with the task set's reward function; in the order given."""
        reward = self.task_set.reward
        handed_over = time.perf_counter()

        def verify(sandbox, item: tuple[TaskBase, str, Process]) -> Graded:
            task, solution, process = item
            started = time.perf_counter()
            grade = grade_solution(task, solution, sandbox, reward, process)
            return Graded(grade, verify_s=time.perf_counter() - started, queue_s=started - handed_over)

        graded, progress = [], ProgressLines(self.log, "graded {done}/{total}")
        with self.env.sandbox_pool(is_infra_failure=lambda g: g.grade.reward_status is RewardStatus.INFRA_ERROR,
                                   shares=shares) as pool:
            store = self.env.environment_store()
            for done, result in enumerate(pool.map(lambda item: sandbox_spec(item[0], store), verify, work), start=1):
                graded.append(result)
                progress(done, len(work))
        if pool.retries or pool.quarantined:
            self.log(f"sandbox pool: {pool.retries} retries, quarantined: {pool.quarantined}")
        return graded

    def regrade(self) -> Regrade:
        """The submissions this iteration's checkpoint trained on (before its training step: the
        stored trajectories) graded again, in fresh sandboxes, by the task set's grader and reward
        function as they are now."""
        store, name, number = self.env.store(), self.experiment.name, self.number
        try:
            files = self.trained_on() or store.partition_files("trajectories", name, number)
        except FileNotFoundError:
            raise Refused(f"iteration {number} has no stored trajectories to re-grade: materialize it first.") from None
        tasks = {task.id: task for task in self.task_set}
        rows = [{**row, "trajectory_file": file} for file in files for row in store.read_files(
            "trajectories", [file], ["task_id", "group_id", "sample_index", "patch", "turns", "passed", "reward",
                                     "reward_version"]
        ).to_pylist()]
        missing = sorted({row["task_id"] for row in rows} - tasks.keys())
        if missing:
            raise Refused(f"the task set {self.task_set.name!r} no longer has task(s) {', '.join(missing[:5])} that "
                          f"iteration {number} answered, so they cannot be graded again.")
        graded = self.grade_submissions([(tasks[row["task_id"]], row["patch"] or "",
                                          Process(turns=len(row["turns"]),
                                                  tokens=sum(turn["sampled_tokens"] for turn in row["turns"])))
                                         for row in rows])
        now = datetime.now(timezone.utc)
        return Regrade(self.task_set.reward.version,
                       [regrade_row(row, tasks[row["task_id"]], g.grade, row["trajectory_file"], now)
                        for row, g in zip(rows, graded)],
                       verdicts_changed=sum(row["passed"] != g.grade.passed for row, g in zip(rows, graded)))

    @staticmethod
    def grading_work(sampled: list[TaskBase], rollouts: list[Rollout]) -> list[tuple[TaskBase, Rollout]]:
        """Each rollout with its task, in the rollouts' order: what `grade` takes, whole or in slices."""
        tasks = {task.id: task for task in sampled}
        return [(tasks[r.task_id], r) for r in rollouts]

    def verify(self, sampled: list[TaskBase], rollouts: list[Rollout], group_prefix: str,
               graded: list[VerifiedRollout]) -> Verification:
        """Given every rollout graded (`grade` on `grading_work`, in one go or in slices), refill
        while too few groups carry a signal, and grade a seeded share of them again."""
        work = self.grading_work(sampled, rollouts)
        if [(v.rollout.group_id, v.rollout.sample_index) for v in graded] != [(r.group_id, r.sample_index)
                                                                             for r in rollouts]:
            raise ValueError("the grades given are not of these rollouts, in their order")
        refilled = self._refill(sampled, graded, group_prefix)
        again = regrade_sample(len(work), self.experiment.regrade_fraction, self.seed)
        second = self.grade([work[i] for i in again]) if again else []
        regraded = agreement([work[i][0].id for i in again], [refilled.graded[i].grade for i in again],
                             [v.grade for v in second])
        return Verification(refilled, regraded)

    def _refill(self, sampled: list[TaskBase], verified: list[VerifiedRollout],
                group_prefix: str) -> Refilled[VerifiedRollout]:
        """Dynamic sampling: more train tasks, from the same policy, while too few groups have a
        reward spread (training/agent/dynamic_sampling.py)."""
        taken = {task.id for task in sampled}
        reserve = [task for task in self.experiment.rl_tasks(self.task_set) if task.id not in taken]
        random.Random(self.seed).shuffle(reserve)
        engine: InferenceEngine | None = None  # opened on the first refill round only

        def sample_and_grade(tasks: list[TaskBase], round_: int) -> list[VerifiedRollout]:
            nonlocal engine
            self.log(f"dynamic sampling round {round_}: {len(tasks)} more tasks")
            engine = engine or self.engine()
            samples = self.sample(engine, tasks, self.rollout_params(), f"{group_prefix}/refill{round_}")
            by_id = {task.id: task for task in tasks}
            return self.grade([(by_id[s.task_id], s) for s in samples])

        def group_reward(v: VerifiedRollout) -> tuple[str, float] | None:
            return (v.rollout.group_id, v.grade.reward) if v.grade.reward_status is RewardStatus.SCORED else None

        target = len(sampled) if self.experiment.refill_rounds else 0
        return refill(verified, reserve, sample_and_grade, group_reward, target, self.experiment.refill_rounds)

    def trained_on(self) -> list[str]:
        """The trajectory files this iteration's checkpoint was trained on, by its lineage ([]
        before its training step): a re-run of the iteration's sampling must keep them."""
        store, name = self.env.store(), self.experiment.name
        if not store.has_partition("checkpoints", name, self.number):
            return []
        return store.read_partition("checkpoints", name, self.number)["trajectories"].to_pylist()[0] or []

    def later_trained(self) -> list[int]:
        """The experiment's later iterations that have a training step on record: a re-run of this
        one leaves them on a lineage whose start it replaced."""
        return [number for number in self.env.store().iterations("checkpoints", self.experiment.name)
                if number > self.number]

    def train_job(self) -> TrainJob:
        """The training step on this iteration's stored trajectories, from the policy that sampled them."""
        parent_dir, parent_hash = self.policy()
        store, experiment = self.env.store(), self.experiment
        # The exact files (datastore/store.py never rewrites one): what lineage names is what is read.
        trajectory_files = store.partition_files("trajectories", experiment.name, self.number)
        samplers = sorted(set(store.read_files("trajectories", trajectory_files, ["policy_version"])
                              ["policy_version"].to_pylist()), key=str)
        if samplers != [parent_hash]:
            sampled = ", ".join(str(version)[:12] for version in samplers)
            raise Refused(f"iteration {self.number}'s trajectories were sampled by {sampled}, not by checkpoint "
                          f"{self.number - 1} as it is now ({parent_hash[:12]}): materialize iteration {self.number} "
                          "again from its rollouts.")
        return TrainJob(
            parent_dir=str(parent_dir), out_dir=str(self.env.checkpoint_dir(experiment.name, self.number)),
            storage_root=self.env.storage_root, trajectory_files=trajectory_files, grpo=experiment.grpo,
            temperature=experiment.temperature,
            reference_dir=str(self.env.base_policy_dir(experiment.name)) if experiment.grpo.kl_coef else None,
            # Where the experiment reports its numbers changes no weight: not part of the settings' hash.
            lineage=lineage(parent_dir, parent_hash, trajectory_files, self.task_set.version,
                            experiment.model_dump(mode="json", exclude={"report_to"})),
        )

    def judge_step(self, job: TrainJob) -> StepRecord:
        """The step's health signals (the trainer's metrics beside the `iteration_rewards` row of
        exactly the trajectory files it trained on), the monitors' verdicts, and the
        `checkpoints` row."""
        manifest = verify_checkpoint(job.out_dir)
        trained_on = catalog.connect(self.env.storage_root, pinned={"trajectories": job.trajectory_files})
        [rewards] = catalog.records(trained_on, "SELECT * FROM iteration_rewards WHERE experiment = ? AND "
                                    "iteration = ?", [self.experiment.name, self.number])
        metrics = manifest["metrics"]
        signals = {**{key: None if metrics[key] is None else float(metrics[key]) for key in TRAINER_SIGNALS},
                   **{key: rewards[key] for key in SAMPLE_SIGNALS}}
        # No optimizer step (no group had a reward spread): the checkpoint is its parent, and a
        # monitor would judge numbers nothing measured, so none runs.
        learned = metrics["optimizer_steps"] > 0
        verdicts = judge(signals, self._history(), weights_are_finite(job.out_dir),
                         self.experiment.monitors) if learned else []
        parent = job.lineage["parent"]
        row = {
            "path": job.out_dir, "content_hash": manifest["content_hash"],
            "parent_path": parent["path"], "parent_hash": parent["content_hash"],
            "trajectories": job.trajectory_files, "task_set_version": job.lineage["task_set_version"],
            "config_hash": job.lineage["config_hash"], "code_version": job.lineage["code_version"],
            "global_step": manifest["global_step"], **signals,
            "train_tokens": metrics["tokens"], "tokens_per_s": metrics["tokens_per_s"],
            "blocked": bool(blocking_failures(verdicts)),
            "monitor_messages": [f"{v.check}: {'ok' if v.passed else v.severity}: {v.message}" for v in verdicts]
            if learned else [NOTHING_LEARNED],
        }
        return StepRecord(signals, verdicts, row, learned)

    def _history(self) -> list[dict]:
        """The signals of the experiment's earlier iterations, oldest first."""
        store, name = self.env.store(), self.experiment.name
        return [store.read_partition("checkpoints", name, earlier).to_pylist()[0]
                for earlier in range(1, self.number) if store.has_partition("checkpoints", name, earlier)]

    def evaluate(self) -> list[dict]:
        """This iteration's checkpoint on the held-out split, after the base policy's (iteration 0)
        when the experiment has none yet; each stored as its `evaluations` partition."""
        _, content_hash = self._checkpoint(self.number, f"iteration {self.number} evaluates")
        self._trained(self.number, content_hash, "it would be evaluated")
        self._lineage_holds(self.number)
        _, base_hash = self._checkpoint(0, f"iteration {self.number} is compared with")
        if self._evaluated(0) != base_hash:
            self.log("evaluating the base policy first (iteration 0), the baseline of every iteration")
            self._evaluate(0, base_hash)
        if self._evaluated(self.number - 1) == content_hash:
            return self._reuse_evaluation(self.number - 1, content_hash)
        return self._evaluate(self.number, content_hash)

    def _reuse_evaluation(self, earlier: int, content_hash: str) -> list[dict]:
        """Checkpoint `earlier`'s evaluation as this one's: the same weights (a step that took no
        optimizer step copies its parent), so evaluating them again would only cost the time."""
        store, name = self.env.store(), self.experiment.name
        table = store.read_partition("evaluations", name, earlier)
        self.log(f"checkpoint {self.number} is checkpoint {earlier} ({content_hash[:12]}): its held-out "
                 "evaluation is reused, not run again")
        store.write_partition("evaluations", name, self.number, table)
        return table.to_pylist()

    def _evaluated(self, iteration: int) -> str | None:
        """The checkpoint (content hash) that the stored evaluation of `iteration` evaluated."""
        store, name = self.env.store(), self.experiment.name
        if not store.has_partition("evaluations", name, iteration):
            return None
        files = store.partition_files("evaluations", name, iteration)
        versions = set(store.read_files("evaluations", files, ["policy_version"])["policy_version"].to_pylist())
        return versions.pop() if len(versions) == 1 else None

    def _evaluate(self, iteration: int, expected_hash: str | None = None) -> list[dict]:
        """Checkpoint `iteration` on the held-out tasks (refused unless it still is
        `expected_hash`): greedily, or `eval_samples` samples per task at the rollout temperature;
        with `eval_blanked` (episodes), again with every observation hidden from the policy
        (`eval_blanked_samples` per task)."""
        experiment = self.experiment
        policy_dir, content_hash = self._checkpoint(iteration, f"iteration {self.number} evaluates")
        if expected_hash not in (None, content_hash):
            raise Refused(f"checkpoint {iteration} changed during this evaluation (now "
                          f"{content_hash[:12]}, checked {expected_hash[:12]}): materialize iteration {iteration}'s "
                          "evaluation again.")
        engine = self.engine((policy_dir, content_hash))
        tasks = experiment.held_out_tasks(self.task_set)
        greedy = experiment.eval_samples == 1
        params = SamplingParams(n=experiment.eval_samples, max_new_tokens=experiment.max_new_tokens,
                                temperature=0.0 if greedy else experiment.temperature, seed=experiment.seed)
        rows = []
        for observations in self.eval_conditions():
            label = "" if observations is Observations.SHOWN else f" with observations {observations.value}"
            self.log(f"evaluating checkpoint {iteration} on {len(tasks)} held-out tasks{label}")
            blanked = observations is Observations.BLANKED
            draws = dataclasses.replace(params, n=experiment.eval_blanked_samples or params.n) if blanked else params
            rows += self._evaluate_in_chunks(engine, iteration, tasks, draws, observations)
        self.env.store().write_partition("evaluations", experiment.name, iteration, rows_to_table("evaluations", rows))
        return rows

    def _evaluate_in_chunks(self, engine: InferenceEngine, iteration: int, tasks: list[Task], params: SamplingParams,
                            observations: Observations) -> list[dict]:
        """The evaluation rows of `tasks`, a chunk at a time, each stored in `evaluation_chunks`
        as it is graded: a stopped evaluation of the same checkpoint resumes after the chunks it
        finished. A chunk is one generate call's tasks (a wave of episodes), sampled with the
        seed an unchunked evaluation would give it, so chunking changes no sample."""
        store, name, content_hash = self.env.store(), self.experiment.name, engine.policy_version
        episodes = self.experiment.max_turns > 1
        size = max(1, MAX_LIVE // params.n) if episodes else TASKS_PER_CALL
        rows: list[dict] = []
        for start in range(0, len(tasks), size):
            chunk, part = tasks[start : start + size], f"{observations.value}-{start // size:04d}"
            finished = self._finished_chunk(iteration, part, content_hash, chunk, params.n)
            if finished is None:
                # Episodes seed each wave by its first episode's index (run_episodes); single replies
                # seed every call alike (sample_rollouts).
                draws = dataclasses.replace(params, seed=params.seed + start * params.n) if episodes else params
                samples = self.sample(engine, chunk, draws, f"{name}/eval/{iteration}",
                                      blanked=observations is Observations.BLANKED)
                by_id = {task.id: task for task in chunk}
                finished = [evaluation_row(v, observations) for v in self.grade([(by_id[s.task_id], s) for s in samples])]
                store.write_partition("evaluation_chunks", name, iteration, rows_to_table("evaluations", finished),
                                      part=part)
            else:
                self.log(f"checkpoint {iteration}: held-out tasks {start + 1}-{start + len(chunk)} were evaluated "
                         "before this run stopped: kept")
            rows += finished
            self.log(f"checkpoint {iteration}: {start + len(chunk)}/{len(tasks)} held-out tasks evaluated")
        return rows

    def _finished_chunk(self, iteration: int, part: str, content_hash: str, chunk: list[Task],
                        samples: int) -> list[dict] | None:
        """The stored rows of chunk `part` where an earlier evaluation finished it for this
        checkpoint, these tasks and `samples` answers each; None where it must be evaluated."""
        store, name = self.env.store(), self.experiment.name
        if not store.has_partition("evaluation_chunks", name, iteration, part):
            return None
        rows = store.read_partition("evaluation_chunks", name, iteration, part).to_pylist()
        answers = sorted((row["task_id"], row["sample_index"]) for row in rows)
        expected = sorted((task.id, index) for task in chunk for index in range(samples))
        return rows if {row["policy_version"] for row in rows} == {content_hash} and answers == expected else None

    def eval_conditions(self) -> tuple[Observations, ...]:
        """Shown, and blanked as well where the experiment asks for it and its samples are episodes
        (a single reply sees no observation)."""
        blind = self.experiment.eval_blanked and self.experiment.max_turns > 1
        return (Observations.SHOWN, Observations.BLANKED) if blind else (Observations.SHOWN,)

    def feedback_curve(self) -> list[dict]:
        """The `feedback_value` rows of iterations 0..this one (datastore/metrics.py): held-out pass
        rates with observations shown and blanked, paired by task; [] without blanked evaluations."""
        return catalog.records(catalog.connect(self.env.storage_root), "SELECT * FROM feedback_value WHERE "
                               "experiment = ? AND iteration <= ? ORDER BY iteration",
                               [self.experiment.name, self.number])

    def held_out_curve(self) -> list[dict]:
        """The `held_out` rows of iterations 0..this one (datastore/metrics.py), the base policy's
        first; refused unless both it and this iteration have scored samples of a shared task."""
        curve = catalog.records(catalog.connect(self.env.storage_root), "SELECT * FROM held_out WHERE experiment = ? "
                                "AND iteration <= ? ORDER BY iteration", [self.experiment.name, self.number])
        if not curve or curve[0]["iteration"] != 0:
            raise Refused("the base policy's held-out evaluation (iteration 0) has no scored sample: see the "
                          "reward_status of its evaluations, fix the sandbox, and rewrite that partition")
        if curve[-1]["iteration"] != self.number:
            raise Refused(f"no held-out sample of iteration {self.number} was scored: see the reward_status of its "
                          "evaluations")
        if not curve[-1]["paired_tasks"]:
            raise Refused(f"iteration {self.number} and the base policy have no scored held-out task in common")
        return curve
