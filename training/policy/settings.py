"""The policy's settings, importable without torch or transformers: the built-in model's
architecture, the dtypes training holds and computes in, and the log-prob head's chunk size."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The trainer holds weights (and optimizer state) in TRAINING_DTYPE whatever dtype a checkpoint
# stores, and computes in it on the CPU; on a GPU it computes in GPU_COMPUTE_DTYPE (autocast).
# vLLM, which samples on the GPU, computes in that dtype too, so that behaviour and trainer
# log-probs agree as closely as two sets of kernels can (`tis_cap` corrects what remains).
TRAINING_DTYPE = "float32"
GPU_COMPUTE_DTYPE = "bfloat16"

# Rows per LM-head call: 512 x 152k (Qwen's vocabulary) x 4 bytes is 0.3 GB of logits.
DEFAULT_CHUNK_TOKENS = 512


class PolicyConfig(BaseModel):
    """The built-in model's architecture (a small Llama)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden_size: int = Field(256, ge=8, description="3.43M parameters in total at the default")
    num_layers: int = Field(4, ge=1, description="enough depth for induction heads (copying constants from the "
                            "prompt)")
    num_heads: int = Field(4, ge=1, description="attention heads (head_dim 64 at the default)")
    num_kv_heads: int = Field(4, ge=1, description="plain multi-head attention: no GQA at this size")
    intermediate_size: int = Field(688, ge=8, description="~8/3 of hidden, rounded to a multiple of 16 "
                                   "(Llama's SwiGLU ratio)")
    vocab_size: int = Field(1024, ge=1, description="covers the BPE vocabulary (training/policy/tokenizer.py); a "
                            "multiple of 64")
    max_position_embeddings: int = Field(1024, ge=16, description="prompt + response budget")
    rope_theta: float = Field(10000.0, gt=0)
    tie_word_embeddings: bool = Field(True, description="saves 262k parameters (1024 x 256); vLLM handles tied "
                                      "Llama heads")
    initializer_range: float = Field(0.02, gt=0)
    seed: int = Field(0, description="weights are a pure function of (config, seed)")
