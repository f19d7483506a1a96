"""The engine an experiment samples with, by name.

One vLLM engine lives per process (a run executes its assets in one process): every stage that
samples (rollouts, dynamic sampling's refill, evaluation) gets the same engine, which loads the
checkpoint it is asked for into the engine it already has instead of starting another, and
sleeps while the training step has the GPU (`gpu_released`).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from training.inference.engine import InferenceEngine
from training.inference.http_engine import OpenAICompatibleEngine
from training.inference.settings import ServerSettings, VLLMSettings
from training.policy.chat import ChatFormat
from training.policy.checkpoint import TOKENIZER_FILES

ENGINES = ("transformers", "vllm", "openai")
_live_vllm: dict[tuple, object] = {}  # (model identity, options) -> the process's one VLLMEngine
_ARCHITECTURE_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")


def open_engine(kind: str, checkpoint_dir: str | Path, policy_version: str, *, server: ServerSettings | None = None,
                vllm: VLLMSettings = VLLMSettings(), max_model_len: int | None = None,
                observation_role: str = "user", threads: int | None = None,
                log: Callable[[str], None] | None = None) -> InferenceEngine:
    """The engine of `kind` sampling the checkpoint `checkpoint_dir` (content hash
    `policy_version`): "transformers" (CPU, the default, on `threads` threads: None, a thread per
    CPU), "vllm" (GPU, `pip install -e '.[gpu]'`), or "openai" (`server`, rendering prompts in
    that checkpoint's chat format); episodes show observations in the `observation_role` turn.
    `log` takes the CPU engine's decoding progress (the others are fast enough not to need it)."""
    if kind == "transformers":
        # Each engine's library is imported when it is chosen: torch, transformers and vLLM take
        # seconds, and the code location (every run's start) loads this module without them.
        from training.inference.transformers_engine import TransformersEngine

        return TransformersEngine(checkpoint_dir, policy_version, observation_role=observation_role, threads=threads,
                                  log=log)
    if kind == "openai":
        if server is None:
            raise ValueError('engine "openai" needs the server settings (base_url, model)')
        chat = ChatFormat.from_pretrained(checkpoint_dir, observation_role)
        return OpenAICompatibleEngine(
            server.base_url, server.model, chat, policy_version=policy_version,
            api_key=os.environ.get(server.api_key_env) if server.api_key_env else None, timeout_s=server.timeout_s,
            retries=server.retries, concurrency=server.concurrency, api=server.api)
    if kind == "vllm":
        return _vllm_engine(checkpoint_dir, policy_version, vllm, max_model_len, observation_role)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


def _vllm_engine(checkpoint_dir: str | Path, policy_version: str, settings: VLLMSettings,
                 max_model_len: int | None, observation_role: str) -> InferenceEngine:
    from training.inference.vllm_engine import VLLMEngine

    options = (model_identity(checkpoint_dir), settings.model_dump_json(), settings.max_model_len or max_model_len)
    engine = _live_vllm.get(options)
    if engine is None:
        close_engines()  # another model or other options: the old engine goes before the new one starts
        engine = _live_vllm[options] = VLLMEngine(checkpoint_dir, policy_version, settings,
                                                  max_model_len=options[2], observation_role=observation_role)
    else:
        engine.load(checkpoint_dir, policy_version, observation_role)
    return engine


def model_identity(checkpoint_dir: str | Path) -> str:
    """What checkpoints of one lineage share, and a live engine can load in place: the
    architecture (config.json's shape, not its training-time keys) and the tokenizer's files."""
    root = Path(checkpoint_dir)
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    shape = {key: config.get(key) for key in _ARCHITECTURE_KEYS}
    tokenizer = {name: hashlib.sha256((root / name).read_bytes()).hexdigest()
                 for name in TOKENIZER_FILES if (root / name).is_file()}
    return json.dumps([shape, tokenizer], sort_keys=True)


def close_engines() -> None:
    """Drop the process's live vLLM engine; the next open starts a new one."""
    _live_vllm.clear()
    gc.collect()


@contextlib.contextmanager
def gpu_released() -> Iterator[None]:
    """The process's vLLM engine (if it has one) asleep meanwhile: its GPU memory is the
    training step's."""
    live = list(_live_vllm.values())
    for engine in live:
        engine.sleep()
    try:
        yield
    finally:
        for engine in live:
            engine.wake_up()
