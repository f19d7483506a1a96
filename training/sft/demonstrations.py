"""Warm-up examples: what a good answer looks like, in both of the policy's formats.

- single-turn: the prompt of training/agent/prompts.py, answered with the reference solution
  (only where the prompt says enough to write it: not for a task whose tests must be run to
  learn what they expect);
- episode: the prompt of training/agent/episodes.py, answered turn by turn with actions. A task
  with a `check_command` (its visible tests) is demonstrated as a good episode runs it: run the
  check, read what failed, write the fix, submit; the episode is played in a real sandbox
  session, so every observation is exactly what the environment answered. Any other
  task: write each file the reference changes (the whole solution.py for a function task), then
  submit. The episode is one example: its prompt, then its replies (learned) and observations (not
  learned, as in a trajectory's loss mask), so the warm-up teaches the token sequences an episode
  produces at the cost of one pass over it.
Examples are token ids (training/sft/job.py's Example), every reply ending with the model's own
end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from sandbox.base import Session
from task_sets.patches import apply_patch, changed_paths
from task_sets.schema import SOLUTION_FILE, RepositoryTask, Task
from training.agent.actions import Action, Run, Write
from training.agent.episodes import episode_messages, perform, wrote
from training.agent.prompts import render_prompt
from training.agent.sessions import OpenSession
from training.policy.chat import ChatFormat
from training.sft.job import Example

DemonstratedTurn = tuple[str, str | None]  # the reply, what it was answered (None: the episode ended)


def warmup_examples(chat: ChatFormat, tasks: Sequence[Task], episodes: bool = True, system: str | None = None,
                    open_session: OpenSession | None = None) -> list[Example]:
    """For every task: its single-turn example (function tasks whose prompt is enough) and, with
    `episodes`, its episode's turns, prompted with `system` (the task set's system message) if
    it has one. `open_session` plays the episodes of tasks with a check command (required when
    there are any)."""
    played = demonstrated_turns(tasks, open_session) if episodes else {}
    examples = []
    for task in tasks:
        if not isinstance(task, RepositoryTask) and task.check_command is None:
            examples += single_turn_examples(chat, [(task.prompt, task.reference_solution)], system)
        if episodes:
            examples += episode_examples(chat, task, played[task.id], system)
    return examples


def single_turn_examples(chat: ChatFormat, pairs: Iterable[tuple[str, str]],
                         system: str | None = None) -> list[Example]:
    return [Example(render_prompt(chat, prompt, system), chat.reply_ids(solution)) for prompt, solution in pairs]


def episode_examples(chat: ChatFormat, task: Task, turns: Sequence[DemonstratedTurn],
                     system: str | None = None) -> list[Example]:
    """The demonstrated episode as one example: the replies learned, the observations not."""
    response: list[int] = []
    scored: list[int] = []
    for reply_text, observation in turns:
        reply = chat.reply_ids(reply_text)
        observed = [] if observation is None else chat.observation_ids(observation, reply_closed=True)
        response += reply + observed
        scored += [1] * len(reply) + [0] * len(observed)
    return [Example(chat.prompt_ids(episode_messages(chat, task, system)), response, scored)]


def demonstrated_turns(tasks: Sequence[Task], open_session: OpenSession | None,
                       workers: int = 8) -> dict[str, list[DemonstratedTurn]]:
    """Every task's good episode, by task id; those that run a check command play in sandbox
    sessions, `workers` at a time (each worker's session reset from one task to its next)."""
    def play(share: Sequence[Task]) -> list[tuple[str, list[DemonstratedTurn]]]:
        played, session = [], None
        try:
            for task in share:
                if task.check_command is None:
                    played.append((task.id, _written(task)))
                    continue
                if open_session is None:
                    raise ValueError(f"task {task.id} is demonstrated by running its check command: give open_session")
                session = open_session(task, session)
                played.append((task.id, _played(task, session)))
        finally:
            if session is not None:
                session.close()
        return played

    with ThreadPoolExecutor(workers) as pool:
        found = dict(pair for share in pool.map(play, [tasks[i::workers] for i in range(workers)]) for pair in share)
    return {task.id: found[task.id] for task in tasks}


def _written(task: Task) -> list[DemonstratedTurn]:
    """Write each file the reference changes, then submit."""
    return [*((_write_reply(path, content), wrote(path, content)) for path, content in _files_to_write(task)),
            ("<submit/>", None)]


def _played(task: Task, session: Session) -> list[DemonstratedTurn]:
    """Run the check, write the fix, run the check again, submit, in `session` (holding the task's
    starting files). A fix is submitted once the check says it passes (whether a policy gets a
    turn to act on a failing second run is its experiment's max_turns)."""
    check = (f"<run>{task.check_command}</run>", Run(task.check_command))
    actions: list[tuple[str, Action]] = [check]
    actions += [(_write_reply(path, content), Write(path, content)) for path, content in _files_to_write(task)]
    played = [_perform(task, session, reply, action)[0] for reply, action in actions]
    rerun, exit_code = _perform(task, session, *check)
    if exit_code != 0:
        raise RuntimeError(f"task {task.id}: its reference solution fails its check command "
                           f"({rerun[1].strip().splitlines()[-1]}), so its demonstration would submit a failing fix")
    return [*played, rerun, ("<submit/>", None)]


def _perform(task: Task, session: Session, reply: str, action: Action) -> tuple[DemonstratedTurn, int | None]:
    """The demonstrated turn of `action` and its exit code (None if not a command)."""
    kind, _, _, exit_code, observation = perform(session, action, task.limits.wall_s)
    if kind == "run" and exit_code is None:  # killed, timed out, or the sandbox failed
        raise RuntimeError(f"task {task.id}: its check command did not exit ({observation.splitlines()[0]}), "
                           "so its demonstration would teach a broken observation")
    return (reply, observation), exit_code


def _write_reply(path: str, content: str) -> str:
    return f'<write path="{path}">\n{content}</write>'


def _files_to_write(task: Task) -> list[tuple[str, str]]:
    if isinstance(task, RepositoryTask):
        solved = apply_patch(task.files, task.reference_solution)
        return [(path, solved[path]) for path in sorted(changed_paths(task.files, solved)) if path in solved]
    return [(SOLUTION_FILE, task.solution_file(task.reference_solution))]
