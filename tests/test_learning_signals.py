"""Stability and sample monitors, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from training.evaluation.monitors import (
    MonitorConfig,
    blocking_failures,
    judge,
    judge_samples,
    weights_are_finite,
)

pytestmark = pytest.mark.unit

HEALTHY = {"loss": 0.01, "final_kl": 0.01, "mean_step_kl": 0.005, "kl_to_reference": 0.0, "entropy": 0.8,
           "clip_fraction": 0.02, "grad_norm": 0.5, "grad_norm_max": 0.9, "sampled_tokens": 40.0,
           "zero_variance_fraction": 0.3, "reward_mean": 0.2, "reward_std": 0.3, "tamper_rate": 0.0}


def test_healthy_signals_pass_every_monitor():
    verdicts = judge(HEALTHY, [HEALTHY], finite_weights=True)
    assert [v.check for v in verdicts] == ["training_finite", "training_not_diverged", "entropy_not_collapsed",
                                           "tamper_rate_not_rising"]
    assert all(v.passed for v in verdicts) and not blocking_failures(verdicts)


@pytest.mark.parametrize(("change", "finite", "failed", "severity"), [
    ({"loss": math.nan}, True, "training_finite", "error"),
    ({"grad_norm_max": math.inf}, True, "training_finite", "error"),
    ({}, False, "training_finite", "error"),
    ({"final_kl": 0.9}, True, "training_not_diverged", "error"),
    ({"entropy": 0.2}, True, "entropy_not_collapsed", "warn"),  # below 0.3 of the first iteration's 0.8
    ({"tamper_rate": 0.05}, True, "tamper_rate_not_rising", "warn"),
])
def test_each_monitor_catches_its_failure(change, finite, failed, severity):
    verdicts = judge({**HEALTHY, **change}, [HEALTHY], finite_weights=finite, config=MonitorConfig())
    assert [v.check for v in verdicts if not v.passed] == [failed]
    assert [v.severity for v in verdicts if not v.passed] == [severity]
    assert bool(blocking_failures(verdicts)) == (severity == "error")


HEALTHY_SAMPLES = {"infra_error_rate": 0.0, "env_error_rate": 0.0, "tamper_rate": 0.0, "truncation_rate": 0.1, "zero_variance_fraction": 0.5}


@pytest.mark.parametrize(("change", "failed", "severity"), [
    ({}, None, None),
    ({"infra_error_rate": 0.21}, "infra_errors_within_limit", "error"),
    ({"env_error_rate": 0.21}, "env_errors_within_limit", "error"),
    ({"tamper_rate": 0.11}, "tampering_within_limit", "error"),
    ({"truncation_rate": 0.6}, "truncation_within_limit", "warn"),
    ({"zero_variance_fraction": 0.95}, "learning_signal_present", "warn"),
    ({"infra_error_rate": 0.2, "env_error_rate": 0.2, "tamper_rate": 0.1, "truncation_rate": 0.5, "zero_variance_fraction": 0.9}, None, None),
])
def test_each_sample_monitor_catches_its_failure_at_its_limit(change, failed, severity):
    verdicts = judge_samples({**HEALTHY_SAMPLES, **change})
    assert [(v.check, v.severity) for v in verdicts if not v.passed] == ([(failed, severity)] if failed else [])


def test_entropy_is_judged_against_the_first_iteration_that_trained():
    untrained = {**HEALTHY, **dict.fromkeys(("loss", "final_kl", "mean_step_kl", "entropy", "grad_norm"), None)}
    [collapsed] = [v for v in judge({**HEALTHY, "entropy": 0.2}, [untrained, HEALTHY], finite_weights=True)
                   if v.check == "entropy_not_collapsed"]
    assert not collapsed.passed and "first iteration 0.8" in collapsed.message


def test_weights_with_a_nan_are_caught(tmp_path):
    save_file({"w": torch.ones(3)}, tmp_path / "model.safetensors")
    assert weights_are_finite(tmp_path)
    save_file({"w": torch.tensor([1.0, math.nan])}, tmp_path / "model.safetensors")
    assert not weights_are_finite(tmp_path)
