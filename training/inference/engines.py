"""The engine an experiment samples with, by name."""

from __future__ import annotations

from pathlib import Path

from training.inference.engine import InferenceEngine
from training.inference.transformers_engine import TransformersEngine
from training.inference.vllm_engine import VLLMEngine

ENGINES = ("transformers", "vllm")


def open_engine(kind: str, checkpoint_dir: str | Path, policy_version: str) -> InferenceEngine:
    """The engine an experiment samples with: "transformers" (CPU, the default) or "vllm" (GPU,
    `pip install -e '.[gpu]'`). Both load the same checkpoint directory."""
    if kind == "vllm":
        return VLLMEngine(checkpoint_dir, policy_version)
    if kind != "transformers":
        raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")
    return TransformersEngine(checkpoint_dir, policy_version)
