"""How an iteration grades: every submission in a fresh sandbox through the sandbox pool, scored
with the task set's reward function; then dynamic sampling's refills while too few groups carry a
learning signal, and a seeded share graded again to measure how reproducible verdicts are."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from environments.store import EnvironmentStore
from grading.reproducibility import Agreement, agreement, regrade_sample
from grading.rewards import Process
from grading.submission import grade_solution, sandbox_spec
from grading.verdict import GradeResult
from sandbox.pool import SandboxPool
from statuses import RewardStatus
from task_sets.loader import TaskSet
from task_sets.rewards import RewardFunction
from task_sets.schema import TaskBase
from training.agent.dynamic_sampling import Refilled, refill
from training.agent.rollout import Rollout
from training.agent.trajectory import VerifiedRollout
from training.iteration.context import Environment, IterationRef, Log
from training.progress import ProgressLines


@dataclass(frozen=True)
class Graded:
    grade: GradeResult
    verify_s: float  # grading wall time: sandbox set-up, tests, report parsing
    queue_s: float  # from handing it to the sandbox pool until the grading that counted began


@dataclass(frozen=True)
class Grader:
    reward: RewardFunction  # the task set's
    sandbox_pool: Callable[..., SandboxPool]  # (is_infra_failure, shares) -> the deployment's pool
    environments: EnvironmentStore  # where the tasks' environments are built
    log: Log = print

    @classmethod
    def of(cls, env: Environment, task_set: TaskSet, log: Log) -> Grader:
        """`task_set`'s grader, in `env`'s sandbox pool."""
        return cls(task_set.reward, env.sandbox_pool, env.environment_store(), log)

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
        sandbox), scored with the reward function; in the order given."""
        handed_over = time.perf_counter()

        def verify(sandbox, item: tuple[TaskBase, str, Process]) -> Graded:
            task, solution, process = item
            started = time.perf_counter()
            grade = grade_solution(task, solution, sandbox, self.reward, process)
            return Graded(grade, verify_s=time.perf_counter() - started, queue_s=started - handed_over)

        graded, progress = [], ProgressLines(self.log, "graded {done}/{total}")
        with self.sandbox_pool(is_infra_failure=lambda g: g.grade.reward_status is RewardStatus.INFRA_ERROR,
                               shares=shares) as pool:
            for done, result in enumerate(pool.map(lambda item: sandbox_spec(item[0], self.environments), verify, work),
                                          start=1):
                graded.append(result)
                progress(done, len(work))
        if pool.retries or pool.quarantined:
            self.log(f"sandbox pool: {pool.retries} retries, quarantined: {pool.quarantined}")
        return graded


def grading_work(sampled: list[TaskBase], rollouts: list[Rollout]) -> list[tuple[TaskBase, Rollout]]:
    """Each rollout with its task, in the rollouts' order: what `Grader.grade` takes, whole or in slices."""
    tasks = {task.id: task for task in sampled}
    return [(tasks[r.task_id], r) for r in rollouts]


@dataclass(frozen=True)
class Verification:
    graded: Refilled[VerifiedRollout]
    regraded: Agreement


SampleMore = Callable[[list[TaskBase], str], list[Rollout]]  # (tasks, group prefix) -> their rollouts


def verify(ref: IterationRef, *, task_set: TaskSet, sampled: list[TaskBase], rollouts: list[Rollout],
           graded: list[VerifiedRollout], grader: Grader, sample_more: SampleMore) -> Verification:
    """Given every rollout graded (`Grader.grade` on `grading_work`, in one go or in slices),
    refill with `sample_more` while too few groups carry a signal, and grade a seeded share of
    them again."""
    work = grading_work(sampled, rollouts)
    if [(v.rollout.group_id, v.rollout.sample_index) for v in graded] != [(r.group_id, r.sample_index)
                                                                         for r in rollouts]:
        raise ValueError("the grades given are not of these rollouts, in their order")
    refilled = _refill(ref, task_set, sampled, graded, grader, sample_more)
    again = regrade_sample(len(work), ref.experiment.regrade_fraction, ref.seed)
    second = grader.grade([work[i] for i in again]) if again else []
    regraded = agreement([work[i][0].id for i in again], [refilled.graded[i].grade for i in again],
                         [v.grade for v in second])
    return Verification(refilled, regraded)


def _refill(ref: IterationRef, task_set: TaskSet, sampled: list[TaskBase], verified: list[VerifiedRollout],
            grader: Grader, sample_more: SampleMore) -> Refilled[VerifiedRollout]:
    """Dynamic sampling: more train tasks, from the same policy, while too few groups have a
    reward spread (training/agent/dynamic_sampling.py)."""
    taken = {task.id for task in sampled}
    reserve = [task for task in ref.experiment.rl_tasks(task_set) if task.id not in taken]
    random.Random(ref.seed).shuffle(reserve)

    def sample_and_grade(tasks: list[TaskBase], round_: int) -> list[VerifiedRollout]:
        grader.log(f"dynamic sampling round {round_}: {len(tasks)} more tasks")
        return grader.grade(grading_work(tasks, sample_more(tasks, f"{ref.group_prefix}/refill{round_}")))

    def group_reward(v: VerifiedRollout) -> tuple[str, float] | None:
        return (v.rollout.group_id, v.grade.reward) if v.grade.reward_status is RewardStatus.SCORED else None

    target = len(sampled) if ref.experiment.refill_rounds else 0
    return refill(verified, reserve, sample_and_grade, group_reward, target, ref.experiment.refill_rounds)
