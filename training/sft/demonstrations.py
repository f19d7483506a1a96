"""Warm-up examples: what a good answer looks like, in both of the policy's formats.

- single-turn: the prompt of training/agent/prompts.py, answered with the reference solution;
- episode: the prompt of training/agent/episodes.py, answered turn by turn with actions: write each
  file the reference changes (the whole solution.py for a function task), then submit. Each
  turn is one example whose prompt is the context so far (earlier actions and the observations
  the environment would have given), so the warm-up teaches the same token sequences an episode
  produces.
Examples are token ids (prompt, response), the response ending with <|im_end|>.
"""

from __future__ import annotations

from collections.abc import Iterable

from task_sets.patches import apply_patch, changed_paths
from task_sets.schema import RepositoryTask, Task
from task_sets.submission import SOLUTION_FILE
from training.agent.episodes import observation_ids, render_episode_prompt, wrote
from training.agent.prompts import render_prompt
from training.policy.tokenizer import IM_END

Example = tuple[list[int], list[int]]


def warmup_examples(tokenizer, tasks: Iterable[Task], episodes: bool = True) -> list[Example]:
    """For every task: its single-turn example (function tasks) and, with `episodes`, its
    episode's turns."""
    examples = []
    for task in tasks:
        if not isinstance(task, RepositoryTask):
            examples += single_turn_examples(tokenizer, [(task.prompt, task.reference_solution)])
        if episodes:
            examples += episode_examples(tokenizer, task)
    return examples


def single_turn_examples(tokenizer, pairs: Iterable[tuple[str, str]]) -> list[Example]:
    return [(render_prompt(tokenizer, prompt), _reply(tokenizer, solution)) for prompt, solution in pairs]


def episode_examples(tokenizer, task: Task) -> list[Example]:
    context, examples = render_episode_prompt(tokenizer, task), []
    for path, content in _files_to_write(task):
        reply = _reply(tokenizer, f'<write path="{path}">\n{content}</write>')
        examples.append((context, reply))
        context = context + reply + observation_ids(tokenizer, wrote(path, content))
    examples.append((context, _reply(tokenizer, "<submit/>")))
    return examples


def _files_to_write(task: Task) -> list[tuple[str, str]]:
    if isinstance(task, RepositoryTask):
        solved = apply_patch(task.files, task.reference_solution)
        return [(path, solved[path]) for path in sorted(changed_paths(task.files, solved)) if path in solved]
    return [(SOLUTION_FILE, task.solution_file(task.reference_solution))]


def _reply(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text + IM_END, add_special_tokens=False))
