"""The `rollouts` asset as a fan-out over shards of the sampled tasks (assets/fan_out.py):

    task_set -> plan_rollout_shards -> sample_rollout_shard[shard_0], [shard_1], … -> gather_rollouts

A shard is a contiguous slice of whole tasks (training/iteration/sampling.py `shards`) sampled by a
step of its own with an engine of its own; pods, with a Kubernetes executor, are not wired yet
(docs/cluster.md).
"""

import datetime as dt
from collections import Counter
from collections.abc import Iterator

from dagster import (
    AssetIn,
    DagsterInstance,
    DynamicOut,
    DynamicOutput,
    Failure,
    In,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    graph_asset,
    op,
)

from assets.failure_policy import failure_policy
from assets.fan_out import Shard, ShardDone, gathered, planned
from assets.iteration import ITERATION, this_iteration
from assets.partitions import runs_making
from assets.pools import SAMPLING
from assets.resources import CrucibleResource
from assets.stages import record_stage
from assets.step_outputs import STEP_OUTPUTS, hand_overs_gathered
from datastore.schema import TRUNCATED
from task_sets.schema import TaskBase
from training.agent.rollout import Rollout
from training.iteration import sampling
from training.iteration.context import SamplingPolicy
from training.iteration.lineage import Checkpoints
from training.iteration.sampling import Sampler
from training.iteration.tasks import usable_task_set


@op(ins={"task_set": In(list[TaskBase]), "base_policy": In(Nothing)},
    out=DynamicOut(Shard, io_manager_key=STEP_OUTPUTS))
def plan_rollout_shards(context: OpExecutionContext, crucible: CrucibleResource,
                        task_set: list[TaskBase]) -> Iterator[DynamicOutput[Shard]]:
    """The sampled tasks in the experiment's `rollout_shards` slices, and the checkpoint they
    sample, checked once (its lineage and content hash) for all of them."""
    iteration, planned_at = this_iteration(context, crucible), dt.datetime.now(dt.timezone.utc)
    with failure_policy(crucible.store()):
        policy = Checkpoints(crucible, iteration.name).sampled_by(iteration.number, iteration.experiment.max_staleness)
    refuse_without_a_parent_on_the_way(context.instance, iteration.name, iteration.number, policy)
    yield from planned(sampling.shards(iteration.experiment, task_set), planned_at, policy)


def refuse_without_a_parent_on_the_way(instance: DagsterInstance, experiment: str, number: int,
                                       policy: SamplingPolicy) -> None:
    """Sampling from an older checkpoint is worth it only while the one the iteration trains from
    (number - 1) is being made: without a run of it, the iteration would sample and grade, then be
    refused at its training step."""
    parent = number - 1
    if policy.iteration < parent and not runs_making(instance, experiment, parent):
        raise Failure(f"iteration {number} trains from checkpoint {parent}, which has not finished its training step, "
                      f"and no run of iteration {parent} is queued or under way: materialize iteration {parent} first",
                      allow_retries=False)


@op(out=Out(ShardDone, io_manager_key=STEP_OUTPUTS), pool=SAMPLING)
def sample_rollout_shard(context: OpExecutionContext, crucible: CrucibleResource, shard: Shard) -> ShardDone:
    """K samples per task of one shard, from the previous iteration's checkpoint."""
    iteration = this_iteration(context, crucible)
    sampler = Sampler.of(crucible, iteration.experiment, usable_task_set(crucible, iteration.experiment),
                         context.log.info)
    with failure_policy(crucible.store()):
        return ShardDone(shard, sampler.sample_shard(iteration, shard.work, shard.index, shard.count, shard.policy))


@op(out=Out(list[Rollout]))
def gather_rollouts(context: OpExecutionContext, crucible: CrucibleResource,
                    shards: list[ShardDone]) -> Output[list[Rollout]]:
    """The shards' samples in the order of the tasks, and the stage's time, first plan to last
    shard. Once it has succeeded, the shards' hand-overs are deleted (assets/step_outputs.py)."""
    iteration = this_iteration(context, crucible)
    samples, first = gathered(shards)
    with failure_policy(crucible.store()):
        record_stage(crucible.store(), iteration.name, iteration.number, "rollouts", started_at=first.planned_at)
    tokens, seconds = sum(r.sampled_tokens for r in samples), sum(r.generate_s for r in samples)
    return Output(samples, metadata={
        "policy": MetadataValue.path(str(first.policy.checkpoint[0])),
        "policy_version": first.policy.checkpoint[1],
        "policy_iteration": first.policy.iteration,
        "staleness": first.policy.staleness(iteration.number),
        "samples": len(samples),
        "shards": first.count,
        "sampled_tokens": tokens,
        "sampled_tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
        "truncated": sum(r.finish_reason in TRUNCATED for r in samples),
        # A server that answers text alone gives no behaviour log-probs: graded, never trained on.
        "without_logprobs": sum(r.behaviour_logprobs is None for r in samples),
        "finish_reasons": MetadataValue.json(dict(Counter(r.finish_reason for r in samples))),
        "mean_turns": sum(max(1, len(r.turns)) for r in samples) / len(samples),
        "example": MetadataValue.md(f"```python\n{samples[0].response_text}\n```"),
    })


@graph_asset(**ITERATION, ins={"task_set": AssetIn(), "base_policy": AssetIn(dagster_type=Nothing)},
             kinds={"pytorch"})
def rollouts(task_set: list[TaskBase], base_policy) -> list[Rollout]:
    """K samples per task from the previous iteration's checkpoint, with behaviour log-probs:
    single replies, or multi-turn episodes in sandbox sessions when the experiment allows turns;
    sampled in the experiment's `rollout_shards` shards, side by side where the executor allows."""
    shards = plan_rollout_shards(task_set=task_set, base_policy=base_policy)
    gather = gather_rollouts.with_hooks({hand_overs_gathered("rollouts")})
    return gather(shards.map(sample_rollout_shard).collect())
