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

from collections.abc import Callable
from pathlib import Path

from training.agent.trajectory import trajectory_row
from training.experiment import ExperimentConfig
from training.inference.engine import SamplingParams
from training.iteration import Environment, Iteration


def evaluate_model(env: Environment, experiment: ExperimentConfig, model: str, chat_dir: Path,
                   log: Callable[[str], None] = print) -> list[dict]:
    """The `model_evaluations` rows of `model` on `experiment`'s task set: `eval_samples`
    answers to each of its first `eval_tasks` held-out tasks (greedy when that is 1), with
    `experiment`'s engine, turns and budgets; `chat_dir` holds the model's tokenizer (or is it)."""
    iteration = Iteration(env, experiment, number=0, log=log)
    iteration.prove_unproven()  # an imported set's held-out tasks are evaluated only once proven gradable
    task_set = iteration.task_set
    engine = iteration.engine((chat_dir, model))
    tasks = experiment.held_out_tasks(task_set)
    greedy = experiment.eval_samples == 1
    params = SamplingParams(n=experiment.eval_samples, max_new_tokens=experiment.max_new_tokens,
                            temperature=0.0 if greedy else experiment.temperature, seed=experiment.seed)
    log(f"evaluating {model} on {len(tasks)} held-out tasks of {task_set.name}, {params.n} answers each")
    samples = iteration.sample(engine, tasks, params, f"{experiment.name}/eval")
    by_id = {task.id: task for task in tasks}
    graded = iteration.grade([(by_id[sample.task_id], sample) for sample in samples])
    return [{"model": model, "task_set": task_set.name, "domain": verified.task.domain, **trajectory_row(verified)}
            for verified in graded]
