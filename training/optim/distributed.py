"""Data parallel training under torchrun, on torch.distributed's own engines.

`torchrun --nproc-per-node N -m assets.train_process` starts N ranks; `process_group()` joins
them (gloo on CPU, nccl for CUDA tensors). Every rank holds the same samples and forms the
same micro-batches; `deal` gives each rank its share, padded with zero-weight passes so that
every rank runs the same number of forward and backward passes (DDP and FSDP both need that).
Gradients are averaged by DistributedDataParallel or FSDP2's `fully_shard` (setting `parallel`);
full state dicts for saving come from torch.distributed.checkpoint's state-dict API, on rank 0.
Without torchrun (one process, no process group) every helper here is the identity.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from training.optim.settings import DeviceSetting, Parallel

T = TypeVar("T")
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def writes(self) -> bool:
        """Rank 0 writes checkpoints and reports; the others only compute."""
        return self.rank == 0


def current_ranks() -> Ranks:
    """The ranks of the joined process group (torchrun's environment), or a single process."""
    if not dist.is_initialized():
        return Ranks()
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)),
                 int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())))


@contextmanager
def process_group() -> Iterator[Ranks]:
    """Join torchrun's process group for the duration (a no-op outside torchrun)."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        yield Ranks()
        return
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield current_ranks()
    finally:
        dist.destroy_process_group()


def training_device(setting: DeviceSetting, ranks: Ranks) -> torch.device:
    """`auto`: this rank's GPU when CUDA is present, else the CPU."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    torch.cuda.set_device(ranks.local_rank)
    return torch.device("cuda", ranks.local_rank)


def parallelize(module: torch.nn.Module, parallel: Parallel, device: torch.device,
                layer_classes: Sequence[str]) -> torch.nn.Module:
    """Wrap `module` for data parallel training across the process group (unchanged in one
    process). FSDP2 shards every decoder layer (the classes in `layer_classes`, Hugging Face's
    `_no_split_modules`) and the rest as the root group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return module
    if parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # the step's device, not the host's GPU
    for sub in module.modules():
        if type(sub).__name__ in layer_classes:
            fully_shard(sub, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def gradient_sync(module: torch.nn.Module, enabled: bool):
    """A context in which a backward pass accumulates gradients locally (enabled=False) or also
    averages them across ranks. DDP defers to a step's last micro-batch; FSDP2 reduce-scatters
    after every one, since deferring would keep every layer's unsharded gradient until then."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel) and not enabled:
        return module.no_sync()
    return nullcontext()


def reshard(module: torch.nn.Module) -> None:
    """After forward passes without a backward, FSDP2 leaves the root group's parameters gathered
    (unsharded objects in the module): put the shards back, which the optimizer and the
    state-dict API address."""
    if hasattr(module, "reshard"):
        module.reshard()


def deal(items: list[T], ranks: Ranks) -> list[T | None]:
    """This rank's share of `items` (round robin), padded with None to the longest share."""
    per_rank = -(-len(items) // ranks.world_size)
    share: list[T | None] = list(items[ranks.rank :: ranks.world_size])
    return share + [None] * (per_rank - len(share))


def all_sum(values: dict[str, float]) -> dict[str, float]:
    """`values` summed over ranks (keys in the same order everywhere)."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(list(values.values()), dtype=torch.float64)
    dist.all_reduce(tensor)
    return dict(zip(values, tensor.tolist()))


def all_gather(value: T) -> list[T]:
    """Every rank's `value`, in rank order."""
    if not dist.is_initialized():
        return [value]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def broadcast(value: T) -> T:
    """Rank 0's `value`, on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def full_model_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded, on the CPU, on rank 0 (in a process group the other ranks may get {})."""
    return get_model_state_dict(module, options=FULL)


def full_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Keyed by parameter name, so it loads into any wrapping and any number of ranks."""
    return get_optimizer_state_dict(module, optimizer, options=FULL)


def load_full_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    model_state: dict | None, optimizer_state: dict | None) -> None:
    """Load full (unsharded) states, each rank keeping its shard."""
    if model_state is not None:
        set_model_state_dict(module, model_state, options=StateDictOptions(full_state_dict=True))
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(module, optimizer, optimizer_state, options=StateDictOptions(full_state_dict=True))
