"""Every checkpoint loads in transformers 4.57 (what older vLLM releases, and many users'
environments, run) with the logits transformers 5 computes: a second environment (.venv/transformers-4.57, made by `make
setup` from tests/transformers-4.57.txt) loads what a training step saved
(tests/under_transformers_4.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch
from model_families import FAMILIES, shared_model

from training.policy.chat import ChatFormat
from training.policy.checkpoint import save_checkpoint
from training.policy.importing import import_model
from training.policy.model import load_policy

SECOND_ENVIRONMENT = Path(sys.prefix) / "transformers-4.57"
RUNNER = Path(__file__).with_name("under_transformers_4.py")
MESSAGES = [{"role": "user", "content": "Write a function f(x) that returns x squared."}]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request, tmp_path_factory) -> Path:
    """A checkpoint as a training step leaves it, saved by transformers 5 from an imported model."""
    root = tmp_path_factory.mktemp(request.param)
    base = import_model(str(shared_model(request.param, tmp_path_factory)), root / "base", context_tokens=1024)
    model, _ = load_policy(base)
    return save_checkpoint(model, base, root / "trained", {"kind": "grpo"})


def under_transformers_4(checkpoint: Path, out: Path) -> tuple[dict, numpy.ndarray]:
    if not (SECOND_ENVIRONMENT / "transformers").is_dir():
        pytest.fail(f"no {SECOND_ENVIRONMENT}: pip install --no-deps --target {SECOND_ENVIRONMENT} -r "
                    "tests/transformers-4.57.txt (make setup does)")
    environment = {**os.environ, "PYTHONPATH": str(SECOND_ENVIRONMENT), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(RUNNER), str(checkpoint), str(out), json.dumps(MESSAGES)],
                         env=environment, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), numpy.load(out)


def logits_here(checkpoint: Path) -> tuple[list[int], numpy.ndarray]:
    model, tokenizer = load_policy(checkpoint)
    chat = ChatFormat.of(tokenizer, model.generation_config)
    ids = chat.prompt_ids(MESSAGES)
    with torch.no_grad():
        return ids, model(torch.tensor([ids])).logits[0].numpy()


def test_a_trained_checkpoint_gives_the_same_tokens_and_logits_under_transformers_4_57(trained, tmp_path):
    reported, theirs = under_transformers_4(trained, tmp_path / "logits.npy")
    ids, ours = logits_here(trained)
    assert reported["transformers"].startswith("4.57.")
    assert reported["ids"] == ids  # the same tokenizer and chat template
    assert reported["rope_theta"] == json.loads((trained / "config.json").read_text())["rope_parameters"]["rope_theta"]
    numpy.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)


def test_without_the_4_x_keys_transformers_4_57_silently_falls_back_to_another_rope_base(trained, tmp_path):
    """Why `portable_config` exists: config.json as transformers 5 writes it changes the logits
    under 4.57 for every family whose RoPE base is not 10000."""
    config = json.loads((trained / "config.json").read_text())
    if config["rope_theta"] == 10_000:
        pytest.skip("this family's RoPE base is 4.57's fallback")
    bare = tmp_path / "as-transformers-5-wrote-it"
    shutil.copytree(trained, bare)
    (bare / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "rope_theta"}))
    reported, theirs = under_transformers_4(bare, tmp_path / "logits.npy")
    assert reported["rope_theta"] == 10_000.0
    assert not numpy.allclose(theirs, logits_here(trained)[1], atol=1e-4)
