"""Single-turn rollouts: K samples per task from an inference engine, with their log-probs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from task_sets.schema import FunctionTask, Task
from training.agent.extraction import Extraction, extract_solution
from training.agent.prompts import prompt_messages
from training.inference.engine import InferenceEngine, SamplingParams
from training.policy.chat import ChatFormat

TASKS_PER_CALL = 16  # one generate call per chunk, so progress shows while a big batch runs


@dataclass(frozen=True)
class Turn:
    """One turn of an episode (training/agent/episodes.py)."""

    reply: str  # the policy's text this turn
    action: str  # run | write | replace | submit | malformed
    detail: str  # the command, the path, or why the reply was malformed
    status: str  # ok | error (the action ran and failed, or could not run) | submitted
    exit_code: int | None
    observation: str  # what the action answered (what the policy was shown, unless the episode was blanked)
    generate_s: float  # this episode's share of the turn's batched generation
    exec_s: float
    sampled_tokens: int


@dataclass(frozen=True)
class Rollout:
    """One sample: a single-turn reply, or a whole multi-turn episode (training/agent/episodes.py)."""

    task_id: str
    group_id: str
    sample_index: int
    policy_version: str
    prompt_ids: list[int]
    response_ids: list[int]  # everything after the prompt (an episode's observations included)
    behaviour_logprobs: list[float] | None  # None: the engine returned none (not trainable)
    finish_reason: str  # a FinishReason (datastore/schema.py): the engine's stop or length, or how an episode ended
    response_text: str
    generate_s: float  # this sample's share of its batch's generation time
    solution: str  # what is graded: the reply's solution.py, or an episode's final workspace (diff or solution.py)
    loss_mask: list[int] | None = None  # None: every response token was sampled
    turns: tuple[Turn, ...] = ()  # an episode's turns; () for a single-turn reply
    extraction: Extraction | None = None  # how a single reply's solution was found in it; None for an episode
    policy_iteration: int | None = None  # the checkpoint that sampled it (0: the base policy); None outside an iteration

    @property
    def sampled_tokens(self) -> int:
        """Tokens the policy wrote (an episode's observations are the environment's)."""
        return len(self.response_ids) if self.loss_mask is None else sum(self.loss_mask)


def sample_rollouts(
    engine: InferenceEngine,
    chat: ChatFormat,
    tasks: Sequence[Task],
    params: SamplingParams,
    group_prefix: str,
    progress: Callable[[int, int], None] | None = None,
    system: str | None = None,
) -> list[Rollout]:
    """`params.n` samples for every task (prompted with `system`, the task set's system message,
    if it has one); samples of one task share the group `prefix/task_id`."""
    rollouts: list[Rollout] = []
    for start in range(0, len(tasks), TASKS_PER_CALL):
        chunk = tasks[start : start + TASKS_PER_CALL]
        conversations = [prompt_messages(chat, task.prompt, system) for task in chunk]
        prompts = [chat.prompt_ids(messages) for messages in conversations]
        began = time.perf_counter()
        completions = engine.generate(prompts, params, conversations)
        share = (time.perf_counter() - began) / (len(chunk) * params.n)
        for task, prompt, group in zip(chunk, prompts, completions):
            entry_point = task.entry_point if isinstance(task, FunctionTask) else None
            extractions = [extract_solution(chat.reply_text(completion.text), entry_point) for completion in group]
            rollouts.extend(
                Rollout(
                    task_id=task.id,
                    group_id=f"{group_prefix}/{task.id}",
                    sample_index=index,
                    policy_version=engine.policy_version,
                    prompt_ids=prompt,
                    response_ids=completion.token_ids,
                    behaviour_logprobs=completion.logprobs,
                    finish_reason=completion.finish_reason,
                    response_text=completion.text,
                    generate_s=share,
                    solution=extraction.code,
                    extraction=extraction,
                )
                for index, (completion, extraction) in enumerate(zip(group, extractions))
            )
        if progress:
            progress(min(start + TASKS_PER_CALL, len(tasks)), len(tasks))
    return rollouts
