"""Teacher forcing: (prompt, response) id lists -> padded tensors -> per-token logprobs.

Shared by SFT (maximise response logprobs) and GRPO (ratio against behaviour logprobs).
Sequences are right-padded, so positions are plain 0..L-1 (the same positions the engine
derives from its left-padded attention mask) and causal attention never sees a pad. Only the
positions that are scored reach the LM head, a chunk at a time, so the full-vocabulary logits
of a batch are never held at once.

Rows that begin alike (the episodes of one task: its prompt, and often the first action and what
it printed) can share that prefix: the decoder runs it once, and the rows' own tokens attend to
its keys and values (`make_batch(share_prefix=True)`). The result is the same computation,
gradients included (they sum over the rows through the one prefix), on fewer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from training.policy.settings import DEFAULT_CHUNK_TOKENS

# A shorter common prefix is not worth a second decoder call.
MIN_SHARED_PREFIX = 8


@dataclass
class TokenBatch:
    input_ids: Tensor  # [B, L]: prompt + response without its last token, right-padded
    targets: Tensor  # [B, L]: the next token at each position (pad id where there is none)
    mask: Tensor  # [B, L] float: 1.0 where the target is a response token
    valid: Tensor  # [B, L] float: 1.0 where the target is a real token (prompt or response)
    response_slices: list[slice]  # per row: where its response targets sit along L
    shared_prefix: int = 0  # the first this many input ids are the same in every row: run once

    @property
    def tokens(self) -> int:
        """Positions the decoder computes: a shared prefix counts once."""
        rows, width = self.input_ids.shape
        return rows * width - (rows - 1) * self.shared_prefix


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
               share_prefix: bool = False) -> TokenBatch:
    """The rows' tensors; with `share_prefix`, the batch records its rows' common prefix (at least
    MIN_SHARED_PREFIX ids, short of the batch's width) for the decoder to run once."""
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
    shared = _common_prefix([seq[:-1] for seq in seqs], width - 1) if share_prefix and len(seqs) > 1 else 0
    return TokenBatch(input_ids, targets, mask, valid, slices, shared if shared >= MIN_SHARED_PREFIX else 0)


def _common_prefix(rows: list[list[int]], cap: int) -> int:
    first, length = rows[0], min(min(len(row) for row in rows), cap)
    for other in rows[1:]:
        length = next((k for k in range(length) if other[k] != first[k]), length)
    return length


def token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0,
                   chunk_tokens: int = DEFAULT_CHUNK_TOKENS, scored: Tensor | None = None) -> Tensor:
    """log_softmax(logits / temperature)[target] where `scored` (default: the batch's mask) is
    set: [B, L], 0 elsewhere."""
    return token_logprobs_and_entropy(model, batch, temperature, chunk_tokens, scored)[0]


def token_logprobs_and_entropy(model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0,
                               chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                               scored: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The targets' log-probs (float32, with gradients) and the entropy of the tempered
    next-token distribution (detached) where `scored` (default: the batch's mask, the response
    targets) is set: [B, L] each, 0 elsewhere.
    A collapsing entropy is the first sign of a policy that stopped exploring.

    Only the scored positions reach the LM head, `chunk_tokens` rows at a time, and each chunk's
    logits are recomputed in the backward pass rather than kept (activation checkpointing): a
    few [chunk_tokens, vocab] tensors are live at a time, whatever the batch. The head is the
    model's output embedding (with Gemma-style final soft-capping where the config sets it):
    `check_lm_head` refuses a model whose own forward does more to its logits.
    """
    hidden = _hidden_states(model, batch)
    scored = batch.mask if scored is None else scored
    where = scored.flatten().nonzero().squeeze(-1).to(hidden.device)
    rows = hidden.flatten(0, 1).index_select(0, where)
    targets = batch.targets.flatten().to(hidden.device)[where]
    head, softcap = model.get_output_embeddings(), getattr(model.config, "final_logit_softcapping", None)
    chunks = [checkpoint(_score_chunk, head, rows[k : k + chunk_tokens], targets[k : k + chunk_tokens],
                         temperature, softcap, use_reentrant=False)
              for k in range(0, len(where), chunk_tokens)]
    logprobs = torch.zeros(batch.mask.numel(), device=hidden.device)
    entropy = torch.zeros(batch.mask.numel(), device=hidden.device)
    if chunks:
        logprobs = logprobs.index_put((where,), torch.cat([lp for lp, _ in chunks]))
        entropy = entropy.index_put((where,), torch.cat([h for _, h in chunks]))
    else:  # nothing scored (all observation tokens): still a graph through every weight, adding zero
        unused, _ = _score_chunk(head, hidden.flatten(0, 1)[:1], batch.targets.flatten()[:1].to(hidden.device),
                                 temperature, softcap)
        logprobs = logprobs + 0.0 * unused.sum()
    return logprobs.view_as(scored), entropy.view_as(scored)


def _hidden_states(model: torch.nn.Module, batch: TokenBatch) -> Tensor:
    """The decoder's last hidden states, [B, L, H]; a shared prefix is run once, its keys and
    values repeated for the rows' own tokens, which take positions after it."""
    decoder, ids = model.get_decoder(), batch.input_ids.to(_device(model))
    shared = batch.shared_prefix
    if not shared:
        return decoder(input_ids=ids, use_cache=False).last_hidden_state
    prefix = decoder(input_ids=ids[:1, :shared], use_cache=True)
    cache = prefix.past_key_values
    if cache is None or cache.get_seq_length() != shared:  # e.g. checkpointed layers, which keep none
        raise RuntimeError(f"{type(model).__name__} kept no cache of the shared prefix")
    cache.batch_repeat_interleave(len(ids))
    rest = decoder(input_ids=ids[:, shared:], past_key_values=cache, use_cache=True).last_hidden_state
    return torch.cat([prefix.last_hidden_state.expand(len(ids), -1, -1), rest], dim=1)


def shares_prefixes_exactly(model: torch.nn.Module) -> bool:
    """Whether running a shared prefix once gives this model's log-probs (on a short probe): not
    where its cache is more than a per-layer key and value store (recurrent state), its cached
    forward differs, or dropout would draw one mask for what were many rows."""
    if getattr(model.config, "attention_dropout", 0) or any(
            isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return False
    ids = [(7 * i + 3) % model.config.vocab_size for i in range(2 * MIN_SHARED_PREFIX + 4)]
    prompts, responses = [ids[:MIN_SHARED_PREFIX + 2]] * 2, [ids[MIN_SHARED_PREFIX + 2:], ids[:5]]
    try:
        with torch.no_grad():
            shared = token_logprobs(model, make_batch(prompts, responses, pad_id=0, share_prefix=True))
    except Exception:  # noqa: BLE001 - any model the shared path cannot run trains on whole rows
        return False
    with torch.no_grad():
        plain = token_logprobs(model, make_batch(prompts, responses, pad_id=0))
    return float((shared - plain).abs().max()) <= 1e-4


def check_lm_head(model: torch.nn.Module) -> None:
    """Refuse a model whose logits are not what `token_logprobs` computes from its decoder and
    output embedding (a family that scales its logits inside its own forward), on a short probe."""
    ids = [[(7 * i + 3) % model.config.vocab_size for i in range(8)]]
    batch = make_batch([ids[0][:4]], [ids[0][4:]], pad_id=0)
    with torch.no_grad():
        ours = token_logprobs(model, batch)
        logits = model(input_ids=batch.input_ids.to(_device(model))).logits.float().cpu()
    theirs = torch.log_softmax(logits, dim=-1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) * batch.mask
    gap = float((ours.cpu() - theirs).abs().max())
    if gap > 1e-3:
        raise ValueError(f"{type(model).__name__} computes its logits from more than its output embedding of the last "
                         f"hidden state (log-probs differ by up to {gap:.2g} on a probe), which the trainer's chunked "
                         "LM head cannot reproduce")


def _score_chunk(head: torch.nn.Module, rows: Tensor, targets: Tensor, temperature: float,
                 softcap: float | None) -> tuple[Tensor, Tensor]:
    logits = head(rows).float()  # the head in the compute dtype (as vLLM's), the log-softmax in float32
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():  # -sum(p log p) in one temporary
        entropy = -logprobs.exp().mul_(logprobs).sum(dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def micro_batches_by_tokens(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices into `lengths` grouped so that each group, padded to its longest member, holds at
    most `budget` tokens (a sequence longer than the budget goes alone). Sorted by length first,
    so that neighbours pad little."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
