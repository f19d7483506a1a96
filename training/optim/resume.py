"""Resumable training steps: progress saved between optimizer steps, picked up after a crash.

A step that dies part-way (a killed process, a lost node) leaves `.<checkpoint>.progress.pt`
beside the checkpoint it was writing: the weights, optimizer and schedule after the last
completed optimizer step, with the statistics so far. Run again on the same inputs, it goes on
from there and ends with the same checkpoint as an uninterrupted run. The file is keyed by a
fingerprint of the inputs (parent checkpoint, samples, settings), so a changed input starts over.
It holds full (unsharded) states, so a step may resume on another number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class StepProgress:
    done: int = 0  # optimizer steps completed
    totals: dict[str, float] = field(default_factory=dict)
    steps: list[dict[str, float]] = field(default_factory=list)  # per-step statistics

    def record(self, sums: dict[str, float], stats: dict[str, float]) -> None:
        """One more optimizer step done: its sums add to the totals, its statistics to the list."""
        self.done += 1
        self.steps.append(stats)
        for key, value in sums.items():
            self.totals[key] = self.totals.get(key, 0.0) + value


def fingerprint(*parts: object) -> str:
    """sha256 over the JSON of `parts` (ids, rewards, settings, hashes)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()


class ProgressFile:
    def __init__(self, out_dir: str | Path, key: str) -> None:
        out = Path(out_dir).resolve()
        self.path = out.parent / f".{out.name}.progress.pt"
        self.key = key

    def load(self) -> dict | None:
        """The saved state (`model`, `optimizer`, `schedule`, `progress`), or None if none matches."""
        if not self.path.is_file():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
        if state.get("key") != self.key:
            return None  # another step's leftovers: its inputs differ (the writer clears them)
        return {**state, "progress": StepProgress(**state["progress"])}

    def save(self, model_state: dict, optimizer_state: dict, schedule_state: dict, progress: StepProgress) -> None:
        """Full (unsharded) states, written by one rank."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save({"key": self.key, "model": model_state, "optimizer": optimizer_state, "schedule": schedule_state,
                    "progress": {"done": progress.done, "totals": progress.totals, "steps": progress.steps}}, tmp)
        os.replace(tmp, self.path)  # a crash while saving keeps the previous progress

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
