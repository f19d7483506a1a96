"""Drive an experiment's iterations through the Dagster instance's run queue, one run per iteration.

An iteration whose evaluation is already materialized is skipped, which makes `crucible run`
resumable and idempotent. Every run is queued as the UI queues it and followed to its end
(pipelines/run_submission.py), so the queue's limits order it among the runs of the UI, a
backfill or a sensor (one run of an experiment at a time), run monitoring and retries watch it,
and the UI lists it under its job. A daemon launches it: the instance's, or one this command
starts for its own duration (pipelines/local_daemon.py). A run of the same partition already
queued or under way is followed rather than queued twice, so a second `crucible run` of the
experiment follows the first's runs and goes on after them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    MultiPartitionKey,
)

from assets.partitions import add_experiment, add_iteration, iteration_key
from assets.resources import CrucibleResource
from commands.console import errors as console  # progress on stderr: stdout carries results
from commands.errors import UserError
from commands.settings import Settings
from pipelines import run_submission
from pipelines.errors import RunFailed
from pipelines.local_daemon import LocalDaemon
from pipelines.resources import crucible_resource
from pipelines.run_failures import run_failures
from task_sets.loader import TaskSetError, load_task_set
from training.experiment import ExperimentConfig, ExperimentFileError, updated_settings
from training.iteration.context import Refused
from training.iteration.lineage import Checkpoints
from training.policy.checkpoint import CheckpointError, verify_checkpoint


def say(line: str) -> None:
    """A line of a run's progress as the run wrote it: one line however wide, never rich markup."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


class ExperimentRunner:
    def __init__(self, instance: DagsterInstance, defs: Definitions, deployment: Settings, config: ExperimentConfig,
                 through: int | None = None):
        self.instance, self.defs, self.deployment, self.config = instance, defs, deployment, config
        self.crucible = crucible_resource(deployment)
        self.through = through or config.iterations  # this run's last iteration
        self.daemon: LocalDaemon | None = None  # while run() runs
        self._ours: dict[str, int] = {}  # the runs this command queued and follows now, and their iterations
        self._queueing, self._stopped = threading.Lock(), False  # _stop: no more runs are queued

    @classmethod
    def for_experiment(cls, name: str, settings: ExperimentConfig | None = None, *, deployment: Settings,
                       **overrides: int | None) -> ExperimentRunner:
        """Stored settings of `name` (or `settings` from an experiment file, or the defaults),
        updated with the overrides that are set. An experiment that has run keeps its settings:
        a file that changes more than how long it runs is refused (`updated_settings`). An `iterations` override is how far
        this run goes: it raises the stored limit (which the sensor and UI launches follow), and
        never lowers it."""
        crucible = crucible_resource(deployment)
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
        refuse_unusable(config, crucible, new=not exists)  # before anything is stored: a refusal leaves no trace
        crucible.save_experiment(config)
        # Its jobs only (a run's resources are made where it executes); loaded after the refusals, which need none of it.
        from pipelines.definitions import defs

        instance = DagsterInstance.get()
        add_experiment(instance, name)
        return cls(instance, defs, deployment, config, through)

    def run(self, rerun_from: int | None = None) -> None:
        """Base policy, then each iteration not yet evaluated (or whose checkpoint cannot be built
        on, or from `rerun_from` on), then the analytics."""
        self._refuse_old_instance()
        if not self._base_policy_ready():
            check_base_model(self.config)  # before a daemon starts: a refusal takes a second, not a minute
        with LocalDaemon(self.instance, self.deployment.environment(), say) as self.daemon:
            self._ensure_base_policy()
            planned = self._planned(rerun_from)
            if self.config.max_staleness:
                self._overlapping(planned, window=self.config.max_staleness + 1)
            else:
                for iteration, key, since in planned:
                    self._iteration(iteration, key, since, say)
            self._execute("reward_analytics_job", done=self._analytics_current)

    def _planned(self, rerun_from: int | None) -> list[tuple[int, MultiPartitionKey, float]]:
        """The iterations to run, in order, each with the time after which its evaluation counts
        as done (0: any time; a re-run: after this command started)."""
        name, planned = self.config.name, []
        evaluated = [self._evaluated(iteration_key(name, n)) for n in range(1, self.through + 1)] + [False]
        for iteration in range(1, self.through + 1):
            key = add_iteration(self.instance, name, iteration)
            since = 0.0  # evaluated at any time is done; for a re-run, evaluated after it started
            if evaluated[iteration - 1]:
                # Only the checkpoint the next iteration samples from is verified (a hash of
                # every file: minutes for a large model); the lineage behind it, by its records.
                unusable = None if evaluated[iteration] else self._unusable(iteration)
                if rerun_from is not None and iteration >= rerun_from:
                    console.print(f"iteration {iteration}: evaluated, and run again from {rerun_from}", markup=False)
                elif unusable is not None:
                    console.print(f"iteration {iteration}: evaluated, but its checkpoint cannot be built on, so "
                                  f"it runs again: {unusable}", markup=False)
                    rerun_from = iteration  # and every later one, whose lineage then changes
                else:
                    console.print(f"[dim]iteration {iteration}: already materialized ({key})[/dim]")
                    continue
                since = time.time()
            planned.append((iteration, key, since))
        return planned

    def _iteration(self, iteration: int, key: MultiPartitionKey, since: float, said: Callable[[str], None] = say,
                   queued: threading.Event | None = None) -> None:
        console.rule(f"iteration {iteration}/{self.through}  ({key})")
        self._execute("iteration", key, done=lambda: self._evaluated(key, since), said=said, queued=queued)

    def _overlapping(self, planned: list[tuple[int, MultiPartitionKey, float]], window: int) -> None:
        """Up to `window` (max_staleness + 1) iterations under way at once, their lines told apart
        by the iteration. Each is queued after the one before it (the queue starts runs in that
        order: a later iteration never takes the slot an earlier one waits for) and once the one
        `window` places before it has ended. A failure stops the queueing: the iterations after
        the failed one, which would train on what it did not make, are cancelled (ours; another
        launcher's runs are left to it), the ones before it finish, and the command fails with it.
        Interrupted, every run of ours is cancelled."""
        queued = [threading.Event() for _ in planned]

        def one(index: int, iteration: int, key: MultiPartitionKey, since: float) -> None:
            try:
                if index:
                    queued[index - 1].wait()
                self._iteration(iteration, key, since, _prefixed(iteration), queued[index])
            finally:
                queued[index].set()

        with ThreadPoolExecutor(max_workers=window, thread_name_prefix="iteration") as threads:
            started = {threads.submit(one, index, *plan): plan[0] for index, plan in enumerate(planned)}
            try:
                done, _ = wait(started, return_when=FIRST_EXCEPTION)
            except KeyboardInterrupt:
                self._stop(after=0, why="interrupted")
                threads.shutdown(wait=False, cancel_futures=True)
                raise
            first = _first_failed(started, done)
            if first is not None:
                self._stop(after=started[first], why=f"iteration {started[first]} failed")
                threads.shutdown(wait=False, cancel_futures=True)
        first = _first_failed(started, started)  # an iteration before it may have failed since
        if first is not None:
            raise first.exception()

    def _stop(self, after: int, why: str) -> None:
        """Queue no more runs, and cancel ours of the iterations after `after`."""
        with self._queueing:
            self._stopped = True
            for run_id, iteration in list(self._ours.items()):
                if iteration > after:
                    self._cancel(run_id, say, why)

    def _evaluated(self, key, since: float = 0.0) -> bool:
        """checkpoint_eval is materialized for the partition (after `since`, a time.time())."""
        latest = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("checkpoint_eval"), asset_partitions=[str(key)]), limit=1).records
        return bool(latest) and latest[0].timestamp > since

    def _unusable(self, iteration: int) -> str | None:
        """Why an evaluated iteration's checkpoint cannot be built on (it fails verification, is
        not what its training step recorded, or descends from a checkpoint since replaced), if so:
        Dagster's record says the iteration ran, not that its outputs are still whole."""
        checkpoints = Checkpoints(self.crucible, self.config.name)
        try:
            _, content_hash = checkpoints.verified(iteration, "the next iteration would sample from")
            checkpoints.trained(iteration, content_hash, "the next iteration would sample from it")
            checkpoints.lineage_holds(iteration, rerun_through=iteration)
        except Refused as refusal:
            return str(refusal)
        return None

    def _analytics_current(self) -> bool:
        """reward_analytics was materialized after every trajectory and evaluation it reads."""
        def latest(asset: str) -> float | None:
            event = self.instance.get_latest_materialization_event(AssetKey(asset))
            return event.timestamp if event else None

        analytics, inputs = latest("reward_analytics"), [latest("trajectories"), latest("checkpoint_eval")]
        return analytics is not None and all(made is None or made <= analytics for made in inputs)

    def _refuse_old_instance(self) -> None:
        if self.instance.get_dynamic_partitions("iterations"):
            raise UserError(f"the Dagster instance in {self.instance.root_directory} records iterations under the "
                            "old '<experiment>-<NNNN>' partition keys, from before experiments were a partition "
                            "dimension: `make clean` (or another DAGSTER_HOME) starts a new one")

    def _ensure_base_policy(self) -> None:
        if not self._base_policy_ready():
            made = f"import {self.config.base_model}" if self.config.base_model else "build the built-in model"
            warm = ", then warm it up on reference solutions" if self.config.base.sft_steps else ""
            console.rule(f"base policy of {self.config.name!r}: {made}{warm}")
            self._execute("base_policy_job", self.config.name, done=self._base_policy_ready)

    def _base_policy_ready(self) -> bool:
        """Materialized in this instance and intact on disk (a half-deleted one is rebuilt)."""
        if self.config.name not in self.instance.get_materialized_partitions(AssetKey("base_policy")):
            return False
        try:
            verify_checkpoint(self.crucible.base_policy_dir(self.config.name))
        except CheckpointError:
            return False
        return True

    def _execute(self, job_name: str, partition_key: str | None = None, done: Callable[[], bool] = lambda: False,
                 said: Callable[[str], None] = say, queued: threading.Event | None = None):
        """Run `job_name` for the partition unless `done()` says it is made (by another run
        meanwhile: a UI launch, a sensor, another `crucible run`); its lines go to `said`, and
        `queued` is set once our run is queued."""
        started = time.perf_counter()
        self._submit_and_follow(job_name, partition_key, done, said, queued)
        console.print(f"[green]{job_name} {partition_key or ''} done in {time.perf_counter() - started:.1f}s[/green]")

    def _submit_and_follow(self, job_name: str, partition_key: str | None, done: Callable[[], bool],
                           said: Callable[[str], None], queued: threading.Event | None) -> None:
        """Queue the run and follow it to its end. A run of the partition already queued or under
        way (the UI, a sensor) is followed instead, and ours is cancelled if one was queued a moment
        before it: two runs of a partition would train the same iteration twice. One queued after
        ours is its launcher's to answer for (the queue runs it after ours, on the iteration ours
        made). Interrupted, our run is cancelled; another's is left to its launcher."""
        job = self.defs.resolve_job_def(job_name)
        tags = dict(job.partitions_def.get_tags_for_partition_key(str(partition_key))) if partition_key else {}
        while True:
            self._follow_others(job_name, partition_key, tags, said)
            if done():  # looked at after the others' runs ended: their materializations are recorded by then
                return
            run_id = self._submit(job_name, tags, partition_key)
            ours = self.instance.get_run_record_by_id(run_id).storage_id
            rivals = [r for r in self._unfinished(tags) if r.storage_id < ours]
            if not rivals:
                break
            self.instance.run_coordinator.cancel_run(run_id)
            self._ours.pop(run_id, None)
            said(f"{job_name} {partition_key}: run {rivals[0].dagster_run.run_id} was queued first; ours cancelled")
        said(f"{job_name} {partition_key or ''}: queued as run {run_id}")
        if queued is not None:
            queued.set()
        try:
            run = run_submission.follow(self.instance, self.daemon, run_id, said)
        except KeyboardInterrupt:  # in the command's own thread: overlapping iterations are cancelled by _stop
            self._cancel(run_id, said)
            raise
        finally:
            self._ours.pop(run_id, None)
        if run.status != DagsterRunStatus.SUCCESS:
            raise RunFailed(f"{job_name} {partition_key or ''} {run.status.value.lower()} (run {run.run_id}):\n"
                            + "\n".join(run_failures(self.instance, run.run_id)))

    def _submit(self, job_name: str, tags: dict[str, str], partition_key: str | None) -> str:
        """Queue a run (counted as ours before anyone may cancel ours), unless queueing has stopped."""
        with self._queueing:
            if self._stopped:
                raise RunFailed(f"{job_name} {partition_key or ''} was not queued: an iteration before it failed")
            run_id = run_submission.submit(self.daemon, job_name, tags)
            self._ours[run_id] = int(tags.get("dagster/partition/iteration", 0))
        return run_id

    def _cancel(self, run_id: str, say: Callable[[str], None], why: str = "interrupted") -> None:
        """Cancel our run (or the retry that replaced it) if it has not ended."""
        run = self.instance.get_run_by_id(run_id)
        while run.tags.get(run_submission.RETRY_TAG):
            run = self.instance.get_run_by_id(run.tags[run_submission.RETRY_TAG])
        if not run.is_finished:
            say(f"run {run.run_id[:8]}: {why}, cancelling it")
            self.instance.run_coordinator.cancel_run(run.run_id)

    def _unfinished(self, tags: dict[str, str]) -> list:
        return run_submission.unfinished_runs(self.instance, tags) if tags else []

    def _follow_others(self, job_name: str, partition_key: str | None, tags: dict[str, str], say) -> None:
        """Follow the partition's runs queued or under way to their end."""
        for record in self._unfinished(tags):
            run = record.dagster_run
            say(f"{job_name} {partition_key}: run {run.run_id} is {run.status.value.lower()} already; following it")
            run_submission.follow(self.instance, self.daemon, run.run_id, say)


def _first_failed(started: dict[Future, int], ended: Iterable[Future]) -> Future | None:
    """The earliest iteration's future among those ended that failed."""
    failed = [future for future in ended if future.done() and not future.cancelled() and future.exception()]
    return min(failed, key=started.__getitem__, default=None)


def _prefixed(iteration: int) -> Callable[[str], None]:
    """`say`, for one of several iterations under way at once."""
    return lambda line: say(f"[{iteration}] {line}")


def refuse_unusable(config: ExperimentConfig, crucible: CrucibleResource, new: bool) -> None:
    """Refuse, in one sentence, an experiment whose task set cannot be found or read, or (a new
    one) whose base_model cannot be post-trained: before its settings are stored, so that a
    corrected file is a first start, not a change of a stored experiment."""
    try:
        load_task_set(config.task_set, Path(crucible.task_sets))
    except TaskSetError as error:
        raise UserError(f"experiment {config.name!r}: {error}") from None
    if new:
        check_base_model(config)


def check_base_model(config: ExperimentConfig) -> None:
    """A base_model that cannot be post-trained is refused before any run starts."""
    if config.base_model is None:
        return
    from training.policy.importing import ModelImportError, checked_source  # transformers: only for a base_model

    try:
        checked_source(config.base_model, config.episode_max_tokens, config.prompt_format, config.completion())
    except ModelImportError as error:
        raise UserError(str(error)) from None
