"""How far the trainer's log-probs are from the sampler's, per sample: the gap truncated importance
sampling corrects (training/rl/grpo.py `truncated_is_weights`).

For each sampled token t of a sample (loss mask 1), d_t = log pi_proximal(t) - log pi_behaviour(t),
the proximal being the trainer's own policy at the weights the step starts from, the behaviour
the engine that sampled (a checkpoint up to max_staleness steps older, or the same weights under
other kernels and precision). Per sample: the mean of d (its sign says which side is more
confident), the mean of |d|, and the largest |d| with the token and its position: where the two
disagree most. The `logprob_mismatch` view (datastore/catalog.py) has them with each sample's
staleness.
"""

from __future__ import annotations

from collections.abc import Callable

from training.rl.sample import TrainSample


def logprob_mismatch(samples: list[TrainSample], proximal: list[list[float]],
                     token_text: Callable[[int], str]) -> list[dict]:
    """One row per sample with at least one sampled token (see the module docstring)."""
    rows = []
    for sample, trainer in zip(samples, proximal):
        mask = sample.loss_mask or [1] * len(sample.response_ids)
        gaps = [(position, p - b) for position, (p, b, sampled) in enumerate(zip(trainer, sample.behaviour_logprobs, mask))
                if sampled]
        if not gaps:
            continue
        at, largest = max(gaps, key=lambda gap: abs(gap[1]))
        rows.append({"group_id": sample.group_id, "sample_index": sample.sample_index, "tokens": len(gaps),
                     "mean_diff": sum(d for _, d in gaps) / len(gaps),
                     "mean_abs_diff": sum(abs(d) for _, d in gaps) / len(gaps),
                     "max_abs_diff": abs(largest), "max_at": at, "max_token": token_text(sample.response_ids[at])})
    return rows
