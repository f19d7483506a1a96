"""The vLLM engine's call contract against a stand-in built from vLLM 0.33.0's signatures
(tests/vllm_stand_in.py): vLLM needs CUDA and cannot be installed on these CPU machines. This
checks the adapter, not vLLM; a GPU run checks the rest (docs/engines.md)."""

from __future__ import annotations

import dataclasses

import pytest
import vllm_stand_in

from training.inference import engines
from training.inference.engine import SamplingParams, request_seed
from training.inference.settings import VLLMSettings
from training.policy.model import build_base_policy
from training.policy.settings import GPU_COMPUTE_DTYPE, PolicyConfig

TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=256)


@pytest.fixture
def llm(monkeypatch):
    engines.close_engines()  # each test starts without a live engine, and leaves none
    yield vllm_stand_in.install(monkeypatch)
    engines.close_engines()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    return [build_base_policy(root / f"policy-{seed}", TINY.model_copy(update={"seed": seed})) for seed in (0, 1)]


def test_the_stand_in_refuses_what_vllm_0_33_refuses():
    with pytest.raises(TypeError):
        vllm_stand_in.SamplingParams(max_token=8)  # misspelt
    with pytest.raises(TypeError):
        vllm_stand_in.LLM("m", gpu_memory_utilisation=0.5)  # misspelt: not an EngineArgs field either
    with pytest.raises(TypeError):
        vllm_stand_in.LLM("m", "tokenizer-as-positional")  # everything after model is keyword-only
    with pytest.raises(vllm_stand_in.VLLMValidationError):
        vllm_stand_in.SamplingParams(n=2, temperature=0.0)


def test_the_vllm_engine_sends_token_prompts_and_keeps_the_sampled_tokens(llm, checkpoints):
    settings = VLLMSettings(gpu_memory_utilization=0.4, tensor_parallel_size=2)
    engine = engines.open_engine("vllm", checkpoints[0], "ckpt-3", vllm=settings, max_model_len=1024)
    groups = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(n=2, max_new_tokens=9, temperature=0.8, seed=5))

    (_, options), (_, prompts, [sampling, second_sampling], use_tqdm) = llm.calls
    assert options | {"model": "", "tokenizer": ""} == {
        "model": "", "tokenizer": "", "seed": 0, "dtype": GPU_COMPUTE_DTYPE, "gpu_memory_utilization": 0.4,
        "tensor_parallel_size": 2, "max_model_len": 1024, "enable_sleep_mode": True,
        "logprobs_mode": "processed_logprobs", "enable_prefix_caching": True, "max_logprobs": 20, "max_num_seqs": None,
        "load_format": "auto", "disable_log_stats": False}
    assert options["model"] == options["tokenizer"] == str(checkpoints[0])
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}] and use_tqdm is False
    assert (sampling.n, sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (2, 9, 0.8, 1.0, 5)
    assert second_sampling == dataclasses.replace(sampling, seed=request_seed(5, 2))  # its samples come after 2
    assert sampling.logprobs == 0 and sampling.skip_special_tokens is False
    assert sampling.stop_token_ids == engine.stop_ids and engine.stop_ids  # the checkpoint's own stop ids
    [first, second] = groups[0]
    assert (first.token_ids, first.logprobs, first.finish_reason, first.text) == ([7, 8], [-0.5, -0.25], "stop", "ab")
    assert (second.finish_reason, second.logprobs) == ("length", [-1.0, -2.0, -3.0])
    assert len(groups) == 2 and engine.policy_version == "ckpt-3"


def test_the_same_prompt_twice_in_one_call_is_two_requests_seeded_apart(llm, checkpoints):
    """An episode group's first turn: vLLM seeds each request alone, so the same seed would give
    every episode of the group the same reply."""
    engine = engines.open_engine("vllm", checkpoints[0], "ckpt-1")
    engine.generate([[1, 2, 3]] * 3, SamplingParams(n=1, seed=7))
    (_, _, sampling, _) = llm.calls[-1]
    assert [s.seed for s in sampling] == [request_seed(7, index) for index in range(3)]
    assert len({s.seed for s in sampling}) == 3


def test_one_engine_serves_every_stage_of_a_run_and_loads_each_checkpoint_in_place(llm, checkpoints):
    rollouts = engines.open_engine("vllm", checkpoints[0], "base")
    evaluation = engines.open_engine("vllm", checkpoints[0], "base")
    later = engines.open_engine("vllm", checkpoints[1], "ckpt-1")
    assert rollouts is evaluation is later and later.policy_version == "ckpt-1"
    assert [call[0] for call in llm.calls] == ["LLM", "collective_rpc", "reset_prefix_cache"]
    assert llm.calls[1] == ("collective_rpc", "reload_weights", {"weights_path": str(checkpoints[1])})


def test_the_engine_sleeps_while_the_training_step_has_the_gpu(llm, checkpoints):
    engine = engines.open_engine("vllm", checkpoints[0], "base")
    with engines.gpu_released():
        assert engine.llm.asleep
    assert not engine.llm.asleep and [c[0] for c in llm.calls] == ["LLM", "sleep", "wake_up"]


def test_other_engine_settings_replace_the_live_engine(llm, checkpoints):
    first = engines.open_engine("vllm", checkpoints[0], "base")
    second = engines.open_engine("vllm", checkpoints[0], "base", vllm=VLLMSettings(gpu_memory_utilization=0.8))
    assert first is not second and [c[0] for c in llm.calls] == ["LLM", "LLM"]


def test_new_content_at_the_same_path_is_reloaded_and_another_model_gets_its_own_engine(llm, checkpoints, tmp_path):
    engine = engines.open_engine("vllm", checkpoints[0], "v1")
    assert engines.open_engine("vllm", checkpoints[0], "v2") is engine  # rewritten in place: a new content hash
    assert llm.calls[1] == ("collective_rpc", "reload_weights", {"weights_path": str(checkpoints[0])})
    other = build_base_policy(tmp_path / "wider", TINY.model_copy(update={"hidden_size": 128}))
    assert engines.open_engine("vllm", other, "w") is not engine
    assert [call[0] for call in llm.calls] == ["LLM", "collective_rpc", "reset_prefix_cache", "LLM"]
