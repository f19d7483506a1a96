"""The OpenAI-compatible HTTP engine against a real local completions server (tests/openai_server.py:
HTTP, JSON, a real checkpoint sampled by the transformers engine)."""

from __future__ import annotations

import dataclasses

import pytest
from openai_server import CompletionsServer

from commands.errors import UserError
from pipelines.eval_cli import served_model
from training.agent.prompts import prompt_messages, render_prompt
from training.inference.engine import SamplingParams, request_seed
from training.inference.http_engine import EngineError, OpenAICompatibleEngine
from training.inference.transformers_engine import TransformersEngine
from training.policy.model import build_base_policy
from training.policy.settings import PolicyConfig

TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=512)
SAMPLED = SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> TransformersEngine:
    policy = build_base_policy(tmp_path_factory.mktemp("http") / "policy", TINY)
    return TransformersEngine(policy, policy_version="base", threads=1, batch_size=8)


@pytest.fixture
def server(local):
    serving = CompletionsServer(local)
    yield serving
    serving.close()


def prompts(engine) -> list[list[int]]:
    return [render_prompt(engine.chat, text) for text in ("Write add(x, y).", "Write a function f.")]


def test_the_http_engine_returns_exactly_what_the_server_sampled(server, local):
    remote = OpenAICompatibleEngine(server.url, "crucible-tiny", local.chat, policy_version="served-base")
    over_http = remote.generate(prompts(local), SAMPLED)
    direct = [local.generate([prompt], dataclasses.replace(SAMPLED, seed=request_seed(SAMPLED.seed, index * 3)))[0]
              for index, prompt in enumerate(prompts(local))]
    assert [[c.token_ids for c in group] for group in over_http] == [[c.token_ids for c in g] for g in direct]
    for group, expected in zip(over_http, direct):  # the server samples in its own thread: last-bit noise
        for completion, reference in zip(group, expected):
            assert completion.logprobs == pytest.approx(reference.logprobs, abs=1e-5)
    assert [len(group) for group in over_http] == [3, 3] and remote.policy_version == "served-base"
    sent = sorted(request["prompt"] for request in server.requests)  # concurrent requests: any order
    assert sent == sorted(prompts(local))  # token ids went out, not text


def test_the_same_prompt_twice_in_one_call_is_sampled_apart(server, local):
    """An episode group's first turn: a server seeds each request alone, so one seed for both
    would give both episodes the same reply."""
    prompt = prompts(local)[0]
    remote = OpenAICompatibleEngine(server.url, "crucible-tiny", local.chat)
    [first], [second] = remote.generate([prompt, prompt], dataclasses.replace(SAMPLED, n=1))
    assert sorted(request["seed"] for request in server.requests) == [request_seed(7, 0), request_seed(7, 1)]
    assert first.token_ids != second.token_ids


def test_a_text_only_server_gives_completions_that_are_never_trained_on(server, local):
    server.text_only = True
    [[completion, *_], _] = OpenAICompatibleEngine(server.url, "crucible-tiny", local.chat).generate(
        prompts(local), SAMPLED)
    assert completion.logprobs is None
    assert completion.token_ids == local.chat.encode(completion.text)


def test_overload_is_retried_and_refusals_are_clear(server, local):
    server.fail_next = 2
    engine = OpenAICompatibleEngine(server.url, "crucible-tiny", local.chat, retries=2)
    assert len(engine.generate(prompts(local)[:1], SAMPLED)[0]) == 3
    with pytest.raises(EngineError, match=r"HTTP 404: model 'gpt-nope' does not exist"):
        OpenAICompatibleEngine(server.url, "gpt-nope", local.chat).generate(prompts(local)[:1], SAMPLED)
    server.fail_next = 5
    with pytest.raises(EngineError, match=r"HTTP 503: overloaded, try again \(after 1 retries\)"):
        OpenAICompatibleEngine(server.url, "crucible-tiny", local.chat, retries=1).generate(
            prompts(local)[:1], SAMPLED)


def test_an_unreachable_server_is_named(local):
    engine = OpenAICompatibleEngine("http://127.0.0.1:9", "m", local.chat, retries=0, timeout_s=2)
    with pytest.raises(EngineError, match=r"cannot reach http://127.0.0.1:9/v1/completions"):
        engine.generate(prompts(local)[:1], SAMPLED)


def test_the_chat_api_gets_the_conversation_as_messages_and_gives_evaluation_only_completions(server, local):
    chat = local.chat
    conversation = [*prompt_messages(chat, "Write add(x, y)."), {"role": "assistant", "content": "<run>ls</run>"},
                    {"role": "user", "content": "solution.py"}]
    episode_context = (render_prompt(chat, "Write add(x, y).") + chat.reply_ids("<run>ls</run>")
                       + chat.observation_ids("solution.py", reply_closed=True))
    remote = OpenAICompatibleEngine(server.url, "crucible-tiny", chat, api="chat")
    [[completion, *_]] = remote.generate([episode_context], SAMPLED, [conversation])
    assert server.requests[-1]["messages"] == conversation
    assert server.chat_prompts[-1] == episode_context  # the server's template renders the tokens the episode holds
    assert completion.logprobs is None and completion.token_ids == chat.encode(completion.text)


def test_the_chat_api_refuses_prompts_without_their_conversations(local):
    remote = OpenAICompatibleEngine("http://127.0.0.1:9", "m", local.chat, api="chat")
    with pytest.raises(EngineError, match="without their conversations"):
        remote.generate(prompts(local), SAMPLED)


def test_crucible_eval_asks_the_server_which_model_it_serves(server):
    assert served_model(server.url) == "crucible-tiny"
    with pytest.raises(UserError, match=r"/v1/models does not name one model \(0 listed\): give --model"):
        served_model("http://127.0.0.1:9")
