"""How a task becomes prompt tokens (training/agent/extraction.py: how a reply becomes solution.py)."""

from __future__ import annotations

from training.policy.chat import ChatFormat

# Short on purpose: every token of it is one the small policy must attend over. A task set's own
# (its system.md) replaces it.
SYSTEM_MESSAGE = "Reply with the complete solution.py only."


def prompt_messages(chat: ChatFormat, task_prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """The system message (the task set's, else SYSTEM_MESSAGE) and the task as the user's."""
    return chat.messages(system or SYSTEM_MESSAGE, task_prompt)


def render_prompt(chat: ChatFormat, task_prompt: str, system: str | None = None) -> list[int]:
    """The task as the model's chat template renders a system and a user message, ending in
    the opening of the assistant's turn."""
    return chat.prompt_ids(prompt_messages(chat, task_prompt, system))

