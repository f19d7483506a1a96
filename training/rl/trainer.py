"""One policy update: scored rollouts in, next policy checkpoint out.

Advantages come from the configured estimator over groups (completions of the same prompt share
a group_id). Token log-probs are recomputed with teacher forcing under the engine's convention,
log_softmax(logits / temperature) at the temperature the samples were drawn at, and the PPO-clipped surrogate (optionally with a KL penalty
to a frozen reference) is minimised with AdamW, on the full model or on LoRA adapters that are
merged into the saved checkpoint.

Groups whose rewards are all equal carry no signal: by default (`zero_variance_groups="drop"`,
DAPO's dynamic sampling) they leave the batch and its loss denominator. Any remaining sample
with zero advantage contributes exactly zero gradient, so it is not run through the model; its
tokens still count in the denominator, which keeps the loss identical to the full-batch one.
The samples of one prompt share their micro-batches, whose common prefix (the prompt, and the
turns a group's episodes have in common) the decoder runs once (`share_prefixes`).

After the last optimizer step, one more pass without gradients measures `final_kl`, the KL
between the policy that sampled and the policy the step saved, on the trained tokens: what the
divergence monitor judges. Each optimizer step's own `approx_kl` is measured before it updates.

The step runs on training/optim/'s loop, as the warm-up does: on the GPU when there is one
(`device`), in bf16 autocast over float32 weights and optimizer state there (`precision`), and
under torchrun as data parallel ranks (DDP or FSDP2, `parallel`): the samples are shared out,
gradients averaged, and rank 0 alone writes. Micro-batches are sized in tokens and the LM head
runs in chunks (training/rl/forward.py), so memory is bounded by settings, not by the batch.
It saves its progress every `save_progress_every` optimizer steps (run again after a crash, it
resumes there), and writes the checkpoint in the parent's dtype, with the float32 weights
beside them when that loses precision.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from training.optim.loop import Loop, ProgressFn, adamw, take_step
from training.optim.placement import Placement
from training.optim.resume import ProgressFile, StepProgress, fingerprint
from training.optim.saving import OPTIMIZER_FILE, save_trained
from training.optim.schedule import lr_factor
from training.policy.batching import check_lm_head
from training.policy.chat import ChatFormat
from training.policy.checkpoint import copy_checkpoint, read_manifest
from training.rl.forward import Forward, MicroBatch
from training.rl.grpo import advantages, approx_kl, clipped_policy_loss, informative_samples, truncated_is_weights
from training.rl.mismatch import logprob_mismatch
from training.rl.sample import TrainSample
from training.rl.settings import GRPOConfig


def train_policy(
    policy_dir: str | Path,
    samples: list[TrainSample],
    out_dir: str | Path,
    config: GRPOConfig = GRPOConfig(),
    progress: ProgressFn | None = None,
    lineage: dict | None = None,
    reference_dir: str | Path | None = None,
    temperature: float = 1.0,
) -> dict:
    """Load the policy, take the step's optimizer steps on `samples`, save the new policy to
    `out_dir`, and return the step's metrics (with `steps`, the statistics of each optimizer step).

    `lineage` (parent checkpoint, trajectories, task set, settings) goes into the manifest;
    `reference_dir` is the frozen policy of the KL penalty (needed when kl_coef > 0);
    `temperature` is the one the samples were drawn at. Under torchrun every rank calls it
    with the same arguments; rank 0 writes the checkpoint and reports `progress`.
    """
    _validate(samples, config, reference_dir)
    place = Placement.of(config)
    batch = _informative(samples) if config.zero_variance_groups == "drop" else samples
    parent = read_manifest(policy_dir)
    model, tokenizer = place.load(policy_dir)
    check_lm_head(model)
    pad_id = ChatFormat.of(tokenizer, model.generation_config).pad_id
    advantages = _advantages(batch, config)
    forward = Forward(pad_id, config.micro_batch_tokens, temperature, place.ranks,
                      place.shares_prefixes(model, config.share_prefixes))
    # The trainer's own log-probs at the sampling weights: always measured against the engine's
    # (logprob_mismatch), the ratio's base only under truncated IS (tis_cap).
    proximal_logprobs = forward.logprobs(place.scorer(model), batch) if batch else None
    rollout_logprobs = proximal_logprobs if config.tis_cap else None
    reference_logprobs = None
    if config.kl_coef and batch:
        reference_logprobs = forward.logprobs(place.scorer(place.load(reference_dir)[0]), batch)
    if config.lora_rank:
        model = _with_lora(model, config)
    policy = place.trainable(model)
    first_step = int(parent.get("global_step", 0))
    optimizer, schedule = adamw(policy, config.lr, config.betas, config.weight_decay, lambda s: lr_factor(
        first_step + s, config.lr_schedule, config.lr_warmup_steps, config.lr_decay_steps, config.min_lr_ratio),
        saved=_saved_optimizer_state(policy_dir, config))
    minibatches = _minibatches(len(batch), config)
    loop = Loop(policy, optimizer, schedule, place.ranks, ProgressFile(out_dir, fingerprint(
        parent.get("content_hash"), config.model_dump(mode="json"), str(reference_dir), temperature,
        [(s.prompt_ids, s.response_ids, s.loss_mask, s.reward, s.group_id) for s in samples])),
        config.save_progress_every)

    def step(rows: list[int], lr: float) -> tuple[dict, dict]:
        sums = _step(policy, optimizer, batch, advantages, rows, forward, config, rollout_logprobs,
                     reference_logprobs)
        return sums, _step_stats(sums, lr, measures_reference=bool(config.kl_coef))

    start = time.perf_counter()
    done = loop.run(minibatches, step, progress)
    metrics = _metrics(samples, batch, advantages, done, time.perf_counter() - start, config)
    learned = metrics["optimizer_steps"] > 0
    metrics["final_kl"] = _final_kl(policy, batch, forward, rollout_logprobs) if learned else None
    metrics["logprob_mismatch"] = None if proximal_logprobs is None else logprob_mismatch(
        batch, proximal_logprobs, lambda token: tokenizer.decode([token]))
    manifest = {"kind": "grpo", "parent": str(policy_dir), "global_step": first_step + (len(minibatches) if learned else 0),
                "grpo_config": config.model_dump(mode="json"), "temperature": temperature, "metrics": metrics,
                **place.manifest(), "lineage": lineage or {}}
    if learned:
        _save(policy, model, optimizer, policy_dir, out_dir, manifest, config, place)
    elif place.ranks.writes:  # no group had a reward spread: the parent's files, so its content hash
        copy_checkpoint(policy_dir, out_dir, manifest)
    loop.finish()
    return metrics


def _validate(samples: list[TrainSample], config: GRPOConfig, reference_dir: str | Path | None) -> None:
    if not samples:
        raise ValueError("train_policy needs at least one sample")
    if config.kl_coef and reference_dir is None:
        raise ValueError("kl_coef > 0 needs a reference policy (reference_dir)")
    for i, s in enumerate(samples):
        if not s.prompt_ids or not s.response_ids:
            raise ValueError(f"sample {i}: empty prompt or response")
        if len(s.behaviour_logprobs) != len(s.response_ids):
            raise ValueError(
                f"sample {i}: {len(s.behaviour_logprobs)} behaviour logprobs for {len(s.response_ids)} tokens"
            )
        if s.loss_mask is not None and len(s.loss_mask) != len(s.response_ids):
            raise ValueError(f"sample {i}: a loss mask of {len(s.loss_mask)} for {len(s.response_ids)} tokens")


def _group_labels(samples: list[TrainSample]) -> torch.Tensor:
    labels: dict[str, int] = {}
    return torch.tensor([labels.setdefault(s.group_id, len(labels)) for s in samples], dtype=torch.long)


def _rewards(samples: list[TrainSample]) -> torch.Tensor:
    return torch.tensor([float(s.reward) for s in samples])


def _informative(samples: list[TrainSample]) -> list[TrainSample]:
    keep = informative_samples(_rewards(samples), _group_labels(samples))
    return [s for s, kept in zip(samples, keep.tolist()) if kept]


def _advantages(samples: list[TrainSample], config: GRPOConfig) -> torch.Tensor:
    if not samples:
        return torch.zeros(0)
    return advantages(config.estimator, _rewards(samples), _group_labels(samples), scale_by_std=config.scale_by_std)


def _with_lora(model, config: GRPOConfig):
    from peft import LoraConfig, get_peft_model  # only LoRA runs need peft loaded

    return get_peft_model(model, LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                            target_modules=list(config.lora_target_modules), bias="none"))


def _saved_optimizer_state(policy_dir: str | Path, config: GRPOConfig) -> dict | None:
    """The moments the parent's step left, when they carry on (not for LoRA's fresh adapters)."""
    path = Path(policy_dir) / OPTIMIZER_FILE
    if not (config.keep_optimizer_state and not config.lora_rank and path.is_file()):
        return None
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _save(policy, model, optimizer, policy_dir, out_dir, manifest: dict, config: GRPOConfig, place: Placement) -> None:
    """The new policy; with LoRA, its adapters merged into a plain model any engine loads."""
    weights = None
    if config.lora_rank:
        model = model.merge_and_unload()
        weights = model.state_dict()
    keep_moments = config.keep_optimizer_state and not config.lora_rank
    save_trained(policy, model, policy_dir, out_dir, manifest, place.ranks, config.max_shard_size,
                 optimizer=optimizer if keep_moments else None, weights=weights)

def _minibatches(n: int, config: GRPOConfig) -> list[list[int]]:
    rng = random.Random(config.seed)
    out = []
    for _ in range(config.epochs):
        order = list(range(n))
        rng.shuffle(order)
        out.extend(order[i : i + config.minibatch_size] for i in range(0, n, config.minibatch_size))
    return out


def _final_kl(policy, samples: list[TrainSample], forward: Forward,
              rollout_logprobs: list[list[float]] | None) -> float:
    """KL between the policy that sampled and `policy` (the step's result) on the trained tokens
    of `samples`, against the log-probs the ratio used (the engine's, or with truncated IS the
    trainer's own at the sampling weights)."""
    if not samples:
        return 0.0
    policy.eval()
    final = forward.logprobs(policy, samples)
    base = rollout_logprobs or [s.behaviour_logprobs for s in samples]
    mask = _flat(s.loss_mask or [1] * len(s.response_ids) for s in samples).float()
    return approx_kl(_flat(final), _flat(base), mask)


def _flat(rows: Iterable[list]) -> torch.Tensor:
    return torch.tensor([value for row in rows for value in row])


STEP_SUMS = ("loss", "clip_fraction", "approx_kl", "kl_to_reference", "mean_ratio", "entropy", "stat_tokens", "tokens",
             "tis_weight")


def _step(policy, optimizer, samples, advantages, rows, forward: Forward, config: GRPOConfig,
          rollout_logprobs: list[list[float]] | None, reference_logprobs: list[list[float]] | None,
          ) -> dict[str, float]:
    """One optimizer step on the samples `rows` (this rank runs its share of their micro-batches);
    returns token-weighted sums of the stats over all ranks."""
    per_token = config.loss_aggregation == "token"
    denominator = max(sum(samples[i].trained_tokens if per_token else 1 for i in rows), 1)
    active = [i for i in rows if not (config.skip_zero_advantage and advantages[i] == 0)]

    def loss(micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        value, stats, entropy, weights = _micro_loss(policy, samples, advantages, micro, forward, config,
                                                     rollout_logprobs, reference_logprobs)
        # The micro-batch mean as its share of the minibatch mean (over tokens, or samples).
        share_of_mean = (stats["tokens"] if per_token else stats["sequences"]) / denominator * micro.counted
        if not micro.counted:
            return value * share_of_mean, {}
        return value * share_of_mean, {
            "loss": value.detach().item() * share_of_mean,
            **{key: stats[key] * stats["tokens"] for key in ("clip_fraction", "approx_kl", "kl_to_reference",
                                                             "mean_ratio")},
            "entropy": float((entropy * micro.batch.mask).sum()), "stat_tokens": stats["tokens"],
            "tokens": micro.batch.tokens, "tis_weight": float(weights.sum()) if weights is not None else 0.0}

    return take_step(policy, optimizer, forward.share(samples, active), loss, dict.fromkeys(STEP_SUMS, 0.0),
                     config.max_grad_norm, forward.ranks)


def _micro_loss(policy, samples, advantages, micro: MicroBatch, forward: Forward, config: GRPOConfig,
                rollout_logprobs, reference_logprobs):
    batch = micro.batch
    device = next(policy.parameters()).device
    behaviour = _per_token(batch, [samples[i].behaviour_logprobs for i in micro.rows])
    ratio_base = behaviour if rollout_logprobs is None else _per_token(batch, [rollout_logprobs[i] for i in micro.rows])
    reference = None if reference_logprobs is None else _per_token(batch, [reference_logprobs[i] for i in micro.rows])
    weights = None
    if rollout_logprobs is not None:
        weights = truncated_is_weights(ratio_base, behaviour, batch.mask, config.tis_cap)
    logprobs, entropy = policy(batch, forward.temperature)
    loss, stats = clipped_policy_loss(logprobs, ratio_base.to(device), advantages[micro.rows].to(device),
                                      batch.mask.to(device), config.clip_eps, config.clip_eps_high,
                                      config.loss_aggregation, _to(weights, device), _to(reference, device),
                                      config.kl_coef, config.kl_estimator)
    return loss, stats, entropy.cpu(), weights


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def _per_token(batch, values: list[list[float]]) -> torch.Tensor:
    """Per-sample lists of response-token values, laid out like the batch's targets."""
    out = torch.zeros_like(batch.mask)
    for row, row_values in enumerate(values):
        out[row, batch.response_slices[row]] = torch.tensor(row_values)
    return out


def _step_stats(sums: dict[str, float], lr: float, measures_reference: bool) -> dict[str, float | None]:
    tokens = max(sums["stat_tokens"], 1.0)
    return {"loss": sums["loss"], "clip_fraction": sums["clip_fraction"] / tokens,
            "approx_kl": sums["approx_kl"] / tokens,
            "kl_to_reference": sums["kl_to_reference"] / tokens if measures_reference else None,
            "entropy": sums["entropy"] / tokens, "grad_norm": sums["grad_norm"], "lr": lr,
            "tokens": sums["tokens"]}


def _metrics(samples: list[TrainSample], batch: list[TrainSample], advantages: torch.Tensor,
             done: StepProgress, seconds: float, config: GRPOConfig) -> dict:
    totals, steps = done.totals, done.steps
    stat_tokens = max(totals.get("stat_tokens", 0.0), 1.0)
    stepped = [s for s in steps if s["tokens"]]  # an all-zero-advantage minibatch takes no step

    def per_token(key: str) -> float | None:  # null where no token was trained: nothing was measured
        return totals[key] / stat_tokens if totals.get("stat_tokens") else None

    return {
        "loss": sum(s["loss"] for s in stepped) / len(stepped) if stepped else None,
        "clip_fraction": per_token("clip_fraction"),
        "mean_step_kl": per_token("approx_kl"),
        # Without a KL penalty no reference is loaded: nothing was measured, so null rather than 0.
        "kl_to_reference": per_token("kl_to_reference") if config.kl_coef else None,
        "entropy": per_token("entropy"),
        "mean_ratio": per_token("mean_ratio") or 1.0,
        "tis_weight_mean": totals.get("tis_weight", 0.0) / stat_tokens if config.tis_cap else 1.0,
        "grad_norm": sum(s["grad_norm"] for s in stepped) / len(stepped) if stepped else None,
        "grad_norm_max": max((s["grad_norm"] for s in stepped), default=None),
        "lr": steps[-1]["lr"] if steps else config.lr,
        "optimizer_steps": int(totals.get("optimizer_steps", 0.0)),
        "samples": len(samples),
        "samples_trained": len(batch),
        "trained_tokens": sum(s.trained_tokens for s in batch),  # sampled tokens of the samples trained on
        "tokens": int(totals.get("tokens", 0.0)),  # positions through the decoder (padded; a shared prefix once)
        "seconds": seconds,
        "tokens_per_s": totals.get("tokens", 0.0) / max(seconds, 1e-9),
        "mean_advantage": float(advantages.mean()) if len(batch) else 0.0,
        "mean_abs_advantage": float(advantages.abs().mean()) if len(batch) else 0.0,
        "frac_zero_advantage": float((advantages == 0).float().mean()) if len(batch) else 1.0,
        "steps": steps,
    }
