"""The Task contract: one programming problem with hidden tests.

A task file holds plain data (JSONL or YAML); `Task` validates it. The solution the model
writes becomes `solution.py` in the workspace; hidden tests import it and appear only at
grading time.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

Difficulty = Literal["easy", "medium", "hard"]
Split = Literal["train", "eval"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")


class TaskLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float = Field(10.0, gt=0)
    cpu_s: int = Field(10, gt=0)
    memory_mb: int = Field(512, gt=0)
    pids: int = Field(64, gt=0)
    disk_mb: int = Field(64, gt=0)


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-/]+$")
    prompt: str = Field(min_length=1)
    entry_point: str = Field(min_length=1, description="function the tests call")
    reference_solution: str = Field(min_length=1, description="contents of solution.py that passes")
    tests: str = Field(min_length=1, description="hidden test module (test_* functions)")
    files: dict[str, str] = Field(default_factory=dict, description="starting workspace")
    protected_paths: tuple[str, ...] = ()
    entry_command: str = "python3 -I -S /grader/run_tests.py"
    difficulty: Difficulty
    domain: str = "python-functions"
    family: str = Field(min_length=1, description="generator family, for per-family analytics")
    language: Literal["python"] = "python"
    limits: TaskLimits = Field(default_factory=TaskLimits)
    network: bool = False
    image: str = "host"
    split: Split

    @computed_field  # type: ignore[prop-decorator]
    @property
    def version(self) -> str:
        """Content hash: changes whenever anything the model or grader sees changes."""
        body = self.model_dump(exclude={"version"}, mode="json")
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]
