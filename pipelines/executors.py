"""The executor of every run, chosen by the step_processes setting (CRUCIBLE_STEP_PROCESSES).

- 1 (the default): Dagster's in-process executor, the run's steps one after another in its own
  process. An iteration's steps form a chain and each loads torch: a process per step would only
  add start-up time.
- N > 1: Dagster's multiprocess executor, a process per step and up to N at once, which samples an
  iteration's rollout shards side by side (assets/rollouts.py). Each step's process forks from a
  server that has imported the code location once (~10 s a step saved on 2 cores).
"""

from __future__ import annotations

from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

FORKSERVER = {"forkserver": {"preload_modules": ["pipelines.definitions"]}}


def step_executor(processes: int) -> ExecutorDefinition:
    if processes == 1:
        return in_process_executor
    return multiprocess_executor.configured({"max_concurrent": processes, "start_method": FORKSERVER})
