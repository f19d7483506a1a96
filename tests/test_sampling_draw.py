"""The engine's token draw (training/inference/transformers_engine.py): one uniform number a row
against the cumulated distribution, which must sample exactly what the probabilities say."""

from __future__ import annotations

import pytest
import torch

from training.inference.transformers_engine import _inverse_cdf_draw

pytestmark = pytest.mark.unit


def test_tokens_are_drawn_as_often_as_their_probability():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0]).repeat(40_000, 1)
    torch.manual_seed(0)
    counts = torch.bincount(_inverse_cdf_draw(probs), minlength=5) / len(probs)
    torch.testing.assert_close(counts, torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0]), atol=0.01, rtol=0)
    assert counts[1] == 0 and counts[4] == 0  # never a token of probability 0, the last one included

