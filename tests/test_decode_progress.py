"""A long generate call on CPU says how far it is: replies ended, tokens sampled, tokens/s."""

from __future__ import annotations

import re

import pytest

from training.inference.engine import SamplingParams
from training.inference.transformers_engine import TransformersEngine
from training.policy.model import build_base_policy


@pytest.mark.unit
def test_decoding_reports_replies_ended_and_every_token_sampled(tmp_path):
    lines: list[str] = []
    engine = TransformersEngine(build_base_policy(tmp_path / "base"), "base", threads=1, batch_size=2,
                                log=lines.append, progress_every_s=0)  # a line every decode step
    prompts = [engine.chat.prompt_ids(engine.chat.messages("You write code.", task)) for task in ("Add.", "Sort it.")]
    groups = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=16, temperature=1.0))
    sampled = sum(len(completion.token_ids) for group in groups for completion in group)
    assert re.fullmatch(rf"decoding: 6/6 replies ended, {sampled:,} tokens sampled, \d+\.\d tokens/s", lines[-1])
    ended = [int(line.split()[1].split("/")[0]) for line in lines]
    assert ended == sorted(ended)


@pytest.mark.unit
def test_loading_a_policy_prints_no_progress_bar_of_transformers(tmp_path, capfd):
    """The engine's lines are the progress a user reads; transformers would add a "Loading
    weights" bar for every model an evaluation or iteration loads."""
    checkpoint = build_base_policy(tmp_path / "base")
    capfd.readouterr()
    TransformersEngine(checkpoint, "base", threads=1)
    assert "Loading weights" not in capfd.readouterr().err
