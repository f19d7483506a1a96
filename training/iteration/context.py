"""What every stage of an iteration is given: where the experiment's data, checkpoints and
sandboxes are (`Environment`), which iteration it is (`IterationRef`), and how a stage says no
(`Refused`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from datastore.store import DatasetStore
from environments.store import EnvironmentStore
from sandbox.base import Session
from sandbox.pool import SandboxPool
from task_sets.schema import Task
from training.experiment import ExperimentConfig

SEED_STRIDE = 100_003  # a prime: experiments' seeds never collide for the first 100k iterations

Log = Callable[[str], None]
Checkpoint = tuple[Path, str]  # a checkpoint's directory and content hash


@dataclass(frozen=True)
class SamplingPolicy:
    """The checkpoint an iteration samples from, and its number (0: the base policy)."""

    iteration: int
    checkpoint: Checkpoint

    def staleness(self, number: int) -> int:
        """Training steps between it and the checkpoint iteration `number` trains from (`number` - 1)."""
        return number - 1 - self.iteration


class Refused(Exception):
    """The iteration cannot go on; the message says why in one sentence, and what to do."""


class Environment(Protocol):
    """Where an experiment's data and checkpoints live and how its code is sandboxed (the
    `crucible` resource is one)."""

    storage_root: str
    task_sets: str  # the imported task-set library
    sandbox_backend: str  # where tasks are graded: what their proofs of gradability are for

    def store(self) -> DatasetStore: ...
    def sandbox_pool(self, is_infra_failure: Callable[[object], bool], shares: int = 1) -> SandboxPool: ...
    def open_session(self, task: Task, previous: Session | None = None, /) -> Session: ...
    def checkpoint_dir(self, experiment: str, iteration: int) -> Path: ...
    def environment_store(self) -> EnvironmentStore: ...
    def base_policy_dir(self, experiment: str) -> Path: ...


@dataclass(frozen=True)
class IterationRef:
    """Iteration `number` of `experiment`, and what follows from that alone."""

    experiment: ExperimentConfig
    number: int

    @property
    def name(self) -> str:
        return self.experiment.name

    @property
    def seed(self) -> int:
        """The seed of every random choice the iteration makes."""
        return self.experiment.seed * SEED_STRIDE + self.number

    @property
    def group_prefix(self) -> str:
        """What the iteration's group ids start with (`<experiment>-<NNNN>`)."""
        return f"{self.experiment.name}-{self.number:04d}"


def slices(items: list, count: int) -> list[list]:
    """`items` in `count` contiguous slices (fewer if there are fewer items), as even as they
    allow; none is empty."""
    count = min(count, len(items))
    bounds = [len(items) * i // count for i in range(count + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(count)]
