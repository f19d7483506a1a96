"""Prefix caching in TransformersEngine: an episode's next turn re-uses the keys and values of the
last call's sequences and prefills only what is new, with the log-probs of a full recomputation.
Checked on the built-in policy and on tiny models of three real families (their own tokenizers,
chat templates and attention layouts: Qwen2 and Llama 3 with grouped-query attention, Mistral with
a sliding window)."""

from __future__ import annotations

import pytest
import torch

import json

from model_families import FAMILIES, make_model, shared_model
from training.inference.engine import SamplingParams
from training.inference.prefix_cache import CachedPrefix, PrefixCache
from training.inference.transformers_engine import TransformersEngine
from training.policy.batching import make_batch, token_logprobs
from training.policy.importing import import_model
from training.policy.model import build_base_policy

OBSERVATIONS = ["[exited exit 1]\nFAIL combine(3, 5): expected 17, got 9", "wrote 40 bytes to solution.py",
                "error: the old text occurs 0 times in solution.py; it must occur exactly once"]


@pytest.fixture(scope="module", params=["builtin", *sorted(FAMILIES)])
def engine(request, tmp_path_factory) -> TransformersEngine:
    if request.param == "builtin":
        checkpoint = build_base_policy(tmp_path_factory.mktemp("builtin") / "base")
    else:
        source = shared_model(request.param, tmp_path_factory)
        checkpoint = import_model(str(source), tmp_path_factory.mktemp("imported") / "base", context_tokens=1024)
    return TransformersEngine(checkpoint, policy_version="base", threads=1, batch_size=4)


def first_turn(engine: TransformersEngine) -> list[list[int]]:
    """Prompts of different lengths, so that the batches are padded."""
    return [engine.chat.prompt_ids(engine.chat.messages("You fix code.", task))
            for task in ("Fix it.", "`combine(a, b)` in solution.py fails `python3 check.py`: fix it, then submit.",
                         "Make the tests pass.", "Run the tests, read what they print, then fix the function.",
                         "Submit.")]


def next_turn(engine: TransformersEngine, contexts: list[list[int]], params: SamplingParams):
    """Each context extended by its sampled reply and an observation (of a different length per
    context), as an episode's next turn is; and the replies sampled there."""
    replies = [group[0] for group in engine.generate(contexts, params)]
    extended = [context + reply.token_ids + engine.chat.observation_ids(
        OBSERVATIONS[row % len(OBSERVATIONS)], reply_closed=reply.token_ids[-1:] == [engine.chat.end_of_turn_id])
        for row, (context, reply) in enumerate(zip(contexts, replies))]
    return extended, replies


def test_a_turn_that_extends_the_last_call_prefills_only_its_new_tokens(engine):
    params = SamplingParams(n=1, max_new_tokens=12, temperature=1.0, seed=1)
    contexts, replies = next_turn(engine, first_turn(engine), params)
    reused, prefilled = engine.reused_tokens, engine.prefilled_tokens
    engine.generate(contexts, params)
    computed = [len(prompt) + len(reply.token_ids) - 1 for prompt, reply in zip(first_turn(engine), replies)]
    assert engine.reused_tokens - reused == sum(computed)
    assert engine.prefilled_tokens - prefilled == sum(len(c) for c in contexts) - sum(computed)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_log_probs_of_cached_turns_are_those_of_a_full_recomputation(engine, temperature):
    params = SamplingParams(n=1, max_new_tokens=16, temperature=temperature, seed=2)
    contexts = first_turn(engine)
    for _ in range(2):  # turns 2 and 3: cached prefixes of different lengths in one batch
        contexts, _ = next_turn(engine, contexts, params)
    contexts.append(first_turn(engine)[0])  # and a prompt nothing cached: its row starts from scratch
    reused = engine.reused_tokens
    replies = [group[0] for group in engine.generate(contexts, params)]
    assert engine.reused_tokens > reused
    batch = make_batch(contexts, [reply.token_ids for reply in replies], pad_id=engine.pad_id)
    with torch.no_grad():
        recomputed = token_logprobs(engine.model, batch, temperature or 1.0)
    for row, reply in enumerate(replies):
        torch.testing.assert_close(recomputed[row, batch.response_slices[row]], torch.tensor(reply.logprobs),
                                   atol=1e-4, rtol=0)


def test_copies_of_a_prompt_sample_independently_from_one_prefill(engine):
    prompt = first_turn(engine)[1]
    engine.prefixes = PrefixCache(engine.prefix_cache_bytes)  # nothing of earlier tests
    prefilled = engine.prefilled_tokens
    group = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=12, temperature=1.0, seed=3))[0]
    assert len({tuple(c.token_ids) for c in group}) > 1
    assert engine.prefilled_tokens - prefilled == len(prompt) - 1 + 4  # the prompt once, then a token per copy


def test_a_sliding_window_narrower_than_a_batch_turns_prefix_caching_off(tmp_path):
    """Its mask counts columns, so the holes of a cached batch would push tokens out of the window."""
    source = make_model("mistral", tmp_path / "mistral")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "sliding_window": 64}))
    engine = TransformersEngine(import_model(str(source), tmp_path / "base", context_tokens=1024), "base", threads=1)
    contexts, _ = next_turn(engine, first_turn(engine), SamplingParams(n=2, max_new_tokens=8, seed=4))
    engine.generate(contexts, SamplingParams(n=1, max_new_tokens=8))
    assert engine.prefix_cache_bytes == 0 and engine.reused_tokens == 0


def _prefix(ids: tuple[int, ...], width: int = 2) -> CachedPrefix:
    layer = torch.zeros((1, len(ids), width))
    return CachedPrefix(ids, (layer,), (layer,))


def test_the_longest_cached_prefix_is_found_and_never_the_whole_prompt():
    cache = PrefixCache(max_bytes=1 << 20)
    for ids in [(1, 2), (1, 2, 3, 4), (1, 5)]:
        cache.add(_prefix(ids))
    assert cache.longest_prefix([1, 2, 3, 4, 9]).ids == (1, 2, 3, 4)
    assert cache.longest_prefix([1, 2, 3, 4]).ids == (1, 2)  # the last token is always fed
    assert cache.longest_prefix([1, 2, 3]).ids == (1, 2)
    assert cache.longest_prefix([7, 1, 2]) is None


def test_a_prefix_past_the_byte_budget_is_not_kept():
    one = _prefix((1, 2, 3))
    cache = PrefixCache(max_bytes=one.nbytes + 1)
    assert cache.add(one) and not cache.add(_prefix((4, 5, 6)))
    assert len(cache) == 1 and cache.longest_prefix([4, 5, 6, 7]) is None
