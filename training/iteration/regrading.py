"""Re-grading: the submissions an iteration's checkpoint trained on (before its training step: the
stored trajectories) graded again, in fresh sandboxes, by the task set's grader and reward
function as they are now, stored beside the original verdicts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from grading.rewards import Process
from training.agent.trajectory import regrade_row
from training.iteration.context import Environment, IterationRef, Log, Refused
from training.iteration.lineage import Checkpoints
from training.iteration.tasks import usable_task_set
from training.iteration.verification import Grader

GRADED_COLUMNS = ["task_id", "group_id", "sample_index", "patch", "turns", "passed", "reward", "reward_version"]


@dataclass(frozen=True)
class Regrade:
    reward_version: str
    rows: list[dict]  # of the `regrades` dataset
    verdicts_changed: int  # samples whose `passed` differs from the original grading's


def regrade(ref: IterationRef, env: Environment, log: Log) -> Regrade:
    """Iteration `ref`'s trained-on submissions graded again by its task set's grader as it is now."""
    store, name, number = env.store(), ref.name, ref.number
    try:
        files = Checkpoints(env, name).trained_on(number) or store.partition_files("trajectories", name, number)
    except FileNotFoundError:
        raise Refused(f"iteration {number} has no stored trajectories to re-grade: materialize it first.") from None
    task_set = usable_task_set(env, ref.experiment)
    grader = Grader.of(env, task_set, log)
    tasks = {task.id: task for task in task_set}
    rows = [{**row, "trajectory_file": file} for file in files
            for row in store.read_files("trajectories", [file], GRADED_COLUMNS).to_pylist()]
    missing = sorted({row["task_id"] for row in rows} - tasks.keys())
    if missing:
        raise Refused(f"the task set {task_set.name!r} no longer has task(s) {', '.join(missing[:5])} that "
                      f"iteration {number} answered, so they cannot be graded again.")
    graded = grader.grade_submissions([(tasks[row["task_id"]], row["patch"] or "",
                                        Process(turns=len(row["turns"]),
                                                tokens=sum(turn["sampled_tokens"] for turn in row["turns"])))
                                       for row in rows])
    now = datetime.now(timezone.utc)
    return Regrade(grader.reward.version,
                   [regrade_row(row, tasks[row["task_id"]], g.grade, row["trajectory_file"], now)
                    for row, g in zip(rows, graded)],
                   verdicts_changed=sum(row["passed"] != g.grade.passed for row, g in zip(rows, graded)))
