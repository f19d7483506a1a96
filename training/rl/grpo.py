"""GRPO-family math as pure tensor functions (no model, no I/O).

Advantage estimators, over the completions of one prompt (a group). In all of them, groups whose
rewards are all equal, and singleton groups, get exactly 0: they carry no signal.
- group_advantages (GRPO): A_i = (r_i - mean_g) / (std_g + eps), std the unbiased sample std
  as in TRL's GRPOTrainer; with scale_by_std=False, plain centring (Dr. GRPO).
- rloo_advantages (RLOO): A_i = r_i - mean of the group's other rewards = n/(n-1) (r_i - mean_g).
- reinforce_pp_advantages (REINFORCE++ with a group baseline): A_i = r_i - mean_g, then divided
  by the standard deviation of those values over the whole batch (global normalisation).

clipped_policy_loss: PPO's clipped surrogate, aggregated over tokens (DAPO / TRL "token" loss)
or sequences, optionally with a KL penalty towards a frozen reference policy.

truncated_is_weights: the decoupled objective's correction (Hilton et al. 2022, "Batch size-invariance
for policy optimization"; AReaL's staleness-bounded PPO). When the samples' policy (the behaviour:
an engine whose kernels differ, or a checkpoint up to max_staleness steps older) is not the one the
step starts from (the proximal: the trainer's own log-probs at the parent's weights), the ratio is
clipped around the proximal policy, so the trust region is one step's whatever the samples' age, and
each token is weighted by min(pi_proximal / pi_behaviour, cap): plain PPO against a stale behaviour
would clip away every token the policy has since moved by more than eps, and learn nothing from it.

approx_kl: how far a policy moved from the one that sampled, k3 per token: the stability
monitor's measure, after the step, and each optimizer step's statistic, before it.

informative_samples: dynamic sampling's filter (DAPO): a sample counts only if its group's
rewards differ.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

ESTIMATORS = ("grpo", "rloo", "reinforce_pp")
KL_ESTIMATORS = ("k1", "k3")


def advantages(estimator: str, rewards: Tensor, group_ids: Tensor, scale_by_std: bool = True,
               eps: float = 1e-6) -> Tensor:
    """Per-sample advantages by the named estimator (see the module docstring)."""
    if estimator == "grpo":
        return group_advantages(rewards, group_ids, scale_by_std, eps)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_ids)
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards, group_ids, eps)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")


def group_advantages(rewards: Tensor, group_ids: Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Per-sample advantages; `group_ids` are integer labels, any order, any group sizes."""
    stats = _group_stats(rewards, group_ids)
    adv = stats.centred / (stats.std + eps) if scale_by_std else stats.centred
    return _without_degenerate(adv, stats)


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    stats = _group_stats(rewards, group_ids)
    return _without_degenerate(stats.centred * stats.count / (stats.count - 1).clamp(min=1), stats)


def reinforce_pp_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    stats = _group_stats(rewards, group_ids)
    centred = torch.where(stats.degenerate, torch.zeros_like(stats.centred), stats.centred)
    spread = centred.std() if centred.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
    return _without_degenerate(centred / (spread + eps), stats)


def truncated_is_weights(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Per token: min(pi_proximal / pi_behaviour, cap), 0 at padding (see the module docstring)."""
    return torch.exp(proximal_logprobs - behaviour_logprobs).clamp(max=cap) * mask


def informative_samples(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """True for each sample whose group has at least two samples and not all rewards equal."""
    return ~_group_stats(rewards, group_ids).degenerate


def approx_kl(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> float:
    """k3 estimate of KL(behaviour || current) per masked token, from tokens the behaviour policy
    sampled: mean of (r - 1) - log r with r = pi / pi_behaviour (never negative)."""
    keep = mask.bool()
    log_ratio = torch.where(keep, logprobs - behaviour_logprobs.to(logprobs.dtype), 0.0)
    per_token = torch.expm1(log_ratio) - log_ratio
    return float((per_token * mask).sum() / mask.sum().clamp(min=1.0))


def kl_to_reference(logprobs: Tensor, reference_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(current || reference) from the sampled tokens' log-probs.

    k1 = log pi - log pi_ref (unbiased, can be negative); k3 = r - log r - 1 with
    r = pi_ref / pi (unbiased, never negative, lower variance; GRPO's choice).
    """
    log_ratio = reference_logprobs.to(logprobs.dtype) - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")


class _GroupStats(NamedTuple):
    """Per sample: its reward minus its group's mean, and its group's size, std and degeneracy."""

    centred: Tensor
    count: Tensor
    std: Tensor
    degenerate: Tensor


def _group_stats(rewards: Tensor, group_ids: Tensor) -> _GroupStats:
    rewards = rewards.to(torch.float64).flatten()
    _, index = torch.unique(group_ids.flatten(), return_inverse=True)
    groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(rewards))
    mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, rewards) / count
    centred = rewards - mean[index]
    sq = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, centred**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    lo = torch.full((groups,), float("inf"), dtype=torch.float64).scatter_reduce(0, index, rewards, "amin")
    hi = torch.full((groups,), float("-inf"), dtype=torch.float64).scatter_reduce(0, index, rewards, "amax")
    degenerate = (hi == lo) | (count < 2)
    return _GroupStats(centred, count[index], std[index], degenerate[index])


def _without_degenerate(adv: Tensor, stats: _GroupStats) -> Tensor:
    return torch.where(stats.degenerate, torch.zeros_like(adv), adv).to(torch.float32)


def clipped_policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: str = "token",
    token_weights: Tensor | None = None,
    reference_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss.

    logprobs, behaviour_logprobs, mask: [batch, tokens]; advantages: [batch] or [batch, tokens].
    loss_t = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A), ratio_t =
    exp(lp_t - lp_behaviour_t); eps_high defaults to eps_low (DAPO's clip-higher raises it, 0.28).
    aggregation "token" averages over every masked token of the batch (DAPO / TRL "token" loss);
    "sequence" averages each sequence over its tokens, then the sequences (GRPO's original).
    token_weights (detached, [batch, tokens]) multiply each token's loss: the truncated
    importance-sampling correction, where behaviour_logprobs are the trainer's own at rollout time.
    reference_logprobs with kl_coef > 0 add kl_coef * KL(current || reference) per token
    (kl_to_reference), aggregated like the surrogate.
    stats: clip_fraction (tokens where the clipped branch is active: ratio > 1+eps_high with
    A > 0, or ratio < 1-eps_low with A < 0), mean_ratio, approx_kl (k3 estimator of
    KL(behaviour || current)), kl_to_reference (the penalty's estimate, 0 without a reference),
    tokens, and sequences (those with at least one masked token).
    """
    if aggregation not in ("token", "sequence"):
        raise ValueError(f"unknown loss aggregation {aggregation!r}; choose token or sequence")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    keep = mask.bool()
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    # Padding positions get ratio 1 so that inf/nan there can never leak into the sums.
    log_ratio = torch.where(keep, logprobs - behaviour_logprobs.to(logprobs.dtype), 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if token_weights is not None:
        per_token = per_token * token_weights.to(per_token.dtype)
    kl = torch.zeros_like(per_token)
    if reference_logprobs is not None:
        kl = torch.where(keep, kl_to_reference(logprobs, reference_logprobs, kl_estimator), 0.0)
        per_token = per_token + kl_coef * kl
    tokens = mask.sum().clamp(min=1.0)
    per_sequence_tokens = mask.sum(dim=-1)
    sequences = (per_sequence_tokens > 0).sum().clamp(min=1)
    if aggregation == "token":
        loss = (per_token * mask).sum() / tokens
    else:
        loss = ((per_token * mask).sum(dim=-1) / per_sequence_tokens.clamp(min=1.0)).sum() / sequences
    with torch.no_grad():
        is_clipped = ((ratio > 1.0 + high) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))
        stats = {
            "clip_fraction": float((is_clipped.to(mask.dtype) * mask).sum() / tokens),
            "mean_ratio": float((ratio * mask).sum() / tokens),
            "approx_kl": approx_kl(logprobs, behaviour_logprobs, mask),
            "kl_to_reference": float((kl * mask).sum() / tokens),
            "tokens": float(mask.sum()),
            "sequences": float((per_sequence_tokens > 0).sum()),
        }
    return loss, stats
