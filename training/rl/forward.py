"""How a training step's samples go through the policy.

Micro-batches are sized by tokens (padded rows x longest row, `micro_batch_tokens`), formed the
same way on every rank from the same samples, and dealt out across ranks (training/optim/distributed.py);
a rank with fewer than the others pads its share with zero-weight passes. With `share_prefixes`,
a micro-batch holds the samples of one prompt only (a group's), whose common prefix the decoder
runs once (training/policy/batching.py). Log-probs are
teacher-forced at the sampling temperature through the policy's `TokenScorer`
(training/optim/scorer.py), in chunks and in the step's precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.optim.distributed import Ranks, all_gather, deal, reshard
from training.policy.batching import TokenBatch, make_batch, micro_batches_by_tokens
from training.rl.sample import TrainSample


@dataclass(frozen=True)
class MicroBatch:
    rows: list[int]  # indices into the step's samples
    batch: TokenBatch
    counted: bool = True  # False: a padding pass that keeps the ranks in step; its loss weighs 0


@dataclass(frozen=True)
class Forward:
    pad_id: int
    micro_batch_tokens: int
    temperature: float
    ranks: Ranks = Ranks()
    share_prefixes: bool = False

    def micro_batches(self, samples: list[TrainSample], rows: list[int]) -> list[MicroBatch]:
        """`rows` of `samples` in micro-batches of similar lengths, each with its tensors (all of
        them, the same on every rank)."""
        return [self._tensors(samples, micro) for micro in self._groups(samples, rows)]

    def share(self, samples: list[TrainSample], rows: list[int]) -> list[MicroBatch]:
        """This rank's micro-batches of `rows` (only theirs are built); every rank gets as many
        (padding passes repeat the first micro-batch, uncounted)."""
        groups = self._groups(samples, rows)
        if not groups:
            return []
        return [self._tensors(samples, micro) if micro else self._tensors(samples, groups[0], counted=False)
                for micro in deal(groups, self.ranks)]

    def _groups(self, samples: list[TrainSample], rows: list[int]) -> list[list[int]]:
        if not self.share_prefixes:
            return self._by_tokens(samples, rows)
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i in rows:
            by_prompt.setdefault(tuple(samples[i].prompt_ids), []).append(i)
        # A prompt's only sample shares nothing with itself: such samples are packed together as before.
        alone = [same[0] for same in by_prompt.values() if len(same) == 1]
        return [micro for same in by_prompt.values() if len(same) > 1 for micro in self._by_tokens(samples, same)
                ] + self._by_tokens(samples, alone)

    def _by_tokens(self, samples: list[TrainSample], rows: list[int]) -> list[list[int]]:
        lengths = [len(samples[i].prompt_ids) + len(samples[i].response_ids) - 1 for i in rows]
        return [[rows[k] for k in group] for group in micro_batches_by_tokens(lengths, self.micro_batch_tokens)]

    def _tensors(self, samples: list[TrainSample], micro: list[int], counted: bool = True) -> MicroBatch:
        """The micro-batch's tensors; observation tokens (loss mask 0) are taken out of its mask."""
        batch = make_batch([samples[i].prompt_ids for i in micro], [samples[i].response_ids for i in micro],
                           self.pad_id, share_prefix=self.share_prefixes)
        for row, i in enumerate(micro):
            if samples[i].loss_mask is not None:  # observations are context, never trained on
                span = batch.response_slices[row]
                batch.mask[row, span] *= torch.tensor(samples[i].loss_mask, dtype=batch.mask.dtype)
        return MicroBatch(micro, batch, counted)

    def logprobs(self, scorer: torch.nn.Module, samples: list[TrainSample]) -> list[list[float]]:
        """The log-prob of every response token of each sample, without gradients, gathered from
        all ranks: the trainer's own at the weights that sampled them (truncated IS), the frozen
        reference's (KL penalty), or the trained policy's (final KL)."""
        mine: dict[int, list[float]] = {}
        with torch.no_grad():
            for micro in self.share(samples, list(range(len(samples)))):
                values = scorer(micro.batch, self.temperature)[0].cpu()
                if micro.counted:
                    mine |= {i: values[row, micro.batch.response_slices[row]].tolist()
                             for row, i in enumerate(micro.rows)}
        reshard(scorer)
        gathered = {i: values for part in all_gather(mine) for i, values in part.items()}
        return [gathered[i] for i in range(len(samples))]
