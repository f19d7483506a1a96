"""The settings of the engines an experiment can sample with (ExperimentConfig.server, .vllm)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServerSettings(BaseModel):
    """An OpenAI-compatible server (`engine = "openai"`): vllm serve, SGLang, `transformers
    serve`, a hosted API. It must serve the policy being sampled: Crucible renders prompts with
    that checkpoint's chat format and cannot see which weights the server holds."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="the server's root, e.g. http://localhost:8000 (the /v1/… routes are added)")
    model: str = Field(description="the model name the server answers to")
    api: Literal["completions", "chat"] = Field(
        "completions", description="completions: token ids in, sampled ids and log-probs back (vLLM, SGLang), "
        "trainable; chat: messages in, text back (any server), for evaluation only")
    api_key_env: str | None = Field(None, description="the environment variable holding the API key (the key "
                                    "itself is never stored)")
    concurrency: int = Field(8, ge=1, description="requests in flight at once")
    timeout_s: float = Field(300.0, gt=0, description="per request")
    retries: int = Field(3, ge=0, description="of a connection error or a 429/5xx, with backoff")


class VLLMSettings(BaseModel):
    """The one vLLM engine a run keeps (`engine = "vllm"`). It computes in the trainer's GPU
    dtype (bfloat16, training/policy/settings.py), so that behaviour log-probs and the trainer's agree."""

    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="share of the GPU's memory the engine "
                                          "takes; the rest is the trainer's when they share the GPU")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the engine shards the model over")
    max_model_len: int | None = Field(None, ge=16, description="the engine's context; None: the experiment's "
                                      "episode_max_tokens")
    enable_sleep_mode: bool = Field(True, description="the engine frees its GPU memory while the run's training "
                                    "step runs, and takes it back after")
