"""One GRPO policy update: scored rollouts in, next policy checkpoint out.

Advantages are group-relative (completions of the same prompt share a group_id). Token
logprobs are recomputed with teacher forcing under the same convention as the engine,
log_softmax(logits / temperature), and the PPO-clipped surrogate is minimised with AdamW.
Samples with zero advantage (all-equal groups) contribute exactly zero gradient, so by
default they are not run through the model; their tokens still count in the token-level
denominator, which keeps the loss identical to the full-batch definition.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from .batching import make_batch, token_logprobs
from .checkpoint import save_checkpoint
from .grpo import advantages, clipped_policy_loss
from .model import load_policy

OPTIMIZER_FILE = "optimizer.pt"
ProgressFn = Callable[[int, int, float], None]  # (optimizer step, total steps, loss)


@dataclass(frozen=True)
class GRPOConfig:
    # Adam moves every weight by ~lr per step whatever the gradient scale; the SFT'd 3M model
    # has weights of std ~0.02-0.05, so 1e-5 (the usual 1B+ setting) barely changes a single
    # sequence's logprob, while 1e-4 raises a rewarded sequence's logprob measurably in one
    # step at an approx KL of ~1e-3 (see tests and report). Large models want 1e-6..1e-5.
    lr: float = 1e-4
    epochs: int = 1  # passes over the samples; 1 = strictly on-policy first minibatch
    minibatch_size: int = 64  # samples per optimizer step (e.g. 16 prompts x 4 completions)
    micro_batch_size: int = 16  # samples per forward pass (memory only; the loss is unchanged)
    clip_eps: float = 0.2  # PPO / GRPO standard (the low side when clip_eps_high is set)
    clip_eps_high: float | None = None  # None: symmetric; DAPO's clip-higher uses 0.28
    loss_aggregation: str = "token"  # token: every trained token weighs the same; sequence: every sample
    # Truncated importance sampling: when the engine's log-probs differ from the trainer's at the
    # same weights (vLLM's kernels, bf16), the ratio is taken against the trainer's own log-probs
    # at rollout time and each token is weighted by min(pi_trainer / pi_engine, cap). None: off.
    tis_cap: float | None = None
    max_grad_norm: float = 1.0
    temperature: float = 1.0  # must equal the sampling temperature of the rollouts
    estimator: str = "grpo"  # advantage estimator: grpo | rloo | reinforce_pp (training/grpo.py)
    scale_by_std: bool = True  # GRPO's std normalisation; False = Dr. GRPO-style centring only
    weight_decay: float = 0.0  # no pull towards zero during RL
    betas: tuple[float, float] = (0.9, 0.99)
    keep_optimizer_state: bool = True  # carry AdamW moments across rounds via optimizer.pt
    skip_zero_advantage: bool = True  # exact: such samples have zero gradient
    seed: int = 0  # minibatch shuffling
    threads: int | None = 2  # training is compute-bound: 2 threads ~1.7x faster than 1 here


@dataclass
class TrainSample:
    prompt_ids: list[int]
    response_ids: list[int]  # as generated, including the stop token if any
    behaviour_logprobs: list[float]  # one per response token, from the engine (0.0 where loss_mask is 0)
    reward: float
    group_id: str  # completions of the same prompt (same rollout round) share it
    # 1 where the policy sampled the token, 0 where the environment wrote it (a multi-turn
    # episode's observations); None: every response token was sampled.
    loss_mask: list[int] | None = None

    @property
    def trained_tokens(self) -> int:
        return len(self.response_ids) if self.loss_mask is None else sum(self.loss_mask)


def train_policy(
    policy_dir: str | Path,
    samples: list[TrainSample],
    out_dir: str | Path,
    config: GRPOConfig = GRPOConfig(),
    progress: ProgressFn | None = None,
    lineage: dict | None = None,
) -> dict:
    """Load the policy, take GRPO steps on `samples`, save the new policy to `out_dir`.

    `lineage` (parent checkpoint, trajectories, experiment settings) goes into the manifest.
    """
    _validate(samples, config)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    model, tokenizer = load_policy(policy_dir)
    model.train()
    advantages = _advantages(samples, config)
    rollout_logprobs = _logprobs_at_start(model, samples, tokenizer.pad_token_id, config) if config.tis_cap else None
    optimizer = _optimizer(model, policy_dir, config)
    minibatches = _minibatches(len(samples), config)
    totals: dict[str, float] = {}
    grad_norms: list[float] = []
    start = time.perf_counter()
    for step, rows in enumerate(minibatches, start=1):
        stats = _step(model, optimizer, samples, advantages, rows, tokenizer.pad_token_id, config, rollout_logprobs)
        grad_norms.append(stats.pop("grad_norm"))
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value
        if progress is not None:
            progress(step, len(minibatches), stats["loss"])
    seconds = time.perf_counter() - start
    metrics = _metrics(samples, advantages, totals, grad_norms, len(minibatches), seconds, config)
    manifest = {"kind": "grpo", "parent": str(policy_dir), "grpo_config": asdict(config), "metrics": metrics,
                "lineage": lineage or {}}
    extra = (lambda d: torch.save(optimizer.state_dict(), d / OPTIMIZER_FILE)) if config.keep_optimizer_state else None
    model.eval()
    save_checkpoint(model, tokenizer, out_dir, manifest, extra=extra)
    return metrics


def _validate(samples: list[TrainSample], config: GRPOConfig) -> None:
    if not samples:
        raise ValueError("train_policy needs at least one sample")
    if config.temperature <= 0:
        raise ValueError("temperature must be > 0 (it divides the logits)")
    for i, s in enumerate(samples):
        if not s.prompt_ids or not s.response_ids:
            raise ValueError(f"sample {i}: empty prompt or response")
        if len(s.behaviour_logprobs) != len(s.response_ids):
            raise ValueError(
                f"sample {i}: {len(s.behaviour_logprobs)} behaviour logprobs for {len(s.response_ids)} tokens"
            )
        if s.loss_mask is not None and len(s.loss_mask) != len(s.response_ids):
            raise ValueError(f"sample {i}: a loss mask of {len(s.loss_mask)} for {len(s.response_ids)} tokens")


def _advantages(samples: list[TrainSample], config: GRPOConfig) -> torch.Tensor:
    labels: dict[str, int] = {}
    group_ids = torch.tensor([labels.setdefault(s.group_id, len(labels)) for s in samples])
    rewards = torch.tensor([float(s.reward) for s in samples])
    return advantages(config.estimator, rewards, group_ids, scale_by_std=config.scale_by_std)


def _optimizer(model: torch.nn.Module, policy_dir: str | Path, config: GRPOConfig) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    state_path = Path(policy_dir) / OPTIMIZER_FILE
    if config.keep_optimizer_state and state_path.is_file():
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state)
        for group in optimizer.param_groups:  # this round's config wins over the saved one
            group.update(lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    return optimizer


def _minibatches(n: int, config: GRPOConfig) -> list[list[int]]:
    rng = random.Random(config.seed)
    out = []
    for _ in range(config.epochs):
        order = list(range(n))
        rng.shuffle(order)
        out.extend(order[i : i + config.minibatch_size] for i in range(0, n, config.minibatch_size))
    return out


def _logprobs_at_start(model, samples: list[TrainSample], pad_id: int, config: GRPOConfig) -> list[list[float]]:
    """The trainer's own log-probs of every response token at the weights that sampled them."""
    out = []
    with torch.no_grad():
        for s in samples:
            batch = make_batch([s.prompt_ids], [s.response_ids], pad_id)
            out.append(token_logprobs(model, batch, config.temperature)[0, batch.response_slices[0]].tolist())
    return out


def _step(model, optimizer, samples, advantages, rows, pad_id, config: GRPOConfig,
          rollout_logprobs: list[list[float]] | None = None) -> dict[str, float]:
    """One optimizer step on the samples `rows`; returns token-weighted sums of the stats."""
    per_token = config.loss_aggregation == "token"
    denominator = max(sum(samples[i].trained_tokens if per_token else 1 for i in rows), 1)
    active = [i for i in rows if not (config.skip_zero_advantage and advantages[i] == 0)]
    active.sort(key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
    optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "mean_ratio": 0.0, "stat_tokens": 0.0, "tokens": 0.0,
            "tis_weight": 0.0}
    sums["optimizer_steps"] = 1.0 if active else 0.0
    for k in range(0, len(active), config.micro_batch_size):
        micro = active[k : k + config.micro_batch_size]
        batch = make_batch([samples[i].prompt_ids for i in micro], [samples[i].response_ids for i in micro], pad_id)
        behaviour = torch.zeros_like(batch.mask)
        reference = torch.zeros_like(batch.mask) if rollout_logprobs is not None else behaviour
        for row, i in enumerate(micro):
            span = batch.response_slices[row]
            behaviour[row, span] = torch.tensor(samples[i].behaviour_logprobs)
            if rollout_logprobs is not None:
                reference[row, span] = torch.tensor(rollout_logprobs[i])
            if samples[i].loss_mask is not None:  # observations are context, never trained on
                batch.mask[row, span] *= torch.tensor(samples[i].loss_mask, dtype=batch.mask.dtype)
        weights = None
        if rollout_logprobs is not None:
            weights = torch.exp(reference - behaviour).clamp(max=config.tis_cap) * batch.mask
            sums["tis_weight"] += float(weights.sum())
        logprobs = token_logprobs(model, batch, config.temperature)
        loss, stats = clipped_policy_loss(logprobs, reference, advantages[micro], batch.mask, config.clip_eps,
                                          config.clip_eps_high, config.loss_aggregation, weights)
        # Turns the micro-batch mean into the minibatch mean (over tokens, or over samples).
        weight = (stats["tokens"] if per_token else stats["sequences"]) / denominator
        (loss * weight).backward()
        sums["loss"] += loss.detach().item() * weight
        for key in ("clip_fraction", "approx_kl", "mean_ratio"):
            sums[key] += stats[key] * stats["tokens"]
        sums["stat_tokens"] += stats["tokens"]
        sums["tokens"] += batch.tokens
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)) if active else 0.0
    if active:
        optimizer.step()
    return {**sums, "grad_norm": grad_norm}


def _metrics(samples, advantages, totals, grad_norms, steps, seconds, config) -> dict:
    stat_tokens = max(totals.get("stat_tokens", 0.0), 1.0)
    groups = len({s.group_id for s in samples})
    return {
        "loss": totals.get("loss", 0.0) / max(steps, 1),
        "clip_fraction": totals.get("clip_fraction", 0.0) / stat_tokens,
        "approx_kl": totals.get("approx_kl", 0.0) / stat_tokens,
        "mean_ratio": totals.get("mean_ratio", 0.0) / stat_tokens if totals.get("stat_tokens") else 1.0,
        "tis_weight_mean": totals.get("tis_weight", 0.0) / stat_tokens if config.tis_cap else 1.0,
        "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
        "grad_norm_max": max(grad_norms, default=0.0),
        "optimizer_steps": int(totals.get("optimizer_steps", 0.0)),
        "samples": len(samples),
        "groups": groups,
        "response_tokens": sum(s.trained_tokens for s in samples),
        "tokens": int(totals.get("tokens", 0.0)),  # forward+backward tokens (prompt + response, padded)
        "seconds": seconds,
        "tokens_per_s": totals.get("tokens", 0.0) / max(seconds, 1e-9),
        "mean_reward": sum(s.reward for s in samples) / len(samples),
        "mean_advantage": float(advantages.mean()),
        "mean_abs_advantage": float(advantages.abs().mean()),
        "frac_zero_advantage": float((advantages == 0).float().mean()),
        "lr": config.lr,
    }
