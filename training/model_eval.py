"""Evaluate a model without training it (`crucible eval`): its answers to a task set's held-out
tasks, sampled and graded exactly as an iteration's evaluation samples and grades them, stored
as the `model_evaluations` dataset. The report (datastore/metrics.py, the model_eval_* views)
gives pass rates per task set, domain and difficulty with standard errors, the agreement of
repeated samples of a task, the failure modes, and the cost per solution.

The model is a checkpoint or Hugging Face directory sampled locally, or a server's model
(engine "openai"), whose prompts are rendered in the chat format of the tokenizer directory
given for it.
"""

from __future__ import annotations

from pathlib import Path

from training.agent.trajectory import trajectory_row
from training.experiment import ExperimentConfig
from training.iteration.context import Environment, Log
from training.iteration.sampling import Sampler, eval_params
from training.iteration.tasks import loaded_task_set, prove_unproven, usable
from training.iteration.verification import Grader, grading_work


def evaluate_model(env: Environment, experiment: ExperimentConfig, model: str, chat_dir: Path,
                   log: Log = print) -> list[dict]:
    """The `model_evaluations` rows of `model` on `experiment`'s task set: `eval_samples`
    answers to each of its first `eval_tasks` held-out tasks (greedy when that is 1), with
    `experiment`'s engine, turns and budgets; `chat_dir` holds the model's tokenizer (or is it)."""
    loaded = loaded_task_set(env, experiment)
    prove_unproven(env, loaded, log)  # an imported set's held-out tasks are evaluated only once proven gradable
    task_set = usable(env, loaded)
    sampler = Sampler.of(env, experiment, task_set, log)
    tasks, params = experiment.held_out_tasks(task_set), eval_params(experiment)
    log(f"evaluating {model} on {len(tasks)} held-out tasks of {task_set.name}, {params.n} answers each")
    samples = sampler.sample(sampler.engine((chat_dir, model)), tasks, params, f"{experiment.name}/eval")
    graded = Grader.of(env, task_set, log).grade(grading_work(tasks, samples))
    return [{"model": model, "task_set": task_set.name, "domain": verified.task.domain, **trajectory_row(verified)}
            for verified in graded]
