"""The warm-up as a self-contained job: what `python -m assets.train_process` runs for the
base_policy asset (training/sft/warmup.py's run_warmup_job), in a process of its own (under
`torchrun` on a GPU node as well as beside the orchestrator), as the RL step does
(training/rl/job.py). Importable without torch.

The demonstrations are made where the task set and its sandboxes are, and handed over as a
Parquet file of token ids beside the initial policy; the job names both by location.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from training.sft.settings import SFTConfig


class Example(NamedTuple):
    prompt: list[int]
    response: list[int]
    scored: list[int] | None = None  # per response token, 1 where it is learned (an episode's replies); None: all

    @property
    def length(self) -> int:
        """Positions through the decoder (the last token is only a target)."""
        return len(self.prompt) + len(self.response) - 1

    @property
    def learned(self) -> int:
        return len(self.response) if self.scored is None else sum(self.scored)


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
