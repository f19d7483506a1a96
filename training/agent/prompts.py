"""How a task becomes prompt tokens, and how a response becomes solution.py."""

from __future__ import annotations

import re

from training.policy.tokenizer import EOS_TOKEN, IM_END

# Short on purpose: every token of it is one the small policy must attend over.
SYSTEM_MESSAGE = "Reply with the complete solution.py only."

_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def render_prompt(tokenizer, task_prompt: str) -> list[int]:
    """Chat-templated prompt ids (system + user turn), ending in '<|im_start|>assistant\\n'."""
    messages = [
        {"role": "system", "content": SYSTEM_MESSAGE},
        {"role": "user", "content": task_prompt},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def extract_solution(response_text: str) -> str:
    """The solution.py contents in a response.

    Everything from the first '<|im_end|>' (or '<|endoftext|>') on is dropped; if a ``` fenced block remains,
    its body is returned (an unterminated fence runs to the end), else the text as is.
    """
    text = response_text.split(IM_END, 1)[0].split(EOS_TOKEN, 1)[0]
    match = _FENCE.search(text)
    return match.group(1) if match else text
