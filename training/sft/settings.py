"""The warm-up's settings, importable without torch; where and in what pieces it runs is
training/optim/settings.py (the experiment's `grpo` section gives them, so the warm-up runs
where the RL step does)."""

from __future__ import annotations

from pydantic import Field

from training.optim.settings import OptimizerSettings


class SFTConfig(OptimizerSettings):
    """The warm-up's settings; where and in what pieces it runs: training/optim/settings.py (the
    experiment's `grpo` section gives them, so the warm-up runs where the RL step does)."""

    steps: int = Field(200, ge=1, description="optimizer steps: 200 is 3.2k examples (~4 epochs of compose's "
                       "train split), ~80 s on 2 cores")
    lr: float = Field(3e-3, gt=0, description="peak learning rate; a small (3M) from-scratch model is stable at "
                      "a high peak with warm-up and cosine decay")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor, as a share of lr")
    warmup_steps: int = Field(30, ge=0, description="steps of linear warm-up")
    batch_size: int = Field(16, ge=1, description="examples per optimizer step")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    betas: tuple[float, float] = (0.9, 0.95)
    max_len: int = Field(1024, ge=2, description="examples longer than this (prompt + response) are skipped")
    micro_batch_tokens: int = Field(16384, ge=1, description="tokens per forward pass, padded: a default batch (16 "
                                    "examples of at most max_len) is one pass; lower it where memory is short (the "
                                    "loss is unchanged, to float rounding)")
    save_progress_every: int = Field(50, ge=1, description="optimizer steps between resumable progress saves")
    group_by_length: bool = Field(True, description="batch similar lengths together: less padding")
    share_prefixes: bool = Field(True, description="run the prefix every example of a batch starts with (the chat "
                                 "template's header and system message) once per batch: the same loss and gradients "
                                 "on fewer tokens (25% fewer on repair's demonstrations); not for a model whose cached "
                                 "forward differs")
    prompt_loss_weight: float = Field(0.0, ge=0, description="0: prompt targets masked; more also models the prompt")
    seed: int = 0
