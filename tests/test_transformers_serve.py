"""The OpenAI-compatible engine against `transformers serve` (tests/transformers_server.py), a
real third-party server, serving a Crucible checkpoint on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers_server import transformers_serve

from datastore import catalog
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from training.agent.prompts import prompt_messages, render_prompt
from training.inference.engine import SamplingParams
from training.inference.engines import open_engine
from training.inference.settings import ServerSettings
from training.policy.model import build_base_policy
from training.policy.settings import PolicyConfig

ROOT = Path(__file__).parent.parent
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


def test_crucible_eval_reports_a_served_model_on_a_task_set(checkpoint, served, tmp_path):
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:1], *compose.eval()[:3]], tmp_path / "set")
    environment = {**os.environ, "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "eval", "--task-set", str(tmp_path / "set"),
                          "--engine", "openai", "--base-url", served, "--model", str(checkpoint), "--samples", "2",
                          "--max-new-tokens", "16", "--name", "served-tiny"],
                         env=environment, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for title in ("Pass rate", "Stability across repeated samples", "Failure modes", "Cost"):
        assert f"{title}" in run.stdout
    [rows] = catalog.connect(str(tmp_path / "data")).sql(
        "SELECT count(*), count(DISTINCT task_id), bool_and(behaviour_logprobs IS NULL), any_value(model) "
        "FROM model_evaluations WHERE experiment = 'served-tiny'").fetchall()
    assert rows == (6, 3, True, str(checkpoint))  # 2 answers to each of 3 held-out tasks, text only
    [(tasks, pass_rate)] = catalog.connect(str(tmp_path / "data")).sql(
        "SELECT tasks, pass_rate FROM model_eval_pass_rates WHERE domain = '(all)' AND difficulty = '(all)'").fetchall()
    assert tasks == 3 and 0 <= pass_rate <= 1
