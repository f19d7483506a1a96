"""Drive an experiment's iterations through the Dagster instance, one run per iteration.

An iteration whose evaluation is already materialized is skipped, which makes `crucible run`
resumable and idempotent. Where the runs execute is the instance's choice:

- With Dagster's default run launcher (the embedded default), in this process: no daemon, no
  server, but recorded in the instance, so the UI shows them. They do not pass through the run
  queue, so they take the lock every run of the experiment takes (training/policy/writer_lock.py):
  a second `crucible run` of the experiment waits for the first, and a UI launch meanwhile fails
  at once.
- With any other (a container per run: pipelines/docker_run_launcher.py), each run is queued as the
  UI queues it and followed to its end (pipelines/run_submission.py); the daemon launches it, and
  the run worker takes the experiment's lock. A run of the same partition already queued or under
  way, from the UI or a sensor, is waited for rather than queued twice; a second `crucible run` of
  the experiment waits for the first.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, Definitions, EventLogEntry, RunsFilter
from dagster._core.launcher import DefaultRunLauncher
from rich.console import Console

from assets.partitions import add_experiment, add_iteration
from assets.resources import CrucibleResource
from pipelines import run_submission
from pipelines.errors import RunFailed, UserError
from pipelines.resources import crucible_resource
from training.experiment import ExperimentConfig, ExperimentFileError, updated_settings
from training.policy.checkpoint import CheckpointError, verify_checkpoint
from training.policy.importing import ModelImportError, checked_source
from training.policy.writer_lock import writer_lock

if TYPE_CHECKING:
    from dagster._utils.error import SerializableErrorInfo

console = Console(stderr=True)
# The `crucible run` that executes a run in its own process (there is no run worker to watch):
# host, boot and pid, and the process's start time, so that a pid used again is not taken for it.
PROCESS_TAG = "crucible/process"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
# The daemon's run monitoring and retries are for runs it launched: it cannot end or relaunch a run
# executing in another process, and would mark a live one failed at max_runtime_seconds.
IN_PROCESS_TAGS = {"dagster/max_runtime": "0", "dagster/max_retries": "0"}


def innermost(error: SerializableErrorInfo) -> SerializableErrorInfo:
    """The error at the bottom of a chain: Dagster wraps what a resource or an asset raised
    ("Error executing resource_fn …"), and that is the sentence that says what happened."""
    while error.cause is not None:
        error = error.cause
    return error


def reason(error: SerializableErrorInfo) -> str:
    """What a failed step says: an asset's deliberate Failure by its own sentence, any other
    error as Python prints it (its class, then its message)."""
    error = innermost(error)
    message = error.message.strip()
    return message.split(": ", 1)[1] if error.cls_name == "Failure" and ": " in message else message


class ExperimentRunner:
    def __init__(self, instance: DagsterInstance, defs: Definitions, crucible: CrucibleResource,
                 config: ExperimentConfig, through: int | None = None):
        self.instance, self.defs, self.crucible, self.config = instance, defs, crucible, config
        self.through = through or config.iterations  # this run's last iteration

    @classmethod
    def for_experiment(cls, name: str, settings: ExperimentConfig | None = None,
                       **overrides: int | None) -> ExperimentRunner:
        """Stored settings of `name` (or `settings` from an experiment file, or the defaults),
        updated with the overrides that are set. An experiment that has run keeps its settings:
        a file that changes more than how long it runs is refused (`updated_settings`). An `iterations` override is how far
        this run goes: it raises the stored limit (which the sensor and UI launches follow), and
        never lowers it."""
        from pipelines.definitions import (
            defs,  # after the caller has chosen the environment
        )

        crucible = crucible_resource()
        exists = crucible.experiment_exists(name)
        stored = crucible.experiment(name)
        limit = stored.iterations if exists else 0  # never lowered
        through = overrides.pop("iterations", None)
        if through is not None and through < 1:
            raise UserError(f"--iterations {through}: give 1 or more")
        if settings is not None:
            through = through or settings.iterations  # the file's, even below the stored limit
            try:
                stored = updated_settings(stored if exists else None, settings)
            except ExperimentFileError as error:
                raise UserError(str(error)) from None
        through = through or stored.iterations
        config = ExperimentConfig.model_validate(
            {**stored.model_dump(), **{key: value for key, value in overrides.items() if value is not None},
             "iterations": max(through, limit)}
        )
        crucible.save_experiment(config)
        instance = DagsterInstance.get()
        add_experiment(instance, name)
        return cls(instance, defs, crucible, config, through)

    def run(self) -> None:
        """Base policy, then each iteration not yet evaluated, holding the experiment's writer lock
        throughout: another `crucible run` of it waits, and a Dagster run of it fails at once."""
        self._refuse_old_instance()
        for run_id in release_orphaned_runs(self.instance):
            console.print(f"[yellow]run {run_id} was left unfinished by a `crucible run` that died: marked failed, "
                          "its pool slots given back[/yellow]")
        if not self.in_process:
            run_submission.require_daemon(self.instance)
        name = self.config.name
        # Runs launched elsewhere take the writer lock themselves: this process holds a lock of its
        # own, which only another `crucible run` of the experiment waits for.
        held = self.crucible.experiment_dir(name) / ("" if self.in_process else "submitter")
        with writer_lock(held, f"crucible run --experiment {name}",
                         wait=lambda holder: console.print(f"[yellow]experiment {name!r} is being written by "
                                                           f"{holder}: waiting for it to finish[/yellow]")):
            self._ensure_base_policy()
            evaluated = self.instance.get_materialized_partitions(AssetKey("checkpoint_eval"))
            for iteration in range(1, self.through + 1):
                key = add_iteration(self.instance, name, iteration)
                if key in evaluated:
                    console.print(f"[dim]iteration {iteration}: already materialized ({key})[/dim]")
                    continue
                console.rule(f"iteration {iteration}/{self.through}  ({key})")
                self._execute("iteration", partition_key=key)
        self._execute("reward_analytics_job")

    @property
    def in_process(self) -> bool:
        """Whether this instance's runs execute in the process that starts them."""
        return isinstance(self.instance.run_launcher, DefaultRunLauncher)

    def _refuse_old_instance(self) -> None:
        if self.instance.get_dynamic_partitions("iterations"):
            raise UserError(f"the Dagster instance in {self.instance.root_directory} records iterations under the "
                            "old '<experiment>-<NNNN>' partition keys, from before experiments were a partition "
                            "dimension: `make clean` (or another DAGSTER_HOME) starts a new one")

    def _ensure_base_policy(self) -> None:
        if not self._base_policy_ready():
            self._check_base_model()
            made = f"import {self.config.base_model}" if self.config.base_model else "build the built-in model"
            warm = ", then warm it up on reference solutions" if self.config.base.sft_steps else ""
            console.rule(f"base policy of {self.config.name!r}: {made}{warm}")
            self._execute("base_policy_job", partition_key=self.config.name)

    def _check_base_model(self) -> None:
        """A base_model that cannot be post-trained is refused before any run starts."""
        if self.config.base_model is None:
            return
        try:
            checked_source(self.config.base_model, self.config.episode_max_tokens, self.config.prompt_format,
                           self.config.completion())
        except ModelImportError as error:
            raise UserError(str(error)) from None

    def _base_policy_ready(self) -> bool:
        """Materialized in this instance and intact on disk (a half-deleted one is rebuilt)."""
        if self.config.name not in self.instance.get_materialized_partitions(AssetKey("base_policy")):
            return False
        try:
            verify_checkpoint(self.crucible.base_policy_dir(self.config.name))
        except CheckpointError:
            return False
        return True

    def _execute(self, job_name: str, partition_key: str | None = None) -> None:
        started = time.perf_counter()
        if self.in_process:
            self._execute_here(job_name, partition_key)
        else:
            self._submit_and_follow(job_name, partition_key)
        console.print(f"[green]{job_name} {partition_key or ''} done in {time.perf_counter() - started:.1f}s[/green]")

    def _submit_and_follow(self, job_name: str, partition_key: str | None) -> None:
        """Queue the run and follow it to its end. A run of the partition already queued or under
        way (the UI, a sensor) is followed instead, and ours is cancelled if one was queued a moment
        before it: two runs of a partition would train the same iteration twice. One queued after
        ours is its launcher's to answer for (the queue runs it after ours, on the iteration ours
        made)."""
        job = self.defs.resolve_job_def(job_name)
        tags = dict(job.partitions_def.get_tags_for_partition_key(str(partition_key))) if partition_key else {}
        say = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731
        while True:
            if self._follow_others(job_name, partition_key, tags, say):
                return
            run_id = run_submission.submit(job_name, tags)
            ours = self.instance.get_run_record_by_id(run_id).storage_id
            rivals = [r for r in self._unfinished(tags) if r.storage_id < ours]
            if not rivals:
                break
            self.instance.run_coordinator.cancel_run(run_id)
            say(f"{job_name} {partition_key}: run {rivals[0].dagster_run.run_id} was queued first; ours cancelled")
        say(f"{job_name} {partition_key or ''}: queued as run {run_id}")
        run = run_submission.follow(self.instance, run_id, say)
        if run.status != DagsterRunStatus.SUCCESS:
            raise RunFailed(f"{job_name} {partition_key or ''} {run.status.value.lower()} (run {run_id}):\n"
                            + "\n".join(run_failures(self.instance, run_id)))

    def _unfinished(self, tags: dict[str, str]) -> list:
        return run_submission.unfinished_runs(self.instance, tags) if tags else []

    def _follow_others(self, job_name: str, partition_key: str | None, tags: dict[str, str], say) -> bool:
        """Follow the partition's runs queued or under way; whether they left it materialized."""
        pending = self._unfinished(tags)
        for record in pending:
            run = record.dagster_run
            say(f"{job_name} {partition_key}: run {run.run_id} is {run.status.value.lower()} already; following it")
            run_submission.follow(self.instance, run.run_id, say)
        return bool(pending) and self._materialized(job_name, partition_key)

    def _materialized(self, job_name: str, partition_key: str) -> bool:
        """Whether every asset of the job holds the partition (another run made them meanwhile)."""
        assets = self.defs.resolve_job_def(job_name).asset_layer.executable_asset_keys
        return all(partition_key in self.instance.get_materialized_partitions(key) for key in assets)

    def _execute_here(self, job_name: str, partition_key: str | None) -> None:
        result = self.defs.resolve_job_def(job_name).execute_in_process(
            instance=self.instance,
            partition_key=partition_key,
            # Dagster instantiates a job's own loggers only when the run config names them.
            run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
            tags=IN_PROCESS_TAGS | {PROCESS_TAG: this_process()},
            raise_on_error=False,
        )
        if not result.success:
            failures = [
                reason(event.step_failure_data.error)
                for event in result.all_events
                if event.is_step_failure and event.step_failure_data.error
            ]
            raise RunFailed(
                f"{job_name} {partition_key or ''} failed (run {result.run_id}):\n" + "\n".join(failures)
            )


def run_failures(instance: DagsterInstance, run_id: str) -> list[str]:
    """Why a run that ended elsewhere failed: its steps' reasons, else the run's own (a worker that
    never started, a run the monitoring cancelled)."""
    steps = [reason(entry.dagster_event.step_failure_data.error)
             for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
             if entry.dagster_event.step_failure_data.error]
    if steps:
        return steps
    ended = instance.all_logs(run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED})
    return [_run_reason(entry) for entry in ended] or ["(no reason recorded)"]


def _run_reason(entry: EventLogEntry) -> str:
    """A run's failure: the error raised outside its steps (the executor's), else Dagster's word."""
    event = entry.dagster_event
    error = event.job_failure_data.error if event.event_type == DagsterEventType.RUN_FAILURE else None
    return reason(error) if error else event.message or entry.user_message


def this_process() -> str:
    """The PROCESS_TAG value of this process (alive, so never None)."""
    return _process_id(os.getpid()) or ""


def _process_id(pid: int) -> str | None:
    """host/boot/pid/start of a live process on this host; None when there is none with that pid."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    return f"{socket.gethostname()}/{_BOOT_ID}/{pid}/{started}"


def release_orphaned_runs(instance: DagsterInstance) -> list[str]:
    """Fail the runs a `crucible run` on this host was executing when it died without a word
    (SIGKILL, the OOM killer), and give back the pool slots of every run that has ended; returns
    the ids of the runs failed. A process that dies so never frees its slot of the accelerator pool
    (assets/pools.py), and every later step of the pool, in any experiment, would wait for it for
    ever. Interrupted (Ctrl-C), it frees them itself."""
    host = f"{socket.gethostname()}/{_BOOT_ID}/"
    released = []
    unfinished = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    for run in instance.get_runs(RunsFilter(statuses=unfinished)):
        owner = run.tags.get(PROCESS_TAG, "")
        if run.remote_job_origin is not None or not owner.startswith(host):
            continue  # a run worker the daemon watches, or another machine's process
        pid = owner.removeprefix(host).split("/")[0]
        if pid.isdigit() and _process_id(int(pid)) == owner:
            continue
        instance.report_run_failed(run, f"the crucible run process that executed it ({owner}) died")
        released.append(run.run_id)
    if instance.event_log_storage.supports_global_concurrency_limits:
        for run_id in instance.event_log_storage.get_concurrency_run_ids():
            run = instance.get_run_by_id(run_id)
            if run is None or run.is_finished:
                instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return released
