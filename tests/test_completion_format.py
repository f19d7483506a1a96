"""A base model, as zero-RL post-trains them: no chat template, so it is prompted with a
completion template (training/policy/completion.py) that its imported checkpoint carries, and its
replies end at stop strings. Two real families' tokenizers (tests/model_families.py), their
templates removed as a base model's repository has none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from model_families import make_model

from assets.resources import CrucibleResource
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from training.experiment import ExperimentConfig
from training.inference.engine import SamplingParams
from training.inference.transformers_engine import TransformersEngine
from training.policy.chat import ChatFormat
from training.policy.checkpoint import verify_checkpoint
from training.policy.completion import BUILT_IN, completion_template
from training.policy.importing import ModelImportError, import_model

ROOT = Path(__file__).parent.parent


def without_template(source: Path) -> Path:
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    return source


@pytest.fixture(scope="module", params=("llama3", "mistral"))  # tiktoken BPE with a BOS; SentencePiece
def base_model(request, tmp_path_factory) -> Path:
    return without_template(make_model(request.param, tmp_path_factory.mktemp(request.param) / "model"))


@pytest.fixture(scope="module")
def imported(base_model, tmp_path_factory) -> Path:
    return import_model(str(base_model), tmp_path_factory.mktemp("imported") / "base", context_tokens=1024)


@pytest.fixture(scope="module")
def chat(imported) -> ChatFormat:
    return ChatFormat.from_pretrained(imported)


def test_a_model_without_a_chat_template_is_imported_with_the_dialogue_template_and_says_why(base_model, imported):
    manifest = verify_checkpoint(imported)
    assert manifest["prompt_format"] == "completion" and manifest["completion_template"] == "dialogue"
    assert "has no chat template" in manifest["prompt_format_reason"]
    assert (imported / "chat_template.jinja").read_text() == BUILT_IN["dialogue"].jinja
    assert json.loads((imported / "generation_config.json").read_text())["stop_strings"] == ["\nUser:", "\nObservation:"]
    assert not (base_model / "chat_template.jinja").exists()  # the source is left as it was


def test_the_dialogue_template_renders_plain_text_turns_after_the_tokenizers_bos(chat):
    prompt = chat.tokenizer.decode(chat.prompt_ids(chat.messages("Reply with code.", "Write f.")))
    assert prompt == f"{chat.tokenizer.bos_token}Reply with code.\n\nUser: Write f.\n\nAssistant:"


def test_a_reply_that_starts_the_next_turn_closes_its_own_and_is_not_closed_twice(chat):
    reply = chat.encode(" return 1\n\nUser:")
    assert chat.closes_turn(reply) and not chat.closes_turn(chat.encode(" return 1"))
    assert chat.reply_text(" return 1\n\nUser:") == " return 1\n"
    closed = chat.tokenizer.decode(reply + chat.observation_ids("ok", reply_closed=True))
    assert closed.count("User:") == 1 and closed.endswith("ok\n\nAssistant:")
    cut = chat.tokenizer.decode(chat.encode(" return") + chat.observation_ids("ok", reply_closed=False))
    assert cut.endswith("return\n\nUser: ok\n\nAssistant:")  # no word-start space before the header


def test_a_demonstrated_reply_ends_with_the_close_the_template_writes(chat):
    assert chat.tokenizer.decode(chat.reply_ids("return 1")).endswith("return 1\n\nUser:")


def test_the_engine_ends_a_reply_at_a_stop_string_and_keeps_the_tokens_it_sampled(imported, tmp_path):
    """Random weights write random text: a one-letter stop string comes up within a few tokens,
    where the engine must stop, and the reply's text ends before it."""
    stopped = tmp_path / "stopped"
    shutil.copytree(imported, stopped)
    settings = json.loads((stopped / "generation_config.json").read_text())
    (stopped / "generation_config.json").write_text(json.dumps({**settings, "stop_strings": ["e"]}))
    engine = TransformersEngine(stopped, "v0", threads=1)
    [group] = engine.generate([engine.chat.prompt_ids(engine.chat.messages("s", "u"))],
                              SamplingParams(n=8, max_new_tokens=64, temperature=1.0))
    ended = [c for c in group if c.finish_reason == "stop"]
    assert ended, [c.text for c in group]
    for completion in ended:
        text = engine.tokenizer.decode(completion.token_ids)
        assert "e" in engine.tokenizer.decode(completion.token_ids[-1:]) and "e" not in engine.tokenizer.decode(
            completion.token_ids[:-1])
        assert "e" not in engine.chat.reply_text(text) and len(completion.logprobs) == len(completion.token_ids)


def test_the_function_template_continues_the_prompt_as_humaneval_does(base_model, tmp_path):
    imported = import_model(str(base_model), tmp_path / "base", 1024, "completion", BUILT_IN["function"])
    chat = ChatFormat.from_pretrained(imported)
    opening = 'def add(a, b):\n    """Add."""\n'
    rendered = chat.tokenizer.decode(chat.prompt_ids(chat.messages("Complete it.\n\nKeep it short.", opening)))
    assert rendered == f"{chat.tokenizer.bos_token}# Complete it.\n#\n# Keep it short.\n\n{opening}"
    assert chat.stop_strings == ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
    assert chat.reply_text("    return a + b\n\ndef test():") == "    return a + b\n"


def test_a_template_of_your_own_renders_with_its_stop_strings(base_model, tmp_path):
    (tmp_path / "qa.jinja").write_text("{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content }}\n"
                                       "{% elif m.role == 'assistant' %}A: {{ m.content }}\n{% endif %}{% endfor %}"
                                       "{% if add_generation_prompt %}A:{% endif %}")
    template = completion_template(str(tmp_path / "qa.jinja"), ["\nQ:"])
    chat = ChatFormat.from_pretrained(import_model(str(base_model), tmp_path / "base", 1024, "completion", template))
    assert chat.tokenizer.decode(chat.prompt_ids([{"role": "user", "content": "2+2?"}])).endswith("Q: 2+2?\nA:")
    assert chat.closing_text == "\nQ:"


def test_prompt_format_chat_refuses_a_model_without_a_template_in_one_sentence(base_model, tmp_path):
    with pytest.raises(ModelImportError, match='has no chat template .*prompt_format = "completion"'):
        import_model(str(base_model), tmp_path / "out", 1024, "chat")
    assert not (tmp_path / "out").exists()


@pytest.mark.unit
@pytest.mark.parametrize("settings, message", [
    ({"completion_template": "dialogue"}, "the built-in model has its own chat template"),
    ({"base_model": "m", "prompt_format": "chat", "stop_strings": ["\nQ:"]}, "apply to prompt_format = \"completion\""),
    ({"base_model": "m", "completion_template": "function", "max_turns": 3}, "renders one reply"),
    ({"base_model": "m", "completion_template": "no/such.jinja"}, "neither a built-in"),
])
def test_prompt_settings_that_cannot_apply_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ExperimentConfig(**settings)


@pytest.mark.unit
def test_a_template_file_without_stop_strings_is_refused(tmp_path):
    (tmp_path / "mine.jinja").write_text("{{ messages[0].content }}")
    with pytest.raises(ValueError, match="needs `stop_strings`"):
        ExperimentConfig(base_model="m", completion_template=str(tmp_path / "mine.jinja"))


@pytest.mark.unit
def test_unset_prompt_settings_leave_the_stored_experiment_as_it_was():
    assert not {"prompt_format", "completion_template", "stop_strings"} & set(ExperimentConfig().model_dump())


@pytest.mark.slow
def test_crucible_run_post_trains_a_base_model_without_a_template_through_episodes(tmp_path):
    """The whole loop on a base model: imported with the dialogue template (the run says so in one
    line), sampled as two-turn episodes whose observations the template frames, trained, evaluated."""
    source = without_template(make_model("mistral", tmp_path / "base-model"))  # the smallest vocabulary
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:2], *compose.eval()[:2]], tmp_path / "set")
    config = tmp_path / "zero.toml"
    config.write_text(f'name = "zero"\nbase_model = "{source}"\ntask_set = "{tmp_path / "set"}"\niterations = 1\n'
                      "tasks_per_iteration = 2\nsamples_per_task = 2\nmax_new_tokens = 12\nmax_turns = 2\n"
                      "eval_samples = 1\neval_blanked = false\nregrade_fraction = 0\n")
    environment = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "HF_HUB_OFFLINE": "1",
                   "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"), "CRUCIBLE_CHECKPOINT_ROOT": str(tmp_path / "ckpt")}
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--config", str(config)], env=environment,
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "has no chat template (a base model), so it is prompted with a completion template" in run.stdout + run.stderr
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "ckpt"))
    checkpoint = crucible.checkpoint_dir("zero", 1)
    assert verify_checkpoint(checkpoint)["kind"] == "grpo"
    assert (checkpoint / "chat_template.jinja").read_text() == BUILT_IN["dialogue"].jinja
    assert json.loads((checkpoint / "generation_config.json").read_text())["stop_strings"] == ["\nUser:", "\nObservation:"]
    episodes = crucible.store().read_partition("trajectories", "zero", 1).to_pylist()
    two_turns = [row for row in episodes if len(row["turns"]) == 2]
    assert two_turns  # random weights write no valid action: the first turn's observation says so
    for row in two_turns:  # each turn's observation framed as the template renders a user turn, once
        shown = row["turns"][0]["observation_excerpt"][:40]
        text = row["response_text"]
        assert f"\n\nUser: {shown}" in text and text.count("User:") == text.count("\n\nAssistant:") == 2, repr(text)


def test_crucible_eval_evaluates_a_base_model_through_a_completion_template(tmp_path):
    source = without_template(make_model("mistral", tmp_path / "base-model"))
    environment = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "eval", "--task-set", "compose", "--model", str(source),
                          "--tasks", "2", "--samples", "1", "--max-new-tokens", "8", "--storage", str(tmp_path / "data")],
                         env=environment, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [prompted] = (tmp_path / "hf" / "crucible" / "prompted").iterdir()  # made once, beside the GGUF cache
    assert verify_checkpoint(prompted)["completion_template"] == "dialogue"
    assert "Pass rate" in run.stdout
