"""Byte-level BPE tokenizer: GPT-2's 256-byte alphabet, merges learned once, three chat specials.

Any UTF-8 string round-trips exactly (every byte is a token), and the vocabulary is frozen in
`tokenizer.json` beside this module, so a checkpoint never depends on the data it meets.
`python -m training.sft.vocabulary` relearns it from the built-in task sets' train splits (only
train text: nothing of a held-out task shapes it).

Why merges, not bare bytes: a word is then one token, so reading a phrase out of the prompt is a
single attention lookup instead of a circuit that first assembles bytes into words, and examples
are about a third as long, so every step is cheaper. On bytes the built-in model never learned
which phrase chose which piece of code (docs/benchmarks.md, "Measurements behind the defaults").

Saved in plain Hugging Face format (tokenizer.json + tokenizer_config.json with the chat
template + special_tokens_map.json), loadable by AutoTokenizer in transformers 4.57 and 5.x
and by vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"  # end of document; also the padding token
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # ends every chat turn; the generation stop token
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, IM_START, IM_END)
STOP_TOKENS = (IM_END, EOS_TOKEN)  # the built-in model's generation config stops at either
PAD_TOKEN = EOS_TOKEN
VOCABULARY_FILE = Path(__file__).with_name("tokenizer.json")
VOCABULARY_SIZE = 1024  # specials + 256 bytes + merges; PolicyConfig.vocab_size must cover it

# ChatML. The generation prompt is "<|im_start|>assistant\n"; an assistant turn ends with
# "<|im_end|>" (then "\n" between turns, as in Qwen/ChatML).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def learn_vocabulary(texts: Iterable[str], vocab_size: int = VOCABULARY_SIZE) -> Tokenizer:
    """A byte-level BPE over `texts`: specials get ids 0-2, the 256 bytes follow, then merges.
    GPT-2's pre-tokenizer keeps merges inside words, numbers and runs of punctuation."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The project tokenizer, from the frozen vocabulary."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(VOCABULARY_FILE)),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
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
