"""Supervised warm-up: teach the base policy the answer format before RL.

Each example is (prompt ids, response ids, scored), as training/sft/demonstrations.py makes them:
a chat-templated prompt and the reply, ending with its end-of-turn token; or a whole episode after
its prompt, replies and observations, with `scored` marking the replies' tokens. The model learns
only the scored response tokens (prompt and observation targets are masked, like labels = -100). AdamW with linear warm-up then cosine decay; the result is a full checkpoint.

The defaults are sized for the built-in model: enough steps that it reads the answer format out
of the prompt, and what it learns on train tasks carries to held-out ones; few enough that the
base policy leaves reinforcement learning room to show what it adds (docs/benchmarks.md has the
teacher-forced accuracy by step count).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, Field

from training.policy.batching import make_batch, shares_prefixes_exactly, token_logprobs
from training.policy.chat import ChatFormat
from training.policy.checkpoint import save_checkpoint
from training.policy.model import load_policy
from training.rl.schedule import lr_factor

ProgressFn = Callable[[int, int, float], None]  # (step, total_steps, loss)


class Example(NamedTuple):
    prompt: list[int]
    response: list[int]
    scored: list[int] | None = None  # per response token, 1 where it is learned (an episode's replies); None: all


class SFTConfig(BaseModel):
    """The warm-up's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(200, ge=1, description="optimizer steps: 200 is 3.2k examples (~4 epochs of compose's "
                       "train split), ~80 s on 2 cores")
    lr: float = Field(3e-3, gt=0, description="peak learning rate; a small (3M) from-scratch model is stable at "
                      "a high peak with warm-up and cosine decay")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor, as a share of lr")
    warmup_steps: int = Field(30, ge=0, description="steps of linear warm-up")
    batch_size: int = Field(16, ge=1, description="examples per optimizer step")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    max_len: int = Field(1024, ge=2, description="examples longer than this (prompt + response) are skipped")
    group_by_length: bool = Field(True, description="batch similar lengths together: less padding")
    share_prefixes: bool = Field(True, description="run the prefix every example of a batch starts with (the chat "
                                 "template's header and system message) once per batch: the same loss and gradients "
                                 "on fewer tokens (25% fewer on repair's demonstrations); not for a model whose cached "
                                 "forward differs")
    prompt_loss_weight: float = Field(0.0, ge=0, description="0: prompt targets masked; more also models the prompt")
    seed: int = 0
    threads: int | None = Field(2, ge=1, description="training is compute-bound: 2 threads ~1.7x faster than 1 "
                                "on the 2-core machine")


def supervised_warmup(
    policy_dir: str | Path,
    examples: list[Example],
    out_dir: str | Path,
    config: SFTConfig = SFTConfig(),
    progress: ProgressFn | None = None,
) -> dict:
    """Fine-tune the policy in `policy_dir` on (prompt ids, response ids) pairs; save to `out_dir`."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    model, tokenizer = load_policy(policy_dir)
    pad_id = ChatFormat.of(tokenizer, model.generation_config).pad_id
    data = [e for e in examples if e.prompt and e.response and len(e.prompt) + len(e.response) <= config.max_len]
    skipped = len(examples) - len(data)
    if not data:
        raise ValueError("no usable SFT examples (all empty or longer than max_len)")
    rng = random.Random(config.seed)
    share = config.share_prefixes and shares_prefixes_exactly(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s, "cosine", config.warmup_steps, config.steps, config.min_lr_ratio))
        losses, tokens, start = [], 0, time.perf_counter()
        for step, batch_rows in enumerate(_batches(data, config, rng), start=1):
            batch = make_batch([e.prompt for e in batch_rows], [e.response for e in batch_rows], pad_id,
                               share_prefix=share)
            batch.mask = _learned(batch.mask, batch.response_slices, [e.scored for e in batch_rows])
            scored = batch.valid if config.prompt_loss_weight > 0 else batch.mask
            lp = token_logprobs(model, batch, scored=scored)
            loss = -(lp * batch.mask).sum() / batch.mask.sum()  # response tokens only
            objective = loss
            if config.prompt_loss_weight > 0:
                weights = batch.mask + config.prompt_loss_weight * (batch.valid - batch.mask)
                objective = -(lp * weights).sum() / weights.sum()
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            schedule.step()
            losses.append(loss.detach().item())
            tokens += batch.tokens
            if progress is not None:
                progress(step, config.steps, losses[-1])
        seconds = time.perf_counter() - start
    model.eval()
    metrics = {
        "steps": len(losses),
        "examples": len(data),
        "skipped_examples": skipped,
        "initial_loss": losses[0],
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "loss_curve": losses,
        "tokens": tokens,  # positions through the decoder (padded; a shared prefix once)
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
    }
    manifest = {
        "kind": "sft",
        "parent": str(policy_dir),
        "sft_config": config.model_dump(mode="json"),
        "metrics": {k: v for k, v in metrics.items() if k != "loss_curve"},
    }
    save_checkpoint(model, policy_dir, out_dir, manifest)
    return metrics


def _batches(data: list, config: SFTConfig, rng: random.Random):
    """config.steps batches; every epoch is reshuffled.

    With group_by_length, each window of 8 batches is sorted by length before it is cut into
    batches (then the batches are shuffled): ~15% less padding, nearly as random.
    """
    pending: list[list[int]] = []
    for _ in range(config.steps):
        if not pending:
            pending = _epoch_batches(data, config, rng)
        yield [data[i] for i in pending.pop()]


def _epoch_batches(data: list, config: SFTConfig, rng: random.Random) -> list[list[int]]:
    order = list(range(len(data)))
    rng.shuffle(order)
    size = config.batch_size
    window = size * 8 if config.group_by_length else size
    batches = []
    for w in range(0, len(order), window):
        chunk = order[w : w + window]
        if config.group_by_length:
            chunk.sort(key=lambda i: len(data[i].prompt) + len(data[i].response))
        batches.extend(chunk[k : k + size] for k in range(0, len(chunk), size))
    rng.shuffle(batches)
    return batches



def _learned(mask: torch.Tensor, spans: list[slice], scored: list[list[int] | None]) -> torch.Tensor:
    """The batch's response mask, less the response tokens an example does not learn (an
    episode's observations)."""
    mask = mask.clone()
    for row, (span, row_scored) in enumerate(zip(spans, scored)):
        if row_scored is not None:
            mask[row, span] = torch.tensor(row_scored, dtype=mask.dtype)
    return mask
