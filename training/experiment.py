"""ExperimentConfig: every setting of one experiment's iterations in one typed, documented place.

The base policy it starts from is shared by experiments and configured on its own asset.

Stored as JSON beside the experiment's data, so that an iteration launched later (from the UI or
by the sensor) samples and trains exactly as the earlier ones did.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from training.monitors import MonitorConfig
from training.trainer import GRPOConfig


class ExperimentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    task_set: str = Field("default", description="built-in task set name or a path")
    iterations: int = Field(3, ge=1, description="the sensor stops advancing after this many")
    tasks_per_iteration: int | None = Field(
        64, ge=1, description="train tasks sampled each iteration (seeded); None means all"
    )
    samples_per_task: int = Field(4, ge=2, description="GRPO group size K")
    engine: Literal["transformers", "vllm"] = Field(
        "transformers", description="what samples: transformers on CPU, or vLLM on GPU (pip install -e '.[gpu]')")
    max_new_tokens: int = Field(144, ge=8, description="response budget per sample (per turn in episodes): a "
                                "write action of the default set's reference solutions takes 77 tokens (median), "
                                "138 (95th percentile)")
    max_turns: int = Field(2, ge=1, description="1: single-turn (the reply is the solution); more: multi-turn "
                           "episodes in a sandbox session, ended by a submit or this many turns (2 lets the "
                           "warmed-up default model write its solution, then submit)")
    episode_max_tokens: int = Field(1024, ge=64, description="an episode's whole context budget (prompt, replies, "
                                    "observations); at most the model's max_position_embeddings")
    command_timeout_s: float = Field(10.0, gt=0, description="wall limit of each command an episode runs")
    temperature: float = Field(
        0.6, gt=0,
        description="sampling temperature of rollouts, and the trainer's (they must agree); 0.6 "
        "keeps the warmed-up default model's samples mostly valid Python",
    )
    eval_tasks: int | None = Field(None, ge=1, description="held-out tasks per evaluation; None means all")
    eval_samples: int = Field(1, ge=1, description="answers per held-out task: 1 is greedy; more are sampled at "
                              "`temperature`, and a task's pass rate is the share that passed")
    regrade_fraction: float = Field(
        0.05, ge=0, le=1,
        description="share of each iteration's submissions graded a second time, in fresh sandboxes, "
        "to measure how reproducible the verdicts are (0 turns it off)",
    )
    refill_rounds: int = Field(
        0, ge=0, description="dynamic sampling: while fewer groups than tasks_per_iteration have a reward spread, "
        "sample and grade up to this many extra rounds of fresh train tasks (0: off; the trainer still drops "
        "zero-variance groups unless grpo.zero_variance_groups is 'keep')")
    seed: int = 0
    grpo: GRPOConfig = GRPOConfig()
    monitors: MonitorConfig = MonitorConfig()
