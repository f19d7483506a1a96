"""The executor of every run, chosen by CRUCIBLE_STEP_PROCESSES (pipelines/environment.py).

- 1 (the default): Dagster's in-process executor, the run's steps one after another in its own
  process. An iteration's steps form a chain and each loads torch: a process per step would only
  add start-up time, and the run's resources (the experiment's writer lock among them) live as long
  as the run.
- N > 1: Dagster's multiprocess executor, a process per step and up to N at once, which samples an
  iteration's rollout shards side by side (assets/rollouts.py). Each step's process forks from a
  server that has imported the code location once (~10 s a step saved on 2 cores). The process
  that runs the steps holds the run's experiment writer lock for the whole run, as a run in one
  process does; its steps go on under that hold (training/policy/writer_lock.py), so the lock is
  never free between two steps of the run, nor held by one shard against another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

from dagster import DagsterEvent, ExecutorDefinition, executor, in_process_executor, multiprocess_executor
from dagster._core.executor.base import Executor
from dagster._core.execution.step_dependency_config import StepDependencyConfig
from dagster._core.execution.retries import RetryMode
from dagster._core.storage.tags import MAX_RETRIES_TAG

from assets.partitions import experiment_of_run
from assets.resources import busy_failure, run_purpose
from pipelines import environment
from pipelines.resources import crucible_resource
from training.policy.writer_lock import ExperimentBusy, writer_lock

FORKSERVER = {"forkserver": {"preload_modules": ["pipelines.definitions"]}}


class RunHoldsItsExperiment(Executor):
    """An executor whose steps run elsewhere, with the run's experiment lock held here meanwhile."""

    def __init__(self, steps: Executor):
        self.steps = steps

    @property
    def retries(self) -> RetryMode:
        return self.steps.retries

    @property
    def step_dependency_config(self) -> StepDependencyConfig:
        return self.steps.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator[DagsterEvent]:
        run = plan_context.dagster_run
        experiment = experiment_of_run(run.tags)
        with ExitStack() as hold:
            if experiment is not None:
                folder = crucible_resource().experiment_dir(experiment)
                try:
                    hold.enter_context(writer_lock(folder, run_purpose(run.run_id), lends=True))
                except ExperimentBusy as busy:
                    # The run fails before any step, and (a run's failure, not a step's) would be
                    # launched again by the instance's run retries: it is told not to be.
                    plan_context.instance.add_run_tags(run.run_id, {MAX_RETRIES_TAG: "0"})
                    raise busy_failure(experiment, busy) from None
            yield from self.steps.execute(plan_context, execution_plan)


@executor(name="multiprocess", config_schema=multiprocess_executor.config_schema,
          requirements=multiprocess_executor.get_requirements)
def multiprocess_holding_the_experiment(init_context) -> Executor:
    return RunHoldsItsExperiment(multiprocess_executor.executor_creation_fn(init_context))


def step_executor() -> ExecutorDefinition:
    processes = environment.step_processes()
    if processes == 1:
        return in_process_executor
    return multiprocess_holding_the_experiment.configured({"max_concurrent": processes, "start_method": FORKSERVER})
