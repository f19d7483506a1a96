"""The OpenAI-compatible engine against `transformers serve` (tests/transformers_server.py), a
real third-party server, serving a Crucible checkpoint on CPU."""

from __future__ import annotations

import pytest
from transformers_server import transformers_serve

from training.agent.prompts import prompt_messages, render_prompt
from training.inference.engine import SamplingParams
from training.inference.engines import open_engine
from training.inference.settings import ServerSettings
from training.policy.model import PolicyConfig, build_base_policy

TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=512)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_base_policy(tmp_path_factory.mktemp("served") / "policy", TINY)


@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory):
    with transformers_serve(checkpoint, tmp_path_factory.mktemp("serve-log") / "serve.log") as url:
        yield url


def test_the_chat_api_of_transformers_serve_gives_n_text_only_completions_per_prompt(checkpoint, served):
    server = ServerSettings(base_url=served, model=str(checkpoint), api="chat", retries=0, concurrency=2)
    engine = open_engine("openai", checkpoint, "served-base", server=server)
    tasks = ["Write add(x, y).", "Write a function f."]
    groups = engine.generate([render_prompt(engine.chat, t) for t in tasks], SamplingParams(n=3, max_new_tokens=8),
                             [prompt_messages(engine.chat, t) for t in tasks])
    assert [len(group) for group in groups] == [3, 3]
    for completion in (c for group in groups for c in group):
        assert completion.logprobs is None  # never trained on
        assert completion.finish_reason in ("stop", "length")
        assert completion.token_ids == engine.chat.encode(completion.text)
    assert engine.policy_version == "served-base"
