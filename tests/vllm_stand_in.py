"""A stand-in `vllm` module for the contract tests: vLLM needs CUDA and cannot be installed on
these CPU machines. Its signatures are copied from the vLLM 0.33.0 wheel on PyPI (commit
4ba787ec9), so that a misspelt or unknown argument fails here as it would there:

- `LLM.__init__` (vllm/entrypoints/llm.py): `model`, then keyword-only parameters, then
  **kwargs forwarded to `EngineArgs` (vllm/engine/arg_utils.py, a dataclass: an unknown field is
  a TypeError); `generate`, `sleep`, `wake_up`, `collective_rpc`, `reset_prefix_cache`.
- `SamplingParams` (vllm/sampling_params.py, a msgspec Struct: an unknown field is a TypeError)
  with the checks of its `_verify_args` that concern what Crucible sends.
- `TokensPrompt` (vllm/inputs/llm.py, a TypedDict), `CompletionOutput`, `RequestOutput`
  (vllm/outputs.py) and `Logprob` (vllm/logprobs.py).

It records every call; generation answers from a fixed script (two completions per prompt).
"""

from __future__ import annotations

import dataclasses
import sys
import types
from dataclasses import dataclass
from typing import Any, get_args

from typing_extensions import Literal, NotRequired, TypedDict

ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]  # vllm/config/model.py
LogprobsMode = Literal["raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"]


class VLLMValidationError(Exception):
    """vllm.exceptions.VLLMValidationError (not a ValueError)."""


@dataclass
class EngineArgs:  # the fields of vllm.engine.arg_utils.EngineArgs that LLM's **kwargs may carry here
    max_model_len: int | None = None
    enable_sleep_mode: bool = False
    logprobs_mode: LogprobsMode = "raw_logprobs"
    enable_prefix_caching: bool | None = None
    max_logprobs: int = 20
    max_num_seqs: int | None = None
    load_format: str = "auto"
    disable_log_stats: bool = False


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int] | None, prompt_logprobs,
                 outputs: list[CompletionOutput], finished: bool, **kwargs):
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.prompt_logprobs, self.outputs, self.finished = prompt_logprobs, outputs, finished


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    cache_salt: NotRequired[str]


def tokens_prompt(**keys) -> TokensPrompt:
    unknown = set(keys) - set(TokensPrompt.__annotations__)
    if unknown or "prompt_token_ids" not in keys:
        raise TypeError(f"TokensPrompt takes {sorted(TokensPrompt.__annotations__)}, got {sorted(keys)}")
    return TokensPrompt(**keys)


@dataclass
class SamplingParams:  # field names and defaults of vllm.SamplingParams (those before the private ones)
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and self.logprobs < 0 and self.logprobs != -1:
            raise VLLMValidationError(f"logprobs must be non-negative or -1, got {self.logprobs}")
        if self.temperature < 1e-5 and self.n > 1:
            raise VLLMValidationError("n must be 1 when using greedy sampling")
        if not all(isinstance(t, int) for t in self.stop_token_ids or []):
            raise VLLMValidationError("stop_token_ids must contain only integers")


class LLM:
    calls: list[tuple] = []

    def __init__(self, model: str, *, runner: str = "auto", tokenizer: str | None = None, tokenizer_mode: str = "auto",
                 skip_tokenizer_init: bool = False, trust_remote_code: bool = False, tensor_parallel_size: int = 1,
                 dtype: ModelDType = "auto", quantization: str | None = None, revision: str | None = None,
                 seed: int = 0, gpu_memory_utilization: float = 0.92, enforce_eager: bool = False, **kwargs: Any):
        if dtype not in get_args(ModelDType):
            raise ValueError(f"dtype {dtype!r} is not one of {get_args(ModelDType)}")
        engine_args = EngineArgs(**kwargs)  # TypeError on an unknown field, as vLLM's dataclass
        if engine_args.logprobs_mode not in get_args(LogprobsMode):
            raise ValueError(f"logprobs_mode {engine_args.logprobs_mode!r} is not one of {get_args(LogprobsMode)}")
        LLM.calls.append(("LLM", {"model": model, "tokenizer": tokenizer, "tensor_parallel_size": tensor_parallel_size,
                                  "dtype": dtype, "seed": seed, "gpu_memory_utilization": gpu_memory_utilization,
                                  **dataclasses.asdict(engine_args)}))
        self.asleep = False

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 use_tqdm: bool = True,
                 lora_request=None, priority=None, tokenization_kwargs=None, mm_processor_kwargs=None):
        if self.asleep:
            raise RuntimeError("the engine is asleep")
        LLM.calls.append(("generate", prompts, sampling_params, use_tqdm))
        one_for_all = isinstance(sampling_params, SamplingParams)
        per_prompt = [sampling_params] * len(prompts) if one_for_all else list(sampling_params)  # or one per prompt
        if len(per_prompt) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        script = [
            CompletionOutput(0, "ab", [7, 8], -0.75, [{7: Logprob(-0.5)}, {8: Logprob(-0.25)}], finish_reason="stop"),
            CompletionOutput(1, "abc", [7, 8, 9], -6.0, [{7: Logprob(-1.0)}, {8: Logprob(-2.0)}, {9: Logprob(-3.0)}],
                             finish_reason="length"),
        ]
        return [RequestOutput(str(i), None, p["prompt_token_ids"], None, script[: sampling.n], True)
                for i, (p, sampling) in enumerate(zip(prompts, per_prompt))]

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        LLM.calls.append(("sleep", level))
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        LLM.calls.append(("wake_up", tags))
        self.asleep = False
        return True

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        if method != "reload_weights" or set(kwargs or {}) - {"weights_iterator", "weights_path", "is_checkpoint_format"}:
            raise TypeError(f"the GPU worker has no {method}({kwargs}) (reload_weights takes weights_iterator, "
                            "weights_path, is_checkpoint_format)")
        LLM.calls.append(("collective_rpc", method, kwargs))
        return [None]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        LLM.calls.append(("reset_prefix_cache",))
        return True


def install(monkeypatch) -> type[LLM]:
    """Put the stand-in where `import vllm` finds it; returns LLM (its `calls` emptied)."""
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams, module.TokensPrompt = LLM, SamplingParams, tokens_prompt
    monkeypatch.setitem(sys.modules, "vllm", module)
    LLM.calls = []
    return LLM
