"""Fast tests for training/: tokenizer, checkpoints, engine, GRPO math, SFT and the trainer.

Everything runs on a tiny Llama (hidden 64, 2 layers) on CPU; no network (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from task_sets.loader import load_task_set
from training.agent.dynamic_sampling import refill, refill_size
from training.agent.extraction import extract_solution
from training.agent.prompts import render_prompt
from training.inference.engine import Completion, InferenceEngine, SamplingParams
from training.inference.transformers_engine import TransformersEngine
from training.optim.placement import Placement
from training.optim.saving import MASTER_WEIGHTS_FILE, OPTIMIZER_FILE
from training.optim.schedule import lr_factor
from training.policy.batching import make_batch, shares_prefixes_exactly, token_logprobs
from training.policy.chat import ChatFormat
from training.policy.checkpoint import MANIFEST_FILE, CheckpointError, save_checkpoint, verify_checkpoint
from training.policy.model import build_base_policy, generation_config, load_policy
from training.policy.settings import PolicyConfig
from training.policy.tokenizer import (
    EOS_TOKEN,
    IM_END,
    IM_START,
    VOCABULARY_FILE,
    build_tokenizer,
    learn_vocabulary,
    save_tokenizer,
)
from training.rl.grpo import (
    advantages,
    clipped_policy_loss,
    group_advantages,
    informative_samples,
    kl_to_reference,
    truncated_is_weights,
)
from training.rl.mismatch import logprob_mismatch
from training.rl.settings import GRPOConfig
from training.rl.trainer import TrainSample, train_policy
from training.sft.demonstrations import single_turn_examples
from training.sft.settings import SFTConfig
from training.sft.vocabulary import main as relearn_vocabulary
from training.sft.warmup import supervised_warmup

EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
TINY = PolicyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                    max_position_embeddings=256, seed=0)  # fmt: skip
EXAMPLES = [
    ("Write a function add_3(x) that returns x + 3.", "def add_3(x):\n    return x + 3\n"),
    ("Write a function add_5(x) that returns x + 5.", "def add_5(x):\n    return x + 5\n"),
    ("Write a function mul_2(x) that returns x * 2.", "def mul_2(x):\n    return x * 2\n"),
    ("Write a function mul_4(x) that returns x * 4.", "def mul_4(x):\n    return x * 4\n"),
]
TEXTS = [
    "def add_7(x):\n    return x + 7\n",
    "héllo wörld — ünïcödé ✓ 世界 🙂\t\r\n",
    "    if x > 0:\n\treturn [v for v in xs if v > 3]  # {'a': \"b\"}\\n",
    "",
    "\x00\x7f",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def toy_chat(tokenizer=None) -> ChatFormat:
    tokenizer = tokenizer or build_tokenizer()
    return ChatFormat.of(tokenizer, generation_config(tokenizer))


@pytest.fixture(scope="module")
def chat(tokenizer) -> ChatFormat:
    return toy_chat(tokenizer)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    return build_base_policy(tmp_path_factory.mktemp("base") / "policy", TINY)


@pytest.fixture(scope="module")
def sft_result(base_dir, tmp_path_factory):
    """The tiny policy after a short warm-up: it has learned to end its answer with <|im_end|>."""
    out = tmp_path_factory.mktemp("sft") / "policy"
    config = SFTConfig(steps=40, lr=1e-2, warmup_steps=5, batch_size=4, seed=0)
    metrics = supervised_warmup(base_dir, single_turn_examples(toy_chat(), EXAMPLES), out, config)
    return out, metrics


@pytest.fixture(scope="module")
def engine(sft_result) -> TransformersEngine:
    return TransformersEngine(sft_result[0], policy_version="sft-0", threads=1, batch_size=8)


# --- tokenizer and prompts -----------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips_any_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tokenizer_makes_words_single_tokens(tokenizer):
    """What the merges buy: the policy reads and writes words, not letters."""
    prompt = load_task_set("compose").train()[0].prompt
    assert len(tokenizer.encode(prompt, add_special_tokens=False)) < len(prompt.encode()) / 3
    assert tokenizer.tokenize(" doubled, plus two") == ["Ġdoubled", ",", "Ġplus", "Ġtwo"]


def test_learn_vocabulary_merges_frequent_words_and_keeps_every_byte():
    tokenizer = learn_vocabulary(["the product of a and b, squared"] * 20, vocab_size=300)
    assert tokenizer.token_to_id("<|endoftext|>") == EOT_ID and 3 + 256 < tokenizer.get_vocab_size() <= 300
    assert "Ġsquared" in tokenizer.get_vocab()
    unseen = "zebra 🦓"
    assert tokenizer.decode(tokenizer.encode(unseen).ids) == unseen


def test_the_frozen_vocabulary_is_what_the_builtin_train_splits_teach(tmp_path):
    """Like the generated task files: `python -m training.sft.vocabulary` reproduces the committed file,
    so a change to a built-in set that should reshape the vocabulary cannot go unnoticed."""
    relearn_vocabulary(["--out", str(tmp_path / "tokenizer.json")])
    assert (tmp_path / "tokenizer.json").read_bytes() == VOCABULARY_FILE.read_bytes()


def test_tokenizer_specials(tokenizer):
    ids = tokenizer.encode(f"{IM_START}user\nhi{IM_END}{EOS_TOKEN}", add_special_tokens=False)
    im_start, im_end, eos = (tokenizer.convert_tokens_to_ids(t) for t in (IM_START, IM_END, EOS_TOKEN))
    assert ids == [im_start, *tokenizer.encode("user\nhi", add_special_tokens=False), im_end, eos]
    assert (eos, im_start, im_end) == (EOT_ID, IM_START_ID, IM_END_ID)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == eos


def test_tokenizer_reload_gives_identical_ids(tokenizer, tmp_path):
    save_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>assistant" in config["chat_template"]
    assert (tmp_path / "special_tokens_map.json").is_file()
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in [*TEXTS, f"{IM_START}system\nx{IM_END}\n{EOS_TOKEN}"]:
        assert reloaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert render_prompt(toy_chat(reloaded), "Write f.") == render_prompt(toy_chat(tokenizer), "Write f.")


def test_render_prompt_is_chatml_with_generation_prompt(tokenizer, chat):
    text = tokenizer.decode(render_prompt(chat, "Write a function f(x)."))
    assert text.startswith(f"{IM_START}system\n")
    assert f"{IM_START}user\nWrite a function f(x).{IM_END}\n" in text
    assert text.endswith(f"{IM_START}assistant\n")


@pytest.mark.parametrize(
    ("response", "solution"),
    [
        ("def f(x):\n    return x\n<|im_end|>garbage", "def f(x):\n    return x\n"),
        ("Here:\n```python\ndef f(x):\n    return 1\n```\nDone.<|im_end|>", "def f(x):\n    return 1\n"),
        ("```\ndef g():\n    pass\n", "def g():\n    pass\n"),
        ("def h():\n    return 2\n", "def h():\n    return 2\n"),
        ("x = 1<|endoftext|>y", "x = 1"),
    ],
)
def test_the_solution_is_extracted_from_the_reply_before_its_stop_token(chat, response, solution):
    assert extract_solution(chat.reply_text(response)).code == solution


# --- model and checkpoints -----------------------------------------------------------------


def test_base_policy_is_standard_hf_dir_and_seeded(base_dir, tmp_path):
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", MANIFEST_FILE):  # fmt: skip
        assert (base_dir / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    assert model.config.model_type == "llama" and model.config.vocab_size == 1024
    assert model.generation_config.eos_token_id == [IM_END_ID, EOT_ID]
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    assert tokenizer.encode(TEXTS[0], add_special_tokens=False) == build_tokenizer().encode(TEXTS[0], add_special_tokens=False)
    same = verify_checkpoint(build_base_policy(tmp_path / "again", TINY))
    other = verify_checkpoint(build_base_policy(tmp_path / "other", TINY.model_copy(update={"seed": 1})))
    manifest = verify_checkpoint(base_dir)
    assert same["files"]["model.safetensors"] == manifest["files"]["model.safetensors"]
    assert other["files"]["model.safetensors"] != manifest["files"]["model.safetensors"]
    assert manifest["kind"] == "base" and manifest["policy_config"]["hidden_size"] == 64


def test_verify_checkpoint_detects_corruption(base_dir, tmp_path):
    model, tokenizer = load_policy(base_dir)
    ckpt = save_checkpoint(model, base_dir, tmp_path / "ckpt", {"note": "x"})
    assert verify_checkpoint(ckpt)["note"] == "x"

    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        verify_checkpoint(ckpt)

    ckpt = save_checkpoint(model, base_dir, ckpt, {"note": "y"})  # replaces the corrupt one
    assert verify_checkpoint(ckpt)["note"] == "y"
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        verify_checkpoint(ckpt)

    (ckpt / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match="no crucible_manifest.json"):
        verify_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="does not exist"):
        verify_checkpoint(tmp_path / "nope")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dirs left behind


def test_checkpoint_rejects_reserved_manifest_keys(base_dir, tmp_path):
    model, tokenizer = load_policy(base_dir)
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(model, base_dir, tmp_path / "c", {"files": {}})


# --- GRPO math -----------------------------------------------------------------------------


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.5, 0.0, 2.0, 0.0, 0.5, 1.0])
    groups = torch.tensor([7, 3, 7, 9, 7, 3, 7])  # group 7: [1, 0, 0, 1]; 3: all equal; 9: singleton
    adv = group_advantages(rewards, groups)
    s = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = torch.tensor([0.5 / s, 0.0, -0.5 / s, 0.0, -0.5 / s, 0.0, 0.5 / s])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert adv[1] == 0 and adv[5] == 0 and adv[3] == 0  # exact zeros, not 1e-7
    unscaled = group_advantages(rewards, groups, scale_by_std=False)
    torch.testing.assert_close(unscaled, torch.tensor([0.5, 0.0, -0.5, 0.0, -0.5, 0.0, 0.5]))


def test_rloo_advantages_hand_computed():
    # Group 0: rewards 1, 0, 0, 1 -> each minus the mean of the other three: +2/3, -2/3, -2/3, +2/3.
    # Group 1: 0.5, 0.5 (no signal) -> 0; group 2: a singleton -> 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.3])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0])
    assert torch.allclose(advantages("rloo", rewards, groups), expected)


def test_reinforce_pp_advantages_hand_computed():
    # Centred by group: [0.5, -0.5], [0.25, 0.25, 0.25, -0.75] and the no-signal group [0, 0].
    # The batch std of those eight values: squares sum to 1.25, so sqrt(1.25 / 7).
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.7, 0.7])
    groups = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2])
    std = math.sqrt(1.25 / 7)
    expected = torch.tensor([0.5, -0.5, 0.25, 0.25, 0.25, -0.75, 0.0, 0.0]) / std
    assert torch.allclose(advantages("reinforce_pp", rewards, groups), expected, atol=1e-5)


def test_an_unknown_estimator_is_named():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; choose one of grpo, rloo, reinforce_pp"):
        advantages("ppo", torch.tensor([1.0]), torch.tensor([0]))


def test_group_advantages_all_equal_float_group_is_exactly_zero():
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1]), torch.tensor([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3))


def test_clipped_policy_loss_hand_computed():
    eps = 0.2
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1, 9.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # last token is padding
    behaviour = torch.full((1, 6), -2.0)
    logprobs = (behaviour + ratios.log()).requires_grad_(True)
    loss, stats = clipped_policy_loss(logprobs, behaviour, adv, mask, clip_eps=eps)
    # per token: -min(r*A, clip(r)*A)
    # 1.5,+1 -> -1.2 (clipped high) | 0.5,-1 -> 0.8 (clipped low) | 1.5,-1 -> 1.5 | 0.5,+1 -> -0.5 | 1.1,+2 -> -2.2
    expected = (-1.2 + 0.8 + 1.5 - 0.5 - 2.2) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 5)
    assert stats["mean_ratio"] == pytest.approx((1.5 + 0.5 + 1.5 + 0.5 + 1.1) / 5, abs=1e-6)
    kl = sum((r - 1) - math.log(r) for r in (1.5, 0.5, 1.5, 0.5, 1.1)) / 5
    assert stats["approx_kl"] == pytest.approx(kl, abs=1e-6)
    assert stats["tokens"] == 5
    loss.backward()
    # clipped tokens and padding get no gradient; others get -A * r / N
    expected_grad = torch.tensor([[0.0, 0.0, 1.5 / 5, -0.5 / 5, -2.0 * 1.1 / 5, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected_grad, atol=1e-6, rtol=0)


def test_clip_higher_lets_rewarded_tokens_grow_further():
    ratios = torch.tensor([[1.25, 1.25, 0.75]])
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    behaviour = torch.zeros(1, 3)
    loss, stats = clipped_policy_loss(behaviour + ratios.log(), behaviour, adv, torch.ones(1, 3),
                                      clip_eps=0.2, clip_eps_high=0.28)
    # 1.25,+1 -> -1.25 (inside the higher bound) | 1.25,-1 -> 1.25 | 0.75,-1 -> clipped low at 0.8: 0.8
    assert loss.item() == pytest.approx((-1.25 + 1.25 + 0.8) / 3, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)
    symmetric, _ = clipped_policy_loss(behaviour + ratios.log(), behaviour, adv, torch.ones(1, 3), clip_eps=0.2)
    assert symmetric.item() == pytest.approx((-1.2 + 1.25 + 0.8) / 3, abs=1e-6)


def test_sequence_aggregation_weighs_every_sequence_the_same():
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    advantages_ = torch.tensor([1.0, -3.0])
    token, _ = clipped_policy_loss(lp, lp, advantages_, mask)
    sequence, stats = clipped_policy_loss(lp, lp, advantages_, mask, aggregation="sequence")
    assert token.item() == pytest.approx((-1 - 1 - 1 + 3) / 4)
    assert sequence.item() == pytest.approx((-1 + 3) / 2) and stats["sequences"] == 2


def test_clipped_policy_loss_broadcasts_sequence_advantages():
    lp = torch.zeros(2, 3)
    loss, stats = clipped_policy_loss(lp, lp, torch.tensor([1.0, -3.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert loss.item() == pytest.approx((-1 - 1 + 3) / 3)
    assert stats["mean_ratio"] == pytest.approx(1.0) and stats["approx_kl"] == pytest.approx(0.0)


def test_kl_estimators_hand_computed():
    logprobs = torch.tensor([[-1.0, -2.0]])
    reference = torch.tensor([[-1.5, -1.0]])  # log(pi_ref / pi) = -0.5 and +1.0
    torch.testing.assert_close(kl_to_reference(logprobs, reference, "k1"), torch.tensor([[0.5, -1.0]]))
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    torch.testing.assert_close(kl_to_reference(logprobs, reference, "k3"), torch.tensor([k3]))
    with pytest.raises(ValueError, match="unknown KL estimator 'k2'; choose one of k1, k3"):
        kl_to_reference(logprobs, reference, "k2")


def test_kl_penalty_adds_to_the_surrogate_hand_computed():
    lp = torch.zeros(1, 2, requires_grad=True)
    reference = torch.tensor([[-0.5, 0.0]])  # k3 per token: e^-0.5 + 0.5 - 1, and 0
    mask = torch.ones(1, 2)
    loss, stats = clipped_policy_loss(lp, lp.detach(), torch.tensor([1.0]), mask, reference_logprobs=reference,
                                      kl_coef=0.1)
    kl = (math.exp(-0.5) + 0.5 - 1) / 2
    assert loss.item() == pytest.approx(-1.0 + 0.1 * kl, abs=1e-6)
    assert stats["kl_to_reference"] == pytest.approx(kl, abs=1e-6)


def test_informative_samples_are_those_of_groups_with_a_reward_spread():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.3, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 3, 3, 3])  # 1: all equal; 2: a singleton
    assert informative_samples(rewards, groups).tolist() == [True, True, False, False, False, True, True, True]


@pytest.mark.parametrize(("step", "kind", "expected"), [
    (0, "constant", 0.25), (3, "constant", 1.0), (50, "constant", 1.0),  # warm-up of 4 steps, then flat
    (4, "linear", 1.0), (9, "linear", 0.55), (14, "linear", 0.1), (99, "linear", 0.1),
    (4, "cosine", 1.0), (9, "cosine", 0.55), (14, "cosine", 0.1),
])
def test_lr_schedule_hand_computed(step, kind, expected):
    # 4 warm-up steps, then decay to 0.1 over the next 10; cosine at mid-point: 0.1 + 0.9 * 0.5.
    assert lr_factor(step, kind, warmup_steps=4, total_steps=14, min_ratio=0.1) == pytest.approx(expected)


def test_a_decaying_schedule_without_a_horizon_is_refused():
    with pytest.raises(ValueError, match="lr_schedule 'cosine' needs lr_decay_steps"):
        GRPOConfig(lr_schedule="cosine")


# --- SFT and the engine --------------------------------------------------------------------


def test_sft_lowers_loss_and_saves_checkpoint(sft_result):
    out, metrics = sft_result
    assert metrics["steps"] == 40 and metrics["examples"] == 4
    assert metrics["final_loss"] < 0.5 * metrics["initial_loss"]
    manifest = verify_checkpoint(out)
    assert manifest["kind"] == "sft"
    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == 64


def test_sft_masks_the_prompt(tokenizer):
    prompt, response = [1, 2, 3], [4, 5, IM_END_ID]
    batch = make_batch([prompt], [response], pad_id=EOT_ID)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert batch.targets[batch.mask.bool()].tolist() == response
    assert batch.mask.tolist() == [[0, 0, 1, 1, 1]]


def test_engine_returns_n_completions_with_logprobs(engine, tokenizer, chat):
    assert isinstance(engine, InferenceEngine) and engine.policy_version == "sft-0"
    prompts = [render_prompt(chat, p) for p, _ in EXAMPLES[:3]]
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=40, temperature=1.0, seed=1))
    assert len(out) == 3 and all(len(group) == 3 for group in out)
    for group in out:
        for c in group:
            assert isinstance(c, Completion)
            assert len(c.logprobs) == len(c.token_ids) >= 1
            assert all(lp <= 0.0 and math.isfinite(lp) for lp in c.logprobs)
            assert c.text == tokenizer.decode(c.token_ids)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in (IM_END_ID, EOT_ID)
                assert not {IM_END_ID, EOT_ID} & set(c.token_ids[:-1])
            else:
                assert len(c.token_ids) == 40 and not {IM_END_ID, EOT_ID} & set(c.token_ids)


def test_engine_finish_reasons(engine, chat):
    prompt = render_prompt(chat, EXAMPLES[0][0])
    greedy = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=60, temperature=0.0))[0][0]
    assert greedy.finish_reason == "stop"
    assert greedy.token_ids[-1] == IM_END_ID and greedy.text.endswith(IM_END)
    assert extract_solution(chat.reply_text(greedy.text)).code.startswith("def ")
    short = engine.generate([prompt], SamplingParams(n=2, max_new_tokens=3, temperature=1.0))[0]
    assert [c.finish_reason for c in short] == ["length", "length"]
    assert all(len(c.token_ids) == 3 for c in short)


def test_engine_is_deterministic_by_seed(engine, chat):
    prompts = [render_prompt(chat, p) for p, _ in EXAMPLES[:2]]
    params = SamplingParams(n=4, max_new_tokens=24, temperature=1.5, seed=7)
    a = engine.generate(prompts, params)
    b = engine.generate(prompts, params)
    c = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=24, temperature=1.5, seed=8))
    ids = lambda out: [[x.token_ids for x in group] for group in out]  # noqa: E731
    assert ids(a) == ids(b)
    assert [[x.logprobs for x in g] for g in a] == [[x.logprobs for x in g] for g in b]
    assert ids(a) != ids(c)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_teacher_forcing(engine, chat, temperature):
    # Prompts of different lengths exercise the engine's left padding.
    prompts = [render_prompt(chat, "Hi."), render_prompt(chat, EXAMPLES[2][0] + " Please.")]
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=30, temperature=temperature, seed=3))
    flat = [(p, c) for p, group in zip(prompts, out) for c in group]
    batch = make_batch([p for p, _ in flat], [c.token_ids for _, c in flat], pad_id=EOT_ID)
    with torch.no_grad():
        lp = token_logprobs(engine.model, batch, temperature)
    for row, (_, c) in enumerate(flat):
        recomputed = lp[row, batch.response_slices[row]]
        torch.testing.assert_close(recomputed, torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_a_cached_next_turn_has_the_log_probs_of_a_full_recomputation(engine, chat):
    """A policy that stops: replies of different lengths leave the batch at different steps, on
    the first turn and on the next one, which starts from the prefix cache."""
    prompts = [render_prompt(chat, p) for p, _ in EXAMPLES[:3]]
    first = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=40, temperature=1.0, seed=4))
    contexts = [p + c.token_ids + chat.observation_ids("wrote 40 bytes to solution.py",
                                                       reply_closed=c.token_ids[-1:] == [chat.end_of_turn_id])
                for p, group in zip(prompts, first) for c in group]
    reused = engine.reused_tokens
    replies = [g[0] for g in engine.generate(contexts, SamplingParams(n=1, max_new_tokens=40, temperature=1.0, seed=5))]
    assert engine.reused_tokens > reused
    assert len({len(c.token_ids) for group in first for c in group}) > 1 and len({len(c.token_ids) for c in replies}) > 1
    batch = make_batch(contexts, [c.token_ids for c in replies], pad_id=EOT_ID)
    with torch.no_grad():
        lp = token_logprobs(engine.model, batch, 1.0)
    for row, c in enumerate(replies):
        torch.testing.assert_close(lp[row, batch.response_slices[row]], torch.tensor(c.logprobs), atol=1e-4, rtol=0)


# --- GRPO trainer --------------------------------------------------------------------------


def one_pass(**settings) -> GRPOConfig:
    """One pass, no warm-up: each test counts exactly the optimizer steps it expects."""
    return GRPOConfig(epochs=1, lr_warmup_steps=0, **settings)


def _sequence_logprob(policy_dir: Path, sample: TrainSample) -> float:
    model, _ = load_policy(policy_dir)
    batch = make_batch([sample.prompt_ids], [sample.response_ids], pad_id=EOT_ID)
    with torch.no_grad():
        return float((token_logprobs(model, batch) * batch.mask).sum())


def test_train_policy_moves_towards_rewarded_samples(engine, sft_result, chat, tmp_path):
    prompt = render_prompt(chat, EXAMPLES[1][0])
    group = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=30, temperature=1.5, seed=5))[0]
    rewards = [1.0, 0.0, 0.0, 0.0]
    samples = [
        TrainSample(prompt, c.token_ids, c.logprobs, r, group_id="g0") for c, r in zip(group, rewards)
    ] + [TrainSample(prompt, group[0].token_ids, group[0].logprobs, 0.5, group_id="flat")] * 2
    before = [_sequence_logprob(sft_result[0], s) for s in samples[:4]]

    out = tmp_path / "policy-1"
    steps = []
    config = one_pass(lr=1e-3, minibatch_size=16, micro_batch_tokens=64)
    metrics = train_policy(sft_result[0], samples, out, config, progress=lambda *a: steps.append(a),
                           temperature=1.5)  # as sampled
    manifest = verify_checkpoint(out)
    assert manifest["kind"] == "grpo" and (out / OPTIMIZER_FILE).is_file()
    assert steps and steps[-1][:2] == (1, 1)
    assert metrics["optimizer_steps"] == 1 and metrics["samples"] == 6
    assert metrics["samples_trained"] == 4  # the "flat" group left the batch
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-3)  # on-policy: ratio 1 at step one
    assert metrics["clip_fraction"] == 0.0 and metrics["grad_norm"] > 0
    assert metrics["frac_zero_advantage"] == 0.0
    assert metrics["entropy"] > 0 and metrics["kl_to_reference"] is None  # no KL penalty: nothing measured
    assert metrics["mean_advantage"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["tokens_per_s"] > 0

    old, _ = load_policy(sft_result[0])
    new, _ = load_policy(out)
    assert any(not torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    after = [_sequence_logprob(out, s) for s in samples[:4]]
    assert after[0] > before[0]  # the rewarded completion became more likely
    assert sum(after[1:]) < sum(before[1:])

    # A second round resumes the AdamW state saved with the first.
    metrics2 = train_policy(out, samples, tmp_path / "policy-2", config, temperature=1.5)
    assert metrics2["optimizer_steps"] == 1
    verify_checkpoint(tmp_path / "policy-2")


def test_the_divergence_measure_is_the_saved_policy_against_the_sampling_one(engine, sft_result, chat,
                                                                             tmp_path):
    """final_kl is measured after the last optimizer step, on the checkpoint the step saved; the
    step's own approx_kl, taken before it updated, is ~0 on-policy and never sees the update."""
    prompt = render_prompt(chat, EXAMPLES[1][0])
    group = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=30, temperature=1.0, seed=5))[0]
    samples = [TrainSample(prompt, c.token_ids, c.logprobs, r, "g") for c, r in zip(group, [1.0, 0.0, 0.0, 0.0])]
    metrics = train_policy(sft_result[0], samples, tmp_path / "moved", one_pass(lr=3e-3, minibatch_size=4,
                                                                               keep_optimizer_state=False))
    saved, _ = load_policy(tmp_path / "moved")
    batch = make_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id=EOT_ID)
    with torch.no_grad():
        after = token_logprobs(saved, batch)
    behaviour = torch.zeros_like(after)
    for row, s in enumerate(samples):
        behaviour[row, batch.response_slices[row]] = torch.tensor(s.behaviour_logprobs)
    log_ratio = (after - behaviour) * batch.mask
    expected = float(((torch.expm1(log_ratio) - log_ratio) * batch.mask).sum() / batch.mask.sum())
    assert metrics["final_kl"] == pytest.approx(expected, rel=1e-3) and expected > 1e-3
    assert metrics["steps"][0]["approx_kl"] == pytest.approx(0.0, abs=1e-4)


def test_a_shared_prefix_gives_every_row_the_log_probs_and_gradients_of_its_whole_sequence(sft_result, chat):
    """The episodes of a task share their prompt and often their first turn: run once, that prefix
    gives each row what the row alone gives, its gradients summed over the rows."""
    model, _ = load_policy(sft_result[0])
    prompt = render_prompt(chat, EXAMPLES[1][0])
    first_turn = chat.reply_ids("run check.py") + chat.observation_ids("FAIL: expected 3, got 4", reply_closed=True)
    replies = ("def f(): return 3", "def g():\n    return 4", "submit")
    responses = [first_turn + chat.reply_ids(text) for text in replies]
    results = {}
    for share in (False, True):
        batch = make_batch([prompt] * 3, responses, pad_id=EOT_ID, share_prefix=share)
        model.zero_grad()
        logprobs = token_logprobs(model, batch)
        (logprobs * batch.mask).sum().backward()
        results[share] = (batch, logprobs.detach(), [p.grad.clone() for p in model.parameters()])
    (whole, whole_logprobs, whole_grads), (shared, shared_logprobs, shared_grads) = results[False], results[True]
    assert whole.shared_prefix == 0 and shared.shared_prefix >= len(prompt) + len(first_turn)
    assert shared.tokens == whole.tokens - 2 * shared.shared_prefix
    torch.testing.assert_close(shared_logprobs, whole_logprobs, atol=1e-5, rtol=0)
    for a, b in zip(shared_grads, whole_grads):  # the same sums in another order: float32 rounding apart
        assert float((a - b).norm()) <= 1e-4 * float(b.norm())


def test_the_warm_up_runs_a_batchs_shared_system_prompt_once_for_the_loss_of_whole_rows(base_dir, tmp_path):
    """Every demonstration starts with the chat template's header and the task set's system
    message: the warm-up runs that prefix once per batch, and learns what whole rows teach."""
    examples = single_turn_examples(toy_chat(), EXAMPLES, system="You work in a sandboxed repository: run, then fix.")
    config = SFTConfig(steps=3, lr=1e-2, warmup_steps=0, batch_size=4, seed=0)
    shared = supervised_warmup(base_dir, examples, tmp_path / "shared", config)
    whole = supervised_warmup(base_dir, examples, tmp_path / "whole", config.model_copy(update={"share_prefixes": False}))
    assert shared["tokens"] < whole["tokens"]
    assert shared["loss_curve"] == pytest.approx(whole["loss_curve"], rel=1e-4)


def test_a_warm_up_in_micro_batches_learns_what_one_pass_per_batch_does(base_dir, tmp_path):
    """Micro-batches only split the work: the loss and the step are those of the whole batch."""
    examples = single_turn_examples(toy_chat(), EXAMPLES)
    config = SFTConfig(steps=3, lr=1e-2, warmup_steps=0, batch_size=4, seed=0, share_prefixes=False)
    whole = supervised_warmup(base_dir, examples, tmp_path / "whole", config)
    split = supervised_warmup(base_dir, examples, tmp_path / "split", config.model_copy(update={"micro_batch_tokens": 40}))
    assert split["loss_curve"] == pytest.approx(whole["loss_curve"], rel=1e-5)
    # Summed in another order, float32 gradients differ in their last bits, and Adam's first steps
    # (each about lr = 1e-2 per weight, whatever the gradient's size) carry that up to ~3e-5 on a
    # loaded machine; a split that changed the step would move weights by a share of lr.
    assert max(float((a - b).abs().max()) for a, b in zip(_weights(tmp_path / "split"), _weights(tmp_path / "whole"))
               ) < 1e-4


def test_a_crashed_warm_up_resumes_from_its_saved_progress(base_dir, tmp_path):
    """The warm-up saves its progress like the RL step: run again after dying at step 3, it takes
    the remaining steps only and ends with the weights of an uninterrupted warm-up."""
    examples = single_turn_examples(toy_chat(), EXAMPLES)
    config = SFTConfig(steps=5, lr=1e-2, warmup_steps=1, batch_size=2, seed=0, save_progress_every=2)

    def crash_at_three(step, total, stats):
        if step == 3:
            raise KeyboardInterrupt("the node went away")

    with pytest.raises(KeyboardInterrupt):
        supervised_warmup(base_dir, examples, tmp_path / "resumed", config, progress=crash_at_three)
    assert (tmp_path / ".resumed.progress.pt").is_file()
    steps = []
    resumed = supervised_warmup(base_dir, examples, tmp_path / "resumed", config,
                                progress=lambda step, total, stats: steps.append(step))
    whole = supervised_warmup(base_dir, examples, tmp_path / "whole", config)
    assert steps == [3, 4, 5] and not (tmp_path / ".resumed.progress.pt").exists()
    assert resumed["loss_curve"] == whole["loss_curve"]
    assert _same_weights(tmp_path / "resumed", tmp_path / "whole")


def test_a_warmed_up_bf16_model_stays_bf16_with_its_float32_weights_beside(base_dir, tmp_path):
    """The warm-up saves as the RL step does: the published weights keep the parent's dtype, and
    the first RL step starts from the float32 weights the warm-up ended with."""
    model, _ = load_policy(base_dir)
    parent = save_checkpoint(model.to(torch.bfloat16), base_dir, tmp_path / "bf16", {"kind": "base"})
    supervised_warmup(parent, single_turn_examples(toy_chat(), EXAMPLES), tmp_path / "warm",
                      SFTConfig(steps=2, lr=1e-2, warmup_steps=0, batch_size=4))
    assert json.loads((tmp_path / "warm" / "config.json").read_text())["dtype"] == "bfloat16"
    master = torch.load(tmp_path / "warm" / MASTER_WEIGHTS_FILE, weights_only=True)
    loaded, _ = Placement.of(GRPOConfig(device="cpu")).load(tmp_path / "warm")
    assert all(torch.equal(value, master[name]) for name, value in loaded.state_dict().items())
    assert verify_checkpoint(tmp_path / "warm")["device"] == "cpu"


def test_the_probe_keeps_whole_rows_for_a_model_with_dropout(sft_result):
    """Dropout would draw one mask for a prefix that stood for many rows."""
    model, _ = load_policy(sft_result[0])
    assert shares_prefixes_exactly(model)
    model.config.attention_dropout = 0.1
    assert not shares_prefixes_exactly(model)


def _a_group(engine, chat) -> list[TrainSample]:
    prompt = render_prompt(chat, EXAMPLES[1][0])
    group = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=30, temperature=1.0, seed=5))[0]
    return [TrainSample(prompt, c.token_ids, c.logprobs, r, "g") for c, r in zip(group, [1.0, 0.0, 0.0, 1.0])]


def test_a_step_on_shared_prefixes_has_the_loss_and_gradient_of_whole_rows_on_fewer_tokens(engine, sft_result, chat,
                                                                                           tmp_path):
    samples, config = _a_group(engine, chat), one_pass(lr=1e-3, minibatch_size=4, keep_optimizer_state=False)
    shared = train_policy(sft_result[0], samples, tmp_path / "shared", config)
    whole = train_policy(sft_result[0], samples, tmp_path / "whole",
                         config.model_copy(update={"share_prefixes": False}))
    assert shared["tokens"] < whole["tokens"]
    assert shared["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-7)
    assert shared["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    assert shared["final_kl"] == pytest.approx(whole["final_kl"], rel=1e-2, abs=1e-6)


def test_gradient_checkpointing_runs_whole_rows(engine, sft_result, chat, tmp_path):
    """Checkpointed layers keep no cache, which a shared prefix needs."""
    samples, config = _a_group(engine, chat), one_pass(lr=1e-3, minibatch_size=4, keep_optimizer_state=False)
    whole = train_policy(sft_result[0], samples, tmp_path / "whole",
                         config.model_copy(update={"share_prefixes": False}))
    checkpointed = train_policy(sft_result[0], samples, tmp_path / "checkpointed",
                                config.model_copy(update={"gradient_checkpointing": True}))
    assert checkpointed["tokens"] == whole["tokens"]


def test_train_policy_rejects_mismatched_logprobs(sft_result, tmp_path):
    bad = TrainSample([1, 2], [3, 4], [-0.1], 1.0, "g")
    with pytest.raises(ValueError, match="behaviour logprobs"):
        train_policy(sft_result[0], [bad], tmp_path / "x")


def test_observation_tokens_are_context_and_never_trained_on(sft_result, tmp_path):
    """Two multi-turn samples that differ only where the loss mask is 0 (the environment's
    tokens: their behaviour log-probs are junk on purpose) train to the same weights."""
    prompt, reply, observation = [5, 6, 7], [40, 41, 42], [50, 51]
    response = reply + observation + reply
    mask = [1, 1, 1, 0, 0, 1, 1, 1]

    def samples(junk: float) -> list[TrainSample]:
        logprobs = [-1.0 if m else junk for m in mask]
        return [TrainSample(prompt, response, logprobs, reward, "g", loss_mask=mask) for reward in (1.0, 0.0)]

    config = one_pass(lr=1e-2, minibatch_size=2, micro_batch_tokens=64, keep_optimizer_state=False)
    clean = train_policy(sft_result[0], samples(0.0), tmp_path / "clean", config)
    junk = train_policy(sft_result[0], samples(123.0), tmp_path / "junk", config)
    assert clean["trained_tokens"] == junk["trained_tokens"] == 2 * sum(mask)
    a, _ = load_policy(tmp_path / "clean")
    b, _ = load_policy(tmp_path / "junk")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(ValueError, match="loss mask of 2 for 8 tokens"):
        train_policy(sft_result[0], [TrainSample(prompt, response, [-1.0] * 8, 1.0, "g", [1, 0])], tmp_path / "x")


def test_training_takes_a_step_with_sequence_aggregation_and_clip_higher(sft_result, tmp_path):
    samples = [TrainSample([5, 6, 7], [40, 41], [-1.0, -1.0], reward, "g") for reward in (1.0, 0.0)]
    config = one_pass(lr=1e-3, minibatch_size=2, micro_batch_tokens=1, loss_aggregation="sequence",
                        clip_eps_high=0.28, estimator="rloo", keep_optimizer_state=False)
    metrics = train_policy(sft_result[0], samples, tmp_path / "policy", config)
    assert metrics["optimizer_steps"] == 1 and metrics["grad_norm"] > 0
    assert metrics["mean_abs_advantage"] == pytest.approx(1.0)  # RLOO on (1, 0): +1 and -1


def test_token_weights_scale_each_tokens_loss():
    lp = torch.zeros(1, 3)
    weights = torch.tensor([[0.5, 2.0, 1.0]])
    loss, _ = clipped_policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 3), token_weights=weights)
    assert loss.item() == pytest.approx(-(0.5 + 2.0 + 1.0) / 3)


def test_the_decoupled_objective_learns_from_a_stale_sample_hand_computed():
    """A token its sampler (two checkpoints back) gave 0.5, the checkpoint the step starts from
    0.8, the policy now 0.88; advantage 1, eps 0.2, cap 2. Against the stale sampler the ratio
    is 1.76, clipped to 1.2: no gradient. Decoupled: ratio 0.88 / 0.8 = 1.1 (inside the clip),
    weight min(0.8 / 0.5, 2) = 1.6, loss -1.6 * 1.1 = -1.76, gradient d/dlogp = -1.76."""
    behaviour, proximal = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.8)]])
    mask, advantage = torch.ones(1, 1), torch.tensor([1.0])
    logprobs = torch.tensor([[math.log(0.88)]], requires_grad=True)
    weights = truncated_is_weights(proximal, behaviour, mask, cap=2.0)
    assert weights.item() == pytest.approx(1.6)
    loss, stats = clipped_policy_loss(logprobs, proximal, advantage, mask, clip_eps=0.2, token_weights=weights)
    assert loss.item() == pytest.approx(-1.76) and stats["clip_fraction"] == 0.0
    loss.backward()
    assert logprobs.grad.item() == pytest.approx(-1.76)
    stale = torch.tensor([[math.log(0.88)]], requires_grad=True)
    plain, stats = clipped_policy_loss(stale, behaviour, advantage, mask, clip_eps=0.2)
    plain.backward()
    assert plain.item() == pytest.approx(-1.2) and stats["clip_fraction"] == 1.0 and stale.grad.item() == 0.0
    far = truncated_is_weights(torch.tensor([[math.log(0.9)]]), torch.tensor([[math.log(0.1)]]), mask, cap=2.0)
    assert far.item() == 2.0  # 9x likelier now: truncated


def test_truncated_importance_sampling_corrects_an_engine_that_disagrees_with_the_trainer(sft_result, tmp_path):
    """The engine's log-probs are 1 nat below the trainer's: the PPO ratio is taken against the
    trainer's own log-probs (so it starts at 1), and every token is weighted by min(e^1, 2) = 2."""
    model, _ = load_policy(sft_result[0])
    prompt, response = [5, 6, 7], [40, 41, 42]
    batch = make_batch([prompt], [response], EOT_ID)
    with torch.no_grad():
        trainer = token_logprobs(model, batch)[0, batch.response_slices[0]].tolist()
    samples = [TrainSample(prompt, response, [v - 1.0 for v in trainer], reward, "g") for reward in (1.0, 0.0)]
    config = one_pass(lr=1e-3, minibatch_size=2, micro_batch_tokens=64, tis_cap=2.0, keep_optimizer_state=False)
    metrics = train_policy(sft_result[0], samples, tmp_path / "tis", config)
    assert metrics["tis_weight_mean"] == pytest.approx(2.0)
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-4)
    uncorrected = train_policy(sft_result[0], samples, tmp_path / "plain",
                               one_pass(lr=1e-3, minibatch_size=2, micro_batch_tokens=64, keep_optimizer_state=False))
    assert uncorrected["mean_ratio"] == pytest.approx(math.e, rel=1e-3)  # against the engine's numbers
    measured = [(3, pytest.approx(1.0, abs=1e-4), pytest.approx(1.0, abs=1e-4))] * 2
    for step in (metrics, uncorrected):  # measured whether or not it is corrected
        assert [(row["tokens"], row["mean_diff"], row["max_abs_diff"]) for row in step["logprob_mismatch"]] == measured


def test_the_logprob_mismatch_of_a_sample_is_over_its_sampled_tokens_hand_computed():
    """Trainer minus sampler on the sampled tokens only (an observation's token, mask 0, is the
    environment's): gaps +0.5, -1.5 (masked: +9), +0.1: mean -0.3, mean |d| 0.7, largest 1.5 at 1."""
    sample = TrainSample([1], [10, 11, 12, 13], [-1.0, -0.5, -9.0, -2.0], 1.0, "g", loss_mask=[1, 1, 0, 1],
                         sample_index=3)
    [row] = logprob_mismatch([sample], [[-0.5, -2.0, 0.0, -1.9]], lambda token: f"<{token}>")
    assert row == {"group_id": "g", "sample_index": 3, "tokens": 3, "mean_diff": pytest.approx(-0.3),
                   "mean_abs_diff": pytest.approx(0.7), "max_abs_diff": pytest.approx(1.5), "max_at": 1,
                   "max_token": "<11>"}


def _weights(path) -> list[torch.Tensor]:
    return list(load_policy(path)[0].state_dict().values())


def _same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b)))


def _two_groups_and_a_flat_one() -> list[TrainSample]:
    informative = [TrainSample([5, 6, 7], [40, 41, 42], [-1.0] * 3, reward, "g") for reward in (1.0, 0.0)]
    flat = [TrainSample([5, 6, 8], [43, 44, 45, 46, 47], [-1.0] * 5, 0.0, "flat") for _ in range(2)]
    return informative + flat


def test_dropping_zero_variance_groups_trains_as_if_they_were_never_sampled(sft_result, tmp_path):
    """DAPO's filter: a group whose rewards are all equal leaves the batch and its loss
    denominator; kept, its tokens dilute the step (same direction, smaller)."""
    samples = _two_groups_and_a_flat_one()
    config = one_pass(lr=1e-3, minibatch_size=4, keep_optimizer_state=False)
    dropped = train_policy(sft_result[0], samples, tmp_path / "dropped", config)
    train_policy(sft_result[0], samples[:2], tmp_path / "never", config)
    kept = train_policy(sft_result[0], samples, tmp_path / "kept", config.model_copy(update={"zero_variance_groups": "keep"}))
    assert dropped["samples_trained"] == 2 and kept["samples_trained"] == 4
    assert _same_weights(tmp_path / "dropped", tmp_path / "never")
    assert not _same_weights(tmp_path / "dropped", tmp_path / "kept")
    assert kept["loss"] == pytest.approx(dropped["loss"] * 6 / 16, rel=1e-4)  # 6 of 16 tokens informative


def test_a_batch_without_signal_is_the_parent_checkpoint_byte_for_byte(sft_result, tmp_path):
    samples = _two_groups_and_a_flat_one()[2:]
    metrics = train_policy(sft_result[0], samples, tmp_path / "same", GRPOConfig(keep_optimizer_state=False))
    assert metrics["optimizer_steps"] == 0 and metrics["samples_trained"] == 0
    saved, parent = verify_checkpoint(tmp_path / "same"), verify_checkpoint(sft_result[0])
    assert saved["content_hash"] == parent["content_hash"] and saved["global_step"] == parent.get("global_step", 0)


def test_a_step_that_trained_no_token_measures_nothing(sft_result, tmp_path):
    """Entropy, loss, KL and gradient norms are null, not 0, when no token was trained: the
    monitors would otherwise judge an entropy of 0 against a floor of 0."""
    metrics = train_policy(sft_result[0], _two_groups_and_a_flat_one()[2:], tmp_path / "same",
                           GRPOConfig(keep_optimizer_state=False))
    for name in ("loss", "entropy", "clip_fraction", "mean_step_kl", "final_kl", "grad_norm", "grad_norm_max"):
        assert metrics[name] is None, name


def test_lr_schedule_counts_optimizer_steps_across_iterations(sft_result, tmp_path):
    samples = [TrainSample([5, 6, 7], [40 + i, 41], [-1.0, -1.0], float(i % 2), f"g{i // 2}") for i in range(4)]
    config = one_pass(lr=1e-3, minibatch_size=2, lr_schedule="linear", lr_decay_steps=4, min_lr_ratio=0.0)
    first = train_policy(sft_result[0], samples, tmp_path / "one", config)
    second = train_policy(tmp_path / "one", samples, tmp_path / "two", config)
    assert [s["lr"] for s in first["steps"] + second["steps"]] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    assert verify_checkpoint(tmp_path / "two")["global_step"] == 4


def test_kl_penalty_needs_and_measures_a_reference(sft_result, base_dir, tmp_path):
    samples = [TrainSample([5, 6, 7], [40, 41], [-1.0, -1.0], reward, "g") for reward in (1.0, 0.0)]
    config = one_pass(lr=1e-3, minibatch_size=2, kl_coef=0.1, keep_optimizer_state=False)
    with pytest.raises(ValueError, match="kl_coef > 0 needs a reference policy"):
        train_policy(sft_result[0], samples, tmp_path / "x", config)
    itself = train_policy(sft_result[0], samples, tmp_path / "self", config, reference_dir=sft_result[0])
    assert itself["kl_to_reference"] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the reference
    untrained = train_policy(sft_result[0], samples, tmp_path / "far", config, reference_dir=base_dir)
    assert untrained["kl_to_reference"] > 0.1  # the warm-up moved far from the random initialisation


def test_a_crashed_step_resumes_from_its_saved_progress(sft_result, tmp_path):
    """A step that dies after its second optimizer step leaves its progress beside the checkpoint;
    run again, it takes only the remaining steps and ends with the weights of an uninterrupted run."""
    samples = [TrainSample([5, 6, 7], [40 + i, 41], [-1.0, -1.0], float(i % 2), f"g{i // 2}") for i in range(8)]
    config = one_pass(lr=1e-3, minibatch_size=2, save_progress_every=1)

    def crash_after_two(step, total, stats):
        if step == 2:
            raise KeyboardInterrupt("the node went away")

    with pytest.raises(KeyboardInterrupt):
        train_policy(sft_result[0], samples, tmp_path / "resumed", config, progress=crash_after_two)
    assert not (tmp_path / "resumed").exists() and (tmp_path / ".resumed.progress.pt").is_file()
    resumed_steps = []
    resumed = train_policy(sft_result[0], samples, tmp_path / "resumed", config,
                           progress=lambda step, total, stats: resumed_steps.append(step))
    assert resumed_steps == [3, 4] and len(resumed["steps"]) == 4
    assert not (tmp_path / ".resumed.progress.pt").exists()
    whole = train_policy(sft_result[0], samples, tmp_path / "whole", config)
    assert _same_weights(tmp_path / "resumed", tmp_path / "whole")
    assert resumed["loss"] == pytest.approx(whole["loss"])
    changed = [TrainSample(s.prompt_ids, s.response_ids, s.behaviour_logprobs, 1 - s.reward, s.group_id) for s in samples]
    with pytest.raises(KeyboardInterrupt):
        train_policy(sft_result[0], samples, tmp_path / "other", config, progress=crash_after_two)
    fresh = []
    train_policy(sft_result[0], changed, tmp_path / "other", config, progress=lambda step, *_: fresh.append(step))
    assert fresh == [1, 2, 3, 4]  # other inputs: the leftover progress is not used


def test_lora_trains_adapters_and_saves_a_plain_merged_model(sft_result, tmp_path):
    samples = [TrainSample([5, 6, 7], [40, 41], [-1.0, -1.0], reward, "g") for reward in (1.0, 0.0)]
    config = one_pass(lr=1e-2, minibatch_size=2, lora_rank=4, lora_target_modules=("q_proj", "v_proj"))
    train_policy(sft_result[0], samples, tmp_path / "lora", config)
    before, after = load_policy(sft_result[0])[0].state_dict(), load_policy(tmp_path / "lora")[0].state_dict()
    assert set(before) == set(after)  # no adapter weights left: any engine loads it
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("q_proj" in name or "v_proj" in name for name in changed)
    assert not (tmp_path / "lora" / OPTIMIZER_FILE).exists()  # adapters start afresh each step


def test_refill_sizes_each_round_by_the_informative_share_seen_so_far():
    assert refill_size(informative=2, groups=8, target=8, available=100) == 8  # 6 missing at 1 in 4: 24, capped at 8
    assert refill_size(informative=4, groups=8, target=6, available=100) == 4  # 2 missing at 1 in 2
    assert refill_size(informative=0, groups=4, target=4, available=3) == 3  # never more than the reserve
    assert refill_size(informative=5, groups=8, target=4, available=100) == 0


def test_dynamic_sampling_refills_a_batch_with_zero_variance_groups():
    """Four tasks, two of whose groups got equal rewards: one extra round of sampled tasks brings
    the informative groups to the target; the round after is not needed."""
    def graded_group(task: str, rewards: list[float]) -> list[tuple[str, float]]:
        return [(task, reward) for reward in rewards]

    first = (graded_group("a", [1, 0]) + graded_group("b", [0, 0]) + graded_group("c", [1, 1])
             + graded_group("d", [0.5, 0]) + [("e", None)])  # e: an infrastructure error
    outcomes = {"f": [1, 0], "g": [0, 0], "h": [0, 1], "i": [1, 0]}
    rounds_asked = []

    def sample_and_grade(tasks: list[str], round_: int) -> list[tuple[str, float]]:
        rounds_asked.append((tasks, round_))
        return [pair for task in tasks for pair in graded_group(task, outcomes[task])]

    done = refill(first, ["f", "g", "h", "i"], sample_and_grade,
                  lambda item: None if item[1] is None else item, target=4, max_rounds=3)
    assert rounds_asked == [(["f", "g", "h", "i"], 1)]  # 2 missing at 2 in 4: four more tasks
    assert done.rounds == 1 and done.informative == 5 and done.groups == 8
    assert len(done.graded) == len(first) + 8  # the zero-variance groups stay in the data
    assert refill(first, ["f"], sample_and_grade, lambda item: item if item[1] is not None else None,
                  target=4, max_rounds=0).rounds == 0


def test_a_bf16_model_is_published_in_bf16_and_trained_on_from_its_float32_weights(sft_result, tmp_path):
    """An imported bf16 model stays bf16 for the engines; the float32 weights the step ended with
    go beside the optimizer state, and the next step starts from them, not from the rounded ones."""
    model, _ = load_policy(sft_result[0])
    parent = save_checkpoint(model.to(torch.bfloat16), sft_result[0], tmp_path / "bf16", {"kind": "base"})
    samples = [TrainSample([5, 6, 7], [40, 41], [-1.0, -1.0], reward, "g") for reward in (1.0, 0.0)]
    train_policy(parent, samples, tmp_path / "step", one_pass(lr=1e-6, minibatch_size=2))
    assert json.loads((tmp_path / "step" / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(tmp_path / "step" / "model.safetensors", "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.bfloat16}
    master = torch.load(tmp_path / "step" / MASTER_WEIGHTS_FILE, weights_only=True)
    published = load_policy(tmp_path / "step")[0].state_dict()
    assert all(master[name].dtype == torch.float32 for name in master)
    assert any(not torch.equal(master[name], published[name]) for name in master)  # finer than bf16
    resumed, _ = Placement.of(GRPOConfig(device="cpu")).load(tmp_path / "step")
    assert all(torch.equal(value, master[name]) for name, value in resumed.state_dict().items())


def test_a_checkpoint_larger_than_the_shard_size_is_saved_in_shards(sft_result, tmp_path):
    samples = [TrainSample([5, 6, 7], [40, 41], [-1.0, -1.0], reward, "g") for reward in (1.0, 0.0)]
    train_policy(sft_result[0], samples, tmp_path / "sharded", one_pass(minibatch_size=2, max_shard_size="100KB"))
    train_policy(sft_result[0], samples, tmp_path / "whole", one_pass(minibatch_size=2))
    files = verify_checkpoint(tmp_path / "sharded")["files"]
    assert "model.safetensors.index.json" in files and sum(name.endswith(".safetensors") for name in files) > 1
    assert _same_weights(tmp_path / "sharded", tmp_path / "whole")


def test_a_checkpoint_whose_optimizer_state_is_keyed_by_position_still_trains_on(sft_result, tmp_path):
    """Checkpoints written before the trainer could shard hold torch's own optimizer state dict
    (keyed by parameter position); their moments still carry into the next step."""
    samples = [TrainSample([5, 6, 7], [40, 41], [-1.0, -1.0], reward, "g") for reward in (1.0, 0.0)]
    model, _ = load_policy(sft_result[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    optimizer.step()
    parent = save_checkpoint(model, sft_result[0], tmp_path / "old", {"kind": "grpo", "global_step": 1},
                             extra=lambda directory: torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE))
    train_policy(parent, samples, tmp_path / "next", one_pass(minibatch_size=2))
    moments = torch.load(tmp_path / "next" / OPTIMIZER_FILE, weights_only=True)["state"]
    assert all(value["step"] == 2 for value in moments.values())  # the old step, and this one


def test_a_micro_batch_with_nothing_to_train_on_still_takes_its_step(sft_result, tmp_path):
    """A sample whose response is all observation (loss mask 0) alone in its micro-batch: the
    pass scores nothing and adds zero, and the step goes on (as every rank's pass must)."""
    samples = [TrainSample([5, 6, 7], [40, 41], [0.0, 0.0], 1.0, "g", loss_mask=[0, 0]),
               TrainSample([5, 6, 7, 8], [42, 43], [-1.0, -1.0], 0.0, "g")]
    metrics = train_policy(sft_result[0], samples, tmp_path / "step", one_pass(minibatch_size=2, micro_batch_tokens=1))
    assert metrics["optimizer_steps"] == 1 and metrics["trained_tokens"] == 2
