"""Held-out evaluation (not the monitors of training/evaluation/): a checkpoint's answers to the held-out split, sampled and graded as an
iteration's are, stored as its `evaluations` partition a chunk at a time; the base policy
(iteration 0) first, whenever the stored one evaluated another base policy than the one on disk.
Then the curve across iterations, paired by task with the base policy's (datastore/metrics.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from datastore import catalog, metrics
from datastore.schema import Observations
from datastore.store import rows_to_table
from task_sets.loader import TaskSet
from task_sets.schema import Task
from training.agent.episodes import MAX_LIVE
from training.agent.rollout import TASKS_PER_CALL
from training.agent.trajectory import evaluation_row
from training.experiment import ExperimentConfig
from training.inference.engine import InferenceEngine, SamplingParams
from training.iteration.context import Environment, IterationRef, Log, Refused
from training.iteration.lineage import Checkpoints
from training.iteration.sampling import Sampler, eval_params
from training.iteration.tasks import usable_task_set
from training.iteration.verification import Grader, grading_work


def eval_conditions(experiment: ExperimentConfig) -> tuple[Observations, ...]:
    """Shown, and blanked as well where the experiment asks for it and its samples are episodes
    (a single reply sees no observation)."""
    blind = experiment.eval_blanked and experiment.max_turns > 1
    return (Observations.SHOWN, Observations.BLANKED) if blind else (Observations.SHOWN,)


@dataclass(frozen=True)
class Evaluation:
    """The held-out evaluation of iteration `ref`; its task set, engine and sandboxes are opened
    only once it is known that something must be evaluated."""

    ref: IterationRef
    env: Environment
    log: Log = print

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(self.env, self.ref.name)

    @cached_property
    def task_set(self) -> TaskSet:
        return usable_task_set(self.env, self.ref.experiment)

    @cached_property
    def sampler(self) -> Sampler:
        return Sampler.of(self.env, self.ref.experiment, self.task_set, self.log)

    @cached_property
    def grader(self) -> Grader:
        return Grader.of(self.env, self.task_set, self.log)

    def run(self) -> list[dict]:
        """The iteration's checkpoint on the held-out split, after the base policy's (iteration 0)
        when the experiment has none yet; each stored as its `evaluations` partition."""
        number, checkpoints = self.ref.number, self.checkpoints
        _, content_hash = checkpoints.verified(number, f"iteration {number} evaluates")
        checkpoints.trained(number, content_hash, "it would be evaluated")
        checkpoints.lineage_holds(number, rerun_through=number)
        _, base_hash = checkpoints.verified(0, f"iteration {number} is compared with")
        if self._evaluated(0) != base_hash:
            self.log("evaluating the base policy first (iteration 0), the baseline of every iteration")
            self._evaluate(0, base_hash)
        if self._evaluated(number - 1) == content_hash:
            return self._reuse(number - 1, content_hash)
        return self._evaluate(number, content_hash)

    def _reuse(self, earlier: int, content_hash: str) -> list[dict]:
        """Checkpoint `earlier`'s evaluation as this one's: the same weights (a step that took no
        optimizer step copies its parent), so evaluating them again would only cost the time."""
        store, name = self.env.store(), self.ref.name
        table = store.read_partition("evaluations", name, earlier)
        self.log(f"checkpoint {self.ref.number} is checkpoint {earlier} ({content_hash[:12]}): its held-out "
                         "evaluation is reused, not run again")
        store.write_partition("evaluations", name, self.ref.number, table)
        return table.to_pylist()

    def _evaluated(self, iteration: int) -> str | None:
        """The checkpoint (content hash) that the stored evaluation of `iteration` evaluated."""
        store, name = self.env.store(), self.ref.name
        if not store.has_partition("evaluations", name, iteration):
            return None
        files = store.partition_files("evaluations", name, iteration)
        versions = set(store.read_files("evaluations", files, ["policy_version"])["policy_version"].to_pylist())
        return versions.pop() if len(versions) == 1 else None

    def _evaluate(self, iteration: int, expected_hash: str) -> list[dict]:
        """Checkpoint `iteration` on the held-out tasks (refused unless it still is
        `expected_hash`), in every condition the experiment asks for (`eval_conditions`)."""
        experiment = self.ref.experiment
        checkpoint = self.checkpoints.verified(iteration, f"iteration {self.ref.number} evaluates")
        if checkpoint[1] != expected_hash:
            raise Refused(f"checkpoint {iteration} changed during this evaluation (now "
                          f"{checkpoint[1][:12]}, checked {expected_hash[:12]}): materialize iteration {iteration}'s "
                          "evaluation again.")
        engine = self.sampler.engine(checkpoint)
        tasks = experiment.held_out_tasks(self.task_set)
        rows = []
        for observations in eval_conditions(experiment):
            label = "" if observations is Observations.SHOWN else f" with observations {observations.value}"
            self.log(f"evaluating checkpoint {iteration} on {len(tasks)} held-out tasks{label}")
            params = eval_params(experiment, blanked=observations is Observations.BLANKED)
            rows += self._in_chunks(engine, iteration, tasks, params, observations)
        self.env.store().write_partition("evaluations", experiment.name, iteration, rows_to_table("evaluations", rows))
        return rows

    def _in_chunks(self, engine: InferenceEngine, iteration: int, tasks: list[Task], params: SamplingParams,
                   observations: Observations) -> list[dict]:
        """The evaluation rows of `tasks`, a chunk at a time, each stored in `evaluation_chunks`
        as it is graded: a stopped evaluation of the same checkpoint resumes after the chunks it
        finished. A chunk is one generate call's tasks (a wave of episodes), sampled with the
        seed an unchunked evaluation would give it, so chunking changes no sample."""
        store, name, log = self.env.store(), self.ref.name, self.log
        episodes = self.ref.experiment.max_turns > 1
        size = max(1, MAX_LIVE // params.n) if episodes else TASKS_PER_CALL
        rows: list[dict] = []
        for start in range(0, len(tasks), size):
            chunk, part = tasks[start : start + size], f"{observations.value}-{start // size:04d}"
            finished = self._finished_chunk(iteration, part, engine.policy_version, chunk, params.n)
            if finished is None:
                # Episodes seed each wave by its first episode's index (run_episodes); single replies
                # seed every call alike (sample_rollouts).
                draws = dataclasses.replace(params, seed=params.seed + start * params.n) if episodes else params
                samples = self.sampler.sample(engine, chunk, draws, f"{name}/eval/{iteration}",
                                              blanked=observations is Observations.BLANKED)
                finished = [evaluation_row(v, observations) for v in self.grader.grade(grading_work(chunk, samples))]
                store.write_partition("evaluation_chunks", name, iteration, rows_to_table("evaluations", finished),
                                      part=part)
            else:
                log(f"checkpoint {iteration}: held-out tasks {start + 1}-{start + len(chunk)} were evaluated "
                    "before this run stopped: kept")
            rows += finished
            log(f"checkpoint {iteration}: {start + len(chunk)}/{len(tasks)} held-out tasks evaluated")
        return rows

    def _finished_chunk(self, iteration: int, part: str, content_hash: str, chunk: list[Task],
                        samples: int) -> list[dict] | None:
        """The stored rows of chunk `part` where an earlier evaluation finished it for this
        checkpoint, these tasks and `samples` answers each; None where it must be evaluated."""
        store, name = self.env.store(), self.ref.name
        if not store.has_partition("evaluation_chunks", name, iteration, part):
            return None
        rows = store.read_partition("evaluation_chunks", name, iteration, part).to_pylist()
        answers = sorted((row["task_id"], row["sample_index"]) for row in rows)
        expected = sorted((task.id, index) for task in chunk for index in range(samples))
        return rows if {row["policy_version"] for row in rows} == {content_hash} and answers == expected else None


def feedback_curve(ref: IterationRef, storage_root: str) -> list[dict]:
    """The `feedback_value` rows of iterations 0 to `ref`'s: held-out pass rates with
    observations shown and blanked, paired by task; [] without blanked evaluations."""
    return metrics.curve(catalog.connect(storage_root), "feedback_value", ref.name, through=ref.number)


def held_out_curve(ref: IterationRef, storage_root: str) -> list[dict]:
    """The `held_out` rows of iterations 0 to `ref`'s, the base policy's first; refused unless
    both it and this iteration have scored samples of a shared task."""
    curve = metrics.curve(catalog.connect(storage_root), "held_out", ref.name, through=ref.number)
    if not curve or curve[0]["iteration"] != 0:
        raise Refused("the base policy's held-out evaluation (iteration 0) has no scored sample: see the "
                      "reward_status of its evaluations, fix the sandbox, and rewrite that partition")
    if curve[-1]["iteration"] != ref.number:
        raise Refused(f"no held-out sample of iteration {ref.number} was scored: see the reward_status of its "
                      "evaluations")
    if not curve[-1]["paired_tasks"]:
        raise Refused(f"iteration {ref.number} and the base policy have no scored held-out task in common")
    return curve
