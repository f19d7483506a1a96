"""training/iteration/, without Dagster: which tasks an iteration samples, which checkpoint it
may sample from, train from and evaluate, and what it refuses."""

from __future__ import annotations

import pytest
from test_datastore import trajectory_row

from assets.resources import CrucibleResource
from datastore.store import rows_to_table
from training.continuation import reason_to_stop
from training.experiment import ExperimentConfig
from training.iteration import held_out
from training.iteration.context import IterationRef, Refused
from training.iteration.held_out import Evaluation
from training.iteration.lineage import Checkpoints
from training.iteration.sampling import rollout_params
from training.iteration.tasks import sample_tasks, task_rows, usable_task_set
from training.iteration.training_step import train_job
from training.policy.checkpoint import verify_checkpoint
from training.policy.model import build_base_policy
from training.policy.settings import PolicyConfig

TINY = PolicyConfig(hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=32,
                    max_position_embeddings=64)


@pytest.fixture
def crucible(tmp_path) -> CrucibleResource:
    return CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "checkpoints"))


def ref(number: int, **settings) -> IterationRef:
    return IterationRef(ExperimentConfig(name="exp", **settings), number)


def sampled(crucible: CrucibleResource, number: int, **settings) -> list:
    """The train tasks iteration `number` of an experiment with `settings` samples."""
    iteration = ref(number, **settings)
    return sample_tasks(iteration, usable_task_set(crucible, iteration.experiment))


def evaluate(crucible: CrucibleResource, number: int, log=lambda message: None, **settings) -> list[dict]:
    """Iteration `number`'s held-out evaluation, as its checkpoint_eval asset runs it."""
    return Evaluation(ref(number, **settings), crucible, log).run()


def sampled_by(crucible: CrucibleResource, number: int) -> tuple:
    return Checkpoints(crucible, "exp").sampled_by(number).checkpoint


def test_an_iteration_samples_a_seeded_subset_of_train_tasks_that_changes_each_iteration(crucible):
    first, again, second = (sampled(crucible, n) for n in (1, 1, 2))
    assert [t.id for t in first] == [t.id for t in again] and len(first) == 64
    assert {t.id for t in first} != {t.id for t in second}
    assert all(task.split == "train" for task in first + second)
    other_seed = sampled(crucible, 1, seed=1)
    assert {t.id for t in other_seed} != {t.id for t in first}


def test_an_experiment_without_a_subset_samples_every_train_task(crucible):
    train = usable_task_set(crucible, ref(1).experiment).train()
    assert len(sampled(crucible, 1, tasks_per_iteration=None)) == len(train)


def test_an_experiment_warming_up_on_a_share_samples_only_the_train_tasks_the_warm_up_left_out(crucible):
    half = ref(1, task_set="repair", tasks_per_iteration=None, base={"warmup_fraction": 0.5})
    repair = usable_task_set(crucible, half.experiment)
    warmed = {task.id for task in half.experiment.warmup_tasks(repair)}
    chosen = {task.id for task in sample_tasks(half, repair)}
    assert warmed.isdisjoint(chosen) and warmed | chosen == {task.id for task in repair.train()}
    assert len(warmed) == len(repair.train()) // 2
    everything = ref(1, task_set="repair", tasks_per_iteration=None)
    assert len(everything.experiment.warmup_tasks(repair)) == len(sample_tasks(everything, repair))


def test_a_warm_up_share_that_leaves_nothing_to_sample_is_refused_with_the_reason(crucible):
    with pytest.raises(ValueError, match=r"warmup_fraction 0.9999 leaves none of task set 'repair'\'s 792 train tasks"):
        sampled(crucible, 1, task_set="repair", base={"warmup_fraction": 0.9999})


def test_every_task_of_the_set_is_recorded_and_marked_sampled_or_not(crucible):
    compose = usable_task_set(crucible, ref(3).experiment)
    chosen = sample_tasks(ref(3), compose)
    table = rows_to_table("tasks", task_rows(compose, chosen))
    assert table.num_rows == len(compose)
    assert sum(table["sampled"].to_pylist()) == len(chosen)


def test_one_seed_drives_every_random_choice_of_an_iteration(crucible):
    assert ref(7, seed=2).seed == rollout_params(ref(7, seed=2)).seed
    assert len({ref(n, seed=s).seed for n in range(1, 50) for s in range(3)}) == 147


def test_an_iteration_refuses_a_checkpoint_that_does_not_exist_and_says_what_to_do(crucible):
    with pytest.raises(Refused, match=r"iteration 3 samples from checkpoint 2, which is not usable: .* "
                                      r"Materialize iteration 2 \(or the experiment's base_policy\) first\."):
        sampled_by(crucible, 3)


def test_an_evaluation_with_nothing_scored_is_refused(crucible):
    with pytest.raises(Refused, match=r"the base policy's held-out evaluation \(iteration 0\) has no scored sample"):
        held_out.held_out_curve(ref(1), crucible.storage_root)


def _checkpoint(crucible: CrucibleResource, iteration: int, recorded_hash: str | None = None, seed: int = 0,
                parent_hash: str | None = None) -> str:
    """A real checkpoint (weights drawn from `seed`) where iteration `iteration` keeps it; with
    `recorded_hash`, the `checkpoints` row its training step would have written says that hash
    (and that it was trained from `parent_hash`)."""
    directory = crucible.checkpoint_dir("exp", iteration)
    content_hash = verify_checkpoint(build_base_policy(directory, TINY.model_copy(update={"seed": seed})))["content_hash"]
    if recorded_hash is not None:
        _checkpoint_row(crucible, iteration, recorded_hash, parent_hash)
    return content_hash


def _checkpoint_row(crucible: CrucibleResource, iteration: int, content_hash: str, parent_hash: str | None) -> None:
    """The `checkpoints` row a training step of `iteration` would have written."""
    row = {name: None for name in rows_to_table("checkpoints", []).schema.names}
    row.update(path="p", content_hash=content_hash, parent_hash=parent_hash, blocked=False, monitor_messages=[],
               trajectories=[])
    crucible.store().write_partition("checkpoints", "exp", iteration, rows_to_table("checkpoints", [row]))


def test_an_iteration_refuses_a_checkpoint_other_than_the_one_its_training_step_recorded(crucible):
    on_disk = _checkpoint(crucible, 1, recorded_hash="f" * 64)  # replaced by another run after its step
    with pytest.raises(Refused, match=f"checkpoint 1 on disk is {on_disk[:12]}, not ffffffffffff that iteration 1's "
                                      "training step recorded .* iteration 2 samples from it"):
        sampled_by(crucible, 2)


def test_a_rerun_of_an_earlier_iteration_leaves_later_checkpoints_unusable(crucible):
    """Issue 16: a re-run of iteration 1 from the UI must not let iteration 3 sample checkpoint 2,
    which was trained from the replaced checkpoint 1."""
    base = _checkpoint(crucible, 0)
    first = _checkpoint(crucible, 1, seed=1, parent_hash=base)
    _checkpoint(crucible, 1, seed=1, recorded_hash=first, parent_hash=base)
    second = _checkpoint(crucible, 2, seed=2)
    _checkpoint(crucible, 2, seed=2, recorded_hash=second, parent_hash=first)
    assert sampled_by(crucible, 3)[1] == second  # one lineage: base -> 1 -> 2
    rerun = _checkpoint(crucible, 1, seed=3)
    _checkpoint(crucible, 1, seed=3, recorded_hash=rerun, parent_hash=base)  # iteration 1 again, other weights
    with pytest.raises(Refused, match=f"checkpoint 2 was trained from checkpoint 1 as it was \\({first[:12]}\\), which "
                                      f"has since been replaced \\({rerun[:12]}\\): materialize iterations 2 to 3 "
                                      "again, in order."):
        sampled_by(crucible, 3)
    assert sampled_by(crucible, 2)[1] == rerun  # iteration 2 again is what it takes


def test_the_whole_lineage_back_to_the_base_policy_is_checked(crucible):
    """Not one step back only: after a re-run of iteration 1, iteration 4 must not sample
    checkpoint 3, whose own parent (2) is unchanged but was trained from the replaced 1."""
    hashes = [_checkpoint(crucible, 0)]
    for number in (1, 2, 3):
        hashes.append(_checkpoint(crucible, number, seed=number))
        _checkpoint(crucible, number, seed=number, recorded_hash=hashes[number], parent_hash=hashes[number - 1])
    assert sampled_by(crucible, 4)[1] == hashes[3]
    rerun = _checkpoint(crucible, 1, seed=9)
    _checkpoint(crucible, 1, seed=9, recorded_hash=rerun, parent_hash=hashes[0])
    with pytest.raises(Refused, match=f"checkpoint 2 was trained from checkpoint 1 as it was \\({hashes[1][:12]}\\).* "
                                      "materialize iterations 2 to 4 again, in order."):
        sampled_by(crucible, 4)
    _checkpoint(crucible, 0, seed=5)  # a rebuilt base policy breaks every lineage from it
    with pytest.raises(Refused, match="checkpoint 1 was trained from checkpoint 0 as it was"):
        sampled_by(crucible, 2)


def test_an_iteration_refuses_a_checkpoint_its_training_step_never_recorded(crucible):
    _checkpoint(crucible, 1)
    with pytest.raises(Refused, match="checkpoint 1 has no record of the training step that made it"):
        sampled_by(crucible, 2)


def test_training_refuses_trajectories_another_policy_sampled(crucible):
    base = _checkpoint(crucible, 0)
    rows = [{**trajectory_row(f"t/{i}", i), "policy_version": "0123456789abcdef"} for i in range(2)]
    crucible.store().write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    with pytest.raises(Refused, match=f"iteration 1's trajectories were sampled by 0123456789ab, not by checkpoint 0 "
                                      f"as it is now \\({base[:12]}\\): materialize iteration 1 again"):
        train_job(ref(1), crucible)
    rows = [{**row, "policy_version": base} for row in rows]
    crucible.store().write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    assert train_job(ref(1), crucible).lineage["parent"]["content_hash"] == base


def _lineage(crucible: CrucibleResource, last: int) -> list[str]:
    """Checkpoints 0 … `last` on one lineage, each with its training step's record; their hashes."""
    hashes = [_checkpoint(crucible, 0)]
    for number in range(1, last + 1):
        hashes.append(_checkpoint(crucible, number, recorded_hash="", seed=number))
        _checkpoint_row(crucible, number, hashes[number], hashes[number - 1])
    return hashes


def test_within_its_staleness_an_iteration_samples_the_newest_checkpoint_whose_training_step_ended(crucible):
    hashes = _lineage(crucible, 1)
    checkpoints = Checkpoints(crucible, "exp")
    _checkpoint(crucible, 2, seed=2)  # on disk, its training step not ended: no record yet
    policy = checkpoints.sampled_by(3, max_staleness=1)
    assert (policy.iteration, policy.checkpoint[1], policy.staleness(3)) == (1, hashes[1], 1)
    with pytest.raises(Refused, match="checkpoint 2 has no record of the training step .* iteration 3 samples from it"):
        checkpoints.sampled_by(3)  # max_staleness 0: checkpoint 2 or nothing
    _checkpoint_row(crucible, 2, verify_checkpoint(crucible.checkpoint_dir("exp", 2))["content_hash"], hashes[1])
    assert checkpoints.sampled_by(3, max_staleness=1).iteration == 2


def test_the_oldest_checkpoint_within_the_staleness_must_have_ended_its_training_step(crucible):
    _lineage(crucible, 1)
    with pytest.raises(Refused, match="iteration 4 samples from checkpoint 2, which is not usable: .* Materialize "
                                      "iteration 2"):
        Checkpoints(crucible, "exp").sampled_by(4, max_staleness=1)  # 2 and 3 in flight: 4 waits


def test_training_takes_samples_within_the_staleness_and_names_their_sampler_in_its_lineage(crucible):
    hashes = _lineage(crucible, 2)
    rows = [{**trajectory_row(f"t/{i}", i), "policy_version": hashes[1], "policy_iteration": 1, "staleness": 1}
            for i in range(2)]
    crucible.store().write_partition("trajectories", "exp", 3, rows_to_table("trajectories", rows))
    job = train_job(ref(3, max_staleness=1), crucible)
    assert job.lineage["parent"]["content_hash"] == hashes[2]
    assert job.lineage["samplers"] == [{"iteration": 1, "content_hash": hashes[1]}]
    with pytest.raises(Refused, match="iteration 3's trajectories were sampled by checkpoint 1, 1 training steps "
                                      "behind checkpoint 2 that it trains from, and the experiment's max_staleness "
                                      "is 0: materialize iteration 3 again from its rollouts."):
        train_job(ref(3), crucible)


def test_training_refuses_samples_whose_sampler_has_since_been_replaced(crucible):
    hashes = _lineage(crucible, 2)
    rows = [{**trajectory_row("t/0", 0), "policy_version": "0123456789abcdef", "policy_iteration": 1, "staleness": 1}]
    crucible.store().write_partition("trajectories", "exp", 3, rows_to_table("trajectories", rows))
    with pytest.raises(Refused, match=f"sampled by 0123456789ab, not by checkpoint 1 as it is now \\({hashes[1][:12]}\\)"):
        train_job(ref(3, max_staleness=1), crucible)


def test_evaluation_refuses_a_checkpoint_replaced_after_its_training_step(crucible):
    _checkpoint(crucible, 1, recorded_hash="e" * 64)
    with pytest.raises(Refused, match="checkpoint 1 on disk is .* not eeeeeeeeeeee .* it would be evaluated"):
        evaluate(crucible, 1)


def test_a_checkpoint_that_learned_nothing_reuses_its_parents_evaluation(crucible):
    """A training step without an optimizer step copies its parent: the same weights are not
    evaluated again (4.5 minutes of a real model's time, for the same numbers)."""
    base = _checkpoint(crucible, 0)
    assert _checkpoint(crucible, 1, recorded_hash=base, parent_hash=base) == base
    rows = [{name: None for name in rows_to_table("evaluations", []).schema.names} | {
        "task_id": f"t/{i}", "sample_index": 0, "policy_version": base, "reward": float(i), "passed": bool(i),
        "reward_status": "scored", "observations": "shown"} for i in range(2)]
    crucible.store().write_partition("evaluations", "exp", 0, rows_to_table("evaluations", rows))
    said = []
    evaluated = evaluate(crucible, 1, log=said.append)
    assert evaluated == crucible.store().read_partition("evaluations", "exp", 0).to_pylist()
    assert crucible.store().read_partition("evaluations", "exp", 1).to_pylist() == evaluated
    assert said == [f"checkpoint 1 is checkpoint 0 ({base[:12]}): its held-out evaluation is reused, not run again"]


def test_a_rerun_keeps_the_trajectory_files_its_checkpoint_trained_on(crucible):
    assert Checkpoints(crucible, "exp").trained_on(1) == []  # not trained yet: nothing to keep
    row = {name: None for name in rows_to_table("checkpoints", []).schema.names}
    row.update(path="p", trajectories=["file:///data/trajectories/experiment=exp/iteration=1/data-1.parquet"])
    crucible.store().write_partition("checkpoints", "exp", 1, rows_to_table("checkpoints", [row]))
    assert Checkpoints(crucible, "exp").trained_on(1) == row["trajectories"]


def test_continuous_training_stops_at_the_limit_a_blocked_checkpoint_or_a_plateau():
    """training/continuation.py: the sensor's stopping rules."""
    experiment = ExperimentConfig(name="exp", iterations=6, continuous=True, plateau_patience=2)
    curve = [(0, 0.1), (1, 0.3), (2, 0.25), (3, 0.3)]
    assert reason_to_stop(experiment, 2, False, curve[:3]) is None  # one iteration without a gain
    assert reason_to_stop(experiment, 3, False, curve) == (  # equalling the best is no gain
        "plateau: the held-out pass rate has not beaten 0.300 (iteration 1) for 2 iterations (plateau_patience 2)")
    assert reason_to_stop(experiment, 2, True, curve[:3]) == "checkpoint 2 failed a blocking stability check"
    assert reason_to_stop(experiment, 6, False, curve) == "reached its limit of 6 iterations"
    assert reason_to_stop(experiment.model_copy(update={"plateau_patience": None}), 5, False,
                          [(0, 0.5), *((i, 0.1) for i in range(1, 6))]) is None


def test_the_base_policy_evaluation_is_redone_for_a_rebuilt_base_policy(crucible, local_backend):
    """Problem 4 of issue 16: a rebuilt base policy left the stored iteration-0 evaluation stale.
    The evaluation is keyed by the base policy's content hash."""
    wide = TINY.model_copy(update={"max_position_embeddings": 1024})
    settings = dict(task_set="compose", eval_tasks=1, eval_samples=1, max_new_tokens=8, max_turns=1)

    def build(iteration_number: int, seed: int) -> str:
        directory = crucible.checkpoint_dir("exp", iteration_number)
        return verify_checkpoint(build_base_policy(directory, wide.model_copy(update={"seed": seed})))["content_hash"]

    def evaluated_policy(iteration_number: int) -> set[str]:
        return set(crucible.store().read_partition("evaluations", "exp", iteration_number)["policy_version"].to_pylist())

    base, trained = build(0, 0), build(1, 1)
    _checkpoint_row(crucible, 1, trained, parent_hash=base)
    logged: list[str] = []
    def evaluate_once() -> None:
        evaluate(crucible, 1, log=logged.append, **settings)

    evaluate_once()
    assert evaluated_policy(0) == {base} and evaluated_policy(1) == {trained}
    evaluate_once()
    assert sum("evaluating the base policy first" in line for line in logged) == 1  # still the same base
    rebuilt = build(0, 7)
    with pytest.raises(Refused, match="checkpoint 1 was trained from checkpoint 0 as it was"):
        evaluate_once()  # checkpoint 1 descends from the old base policy
    _checkpoint_row(crucible, 1, trained, parent_hash=rebuilt)  # as though iteration 1 ran again from it
    evaluate_once()
    assert evaluated_policy(0) == {rebuilt}
    assert sum("evaluating the base policy first" in line for line in logged) == 2


def test_a_stopped_evaluation_keeps_the_chunks_it_finished_and_resumes_with_the_same_samples(tmp_path,
                                                                                             local_backend):
    """Issue 38: a real model's evaluation takes many minutes on a CPU, and a run stopped during
    it kept nothing. Each chunk (one generate call's tasks) is stored as it is graded; the next
    evaluation of that checkpoint keeps those chunks and samples the rest, as one run would."""
    wide = TINY.model_copy(update={"max_position_embeddings": 1024})
    settings = dict(task_set="compose", eval_tasks=20, eval_samples=2, max_new_tokens=8, max_turns=1)

    def experiment_in(root) -> CrucibleResource:
        crucible = CrucibleResource(storage_root=str(root / "data"), checkpoint_root=str(root / "checkpoints"))
        hashes = [verify_checkpoint(build_base_policy(crucible.checkpoint_dir("exp", number),
                                                      wide.model_copy(update={"seed": number})))["content_hash"]
                  for number in (0, 1)]
        _checkpoint_row(crucible, 1, hashes[1], parent_hash=hashes[0])
        return crucible

    def answers(crucible: CrucibleResource) -> list[tuple]:
        rows = crucible.store().read_partition("evaluations", "exp", 0).to_pylist()
        return sorted((row["task_id"], row["sample_index"], row["response_text"], row["passed"]) for row in rows)

    whole = experiment_in(tmp_path / "whole")
    evaluate(whole, 1, **settings)
    assert whole.store().iterations("evaluation_chunks", "exp", part="shown-0001") == [0, 1]  # 16 tasks, then 4

    # What a run stopped after the base policy's first chunk leaves: that chunk, nothing else.
    stopped = experiment_in(tmp_path / "stopped")
    first = whole.store().read_partition("evaluation_chunks", "exp", 0, part="shown-0000")
    stopped.store().write_partition("evaluation_chunks", "exp", 0, first, part="shown-0000")
    logged: list[str] = []
    evaluate(stopped, 1, log=logged.append, **settings)
    assert "checkpoint 0: held-out tasks 1-16 were evaluated before this run stopped: kept" in logged
    assert not any("held-out tasks 17-20 were evaluated" in line for line in logged)  # sampled afresh
    assert answers(stopped) == answers(whole) and len(answers(whole)) == 40
