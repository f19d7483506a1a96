"""Teacher forcing: (prompt, response) id lists -> padded tensors -> per-token logprobs.

Shared by SFT (maximise response logprobs) and GRPO (ratio against behaviour logprobs).
Sequences are right-padded, so positions are plain 0..L-1 (the same positions the engine
derives from its left-padded attention mask) and causal attention never sees a pad.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TokenBatch:
    input_ids: Tensor  # [B, L]: prompt + response without its last token, right-padded
    targets: Tensor  # [B, L]: the next token at each position (pad id where there is none)
    mask: Tensor  # [B, L] float: 1.0 where the target is a response token
    valid: Tensor  # [B, L] float: 1.0 where the target is a real token (prompt or response)
    response_slices: list[slice]  # per row: where its response targets sit along L

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> TokenBatch:
    if len(prompts) != len(responses) or not prompts:
        raise ValueError("need equally many (>0) prompts and responses")
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(len(s) for s in seqs) - 1
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    targets = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    valid = torch.zeros((len(seqs), width), dtype=torch.float32)
    slices = []
    for row, (p, r) in enumerate(zip(prompts, responses)):
        if not p or not r:
            raise ValueError(f"row {row}: empty prompt or response")
        seq = torch.tensor(p + r, dtype=torch.long)
        input_ids[row, : len(seq) - 1] = seq[:-1]
        targets[row, : len(seq) - 1] = seq[1:]
        span = slice(len(p) - 1, len(p) - 1 + len(r))
        mask[row, span] = 1.0
        valid[row, : len(seq) - 1] = 1.0
        slices.append(span)
    return TokenBatch(input_ids, targets, mask, valid, slices)


def token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0) -> Tensor:
    """log_softmax(logits / temperature)[target] at every position: [B, L] (meaningful where mask)."""
    return token_logprobs_and_entropy(model, batch, temperature)[0]


def token_logprobs_and_entropy(model: torch.nn.Module, batch: TokenBatch,
                               temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """The targets' log-probs, and the entropy of the (tempered) next-token distribution at
    every position, detached: a collapsing entropy is the first sign of a policy that stopped
    exploring."""
    logits = model(input_ids=batch.input_ids).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return logprobs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1), entropy
