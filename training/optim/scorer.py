"""The policy as one module whose forward is teacher-forced token log-probs: what the optimizer
loop trains, and what DDP and FSDP wrap."""

from __future__ import annotations

import torch

from training.policy.batching import TokenBatch, token_logprobs_and_entropy


class TokenScorer(torch.nn.Module):
    """A causal LM whose forward is teacher-forced token log-probs and entropy ([B, L] each, where
    `scored` is set: by default the batch's response targets), in chunks of the LM head, under
    bf16 autocast when `autocast_dtype` is set (the weights, their gradients and the optimizer
    state stay float32; the log-softmax is float32 either way)."""

    def __init__(self, model: torch.nn.Module, chunk_tokens: int, autocast_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens
        self.autocast_dtype = autocast_dtype

    def forward(self, batch: TokenBatch, temperature: float = 1.0,
                scored: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        with torch.autocast(device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            return token_logprobs_and_entropy(self.model, batch, temperature, self.chunk_tokens, scored)
