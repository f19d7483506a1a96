"""How an iteration samples: the experiment's engine on a checkpoint, single replies or multi-turn
episodes in sandbox sessions, whole or in shards of whole tasks."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

from sandbox.base import Session
from task_sets.loader import TaskSet
from task_sets.schema import Task, TaskBase
from training.agent.episodes import EpisodeLimits, as_rollout, run_episodes
from training.agent.rollout import Rollout, sample_rollouts
from training.experiment import ExperimentConfig
from training.inference.engine import InferenceEngine, SamplingParams
from training.inference.engines import open_engine
from training.iteration.context import Checkpoint, Environment, IterationRef, Log, SamplingPolicy, slices
from training.progress import ProgressLines


def rollout_params(ref: IterationRef) -> SamplingParams:
    """The iteration's sampling of train tasks: the experiment's samples per task, with its seed."""
    experiment = ref.experiment
    return SamplingParams(n=experiment.samples_per_task, max_new_tokens=experiment.max_new_tokens,
                          temperature=experiment.temperature, seed=ref.seed)


def eval_params(experiment: ExperimentConfig, blanked: bool = False) -> SamplingParams:
    """Held-out sampling: greedy, or `eval_samples` samples per task at the rollout temperature
    (`eval_blanked_samples` with observations blanked), with the experiment's seed alone, so
    every checkpoint meets the same draws."""
    greedy = experiment.eval_samples == 1
    params = SamplingParams(n=experiment.eval_samples, max_new_tokens=experiment.max_new_tokens,
                            temperature=0.0 if greedy else experiment.temperature, seed=experiment.seed)
    return dataclasses.replace(params, n=experiment.eval_blanked_samples or params.n) if blanked else params


def shards(experiment: ExperimentConfig, tasks: list[TaskBase]) -> list[list[TaskBase]]:
    """The sampled tasks in `rollout_shards` slices (a task's group stays in one)."""
    return slices(tasks, experiment.rollout_shards)


@dataclass(frozen=True)
class Sampler:
    experiment: ExperimentConfig
    system_message: str | None  # the task set's
    open_session: Callable[..., Session]  # (task, previous session) -> a sandbox session for episodes
    log: Log = print

    @classmethod
    def of(cls, env: Environment, experiment: ExperimentConfig, task_set: TaskSet, log: Log) -> Sampler:
        """The experiment's sampler for `task_set`, its episodes in `env`'s sandbox sessions."""
        return cls(experiment, task_set.system_message, env.open_session, log)

    def engine(self, checkpoint: Checkpoint, threads: int | None = None) -> InferenceEngine:
        """The experiment's engine sampling `checkpoint`, on `threads` CPU threads (None: every core)."""
        policy_dir, content_hash = checkpoint
        experiment = self.experiment
        return open_engine(experiment.engine, policy_dir, content_hash, server=experiment.server,
                           vllm=experiment.vllm, max_model_len=experiment.episode_max_tokens,
                           observation_role=experiment.observation_role, threads=threads, log=self.log)

    def sample(self, engine: InferenceEngine, tasks: list[Task] | list[TaskBase], params: SamplingParams,
               group_prefix: str, blanked: bool = False) -> list[Rollout]:
        """Single replies, or multi-turn episodes in sandbox sessions when the experiment allows
        turns (`blanked`: their observations hidden from the policy)."""
        experiment = self.experiment
        if experiment.max_turns == 1:
            return sample_rollouts(engine, engine.chat, tasks, params, group_prefix,
                                   progress=ProgressLines(self.log, "sampled {done}/{total} tasks"),
                                   system=self.system_message)
        limits = EpisodeLimits(max_turns=experiment.max_turns, max_tokens=experiment.episode_max_tokens,
                               command_timeout_s=experiment.command_timeout_s)
        episodes = run_episodes(engine, engine.chat, tasks, params, limits, self.open_session, group_prefix,
                                progress=ProgressLines(self.log, "episodes: {done}/{total} ended"),
                                system=self.system_message, blanked=blanked)
        return [as_rollout(episode, engine.chat) for episode in episodes]

    def sample_shard(self, ref: IterationRef, tasks: list[TaskBase], shard: int, count: int,
                     policy: SamplingPolicy) -> list[Rollout]:
        """Shard `shard` of `count`: its samples from `policy`, by an engine of its own. With
        several shards each samples on its share of the cores, however many run at once, so its
        samples do not depend on that; one samples as an unsharded iteration does."""
        if count == 1:
            return self.sample_iteration(self.engine(policy.checkpoint), policy, tasks, ref, ref.group_prefix)
        import torch  # the CPU engine's; imported with it (training/inference/engines.py)

        threads, before = max(1, len(os.sched_getaffinity(0)) // count), torch.get_num_threads()
        self.log(f"shard {shard + 1}/{count}: {len(tasks)} tasks on {threads} of the CPU threads")
        try:
            return self.sample_iteration(self.engine(policy.checkpoint, threads=threads), policy, tasks, ref,
                                      ref.group_prefix)
        finally:  # the process's later steps (in one process, all of a run's) keep their threads
            torch.set_num_threads(before)

    def sample_iteration(self, engine: InferenceEngine, policy: SamplingPolicy, tasks: list[TaskBase],
                      ref: IterationRef, group_prefix: str) -> list[Rollout]:
        """The iteration's samples of `tasks` by `engine`, which runs `policy`: each names its policy."""
        return [dataclasses.replace(rollout, policy_iteration=policy.iteration)
                for rollout in self.sample(engine, tasks, rollout_params(ref), group_prefix)]


def more_samples(sampler: Sampler, ref: IterationRef,
                 policy: Callable[[], SamplingPolicy]) -> Callable[[list[TaskBase], str], list[Rollout]]:
    """Samples of more train tasks (tasks, group prefix) from the iteration's `policy`, as
    dynamic sampling asks for them; its engine is opened on the first call only."""
    engine: InferenceEngine | None = None
    chosen: SamplingPolicy | None = None

    def sample(tasks: list[TaskBase], group_prefix: str) -> list[Rollout]:
        nonlocal engine, chosen
        if engine is None:
            chosen = policy()
            engine = sampler.engine(chosen.checkpoint)
        return sampler.sample_iteration(engine, chosen, tasks, ref, group_prefix)

    return sample
