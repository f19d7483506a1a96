"""The settings every training loop shares: where it runs and in what pieces.

The RL step's `grpo` section and the warm-up's settings extend them with what they learn and
how fast (rate, betas, decay, their own defaults). None of these changes what a step learns,
only where and in what pieces it is computed (float rounding aside): an experiment may change
them after it has run (training/experiment.py's RUN_SETTINGS).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from training.policy.settings import DEFAULT_CHUNK_TOKENS

Precision = Literal["auto", "float32", "bfloat16"]
Parallel = Literal["ddp", "fsdp"]
DeviceSetting = Literal["auto", "cpu", "cuda"]
# The fields below that say where a loop runs: the warm-up takes them from the experiment's `grpo`.
PLACEMENT = ("device", "precision", "parallel", "logprob_chunk_tokens", "gradient_checkpointing", "max_shard_size",
             "threads")


class OptimizerSettings(BaseModel):
    """Where a training loop runs, in what pieces, and how its progress and result are saved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_tokens: int = Field(4096, ge=1, description="tokens per forward pass, padded (rows x longest row; "
                                    "memory only: the loss is unchanged); a longer sample goes alone")
    logprob_chunk_tokens: int = Field(DEFAULT_CHUNK_TOKENS, ge=1, description="positions per LM-head call: the "
                                      "log-prob computation holds a few [chunk, vocabulary] tensors at a time")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer's activations in the "
                                         "backward pass (less memory, ~30% more compute)")
    device: DeviceSetting = Field("auto", description="auto: this rank's GPU when CUDA is present, else the CPU")
    precision: Precision = Field(
        "auto", description="auto: bfloat16 autocast on a GPU, float32 on the CPU; weights, gradients and optimizer "
        "state stay float32 either way, and the log-softmax over the head's logits is float32")
    parallel: Parallel = Field("ddp", description="under torchrun with several ranks: ddp (every rank holds the "
                               "model) or fsdp (FSDP2 fully_shard: parameters, gradients and optimizer state sharded; "
                               "each rank loads the whole model first)")
    max_shard_size: str = Field("5GB", description="largest safetensors file of a saved checkpoint")
    save_progress_every: int = Field(4, ge=1, description="optimizer steps between resumable progress saves (each "
                                     "writes the weights and the optimizer state)")
    threads: int | None = Field(2, ge=1, description="CPU threads of the loop, shared by the ranks of a node: "
                                "training is compute-bound, 2 threads ~1.7x faster than 1 on the 2-core machine")

    def placement(self) -> dict:
        """The settings that say where this loop runs: another loop of the same experiment runs there too."""
        return {name: getattr(self, name) for name in PLACEMENT}
