"""The engine's grouped-query attention (training/inference/grouped_attention.py) computes what
transformers' own sdpa attention computes, on padded batches of the families that group their
key-value heads (tiny random-weight Qwen2 and Llama 3 models with their real vocabularies), for
the prefill and for decode steps over a cache."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from model_families import shared_model
from training.inference.grouped_attention import NAME, use_grouped_attention


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :5], mask[2, :2] = 0, 0  # left padding of different widths
    return ids, mask


def logits_of(model, ids: torch.Tensor, mask: torch.Tensor, steps: int = 3) -> list[torch.Tensor]:
    """The prefill's logits, then those of `steps` greedy decode steps over the cache."""
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        logits = [out.logits]
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((len(ids), 1))], dim=1)
            out = model(input_ids=out.logits[:, -1:].argmax(-1), attention_mask=mask, past_key_values=cache,
                        use_cache=True)
            logits.append(out.logits)
    return logits


@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_grouped_attention_gives_transformers_sdpa_logits_on_a_padded_batch(family, tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(shared_model(family, tmp_path_factory), attn_implementation="sdpa")
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped, or this pins nothing
    ids, mask = padded_batch()
    expected = logits_of(model.eval(), ids, mask)
    use_grouped_attention(model)
    assert model.config._attn_implementation == NAME
    for step, (got, want) in enumerate(zip(logits_of(model, ids, mask), expected)):
        kept = mask.bool() if step == 0 else slice(None)  # padded positions' outputs are never read
        torch.testing.assert_close(got[kept], want[kept], rtol=1e-5, atol=1e-5, msg=f"step {step}")


def test_a_model_on_another_attention_keeps_it(tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(shared_model("qwen2", tmp_path_factory), attn_implementation="eager")
    use_grouped_attention(model)
    assert model.config._attn_implementation == "eager"
