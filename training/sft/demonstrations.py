"""Warm-up examples: what a good answer looks like, in both of the policy's formats.

- single-turn: the prompt of training/agent/prompts.py, answered with the reference solution;
- episode: the prompt of training/agent/episodes.py, answered turn by turn with actions: write each
  file the reference changes (the whole solution.py for a function task), then submit. Each
  turn is one example whose prompt is the context so far (earlier actions and the observations
  the environment would have given), so the warm-up teaches the same token sequences an episode
  produces.
Examples are token ids (prompt, response), the response ending with the model's own end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Iterable

from task_sets.patches import apply_patch, changed_paths
from task_sets.schema import RepositoryTask, Task
from task_sets.submission import SOLUTION_FILE
from training.agent.episodes import episode_messages, wrote
from training.agent.prompts import render_prompt
from training.policy.chat import ChatFormat

Example = tuple[list[int], list[int]]


def warmup_examples(chat: ChatFormat, tasks: Iterable[Task], episodes: bool = True,
                    system: str | None = None) -> list[Example]:
    """For every task: its single-turn example (function tasks) and, with `episodes`, its
    episode's turns, prompted with `system` (the task set's system message) if it has one."""
    examples = []
    for task in tasks:
        if not isinstance(task, RepositoryTask):
            examples += single_turn_examples(chat, [(task.prompt, task.reference_solution)], system)
        if episodes:
            examples += episode_examples(chat, task, system)
    return examples


def single_turn_examples(chat: ChatFormat, pairs: Iterable[tuple[str, str]],
                         system: str | None = None) -> list[Example]:
    return [(render_prompt(chat, prompt, system), chat.reply_ids(solution)) for prompt, solution in pairs]


def episode_examples(chat: ChatFormat, task: Task, system: str | None = None) -> list[Example]:
    context, examples = chat.prompt_ids(episode_messages(chat, task, system)), []
    for path, content in _files_to_write(task):
        reply = chat.reply_ids(f'<write path="{path}">\n{content}</write>')
        examples.append((context, reply))
        context = context + reply + chat.observation_ids(wrote(path, content), reply_closed=True)
    examples.append((context, chat.reply_ids("<submit/>")))
    return examples


def _files_to_write(task: Task) -> list[tuple[str, str]]:
    if isinstance(task, RepositoryTask):
        solved = apply_patch(task.files, task.reference_solution)
        return [(path, solved[path]) for path in sorted(changed_paths(task.files, solved)) if path in solved]
    return [(SOLUTION_FILE, task.solution_file(task.reference_solution))]
