"""A training sample: one scored completion as the trainer sees it."""

from __future__ import annotations

from dataclasses import dataclass


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
    sample_index: int | None = None  # its place in the group, where it came from a trajectories row

    @property
    def trained_tokens(self) -> int:
        return len(self.response_ids) if self.loss_mask is None else sum(self.loss_mask)
