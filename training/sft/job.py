"""The warm-up as a self-contained job: what `python -m assets.train_process` runs for the
base_policy asset, in a process of its own (under `torchrun` on a GPU node as well as beside the
orchestrator), as the RL step does (training/rl/step.py).

The demonstrations are made where the task set and its sandboxes are, and handed over as a
Parquet file of token ids beside the initial policy; the job names both by location.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from training.optim.distributed import current_ranks
from training.optim.loop import ProgressFn
from training.policy.checkpoint import verify_checkpoint
from training.sft.warmup import Example, SFTConfig, supervised_warmup

EXAMPLES = pa.schema([("prompt", pa.list_(pa.int32())), ("response", pa.list_(pa.int32())),
                      ("scored", pa.list_(pa.int8()))])


class WarmupJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["sft"] = "sft"
    initial_dir: str  # the policy before its warm-up
    examples_file: str  # write_examples' Parquet file
    out_dir: str
    sft: SFTConfig


def write_examples(examples: list[Example], path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([e._asdict() for e in examples], schema=EXAMPLES), path)


def read_examples(path: str | Path) -> list[Example]:
    return [Example(**row) for row in pq.read_table(path, schema=EXAMPLES).to_pylist()]


def run_warmup_job(job: WarmupJob, progress: ProgressFn | None = None) -> tuple[dict, dict | None]:
    """Warm up, then verify what was written; returns (metrics, the base policy's manifest),
    the manifest on the writing rank only (None on the others)."""
    metrics = supervised_warmup(job.initial_dir, read_examples(job.examples_file), job.out_dir, job.sft, progress)
    return metrics, verify_checkpoint(job.out_dir) if current_ranks().writes else None
