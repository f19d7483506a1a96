"""One training step as a self-contained job: its inputs, named by location, and the statistics
it reports for each optimizer step. Importable without torch: the checkpoint asset builds the job
and reads its reports; `python -m assets.train_process` runs it (training/rl/step.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from training.rl.settings import GRPOConfig

STEP_STATS = ("loss", "clip_fraction", "approx_kl", "kl_to_reference", "entropy", "grad_norm", "lr", "tokens")


class TrainJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["grpo"] = "grpo"
    parent_dir: str
    out_dir: str
    storage_root: str  # where the trajectories dataset lives (any fsspec URI)
    trajectory_files: list[str]  # the partition's files, as its manifest named them when the step began
    grpo: GRPOConfig
    temperature: float  # the samples were drawn at it; the trainer's log-probs are taken at it too
    reference_dir: str | None = None  # the frozen policy of the KL penalty
    lineage: dict = {}
