"""The optimizer loop every training in Crucible runs (the warm-up's and the RL step's).

AdamW under a learning-rate schedule; each optimizer step is a few forward and backward passes
(micro-batches) whose gradients sum into one update, averaged across ranks on the last pass,
then clipped. The progress is saved every few steps (resume.py), so that a loop run again after
a crash goes on where it stopped and ends where an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from training.optim.distributed import (
    Ranks,
    all_sum,
    barrier,
    full_model_state,
    full_optimizer_state,
    gradient_sync,
    load_full_state,
)
from training.optim.resume import ProgressFile, StepProgress

Pass = TypeVar("Pass")
Step = TypeVar("Step")
ProgressFn = Callable[[int, int, dict], None]  # (optimizer step, total steps, that step's statistics)
# A pass's objective (its share of the step's loss, 0 for a padding pass) and its statistics.
PassLoss = Callable[[Pass], tuple[torch.Tensor, dict[str, float]]]


def adamw(policy: torch.nn.Module, lr: float, betas: tuple[float, float], weight_decay: float,
          lr_factor: Callable[[int], float], saved: dict | None = None):
    """(optimizer, schedule) over the policy's trainable parameters; `saved`, an optimizer state
    of an earlier loop (its moments carry on; this loop's rate, betas and decay win)."""
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, betas=betas,
                                  weight_decay=weight_decay)
    for group in optimizer.param_groups:  # as a schedule left the saved state: the same keys load into it
        group["initial_lr"] = lr
    if saved is not None:
        if any(isinstance(key, int) for key in saved["state"]):  # by position: written before steps were sharded
            optimizer.load_state_dict(saved)
        else:
            load_full_state(policy, optimizer, None, saved)
    for group in optimizer.param_groups:
        group.update(lr=lr, initial_lr=lr, betas=betas, weight_decay=weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


def take_step(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, passes: Sequence[Pass],
              loss: PassLoss, sums: dict[str, float], max_grad_norm: float, ranks: Ranks) -> dict[str, float]:
    """One optimizer step over this rank's `passes` (every rank runs as many): each pass's
    objective is backpropagated, gradients summing locally and averaged across ranks on the last
    pass. `sums` (every statistic's key, at 0) gathers the passes' statistics, summed over ranks.
    With no pass at all (nothing to train on) no step is taken."""
    optimizer.zero_grad(set_to_none=True)
    for k, item in enumerate(passes):
        with gradient_sync(policy, enabled=k == len(passes) - 1):
            objective, stats = loss(item)
            # Times the ranks, whose gradients DDP and FSDP average rather than add.
            (objective * ranks.world_size).backward()
        for key, value in stats.items():
            sums[key] += value
    sums = all_sum(sums)
    if not passes:
        return {**sums, "optimizer_steps": 0.0, "grad_norm": 0.0}
    norm = torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    return {**sums, "optimizer_steps": 1.0, "grad_norm": float(norm.full_tensor() if hasattr(norm, "full_tensor")
                                                                else norm)}  # FSDP2: a DTensor


@dataclass
class Loop:
    policy: torch.nn.Module  # what trains: the scorer, wrapped for the process group
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    ranks: Ranks
    progress: ProgressFile
    save_every: int

    def run(self, steps: Sequence[Step], step: Callable[[Step, float], tuple[dict, dict]],
            report: ProgressFn | None = None) -> StepProgress:
        """`step(item, lr)` for each of `steps` not yet done, which takes one optimizer step and
        returns (sums to total, that step's statistics); the schedule advances after each."""
        done = self._resumed()
        for item in steps[done.done:]:
            sums, stats = step(item, self.optimizer.param_groups[0]["lr"])
            self.schedule.step()
            done.record(sums, stats)
            if done.done % self.save_every == 0 and done.done < len(steps):
                self._save(done)
            if report is not None and self.ranks.writes:
                report(done.done, len(steps), done.steps[-1])
        return done

    def finish(self) -> None:
        """The result is saved: the progress file goes."""
        if self.ranks.writes:
            self.progress.clear()
        barrier()

    def _resumed(self) -> StepProgress:
        state = self.progress.load()
        if state is None:
            return StepProgress()
        load_full_state(self.policy, self.optimizer, state["model"], state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        return state["progress"]

    def _save(self, done: StepProgress) -> None:
        model_state, optimizer_state = full_model_state(self.policy), full_optimizer_state(self.policy, self.optimizer)
        if self.ranks.writes:
            self.progress.save(model_state, optimizer_state, self.schedule.state_dict(), done)
        barrier()
