"""Grouped-query attention over a padded batch without copying the cache.

transformers' `sdpa` attention gives the SDPA kernels a grouped-query model's keys and values
repeated once per query head whenever there is an attention mask (the kernels take grouped
queries only without one), and a batch of padded rows always has one. For SmolLM2-135M (9 query
heads over 3 key-value heads) a decode step so wrote its whole cache out three times over in every
layer (`benchmarks/sampling_engine.py` measures the difference). Here the queries that share a
key-value head are stacked as extra query rows of that head instead: the same scores, and the
cache is read where it lies.

Registered with transformers' AttentionInterface (and the sdpa mask builder) under `NAME`; the
engine switches a model to it only from plain `sdpa`, and anything this does not cover (no mask,
dropout, a per-head mask, a paged cache or position bias) goes to transformers' own function.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "crucible_grouped_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                 **kwargs) -> tuple[Tensor, None]:
    rows, heads, length, _ = query.shape
    groups = heads // key.shape[1]
    unusual = any(kwargs.get(name) is not None for name in ("position_bias", "cache", "s_aux"))
    if groups == 1 or attention_mask is None or attention_mask.shape[1] != 1 or dropout or unusual:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # Query head h uses key-value head h // groups (transformers' repeat_kv): head-major rows
    # [kv head, group, position] are that head's groups stacked along the query axis.
    stacked = query.reshape(rows, key.shape[1], groups * length, query.shape[-1])
    mask = attention_mask[:, :, :, : key.shape[-2]]
    if mask.shape[2] == length and length > 1:
        mask = mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(rows, heads, length, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_grouped_attention(model: PreTrainedModel) -> None:
    """Switch a model that attends with plain `sdpa` to `grouped_sdpa` (others keep theirs)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
