"""Where a training loop runs: this process's rank, its device and precision, and the policy
loaded and wrapped for them.

The policy is loaded in float32 (its float32 weights where the checkpoint keeps them beside
lower-precision published ones, saving.py) onto the rank's device, and trained as one
`TokenScorer`, which DDP or FSDP2 wraps when torchrun started several ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from training.optim.distributed import Ranks, broadcast, current_ranks, parallelize, training_device
from training.optim.saving import MASTER_WEIGHTS_FILE
from training.optim.scorer import TokenScorer
from training.optim.settings import OptimizerSettings
from training.policy.batching import shares_prefixes_exactly
from training.policy.model import load_policy
from training.policy.settings import GPU_COMPUTE_DTYPE, TRAINING_DTYPE


@dataclass(frozen=True)
class Placement:
    ranks: Ranks
    device: torch.device
    settings: OptimizerSettings

    @classmethod
    def of(cls, settings: OptimizerSettings) -> Placement:
        """This process's place in the joined process group (or alone), with its thread count set."""
        ranks = current_ranks()
        if settings.threads is not None:
            torch.set_num_threads(max(1, settings.threads // ranks.local_world_size))
        return cls(ranks, training_device(settings.device, ranks), settings)

    def load(self, policy_dir: str | Path):
        """(model, tokenizer): the policy in float32 on this rank's device."""
        model, tokenizer = load_policy(policy_dir)
        master = Path(policy_dir) / MASTER_WEIGHTS_FILE
        if master.is_file():
            model.load_state_dict(torch.load(master, map_location="cpu", weights_only=True, mmap=True))
        return model.to(self.device), tokenizer

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 where the loop computes in it (autocast; vLLM's dtype on a GPU), None for plain float32."""
        precision = self.settings.precision
        bf16 = precision == "bfloat16" or (precision == "auto" and self.device.type == "cuda")
        return getattr(torch, GPU_COMPUTE_DTYPE) if bf16 else None

    def scorer(self, model: torch.nn.Module) -> TokenScorer:
        """`model` as a scorer in this loop's precision, unwrapped (for passes without gradients)."""
        return TokenScorer(model, self.settings.logprob_chunk_tokens, self.autocast_dtype)

    def trainable(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` in training mode as the module that trains: its scorer, wrapped for the process group."""
        if self.settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        return parallelize(self.scorer(model), self.settings.parallel, self.device, model._no_split_modules or ())

    def shares_prefixes(self, model: torch.nn.Module, asked: bool) -> bool:
        """Whether to run a batch's common prefix once. Gradient checkpointing drops the cache a
        shared prefix needs, and FSDP2 ranks running a layer twice a micro-batch did not take one
        rank's step (tests/test_data_parallel.py; the cause is not known). Rank 0's probe decides
        for all: ranks that formed their micro-batches differently would wait on each other for ever."""
        usable = asked and not self.settings.gradient_checkpointing and self.settings.parallel != "fsdp"
        return broadcast(usable and shares_prefixes_exactly(model))

    def manifest(self) -> dict:
        """Where the loop ran, as a checkpoint's manifest records it."""
        precision = self.autocast_dtype or getattr(torch, TRAINING_DTYPE)
        return {"world_size": self.ranks.world_size, "device": self.device.type, "parallel": self.settings.parallel,
                "precision": str(precision).removeprefix("torch.")}
