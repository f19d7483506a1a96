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

import torch

from training.optim.distributed import current_ranks, deal
from training.optim.loop import Loop, ProgressFn, adamw, take_step
from training.optim.placement import Placement
from training.optim.resume import ProgressFile, fingerprint
from training.optim.saving import save_trained
from training.optim.schedule import lr_factor
from training.policy.batching import TokenBatch, make_batch, micro_batches_by_tokens
from training.policy.chat import ChatFormat
from training.policy.checkpoint import read_manifest, verify_checkpoint
from training.sft.job import Example, WarmupJob, read_examples
from training.sft.settings import SFTConfig


def supervised_warmup(
    policy_dir: str | Path,
    examples: list[Example],
    out_dir: str | Path,
    config: SFTConfig = SFTConfig(),
    progress: ProgressFn | None = None,
) -> dict:
    """Fine-tune the policy in `policy_dir` on (prompt ids, response ids) pairs; save to `out_dir`.
    Under torchrun every rank calls it with the same arguments; rank 0 writes and reports `progress`."""
    data = [e for e in examples if e.prompt and e.response and len(e.prompt) + len(e.response) <= config.max_len]
    if not data:
        raise ValueError("no usable SFT examples (all empty or longer than max_len)")
    place = Placement.of(config)
    model, tokenizer = place.load(policy_dir)
    pad_id = ChatFormat.of(tokenizer, model.generation_config).pad_id
    share = place.shares_prefixes(model, config.share_prefixes)
    steps = list(_batches(data, config, random.Random(config.seed)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy = place.trainable(model)
        optimizer, schedule = adamw(policy, config.lr, config.betas, config.weight_decay, lambda s: lr_factor(
            s, "cosine", config.warmup_steps, config.steps, config.min_lr_ratio))
        loop = Loop(policy, optimizer, schedule, place.ranks, ProgressFile(out_dir, fingerprint(
            read_manifest(policy_dir).get("content_hash"), config.model_dump(mode="json"), data)),
            config.save_progress_every)

        def step(rows: list[Example], lr: float) -> tuple[dict, dict]:
            sums = _step(policy, optimizer, rows, pad_id, share, config, place)
            return sums, {"loss": sums["loss"], "grad_norm": sums["grad_norm"], "lr": lr, "tokens": sums["tokens"]}

        start = time.perf_counter()
        done = loop.run(steps, step, progress)
        seconds = time.perf_counter() - start
    losses = [s["loss"] for s in done.steps]
    metrics = {
        "steps": len(losses),
        "examples": len(data),
        "skipped_examples": len(examples) - len(data),
        "initial_loss": losses[0],
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "loss_curve": losses,
        "tokens": int(done.totals["tokens"]),  # positions through the decoder (padded; a shared prefix once)
        "seconds": seconds,
        "tokens_per_s": done.totals["tokens"] / max(seconds, 1e-9),
    }
    manifest = {"kind": "sft", "parent": str(policy_dir), "sft_config": config.model_dump(mode="json"),
                "metrics": {k: v for k, v in metrics.items() if k != "loss_curve"}, **place.manifest()}
    save_trained(policy, model, policy_dir, out_dir, manifest, place.ranks, config.max_shard_size)
    loop.finish()
    return metrics


def _step(policy, optimizer, rows: list[Example], pad_id: int, share: bool, config: SFTConfig,
          place: Placement) -> dict[str, float]:
    """One optimizer step on a batch: the mean log-loss of its learned response tokens (with
    `prompt_loss_weight`, of the other targets too, at that weight; the loss reported is the
    response tokens' either way), this rank's share of its passes."""
    learned = sum(e.learned for e in rows)
    weighted = learned + config.prompt_loss_weight * sum(e.length - e.learned for e in rows)

    def loss(micro: tuple[list[Example], bool]) -> tuple[torch.Tensor, dict[str, float]]:
        examples, counted = micro
        batch = make_batch([e.prompt for e in examples], [e.response for e in examples], pad_id, share_prefix=share)
        batch.mask = _learned(batch, [e.scored for e in examples])  # only learned tokens reach the LM head
        mask = batch.mask.to(place.device)
        if config.prompt_loss_weight > 0:
            lp = policy(batch, scored=batch.valid)[0]
            weights = mask + config.prompt_loss_weight * (batch.valid.to(place.device) - mask)
            objective = -(lp * weights).sum() / weighted
        else:
            lp = policy(batch)[0]
            objective = -(lp * mask).sum() / learned
        if not counted:
            return objective * 0.0, {}
        return objective, {"loss": float(-(lp.detach() * mask).sum() / learned), "tokens": batch.tokens}

    passes = [(examples, True) if examples else (shares[0], False)
              for shares in [_passes(rows, config.micro_batch_tokens, place.ranks.world_size)]
              for examples in deal(shares, place.ranks)]
    return take_step(policy, optimizer, passes, loss, dict.fromkeys(("loss", "tokens"), 0.0), config.max_grad_norm,
                     place.ranks)


def _passes(rows: list[Example], budget: int, ranks: int) -> list[list[Example]]:
    """The batch's forward passes: all of it in one where it fits the budget and one rank runs it
    (its rows are already grouped by length), else micro-batches by tokens, sized so that several
    ranks get a share each (a rank short of passes pads with uncounted ones)."""
    padded = len(rows) * max(e.length for e in rows)
    if padded <= budget and ranks == 1:
        return [rows]
    groups = micro_batches_by_tokens([e.length for e in rows], min(budget, -(-padded // ranks)))
    return [[rows[k] for k in group] for group in groups]


def _batches(data: list[Example], config: SFTConfig, rng: random.Random):
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


def _learned(batch: TokenBatch, scored: list[list[int] | None]) -> torch.Tensor:
    """The batch's response mask, less the response tokens an example does not learn (an
    episode's observations)."""
    mask = batch.mask.clone()
    for row, (span, row_scored) in enumerate(zip(batch.response_slices, scored)):
        if row_scored is not None:
            mask[row, span] = torch.tensor(row_scored, dtype=mask.dtype)
    return mask


def run_warmup_job(job: WarmupJob, progress: ProgressFn | None = None) -> tuple[dict, dict | None]:
    """Warm up, then verify what was written; returns (metrics, the base policy's manifest),
    the manifest on the writing rank only (None on the others)."""
    metrics = supervised_warmup(job.initial_dir, read_examples(job.examples_file), job.out_dir, job.sft, progress)
    return metrics, verify_checkpoint(job.out_dir) if current_ranks().writes else None
