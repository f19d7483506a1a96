"""Byte-level tokenizer: token id == byte value for ids 0..255, plus three chat specials.

No merges, so every UTF-8 string round-trips exactly and the vocabulary never depends on
data. Saved in plain Hugging Face format (tokenizer.json + tokenizer_config.json with the
chat template + special_tokens_map.json), loadable by AutoTokenizer in transformers 4.57
and 5.x and by vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"  # end of document; also the padding token
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # ends every chat turn; the generation stop token
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, IM_START, IM_END)
NUM_BYTE_TOKENS = 256

# ChatML. The generation prompt is "<|im_start|>assistant\n"; an assistant turn ends with
# "<|im_end|>" (then "\n" between turns, as in Qwen/ChatML).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (the ByteLevel alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _backend() -> Tokenizer:
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(NUM_BYTE_TOKENS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The project tokenizer: ids 0..255 are bytes, 256..258 are the specials above."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend(),
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=1024,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (with chat_template) and special_tokens_map.json.

    Written by hand rather than with `save_pretrained` so that the files are identical under
    transformers 4.x and 5.x (5.x would write tokenizer_class "TokenizersBackend", which 4.x
    cannot load, and moves the template into a separate .jinja file).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    added = {
        str(tokenizer.convert_tokens_to_ids(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(tokenizer.model_max_length),
        "padding_side": "left",
        "chat_template": tokenizer.chat_template or CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(
        out / "special_tokens_map.json",
        {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "additional_special_tokens": [IM_START, IM_END]},
    )


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
