"""The RL step's settings (one experiment's `grpo` section), importable without torch: what
it learns and how fast; where and in what pieces it runs is training/optim/settings.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from training.optim.schedule import Schedule
from training.optim.settings import OptimizerSettings


class GRPOConfig(OptimizerSettings):
    """The trainer's settings (one experiment's `grpo` section); where and in what pieces it runs:
    training/optim/settings.py."""

    # The defaults suit the built-in 3.4M model: lr 2e-4 with 8 warm-up steps, minibatches of 128
    # and 4 epochs; a higher rate drifts or collapses, a lower one or smaller minibatches barely
    # move it (the comparison: docs/benchmarks.md, "Measurements behind the defaults"). Adam
    # moves every weight by ~lr per step whatever the gradient, so fresh moments want the warm-up,
    # and large minibatches give each of those steps a direction worth taking. Models of 1B+
    # parameters want 1e-6..1e-5.
    lr: float = Field(2e-4, gt=0, description="peak learning rate (AdamW)")
    lr_schedule: Schedule = Field("constant", description="constant, linear or cosine decay over lr_decay_steps")
    lr_warmup_steps: int = Field(8, ge=0, description="optimizer steps of linear warm-up, counted over the experiment")
    lr_decay_steps: int | None = Field(None, ge=1, description="optimizer steps (over the experiment) at which a "
                                       "linear or cosine schedule reaches min_lr_ratio")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="floor of a decaying schedule, as a share of lr")
    epochs: int = Field(4, ge=1, description="passes over the samples (PPO epochs); the clipped ratio keeps later "
                        "passes near the policy that sampled them")
    minibatch_size: int = Field(128, ge=1, description="samples per optimizer step (16 groups of 8)")
    share_prefixes: bool = Field(True, description="run the common prefix of a prompt's samples (the prompt, and the "
                                 "turns its episodes share) through the model once per micro-batch: the same loss "
                                 "and gradients on fewer tokens (36% fewer on repair's episodes); not under "
                                 "gradient checkpointing or FSDP, nor for a model whose cached forward differs")
    estimator: Literal["grpo", "rloo", "reinforce_pp"] = Field("grpo", description="advantage estimator "
                                                               "(training/rl/grpo.py)")
    scale_by_std: bool = Field(True, description="GRPO's std normalisation; False: Dr. GRPO's centring only")
    zero_variance_groups: Literal["drop", "keep"] = Field(
        "drop", description="drop: groups whose rewards are all equal leave the batch (DAPO); keep: they stay, "
        "with zero advantage, in the loss denominator")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip range (the low side when clip_eps_high is set)")
    clip_eps_high: float | None = Field(None, gt=0, description="None: symmetric; DAPO's clip-higher uses 0.28")
    loss_aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: every trained token weighs the same; sequence: every sample does")
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling: when the engine's log-probs differ from the "
        "trainer's at the same weights (vLLM kernels, bf16), the ratio is taken against the trainer's own "
        "log-probs at rollout time and each token weighted by min(pi_trainer / pi_engine, cap); None: off")
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL penalty to the frozen reference (the base "
                           "policy); 0: no penalty, and no reference model is loaded")
    kl_estimator: Literal["k1", "k3"] = Field("k3", description="per-token KL estimator (training/rl/grpo.py)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    weight_decay: float = Field(0.0, ge=0, description="no pull towards zero during RL")
    betas: tuple[float, float] = (0.9, 0.99)
    keep_optimizer_state: bool = Field(True, description="carry AdamW moments across iterations (optimizer.pt); "
                                       "not with LoRA, whose adapters start afresh each step")
    lora_rank: int | None = Field(None, ge=1, description="train LoRA adapters of this rank (peft) instead of "
                                  "every weight; merged into the saved checkpoint")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / rank)")
    lora_target_modules: tuple[str, ...] = Field(("q_proj", "k_proj", "v_proj", "o_proj"),
                                                 description="modules that get adapters")
    skip_zero_advantage: bool = Field(True, description="exact: such samples have zero gradient")
    seed: int = Field(0, description="minibatch shuffling")

    @model_validator(mode="before")
    @classmethod
    def _micro_batches_are_sized_in_tokens(cls, settings: object) -> object:
        """Settings stored before micro-batches were sized in tokens name `micro_batch_size`, a
        number of samples: it only split the work, never changed the loss, so it is dropped."""
        if isinstance(settings, dict) and "micro_batch_size" in settings:
            return {key: value for key, value in settings.items() if key != "micro_batch_size"}
        return settings

    @model_validator(mode="after")
    def _decay_needs_a_horizon(self) -> GRPOConfig:
        if self.lr_schedule != "constant" and self.lr_decay_steps is None:
            raise ValueError(f"lr_schedule {self.lr_schedule!r} needs lr_decay_steps (where the decay ends)")
        return self

    @model_validator(mode="after")
    def _lora_is_data_parallel(self) -> GRPOConfig:
        if self.lora_rank and self.parallel == "fsdp":
            raise ValueError("lora_rank trains adapters small enough for every rank to hold: use parallel 'ddp'")
        return self
