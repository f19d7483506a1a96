"""The `verified_rollouts` asset as a fan-out over slices of the rollouts (assets/fan_out.py), for
when one grading process is not enough (docs/cluster.md):

    rollouts -> plan_grading_shards -> grade_rollout_shard[shard_0], [shard_1], … -> gather_verified_rollouts

The shard count is the deployment's (the crucible resource's `grading_shards`,
CRUCIBLE_GRADING_SHARDS), not the experiment's: each submission is graded in a fresh sandbox of
its own, so verdicts do not depend on it. As sampling's shards do with the cores, each shard takes
its share of the sandbox slots, so the machine is no busier (a suite that reaches its time limit
only because the machine is busier is the one caveat). The gathering step does what needs every
grade at once: dynamic sampling's refills (training/agent/dynamic_sampling.py) and the
re-grading of a seeded share that the `verdicts_reproducible` check reports.
"""

import datetime as dt
from collections import Counter
from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetIn,
    DynamicOut,
    DynamicOutput,
    OpExecutionContext,
    Out,
    Output,
    graph_asset,
    op,
)

from assets.failure_policy import failure_policy
from assets.fan_out import Shard, ShardDone, gathered, planned
from assets.iteration import ITERATION, this_iteration
from assets.resources import CrucibleResource
from assets.stages import record_stage
from assets.step_outputs import STEP_OUTPUTS, hand_overs_gathered
from statuses import RewardStatus
from task_sets.schema import TaskBase
from training.agent.rollout import Rollout
from training.agent.trajectory import VerifiedRollout
from training.iteration.context import IterationRef, SamplingPolicy, slices
from training.iteration.lineage import Checkpoints
from training.iteration.sampling import Sampler, more_samples
from training.iteration.tasks import usable_task_set
from training.iteration.verification import Grader, grading_work, verify

CHECK = "verdicts_reproducible"


@op(out=DynamicOut(Shard, io_manager_key=STEP_OUTPUTS))
def plan_grading_shards(context: OpExecutionContext, crucible: CrucibleResource, task_set: list[TaskBase],
                        rollouts: list[Rollout]) -> Iterator[DynamicOutput[Shard]]:
    """The rollouts, each with its task, in `grading_shards` contiguous slices."""
    planned_at = dt.datetime.now(dt.timezone.utc)
    yield from planned(slices(grading_work(task_set, rollouts), crucible.grading_shards), planned_at)


@op(out=Out(ShardDone, io_manager_key=STEP_OUTPUTS))
def grade_rollout_shard(context: OpExecutionContext, crucible: CrucibleResource, shard: Shard) -> ShardDone:
    """Every rollout of the shard graded in a fresh sandbox against its task's hidden tests."""
    iteration = this_iteration(context, crucible)
    if shard.count > 1:
        context.log.info(f"grading shard {shard.index + 1}/{shard.count}: {len(shard.work)} rollouts")
    grader = Grader.of(crucible, usable_task_set(crucible, iteration.experiment), context.log.info)
    with failure_policy(crucible.store()):
        return ShardDone(shard, grader.grade(shard.work, shares=shard.count))


@op(out={"result": Out(list[VerifiedRollout]), CHECK: Out()})
def gather_verified_rollouts(context: OpExecutionContext, crucible: CrucibleResource, task_set: list[TaskBase],
                             rollouts: list[Rollout], shards: list[ShardDone]) -> Iterator:
    """The shards' grades in the rollouts' order, refilled and partly graded again; the stage's
    time, first plan to the end of this step. Once it has succeeded, the shards' hand-overs are
    deleted (assets/step_outputs.py)."""
    iteration, log = this_iteration(context, crucible), context.log.info
    usable = usable_task_set(crucible, iteration.experiment)
    sampler = Sampler.of(crucible, iteration.experiment, usable, log)
    grades, first = gathered(shards)
    with failure_policy(crucible.store()):
        verification = verify(
            iteration, task_set=usable, sampled=task_set, rollouts=rollouts, graded=grades,
            grader=Grader.of(crucible, usable, log),
            sample_more=more_samples(sampler, iteration, lambda: their_sampler(crucible, iteration, rollouts)))
        record_stage(crucible.store(), iteration.name, iteration.number, "verified_rollouts", started_at=first.planned_at)
    graded, repeat = verification.graded, verification.regraded
    if repeat.disagreeing_task_ids:
        context.log.warning(f"verdicts changed on a second grading for: {', '.join(repeat.disagreeing_task_ids)}")
    statuses = Counter(v.grade.reward_status for v in graded.graded)
    yield Output(graded.graded, "result", metadata={
        "samples": len(graded.graded),
        "grading_shards": first.count,
        "groups": graded.groups,
        "informative_groups": graded.informative,
        "refill_rounds": graded.rounds,
        "infra_errors": statuses[RewardStatus.INFRA_ERROR],
        "env_errors": statuses[RewardStatus.ENV_ERROR],
        "invalid": statuses[RewardStatus.INVALID],
        "regraded": repeat.sampled,
        "regrade_agreement": repeat.rate,
        "reward_function": usable.reward.version,
    })
    yield AssetCheckResult(
        asset_key="verified_rollouts",
        check_name=CHECK,
        passed=not repeat.disagreeing_task_ids,
        severity=AssetCheckSeverity.WARN,
        metadata={"regraded": repeat.sampled, "agreement": repeat.rate,
                  "disagreeing_tasks": ", ".join(repeat.disagreeing_task_ids) or "none"},
    )


def their_sampler(crucible: CrucibleResource, iteration: IterationRef, rollouts: list[Rollout]) -> SamplingPolicy:
    """The checkpoint that sampled `rollouts` (rollouts stored before they named it: the previous
    one), checked again: refills come from it, so an iteration has one sampler."""
    sampler = rollouts[0].policy_iteration
    return Checkpoints(crucible, iteration.name).sampling(
        iteration.number, iteration.number - 1 if sampler is None else sampler)


@graph_asset(**ITERATION, ins={"task_set": AssetIn(), "rollouts": AssetIn()},
             check_specs=[AssetCheckSpec(CHECK, asset="verified_rollouts",
                                         description="a re-graded sample of the submissions gets the same verdicts")])
def verified_rollouts(task_set: list[TaskBase], rollouts: list[Rollout]) -> dict:
    """Every sample graded in a fresh sandbox against its task's hidden tests, in the deployment's
    `grading_shards` shards; a sample of them graded again to check that verdicts are
    reproducible (asset check `verdicts_reproducible`)."""
    shards = plan_grading_shards(task_set=task_set, rollouts=rollouts)
    gather = gather_verified_rollouts.with_hooks({hand_overs_gathered("verified_rollouts")})
    result, check = gather(task_set=task_set, rollouts=rollouts, shards=shards.map(grade_rollout_shard).collect())
    return {"result": result, f"verified_rollouts_{CHECK}": check}
