"""The policy: a small Llama-architecture causal LM over the byte-level BPE tokenizer.

Llama rather than Qwen2 because transformers 5 substitutes its own Qwen2 tokenizer when
loading a Qwen2 directory, which changes token ids; Llama loads the saved tokenizer as is,
and vLLM serves the same directory.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as transformers_logging

from training.policy.checkpoint import save_checkpoint, verify_checkpoint
from training.policy.settings import TRAINING_DTYPE, PolicyConfig
from training.policy.tokenizer import PAD_TOKEN, STOP_TOKENS, build_tokenizer, save_tokenizer


def llama_config(config: PolicyConfig) -> LlamaConfig:
    tokenizer = build_tokenizer()
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {config.vocab_size} < tokenizer size {len(tokenizer)}")
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(list(STOP_TOKENS)),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        torch_dtype="float32",
    )


def generation_config(tokenizer) -> GenerationConfig:
    """Stop at the end of the assistant's turn or of the document (STOP_TOKENS)."""
    return GenerationConfig(bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids(list(STOP_TOKENS)),
                            pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN))


def build_base_policy(out_dir: str | Path, config: PolicyConfig = PolicyConfig()) -> Path:
    """Create a freshly initialised policy from `config.seed` and save it as a checkpoint."""
    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama_config(config))
    model.generation_config = generation_config(tokenizer)
    manifest = {"kind": "base", "policy_config": config.model_dump(mode="json"), "num_parameters": count_parameters(model)}
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        save_tokenizer(tokenizer, tokenizer_dir)
        return save_checkpoint(model, tokenizer_dir, out_dir, manifest)


def load_policy(policy_dir: str | Path, verify: bool = False):
    """Load (model, tokenizer) from a checkpoint directory; TRAINING_DTYPE, eval mode, CPU."""
    if verify:
        verify_checkpoint(policy_dir)
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=getattr(torch, TRAINING_DTYPE))
    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    model.eval()
    return model, tokenizer


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Without transformers' progress bars (a "Loading weights" bar a load, a bar per GGUF tensor
    pass): the stages report their own progress."""
    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
