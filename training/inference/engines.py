"""The engine an experiment samples with, by name.

One vLLM engine lives per process (a run executes its assets in one process): every stage that
samples (rollouts, dynamic sampling's refill, evaluation) gets the same engine, which loads the
checkpoint it is asked for into the engine it already has instead of starting another, and
sleeps while the training step has the GPU (`gpu_released`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from training.inference.engine import InferenceEngine
from training.inference.http_engine import OpenAICompatibleEngine
from training.inference.settings import ServerSettings, VLLMSettings
from training.inference.transformers_engine import TransformersEngine
from training.policy.chat import ChatFormat

ENGINES = ("transformers", "vllm", "openai")
_live_vllm: dict[tuple, object] = {}  # (options) -> the process's one VLLMEngine


def open_engine(kind: str, checkpoint_dir: str | Path, policy_version: str, *, server: ServerSettings | None = None,
                vllm: VLLMSettings = VLLMSettings(), max_model_len: int | None = None,
                observation_role: str = "user") -> InferenceEngine:
    """The engine of `kind` sampling the checkpoint `checkpoint_dir` (content hash
    `policy_version`): "transformers" (CPU, the default), "vllm" (GPU, `pip install -e '.[gpu]'`),
    or "openai" (`server`, rendering prompts in that checkpoint's chat format); episodes show
    observations in the `observation_role` turn."""
    if kind == "transformers":
        return TransformersEngine(checkpoint_dir, policy_version, observation_role=observation_role)
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

    options = (settings.model_dump_json(), settings.max_model_len or max_model_len, observation_role)
    engine = _live_vllm.get(options)
    if engine is None:
        _live_vllm.clear()  # other options: the old engine's GPU memory goes first
        engine = _live_vllm[options] = VLLMEngine(checkpoint_dir, policy_version, settings,
                                                  max_model_len=options[1], observation_role=observation_role)
    else:
        engine.load(checkpoint_dir, policy_version)
    return engine


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
