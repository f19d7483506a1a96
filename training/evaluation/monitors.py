"""Monitors: are an iteration's samples fit to train on, and is the policy after the training
step safe to sample from?

Before the step, the samples' reward analytics (`judge_samples`):
- errors (the training step does not run): infrastructure errors above `max_infra_error_rate`
  (the graded batch is a biased remainder, and the sandbox needs attention); environment errors
  above `max_env_error_rate` (the tasks' environments lack what their tests need); tampered
  submissions above `max_tamper_rate` (the policy is learning to game the grader);
- warnings: truncated responses above `max_truncation_rate`; zero-variance groups above
  `max_zero_variance_fraction` (little learning signal: the tasks are too easy or too hard).

After the step (`judge`):
Each iteration records its health signals (KL, entropy, clip fraction, sampled tokens, share of
zero-variance groups, gradient norm, reward mean and spread, tamper rate). Judged against the
experiment's thresholds and the earlier iterations:
- errors (the next iteration refuses to start): non-finite loss, gradients or weights; a step
  that moved the policy further than `max_step_kl` from the one that sampled its data;
- warnings: entropy collapsing below `min_entropy_ratio` of the first iteration's; a tamper
  rate rising more than `max_tamper_rise` above the previous iteration's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TRAINER_SIGNALS = ("loss", "final_kl", "mean_step_kl", "kl_to_reference", "entropy", "clip_fraction", "grad_norm",
                   "grad_norm_max")
SAMPLE_SIGNALS = ("sampled_tokens", "zero_variance_fraction", "reward_mean", "reward_std", "tamper_rate")  # metrics.py


class MonitorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_step_kl: float = Field(0.5, gt=0, description="KL per trained token between the policy that sampled and "
                               "the one the training step saved (measured after its last optimizer step); above "
                               "it the step diverged (blocks the next iteration)")
    min_entropy_ratio: float = Field(0.3, ge=0, le=1, description="warn when mean token entropy falls below "
                                     "this share of the first iteration's (entropy collapse)")
    max_tamper_rise: float = Field(0.02, ge=0, description="warn when the share of tampered submissions rises "
                                   "by more than this over the previous iteration")
    max_infra_error_rate: float = Field(0.2, ge=0, le=1, description="share of samples whose grading hit an "
                                        "infrastructure error; above it the training step does not run")
    max_env_error_rate: float = Field(0.2, ge=0, le=1, description="share of samples whose task environment "
                                      "could not run the tests (a module or program missing); above it the "
                                      "training step does not run")
    max_tamper_rate: float = Field(0.1, ge=0, le=1, description="share of samples with a tamper flag; above it "
                                   "the training step does not run")
    max_truncation_rate: float = Field(0.5, ge=0, le=1, description="warn when more of the responses than this "
                                       "hit the token limit")
    max_zero_variance_fraction: float = Field(0.9, ge=0, le=1, description="warn when more of the groups than "
                                              "this have equal rewards (no learning signal)")


@dataclass(frozen=True)
class Verdict:
    check: str
    severity: Literal["error", "warn"]
    passed: bool
    message: str


def weights_are_finite(checkpoint_dir: str | Path) -> bool:
    import torch  # only the step's judge needs it; the code location loads this module without it
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(Path(checkpoint_dir) / "model.safetensors").values())


def judge(signals: dict[str, float | None], history: list[dict[str, float]], finite_weights: bool,
          config: MonitorConfig = MonitorConfig()) -> list[Verdict]:
    """Verdicts on this iteration's `signals`, given the earlier iterations' (oldest first); a
    step that took no optimizer step has none (training/iteration/training_step.py skips it)."""
    numbers = ("loss", "grad_norm_max", "final_kl")
    bad = [name for name in numbers if not math.isfinite(signals[name])] + ([] if finite_weights else ["weights"])
    verdicts = [Verdict("training_finite", "error", not bad,
                        f"not finite: {', '.join(bad)}" if bad else "loss, gradients and weights are finite")]
    kl = signals["final_kl"]
    verdicts.append(Verdict("training_not_diverged", "error", kl <= config.max_step_kl,
                            f"KL of the trained policy to the sampling one {kl:.3g} (limit {config.max_step_kl})"))
    # The first iteration that trained: one without an optimizer step measured no entropy.
    first = next((row["entropy"] for row in history if row["entropy"] is not None), signals["entropy"])
    floor = config.min_entropy_ratio * first
    verdicts.append(Verdict("entropy_not_collapsed", "warn", signals["entropy"] >= floor,
                            f"entropy {signals['entropy']:.3g} nats (first iteration {first:.3g}, floor {floor:.3g})"))
    before = history[-1]["tamper_rate"] if history else 0.0
    rise = signals["tamper_rate"] - before
    verdicts.append(Verdict("tamper_rate_not_rising", "warn", rise <= config.max_tamper_rise,
                            f"tamper rate {signals['tamper_rate']:.3f} (previous {before:.3f})"))
    return verdicts


SAMPLE_CHECKS = {  # check: (the measure it bounds, the MonitorConfig limit, severity)
    "infra_errors_within_limit": ("infra_error_rate", "max_infra_error_rate", "error"),
    "env_errors_within_limit": ("env_error_rate", "max_env_error_rate", "error"),
    "tampering_within_limit": ("tamper_rate", "max_tamper_rate", "error"),
    "truncation_within_limit": ("truncation_rate", "max_truncation_rate", "warn"),
    "learning_signal_present": ("zero_variance_fraction", "max_zero_variance_fraction", "warn"),
}


def judge_samples(stats: dict[str, float], config: MonitorConfig = MonitorConfig()) -> list[Verdict]:
    """Verdicts on one iteration's reward analytics (the `iteration_rewards` view's row)."""
    verdicts = []
    for check, (measure, limit_name, severity) in SAMPLE_CHECKS.items():
        value, limit = stats[measure], getattr(config, limit_name)
        verdicts.append(Verdict(check, severity, value <= limit, f"{measure} {value:.3f} (limit {limit})"))
    return verdicts


def blocking_failures(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.severity == "error" and not v.passed]
