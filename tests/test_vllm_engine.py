"""The vLLM engine's call contract. vLLM needs CUDA and cannot be installed on these CPU machines,
so a stand-in `vllm` module (below) records how the engine calls it and answers in vLLM's
output shapes. This checks the adapter, not vLLM; a GPU run checks the rest (README, "GPU")."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest

from training.inference.engine import SamplingParams
from training.policy.model import PolicyConfig, build_base_policy

TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=256)


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str | None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class StandInLLM:
    calls: list = []

    def __init__(self, **options):
        StandInLLM.calls.append(("LLM", options))

    def generate(self, prompts, sampling_params, use_tqdm=True):
        StandInLLM.calls.append(("generate", prompts, sampling_params, use_tqdm))
        return [RequestOutput(p["prompt_token_ids"], [
            CompletionOutput(0, "ab", [7, 8], [{7: Logprob(-0.5)}, {8: Logprob(-0.25)}], "stop"),
            CompletionOutput(1, "abc", [7, 8, 9], [{7: Logprob(-1.0)}, {8: Logprob(-2.0)}, {9: Logprob(-3.0)}], "length"),
        ][: sampling_params.n]) for p in prompts]


@pytest.fixture
def stand_in_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = StandInLLM
    module.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    module.TokensPrompt = lambda **kwargs: dict(kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    StandInLLM.calls = []
    return StandInLLM


def test_the_vllm_engine_sends_token_prompts_and_keeps_the_sampled_tokens(stand_in_vllm, tmp_path):
    from training.inference.vllm_engine import VLLMEngine

    checkpoint = build_base_policy(tmp_path / "policy", TINY)
    engine = VLLMEngine(checkpoint, policy_version="ckpt-3", seed=11, gpu_memory_utilization=0.5)
    groups = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(n=2, max_new_tokens=9, temperature=0.8, seed=5))

    (_, options), (_, prompts, sampling, use_tqdm) = stand_in_vllm.calls
    assert options == {"model": str(checkpoint), "tokenizer": str(checkpoint), "seed": 11,
                       "logprobs_mode": "processed_logprobs", "gpu_memory_utilization": 0.5}
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}] and use_tqdm is False
    assert (sampling.n, sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (2, 9, 0.8, 1.0, 5)
    assert sampling.logprobs == 0 and sampling.skip_special_tokens is False
    assert sampling.stop_token_ids == engine.stop_ids and engine.stop_ids  # the checkpoint's own stop ids
    [first, second] = groups[0]
    assert (first.token_ids, first.logprobs, first.finish_reason, first.text) == ([7, 8], [-0.5, -0.25], "stop", "ab")
    assert (second.finish_reason, second.logprobs) == ("length", [-1.0, -2.0, -3.0])
    assert len(groups) == 2 and engine.policy_version == "ckpt-3"
