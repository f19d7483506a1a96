"""A user's own model, of three real families (tests/model_families.py): imported unchanged,
driven through its own chat format, sampled by the CPU engine and trained a step into a checkpoint
that keeps its tokenizer; and one of them run through a whole iteration by `crucible run --config`
with `base_model`, warm-up included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_families import FAMILIES, shared_model
from transformers import Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM

from assets.resources import CrucibleResource
from grading.submission import grade_solution
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from training.agent.rollout import sample_rollouts
from training.inference.engine import Completion, SamplingParams
from training.inference.engines import open_engine
from training.policy.batching import check_lm_head, make_batch, token_logprobs_and_entropy
from training.policy.chat import ChatFormat, ChatFormatError
from training.policy.checkpoint import TOKENIZER_FILES, verify_checkpoint
from training.policy.importing import ModelImportError, import_model
from training.policy.model import load_policy
from training.rl.sample import TrainSample
from training.rl.settings import GRPOConfig
from training.rl.trainer import train_policy

ROOT = Path(__file__).parent.parent
# The family `crucible run` takes through a whole iteration, warm-up included (the smallest
# vocabulary: the cheapest warm-up on CPU). What differs between families in that loop (import,
# chat format, sampling, log-probs, a trained step's checkpoint) is proven for each one here.
WHOLE_RUN_FAMILY = "mistral"
COMPOSE = load_task_set("compose")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def source(family, tmp_path_factory) -> Path:
    return shared_model(family, tmp_path_factory)


@pytest.fixture(scope="module")
def imported(source, tmp_path_factory) -> Path:
    return import_model(str(source), tmp_path_factory.mktemp("imported") / "base", context_tokens=1024)


@pytest.fixture(scope="module")
def chat(imported) -> ChatFormat:
    return ChatFormat.from_pretrained(imported)


def test_an_import_keeps_the_weights_tokenizer_and_chat_template_byte_for_byte(source, imported):
    manifest = verify_checkpoint(imported)
    assert manifest["kind"] == "imported" and manifest["source"] == str(source)
    kept = [name for name in ("model.safetensors", "generation_config.json", *TOKENIZER_FILES)
            if (source / name).is_file()]
    assert "tokenizer_config.json" in kept
    for name in kept:
        assert (imported / name).read_bytes() == (source / name).read_bytes(), name


def test_the_imported_config_states_the_rope_base_where_transformers_4_reads_it(source, imported):
    written = json.loads((source / "config.json").read_text())
    config = json.loads((imported / "config.json").read_text())
    assert config["rope_theta"] == written["rope_parameters"]["rope_theta"]  # transformers 5 wrote only the latter
    assert config["rope_parameters"] == written["rope_parameters"]


def test_the_chat_format_is_the_familys_own(family, chat):
    end_of_turn = FAMILIES[family].end_of_turn
    assert chat.tokenizer.convert_ids_to_tokens(chat.end_of_turn_id) == end_of_turn
    assert chat.end_of_turn_id in chat.stop_ids
    assert chat.system_role == (family != "mistral")  # Mistral's template refuses a system message
    if chat.tokenizer.pad_token is None:  # Llama 3 and Mistral have none: the end of turn pads
        assert chat.pad_id == chat.end_of_turn_id
    prompt = chat.tokenizer.decode(chat.prompt_ids(chat.messages("Be brief.", "Write f.")))
    assert "Be brief." in prompt and "Write f." in prompt


class EmitsExactly:
    """The model's reply, token for token: `reply` then its own end-of-turn token, decoded as
    the engines decode (special tokens kept)."""

    policy_version = "scripted"

    def __init__(self, chat: ChatFormat, reply: str):
        self.chat, self.ids = chat, chat.reply_ids(reply)

    def generate(self, prompts, params, conversations=None):
        text = self.chat.tokenizer.decode(self.ids, skip_special_tokens=False)
        return [[Completion(self.ids, [0.0] * len(self.ids), "stop", text)] * params.n for _ in prompts]


def test_the_reference_solution_scores_one_when_the_model_ends_its_turn_with_its_own_token(chat):
    task = COMPOSE.eval()[0]
    [rollout] = sample_rollouts(EmitsExactly(chat, task.reference_solution), chat, [task], SamplingParams(n=1), "g")
    assert rollout.solution == task.reference_solution
    assert grade_solution(task, rollout.solution, reward=COMPOSE.reward).reward == 1.0


def test_a_task_sets_system_message_opens_every_prompt(family, chat, tmp_path):
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:1], *compose.eval()[:1]], tmp_path / "set")
    (tmp_path / "set" / "system.md").write_text("You are a careful Python programmer.\n")
    task_set = load_task_set(tmp_path / "set")
    assert task_set.system_message == "You are a careful Python programmer."
    (tmp_path / "set" / "system.md").unlink()
    assert load_task_set(tmp_path / "set").version != task_set.version  # it shapes every prompt
    [rollout] = sample_rollouts(EmitsExactly(chat, "x = 1"), chat, task_set.eval(), SamplingParams(n=1), "g",
                                system=task_set.system_message)
    assert "You are a careful Python programmer." in chat.tokenizer.decode(rollout.prompt_ids)


def test_an_observation_after_a_closed_reply_is_framed_as_the_template_renders_the_conversation(chat):
    conversation = [*chat.messages("Be brief.", "Write f."), {"role": "assistant", "content": "<run>ls</run>"},
                    {"role": "user", "content": "x.py"}]
    rendered = chat.tokenizer.decode(chat.prompt_ids(conversation)).split("<run>ls</run>", 1)[1]
    framed = chat.observation_ids("x.py", reply_closed=True)
    assert chat.tokenizer.decode([chat.end_of_turn_id, *framed]) == rendered
    assert chat.observation_ids("x.py", reply_closed=False) == [chat.end_of_turn_id, *framed]


def test_observations_take_the_tool_role_where_the_template_has_one(family, imported):
    if family == "mistral":  # its template knows user and assistant only
        with pytest.raises(ChatFormatError, match="cannot render an observation as a 'tool' turn"):
            ChatFormat.from_pretrained(imported, observation_role="tool")
        return
    chat = ChatFormat.from_pretrained(imported, observation_role="tool")
    framed = chat.tokenizer.decode(chat.observation_ids("x.py", reply_closed=True))
    assert "x.py" in framed and ("<tool_response>" in framed if family == "qwen2" else "tool" in framed)


@pytest.mark.parametrize(("mutilate", "message"), [
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "distilbert", "vocab_size": 10})),
     "'distilbert' model \\(no architecture named\\) is not a causal language model"),
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"],
                                                          "vocab_size": 10})),
     "'bert' model \\(BertForMaskedLM\\) is not a causal language model"),
    (lambda d: [(d / name).unlink() for name in TOKENIZER_FILES if (d / name).is_file()], "no tokenizer files"),
])
def test_a_directory_that_cannot_be_post_trained_is_refused_in_one_sentence(source, tmp_path, mutilate, message):
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    mutilate(broken)
    with pytest.raises(ModelImportError, match=message):
        import_model(str(broken), tmp_path / "out", context_tokens=1024)
    assert not (tmp_path / "out").exists()


def test_a_context_shorter_than_the_budget_is_refused(source, tmp_path):
    with pytest.raises(ModelImportError, match="context is 2048 tokens, shorter than the experiment's budget of 4096"):
        import_model(str(source), tmp_path / "out", context_tokens=4096)


def test_a_name_that_is_neither_a_directory_nor_cached_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelImportError, match="is not in the local Hugging Face cache"):
        import_model("nobody/no-such-model", tmp_path / "out", context_tokens=1024)


def test_crucible_run_refuses_a_base_model_it_cannot_post_train_before_any_run(source, tmp_path):
    broken = tmp_path / "no-template"
    shutil.copytree(source, broken)
    config = json.loads((broken / "tokenizer_config.json").read_text())
    (broken / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "chat_template"}))
    (tmp_path / "x.toml").write_text(f'name = "x"\nbase_model = "{broken}"\nprompt_format = "chat"\n')
    environment = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "HF_HUB_OFFLINE": "1",
                   "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"), "CRUCIBLE_CHECKPOINT_ROOT": str(tmp_path / "ckpt")}
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--config", str(tmp_path / "x.toml")],
                         env=environment, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()  # one sentence, no traceback
    assert line.startswith(f"error: {broken}: the tokenizer has no chat template")
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    assert not crucible.base_policy_dir("x").exists()
    assert not crucible.experiment_exists("x")  # refused before it was stored: the corrected file is a first start


def test_the_cpu_engine_samples_the_family_and_a_step_on_its_samples_keeps_its_tokenizer(chat, imported, tmp_path):
    """What an iteration does with the model, in one process: sample a group, train one optimizer
    step on it (rewards with a spread, so the step learns), and write a checkpoint whose tokenizer
    files are the family's own, byte for byte."""
    engine = open_engine("transformers", imported, "base", threads=2)
    prompt = chat.prompt_ids([{"role": "user", "content": COMPOSE.train()[0].prompt}])
    [group] = engine.generate([prompt], SamplingParams(n=2, max_new_tokens=8, seed=0))
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in group)
    samples = [TrainSample(prompt, c.token_ids, c.logprobs, reward=float(i), group_id="g") for i, c in enumerate(group)]
    metrics = train_policy(imported, samples, tmp_path / "trained", GRPOConfig(epochs=1, lr_warmup_steps=0))
    assert metrics["optimizer_steps"] == 1
    assert verify_checkpoint(tmp_path / "trained")["content_hash"] != verify_checkpoint(imported)["content_hash"]
    for name in TOKENIZER_FILES:
        if (imported / name).is_file():
            assert (tmp_path / "trained" / name).read_bytes() == (imported / name).read_bytes(), name


@pytest.mark.slow
def test_crucible_run_with_base_model_runs_a_whole_iteration(tmp_path_factory, tmp_path):
    family, source = WHOLE_RUN_FAMILY, shared_model(WHOLE_RUN_FAMILY, tmp_path_factory)
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:2], *compose.eval()[:2]], tmp_path / "set")
    config = tmp_path / f"{family}.toml"
    config.write_text(f'name = "{family}-tiny"\nbase_model = "{source}"\ntask_set = "{tmp_path / "set"}"\n'
                      "iterations = 1\ntasks_per_iteration = 2\nsamples_per_task = 2\nmax_new_tokens = 12\n"
                      "eval_samples = 1\nregrade_fraction = 0\n[base]\nsft_steps = 2\n")
    environment = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "HF_HUB_OFFLINE": "1",
                   "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"), "CRUCIBLE_CHECKPOINT_ROOT": str(tmp_path / "ckpt")}
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--config", str(config)], env=environment,
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    checkpoint = crucible.checkpoint_dir(f"{family}-tiny", 1)
    assert verify_checkpoint(checkpoint)["kind"] == "grpo"
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            assert (checkpoint / name).read_bytes() == (source / name).read_bytes(), name


def test_token_logprobs_in_chunks_are_the_models_own_and_never_score_a_whole_batch_at_once(imported):
    """Only the scored positions reach the LM head, at most `chunk_tokens` rows per call, and
    what comes out is log_softmax of the model's own logits: the head is the family's own."""
    model, _ = load_policy(imported)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 12), generator=generator).tolist()
    batch = make_batch([row[:4] for row in ids], [row[4 : 6 + 2 * k] for k, row in enumerate(ids)], pad_id=0)
    rows_per_call = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _, args, __: rows_per_call.append(len(args[0])))
    with torch.no_grad():
        logprobs, entropy = token_logprobs_and_entropy(model, batch, temperature=0.7, chunk_tokens=4)
    hook.remove()
    assert max(rows_per_call) <= 4 and sum(rows_per_call) == int(batch.mask.sum())
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=batch.input_ids).logits.float() / 0.7, dim=-1)
    expected = full.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) * batch.mask
    assert torch.allclose(logprobs, expected, atol=1e-5)
    assert torch.allclose(entropy, -(full.exp() * full).sum(-1) * batch.mask, atol=1e-4)


def test_a_family_that_scales_its_logits_in_its_own_forward_is_refused_and_soft_capping_is_reproduced():
    """Granite divides its logits by `logits_scaling` inside its forward, which the chunked head
    cannot see: refused with a reason. Gemma 2's final soft-capping is part of the head: kept."""
    tiny = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8)
    torch.manual_seed(0)
    granite = GraniteForCausalLM(GraniteConfig(logits_scaling=4.0, **tiny)).eval()
    with pytest.raises(ValueError, match="GraniteForCausalLM computes its logits from more than its output"):
        check_lm_head(granite)
    check_lm_head(Gemma2ForCausalLM(Gemma2Config(final_logit_softcapping=2.0, **tiny)).eval())
