"""The checkpoint a training loop writes: from rank 0, weights in the parent's dtype (an
imported bf16 model stays bf16), the float32 weights beside them when that rounds them (so
that small updates are not rounded away before the next loop loads them), and the optimizer's
moments when the next loop is to carry them on."""

from __future__ import annotations

from pathlib import Path

import torch

from training.optim.distributed import Ranks, full_model_state, full_optimizer_state
from training.policy.checkpoint import checkpoint_dtype, save_checkpoint
from training.policy.settings import TRAINING_DTYPE

OPTIMIZER_FILE = "optimizer.pt"
MASTER_WEIGHTS_FILE = "master_weights.pt"  # float32 weights, kept when the published ones are bf16 or fp16


def save_trained(policy: torch.nn.Module, model, parent_dir: str | Path, out_dir: str | Path, manifest: dict,
                 ranks: Ranks, max_shard_size: str, optimizer: torch.optim.Optimizer | None = None,
                 weights: dict[str, torch.Tensor] | None = None) -> None:
    """Write `model` (trained as `policy`, its wrapped scorer) to `out_dir` with the parent's
    tokenizer files; `optimizer`'s moments too when given; `weights` instead of the policy's own
    (LoRA adapters merged into a plain model). Every rank calls it: under FSDP the state-dict
    calls are collectives."""
    # An optimizer that never stepped has nothing to keep (asking it for its state would take a zero-lr step).
    optimizer_state = full_optimizer_state(policy, optimizer) if optimizer is not None and optimizer.state else None
    if weights is None:
        weights = {name.removeprefix("model."): value for name, value in full_model_state(policy).items()}
    if not ranks.writes:
        return
    dtype = checkpoint_dtype(parent_dir)
    published = {name: value.to(getattr(torch, dtype)) for name, value in weights.items()}

    def training_state(directory: Path) -> None:
        if optimizer_state is not None:
            torch.save(optimizer_state, directory / OPTIMIZER_FILE)
        if dtype != TRAINING_DTYPE:  # updates below the published dtype's resolution would round away
            torch.save(weights, directory / MASTER_WEIGHTS_FILE)

    master = weights if dtype != TRAINING_DTYPE else None  # saved beside the published weights
    needs = tensor_bytes(published) + tensor_bytes(optimizer_state) + tensor_bytes(master)
    model.eval()
    save_checkpoint(model, parent_dir, out_dir, manifest, extra=training_state, weights=published, dtype=dtype,
                    max_shard_size=max_shard_size, needs=needs)


def tensor_bytes(state: object) -> int:
    """The bytes of the tensors in a (nested) state dict, as saving writes them."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(value) for value in state)
    return 0
