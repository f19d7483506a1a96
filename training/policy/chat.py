"""A model's own chat format: how prompts, replies and observations become its tokens.

Everything comes from the checkpoint. Its tokenizer's chat template renders every message
(`apply_chat_template`); its generation config and tokenizer name the stop tokens. Nothing here
knows a template's special tokens: where a reply ends, and how the environment's answer is
framed, are read off the template by rendering a conversation around a marker and looking at
what the template put after it.

Conventions that differ between model families, and what is done about each:
- No system role (Gemma and Mistral raise on one, some templates drop it): the system message
  goes in front of the first user message, separated by a blank line.
- No pad token (Llama 3): padding uses the end-of-turn token. Padded positions are masked out of
  attention and loss, so the id only has to be a real one.
- An observation is a turn of `observation_role` (default "user", which every template has;
  "tool" where the template renders it).
- No chat template (a base model): the checkpoint carries a completion template instead
  (training/policy/completion.py), which closes a reply with text rather than a token: its stop
  strings (generation_config.json `stop_strings`, as transformers' generate reads them) end
  generation, and the text up to the first of them is the turn's close.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from jinja2 import TemplateError

if TYPE_CHECKING:
    from transformers import GenerationConfig

# Private-use code points: no tokenizer or template gives them a meaning, and no reply holds them.
_MARK = "\ue000crucible-reply\ue001"
_PROBE = "\ue000crucible-probe\ue001"
_SYSTEM_PROBE = "\ue000crucible-system\ue001"


class ChatFormatError(ValueError):
    """The tokenizer and generation config do not describe a chat model Crucible can drive."""


@dataclass(frozen=True)
class ChatFormat:
    tokenizer: object
    stop_ids: tuple[int, ...]  # generation stops at any of them
    end_of_turn_id: int  # the stop token the template closes an assistant turn with (else the first stop token)
    system_role: bool  # the template renders a system message
    observation_role: str = "user"
    stop_strings: tuple[str, ...] = ()  # text that also ends generation (a completion template's next turn)
    # Where the template closes an assistant turn with one of its stop strings rather than a token:
    # the text it writes after a reply up to the end of that stop string ("\n\nUser:"); else None.
    closing_text: str | None = None

    @classmethod
    def of(cls, tokenizer, generation_config: GenerationConfig | None, observation_role: str = "user") -> ChatFormat:
        """The format of `tokenizer` (with its chat template) and `generation_config`; a
        ChatFormatError says in one sentence what is missing."""
        if not getattr(tokenizer, "chat_template", None):
            raise ChatFormatError("the tokenizer has no chat template (tokenizer_config.json `chat_template` or "
                                  "chat_template.jinja): prompt it as a base model with prompt_format = \"completion\", "
                                  "or use the instruct/chat variant of the model")
        stop_ids = stop_token_ids(tokenizer, generation_config)
        if not stop_ids:
            raise ChatFormatError("neither generation_config.json nor the tokenizer names an end-of-sequence token, "
                                  "so generation would never stop: set eos_token_id in generation_config.json")
        system_role = _SYSTEM_PROBE in _rendered(tokenizer, [{"role": "system", "content": _SYSTEM_PROBE},
                                                             {"role": "user", "content": _PROBE}])
        strings = stop_strings_of(generation_config)
        end, closing = _end_of_turn(tokenizer, stop_ids, strings, observation_role)
        chat = cls(tokenizer, stop_ids, end, system_role, observation_role, strings, closing)
        if _PROBE not in tokenizer.decode(chat.observation_ids(_PROBE, reply_closed=True)):
            raise ChatFormatError(f"the chat template drops the content of a {observation_role!r} message, so an "
                                  "episode's observations would never reach the model: use another observation_role")
        return chat

    @classmethod
    def from_pretrained(cls, directory: str | Path, observation_role: str = "user") -> ChatFormat:
        from transformers import AutoTokenizer  # where a tokenizer loads: the code location loads without it

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        return cls.of(tokenizer, generation_config_of(directory), observation_role)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.end_of_turn_id if pad is None else int(pad)

    def messages(self, system: str, user: str) -> list[dict[str, str]]:
        """The opening of a conversation: a system and a user message, or one user message
        holding both where the template has no system role."""
        if self.system_role:
            return [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return [{"role": "user", "content": f"{system}\n\n{user}"}]

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The conversation so far as the template renders it, ending in the opening of the
        assistant's turn."""
        return self.encode(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def reply_ids(self, text: str) -> list[int]:
        """A whole assistant reply as the model should write it: the text, then its close."""
        if self.closing_text is not None:
            return self.encode(text + self.closing_text)
        return self.encode(text) + [self.end_of_turn_id]

    def reply_text(self, text: str) -> str:
        """A sampled reply's text up to (without) the first stop token or stop string; the text
        as is when none was sampled (a reply cut at its token budget, or a server's text)."""
        for stop in (*self._stop_texts, *self.stop_strings):
            text = text.split(stop, 1)[0]
        return text

    def closes_turn(self, token_ids: list[int]) -> bool:
        """Whether a sampled reply wrote the template's close of its turn itself: the end-of-turn
        token last, or (a template that closes with text) one of the stop strings. Read off the
        ids: a server's text leaves the stop string out, its sampled ids do not."""
        if self.closing_text is not None:
            return self.ends_in_stop_string(token_ids)
        return token_ids[-1:] == [self.end_of_turn_id]

    def ends_in_stop_string(self, token_ids: list[int]) -> bool:
        """Whether the last tokens spell one of the stop strings (a string of n characters spans
        at most n tokens: checked after every token, it is found the token it is complete)."""
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(token_ids[-self._stop_window :], skip_special_tokens=False)
        return any(stop in tail for stop in self.stop_strings)

    def observation_ids(self, observation: str, reply_closed: bool) -> list[int]:
        """The environment's answer after a reply: the close of the assistant's turn, the
        observation as the template frames a `observation_role` turn, and the opening of the
        assistant's next turn. A reply that closed its turn itself (`reply_closed`, see
        `closes_turn`) is not closed a second time."""
        conversation = [{"role": "user", "content": _PROBE}, {"role": "assistant", "content": _MARK},
                        {"role": self.observation_role, "content": observation}]
        try:
            text = self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except TemplateError as error:
            raise ChatFormatError(f"the chat template cannot render an observation as a {self.observation_role!r} "
                                  f"turn ({error}): set observation_role to a role it has") from None
        # Encoded from the end of turn on, which the template writes right after a reply: a
        # SentencePiece tokenizer would otherwise begin the text with a word-start "▁" that the
        # template's own rendering does not have.
        after = text.split(_MARK, 1)[1]
        if self.closing_text is not None:
            return self._continuation_ids(after.removeprefix(self.closing_text) if reply_closed else after)
        framed = self.encode(after)
        if reply_closed and framed[:1] == [self.end_of_turn_id]:
            return framed[1:]
        return framed

    def _continuation_ids(self, text: str) -> list[int]:
        """`text` as ids where it continues a sequence: after a special token, so that a
        SentencePiece tokenizer does not begin it with the word-start "▁" of a text's start."""
        anchor = self.stop_ids[0]
        ids = self.encode(self.tokenizer.decode([anchor]) + text)
        return ids[1:] if ids[:1] == [anchor] else self.encode(text)

    def encode(self, text: str) -> list[int]:
        """`text` as ids; special tokens written in it (a template's) are parsed, none added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @cached_property
    def _stop_window(self) -> int:
        return max(len(stop) for stop in self.stop_strings)

    @cached_property
    def _stop_texts(self) -> list[str]:
        """The stop tokens as text; an id the tokenizer has no text for (a padded vocabulary's) is none."""
        return [text for text in (self.tokenizer.decode([token]) for token in self.stop_ids) if text]


def generation_config_of(directory: str | Path) -> GenerationConfig:
    """A model directory's generation config; made from its config.json where it has none (as
    transformers does when it loads the model)."""
    from transformers import AutoConfig, GenerationConfig  # as in ChatFormat.from_pretrained

    try:
        return GenerationConfig.from_pretrained(str(directory))
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(directory)))


def stop_token_ids(tokenizer, generation_config: GenerationConfig | None) -> tuple[int, ...]:
    """The generation config's eos ids (one or a list), then the tokenizer's own eos."""
    configured = generation_config.eos_token_id if generation_config is not None else None
    ids = list(configured) if isinstance(configured, (list, tuple)) else [configured]
    ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(int(token) for token in ids if token is not None))


def stop_strings_of(generation_config: GenerationConfig | None) -> tuple[str, ...]:
    """The generation config's `stop_strings` (one or a list), as transformers' generate reads them."""
    configured = getattr(generation_config, "stop_strings", None) if generation_config is not None else None
    listed = [configured] if isinstance(configured, str) else list(configured or [])
    return tuple(dict.fromkeys(text for text in listed if text))


def _rendered(tokenizer, messages: list[dict[str, str]]) -> str:
    """The conversation as the template renders it; "" where the template refuses it."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateError:
        return ""


def _end_of_turn(tokenizer, stop_ids: tuple[int, ...], stop_strings: tuple[str, ...],
                 observation_role: str) -> tuple[int, str | None]:
    """How the template closes an assistant turn: (the first stop token it writes after the
    reply's content, None), or, for a template that closes with text, (the first stop token,
    the text it writes after a reply up to the end of the first stop string)."""
    conversation = [{"role": "user", "content": _PROBE}, {"role": "assistant", "content": _MARK}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except TemplateError as error:
        raise ChatFormatError(f"the chat template cannot render a user message and an assistant reply: {error}") from None
    if _MARK not in text:
        raise ChatFormatError("the chat template drops the content of an assistant reply, so a multi-turn context "
                              "cannot be rendered")
    after = tokenizer.encode(text.split(_MARK, 1)[1], add_special_tokens=False)
    ended = next((token for token in after if token in stop_ids), None)
    if ended is not None:
        return ended, None
    closing = _closing_text(tokenizer, conversation, stop_strings, observation_role)
    if closing is None:
        raise ChatFormatError(f"the chat template ends an assistant reply with {tokenizer.decode(after)!r}, which "
                              f"holds none of the stop tokens {list(stop_ids)}"
                              + (f" nor the stop strings {list(stop_strings)}" if stop_strings else "")
                              + ": add the model's end-of-turn token to eos_token_id in generation_config.json")
    return stop_ids[0], closing


def _closing_text(tokenizer, conversation: list[dict[str, str]], stop_strings: tuple[str, ...],
                  observation_role: str) -> str | None:
    """The text the template writes after a reply up to the end of the first stop string, with
    the next turn rendered (a completion template's close is the next turn's header)."""
    after = _rendered(tokenizer, [*conversation, {"role": observation_role, "content": _PROBE}]).partition(_MARK)[2]
    ends = [after.index(stop) + len(stop) for stop in stop_strings if stop in after]
    return after[: min(ends)] if ends else None
