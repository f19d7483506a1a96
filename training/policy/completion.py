"""Completion templates: how a model without a chat template is prompted (a base model, as
DeepSeek-R1-Zero, SimpleRL-Zoo and Open-Reasoner-Zero post-train them).

A completion template keeps the contract of a chat template (a Jinja template over `messages`,
with `add_generation_prompt`, `bos_token` and `eos_token`), so every prompt, reply and
observation is rendered as a chat model's are (training/policy/chat.py). What it adds is stop
strings: a base model does not end its turn with a token, it starts writing the next one. The
imported checkpoint carries both where transformers reads them, the template as its
chat_template.jinja and the stop strings as generation_config.json `stop_strings`, so the
checkpoint samples the same way under any engine, or under transformers' own generate.

Built-ins (docs/prompt-formats.md shows what each renders):
- `dialogue`: the conversation as plain text, as zero-RL prompts base models: the system message,
  then "User: …" and "Assistant: …" blocks (an observation of role tool: "Observation: …"),
  a blank line apart. A reply ends where the model starts the next block's header. Single replies
  and multi-turn episodes alike.
- `function`: HumanEval's own convention: the task's prompt (a module opening the function, its
  signature and docstring) continued as it is, below the system message as comment lines, and
  the reply is the function's body, ended by the stop sequences of the Codex paper (Chen et al. 2021: a new
  top-level def, class, if, print or comment). One reply, for tasks whose prompt is code (a
  `solution_prefix` the submission completes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class CompletionTemplateError(ValueError):
    """A completion template that cannot be used; the message says why in one sentence."""


@dataclass(frozen=True)
class CompletionTemplate:
    name: str  # a built-in's name, or the file it was read from
    jinja: str
    stop_strings: tuple[str, ...]
    single_turn: bool  # renders one reply only: an episode's observations have no place in it


# Each opens with the tokenizer's BOS where it has one, as a base model saw every document begin.
_DIALOGUE = """\
{%- if bos_token -%}{{ bos_token }}{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}{{ message.content }}
{%- elif message.role == 'user' -%}User: {{ message.content }}
{%- elif message.role == 'tool' -%}Observation: {{ message.content }}
{%- elif message.role == 'assistant' -%}Assistant: {{ message.content }}
{%- endif -%}
{{- '\\n\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}Assistant:{%- endif -%}
"""

# The system message becomes comment lines over the code (a template that dropped it would have
# it merged into the prompt's first line: chat.py).
_FUNCTION = """\
{%- if bos_token -%}{{ bos_token }}{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- for line in message.content.splitlines() -%}{{ ('# ' ~ line).rstrip() ~ '\n' }}{%- endfor -%}{{ '\n' }}
{%- else -%}{{ message.content }}{%- endif -%}
{%- if message.role == 'assistant' -%}{{ eos_token }}{%- endif -%}
{%- endfor -%}
"""

BUILT_IN = {
    "dialogue": CompletionTemplate("dialogue", _DIALOGUE, ("\nUser:", "\nObservation:"), single_turn=False),
    "function": CompletionTemplate("function", _FUNCTION, ("\nclass", "\ndef", "\n#", "\nif", "\nprint"),
                                   single_turn=True),
}
DEFAULT = "dialogue"


def completion_template(name: str | None, stop_strings: list[str] | None = None) -> CompletionTemplate:
    """A built-in template by name (None: the default), or a Jinja file's; `stop_strings`
    replace the built-in's own, and a file needs them."""
    name = name or DEFAULT
    if name in BUILT_IN:
        built_in = BUILT_IN[name]
        return built_in if stop_strings is None else _with_stops(built_in, stop_strings)
    path = Path(name).expanduser()
    if not path.is_file():
        raise CompletionTemplateError(f"completion_template {name!r} is neither a built-in ({', '.join(BUILT_IN)}) "
                                      "nor a Jinja file")
    if not stop_strings:
        raise CompletionTemplateError(f"completion_template {name!r}: a template of your own needs `stop_strings`, "
                                      "the text the model starts its next turn with (a base model writes on "
                                      "past its reply)")
    # Rendered, and so checked, when the model is imported (chat.py), as a chat template is.
    return CompletionTemplate(str(path), path.read_text(encoding="utf-8"), tuple(stop_strings), single_turn=False)


def _with_stops(template: CompletionTemplate, stop_strings: list[str]) -> CompletionTemplate:
    if not stop_strings or not all(stop_strings):
        raise CompletionTemplateError("stop_strings must be non-empty strings")
    return CompletionTemplate(template.name, template.jinja, tuple(stop_strings), template.single_turn)


def write_completion_format(directory: Path, template: CompletionTemplate) -> None:
    """Make the checkpoint being written at `directory` render with `template`: it becomes the
    tokenizer's chat template (any other removed) and its stop strings the generation config's."""
    for name in ("chat_template.json", "chat_template.jinja"):
        (directory / name).unlink(missing_ok=True)
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        settings = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        if settings.pop("chat_template", None) is not None:
            tokenizer_config.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / "chat_template.jinja").write_text(template.jinja, encoding="utf-8")
    generation_config = directory / "generation_config.json"
    settings = json.loads(generation_config.read_text(encoding="utf-8"))
    settings["stop_strings"] = list(template.stop_strings)
    generation_config.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
