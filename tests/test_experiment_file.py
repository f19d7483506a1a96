"""One file describes an experiment: `crucible run --config FILE` (TOML, YAML or JSON), or the
same settings given to the create_experiment job from the launchpad."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from pydantic import ValidationError

from assets.iteration import task_set
from assets.partitions import add_iteration
from assets.resources import CrucibleResource
from pipelines.jobs import create_experiment
from task_sets.importers import ImportOptions, import_tasks
from task_sets.loader import TaskSet
from training.experiment import ExperimentConfig, ExperimentFileError, differing_settings, load_experiment_file

MBPP = Path(__file__).parent / "data" / "mbpp" / "mbpp.jsonl.gz"

GOOD = """
name = "lora-small"
iterations = 2
tasks_per_iteration = 16

[grpo]
estimator = "rloo"
lr_schedule = "cosine"
lr_decay_steps = 8
kl_coef = 0.05
lora_rank = 8
"""


def test_the_agentic_loop_is_described_by_its_own_file():
    """experiments/repair.toml runs episodes on repair, warmed up on played episodes and evaluated
    blind too; the default stays single replies on compose."""
    loop = load_experiment_file(Path(__file__).parents[1] / "experiments" / "repair.toml")
    assert (loop.name, loop.task_set, loop.max_turns, loop.base.episode_demonstrations, loop.eval_blanked) == (
        "repair", "repair", 3, True, True)
    assert loop.report_to == ["tensorboard", "mlflow"]  # a fresh clone's `make run` fills both
    assert (loop.base.sft_steps, loop.tasks_per_iteration, loop.grpo.minibatch_size, loop.grpo.epochs, loop.grpo.lr,
            loop.grpo.lr_warmup_steps, loop.temperature, loop.eval_samples, loop.eval_blanked_samples) == (
        300, 128, 128, 2, 3e-4, 0, 0.6, 8, 1)
    default = ExperimentConfig()
    assert (default.task_set, default.max_turns, default.base.episode_demonstrations) == ("compose", 1, False)


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "experiments").glob("*.toml")),
                         ids=lambda path: path.name)
def test_every_shipped_experiment_file_loads(path):
    assert load_experiment_file(path).name


def test_a_toml_file_describes_an_experiment(tmp_path):
    path = tmp_path / "lora.toml"
    path.write_text(GOOD)
    config = load_experiment_file(path)
    assert config.name == "lora-small" and config.grpo.estimator == "rloo" and config.grpo.lora_rank == 8
    assert config.grpo.clip_eps == 0.2  # unset settings keep their documented defaults


def test_yaml_and_json_say_the_same(tmp_path):
    (tmp_path / "e.yaml").write_text("name: same\ngrpo:\n  kl_coef: 0.1\n")
    (tmp_path / "e.json").write_text('{"name": "same", "grpo": {"kl_coef": 0.1}}')
    assert load_experiment_file(tmp_path / "e.yaml") == load_experiment_file(tmp_path / "e.json")


@pytest.mark.parametrize(("text", "message"), [
    ('name = "x"\n[grpo]\nlr = -1\n', "field 'grpo.lr': Input should be greater than 0"),
    ('name = "x"\n[grpo]\nestimator = "ppo"\n', "field 'grpo.estimator': Input should be 'grpo', 'rloo' or"),
    ('name = "x"\n[grpo]\nlr_schedule = "cosine"\n', "field 'grpo': Value error, lr_schedule 'cosine' needs"),
    ('name = "x"\nsamples_per_tsk = 4\n', "field 'samples_per_tsk': Extra inputs are not permitted"),
    ('name = "x"\nreport_to = ["wandb"]\n', "field 'report_to.0': Input should be 'tensorboard' or 'mlflow'"),
    ('name = "x\n', "not valid TOML"),
])
def test_a_bad_file_names_the_file_field_and_reason(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ExperimentFileError) as error:
        load_experiment_file(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_only_iterations_may_change_once_an_experiment_ran():
    stored = ExperimentConfig(name="a")
    assert differing_settings(stored, stored.model_copy(update={"iterations": 9})) == []
    changed = ExperimentConfig.model_validate({"name": "a", "temperature": 1.0, "grpo": {"lr": 1e-5}})
    assert differing_settings(stored, changed) == ["grpo.lr", "temperature"]


def test_how_the_training_step_runs_may_change_once_an_experiment_ran():
    """Moving an experiment to a GPU node with more ranks and other micro-batches changes where
    and in what pieces it trains, not what it learns."""
    stored = ExperimentConfig(name="a")
    moved = ExperimentConfig.model_validate({"name": "a", "grpo": {
        "device": "cuda", "parallel": "fsdp", "micro_batch_tokens": 16384, "gradient_checkpointing": True,
        "save_progress_every": 1, "threads": 8}})
    assert differing_settings(stored, moved) == []


def test_where_the_numbers_are_reported_may_change_once_an_experiment_ran():
    stored = ExperimentConfig(name="a")
    assert differing_settings(stored, stored.model_copy(update={"report_to": ["tensorboard", "mlflow"]})) == []


def test_an_experiment_reporting_nowhere_is_stored_and_hashed_as_before_report_to_existed():
    """The settings' dump is what is stored and what the checkpoints' config_hash is taken over."""
    assert "report_to" not in ExperimentConfig(name="a").model_dump(mode="json")


def test_token_budgets_default_by_the_model_an_experiment_starts_from():
    """The built-in model's answers are short; an imported instruct model explains its code, and a
    budget of 96 would cut most of its answers (issue 38)."""
    built_in, imported = ExperimentConfig(name="a"), ExperimentConfig(name="b", base_model="/models/x")
    assert (built_in.max_new_tokens, built_in.episode_max_tokens) == (96, 1024)  # stored, and hashed, as before
    assert (imported.max_new_tokens, imported.episode_max_tokens) == (512, 2048)
    assert ExperimentConfig(name="c", base_model="/models/x", max_new_tokens=64).max_new_tokens == 64


def test_difficulty_tiers_choose_what_is_trained_on_and_what_is_measured():
    """Both splits keep only the experiment's tiers, in the set's order, and the evaluation's first
    `eval_tasks` are counted within them; an experiment without tiers is stored as before."""
    mbpp = TaskSet("mbpp", tuple(import_tasks("mbpp", MBPP, ImportOptions("mbpp", split="source")).tasks))
    easy = ExperimentConfig(name="a", difficulties=["easy"], eval_tasks=5)
    trained, measured = easy.rl_tasks(mbpp), easy.held_out_tasks(mbpp)
    assert {task.difficulty for task in trained + measured} == {"easy"}
    assert {task.split for task in trained} == {"train"} and {task.split for task in measured} == {"eval"}
    assert measured == [task for task in mbpp.eval() if task.difficulty == "easy"][:5]
    assert "difficulties" not in ExperimentConfig(name="b").model_dump(mode="json")


def test_a_tier_the_set_lacks_is_refused_with_the_tiers_it_has():
    tasks = import_tasks("mbpp", MBPP, ImportOptions("mbpp", split="source")).tasks
    easy_only = TaskSet("easy-only", tuple(task for task in tasks if task.difficulty == "easy"))
    with pytest.raises(ValueError, match=r"leave none of task set 'easy-only'.*its tiers: \['easy'\]"):
        ExperimentConfig(name="a", difficulties=["hard"]).rl_tasks(easy_only)
    with pytest.raises(ValidationError, match="difficulties"):
        ExperimentConfig(name="a", difficulties=["trivial"])


def test_the_trackers_are_stored_with_the_experiment():
    reporting = ExperimentConfig(name="a", report_to=["mlflow"])
    assert ExperimentConfig.model_validate_json(reporting.model_dump_json()).report_to == ["mlflow"]


def test_settings_stored_with_micro_batches_in_samples_still_load():
    stored = ExperimentConfig(name="a").model_dump(mode="json")
    stored["grpo"]["micro_batch_size"] = 16  # as experiments were stored before micro_batch_tokens
    assert ExperimentConfig.model_validate(stored).grpo == ExperimentConfig(name="a").grpo


def test_the_cli_refuses_to_change_a_stored_experiment_without_a_traceback(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data")}
    (tmp_path / "data" / "experiments").mkdir(parents=True)
    (tmp_path / "data" / "experiments" / "lora-small.json").write_text(ExperimentConfig(name="lora-small").model_dump_json())
    (tmp_path / "lora.toml").write_text(GOOD)
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--config", str(tmp_path / "lora.toml")],
                            env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2
    assert "experiment 'lora-small' is stored with other settings" in result.stderr
    assert "grpo.estimator" in result.stderr and "Traceback" not in result.stderr


def test_an_unknown_task_set_is_refused_before_the_experiment_is_stored(tmp_path):
    """Issue 40, problem 2: the settings were stored before the task set was resolved, so the
    corrected file was then refused as a change of a stored experiment."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"),
           "CRUCIBLE_TASK_SETS": str(tmp_path / "library")}
    (tmp_path / "typo.toml").write_text('name = "typo"\ntask_set = "compse"\n')
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--config", str(tmp_path / "typo.toml")],
                            env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "TaskSetError" not in result.stderr
    assert f"experiment 'typo': unknown task set 'compse' (imported sets are looked up in {tmp_path / 'library'})" \
        in result.stderr
    assert not (tmp_path / "data" / "experiments" / "typo.json").exists()  # the corrected file is a first start


@pytest.mark.parametrize(("arguments", "said"), [
    (["--task-set", "compse"], "error: unknown task set 'compse' (imported sets are looked up in "),
    (["--task-set", "compose", "--samples", "0"], "argument --samples: 0: give 1 or more"),
])
def test_crucible_eval_refuses_what_it_cannot_evaluate_in_one_line(tmp_path, arguments, said):
    """Before any model is loaded; once a traceback and a pydantic dump."""
    env = {**os.environ, "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data")}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "eval", *arguments, "--model", str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr
    assert "validation error" not in result.stderr


def test_an_error_is_printed_as_typed_not_read_as_markup(tmp_path):
    """Issue 40, problem 7: the terminal library read '[a-z0-9]' in a name pattern as a style."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data")}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "Bad"],
                            env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: invalid setting name: String should match pattern '^[a-z0-9][a-z0-9_\\-]*$'"


def _refusal(path: Path, text: str) -> str:
    """The one sentence loading an experiment file of `text` is refused with."""
    path.write_text(text)
    with pytest.raises(ExperimentFileError) as error:
        load_experiment_file(path)
    return str(error.value)


def test_a_trainer_temperature_other_than_the_sampling_one_is_refused(tmp_path):
    path = tmp_path / "exp.toml"
    assert _refusal(path, 'name = "a"\ntemperature = 0.6\n[grpo]\ntemperature = 1.0\n') == (
        f"{path}: grpo.temperature (1.0) differs from temperature (0.6): the trainer recomputes log-probs at the "
        "temperature the samples were drawn at, so there is one setting; set `temperature` only")


def test_several_blanked_episodes_of_a_greedy_evaluation_are_refused(tmp_path):
    path = tmp_path / "exp.toml"
    assert _refusal(path, 'name = "a"\nmax_turns = 3\neval_samples = 1\neval_blanked_samples = 4\n') == (
        f"{path}: eval_samples = 1 evaluates greedily, so its 4 blanked episodes per task would all be the same: "
        "set eval_blanked_samples to 1, or sample with eval_samples > 1")


def test_a_trainer_temperature_equal_to_the_sampling_one_is_accepted(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text('name = "a"\ntemperature = 0.8\n[grpo]\ntemperature = 0.8\n')
    assert load_experiment_file(path).temperature == 0.8


def test_stored_settings_that_no_longer_validate_stop_the_run_with_their_reason(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data")}
    (tmp_path / "data" / "experiments").mkdir(parents=True)
    stored = ExperimentConfig(name="old").model_dump(mode="json")
    stored["grpo"]["temperature"] = 1.0  # what settings stored before the one temperature held
    (tmp_path / "data" / "experiments" / "old.json").write_text(json.dumps(stored))
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "old"],
                            env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "old.json: grpo.temperature (1.0) differs from temperature (0.6)" in result.stderr


def test_running_fewer_iterations_never_lowers_the_stored_limit(tmp_path, monkeypatch):
    """Issue 16, problem 5: `crucible run --iterations 1` once lowered the limit for good."""
    from commands.errors import UserError
    from pipelines.experiment_runner import ExperimentRunner
    from commands.settings import load_settings

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.setenv("CRUCIBLE_STORAGE_ROOT", str(tmp_path / "data"))
    (tmp_path / "dagster").mkdir()
    deployment = load_settings()
    ExperimentRunner.for_experiment("exp", ExperimentConfig(name="exp", iterations=10), deployment=deployment)
    once = ExperimentRunner.for_experiment("exp", iterations=1, deployment=deployment)
    assert once.through == 1 and once.crucible.experiment("exp").iterations == 10
    longer = ExperimentRunner.for_experiment("exp", iterations=15, deployment=deployment)
    assert longer.through == 15 and longer.crucible.experiment("exp").iterations == 15
    again = ExperimentRunner.for_experiment("exp", ExperimentConfig(name="exp", iterations=10),  # the file, again
                                            deployment=deployment)
    assert again.through == 10 and again.crucible.experiment("exp").iterations == 15
    with pytest.raises(UserError, match="--iterations 0: give 1 or more"):
        ExperimentRunner.for_experiment("exp", iterations=0, deployment=deployment)


def _create(crucible: CrucibleResource, instance: DagsterInstance, settings: str):
    return create_experiment.execute_in_process(
        run_config={"ops": {"store_experiment": {"config": {"settings": settings}}}},
        resources={"crucible": crucible}, instance=instance, raise_on_error=False)


def test_an_experiment_is_created_from_the_launchpad_run_config_validated_as_a_file(tmp_path):
    """Issue 16, problem 5: an experiment exists once its settings are stored, from a file or the UI."""
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    with DagsterInstance.ephemeral() as instance:
        assert _create(crucible, instance, 'name = "ui-made"\niterations = 3\n[grpo]\nepochs = 2\n').success
        assert crucible.experiment("ui-made").grpo.epochs == 2
        assert instance.get_dynamic_partitions("experiments") == ["ui-made"]

        bad = _create(crucible, instance, 'name = "ui-made"\n[grpo]\nlr = -1\n')
        changed = _create(crucible, instance, 'name = "ui-made"\niterations = 3\n[grpo]\nepochs = 3\n')
        shorter = _create(crucible, instance, 'name = "ui-made"\niterations = 2\n[grpo]\nepochs = 2\n')
    [bad_failure] = [event for event in bad.all_events if event.is_step_failure]
    assert "the launchpad's settings: field 'grpo.lr'" in bad_failure.step_failure_data.error.message
    [changed_failure] = [event for event in changed.all_events if event.is_step_failure]
    assert "is stored with other settings (grpo.epochs differ)" in changed_failure.step_failure_data.error.message
    assert shorter.success and crucible.experiment("ui-made").iterations == 3  # the limit is never lowered


def test_a_ui_launch_beyond_the_iteration_limit_fails_with_how_to_raise_it(tmp_path):
    """Issue 16, problem 5: UI launches and backfills ignored the experiment's limit."""
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    crucible.save_experiment(ExperimentConfig(name="short", iterations=3))
    with DagsterInstance.ephemeral() as instance:
        result = materialize([task_set], partition_key=add_iteration(instance, "short", 4), instance=instance,
                             resources={"crucible": crucible}, raise_on_error=False)
    [failure] = [event for event in result.all_events if event.is_step_failure]
    assert ("iteration 4 is beyond experiment 'short''s limit of 3: raise it first (`crucible run --experiment short "
            "--iterations 4`") in failure.step_failure_data.error.message
