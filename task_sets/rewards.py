"""Reward functions as a task set configures them: weights, validated, versioned. Applying one to a
grade (measuring the code, the gating rules) is grading/rewards.py.

The tiers, each weighted (the weights sum to 1, so a flawless submission scores 1):
  1. `compiles`     the submission parses (function tasks), or the diff applies and every
                    Python file it leaves changed parses (repository tasks);
  2. `tests_passed` the fraction of expected tests that passed;
  3. `all_passed`   every expected test passed.
Then optional penalties, subtracted and clipped at 0:
  quality  `lint`       per pyflakes finding in the submitted code (unused imports, undefined
                        names...), `complexity` per unit of McCabe complexity of its most
                        complex function above `complexity_budget`;
  process  `turns`      per turn after the first, `tokens` per 1000 tokens the policy wrote.

A repository task (a SWE-bench instance, say) is judged on its fail-to-pass tests: a diff that
makes none of them pass resolves nothing and earns 0 whatever the tiers, however many of the
pass-to-pass tests it keeps (keeping them is what an empty diff does). Once something is resolved
the partial credit is `tests_passed`: the fail-to-pass fraction scaled by the pass-to-pass fraction
(grading/submission.py), with `compiles` and `all_passed` as for any task.

The function's version, a hash of its name, weights and RULES, is stored beside every reward it
produced.

A task set configures its function in `reward.toml` beside its task files:
    name = "tiered"
    compiles = 0.1
    tests_passed = 0.5
    all_passed = 0.4
Without one it gets `DEFAULT`: the fraction of tests passed, as before tiers existed.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    computed_field,
    model_validator,
)

CONFIG_FILE = "reward.toml"
TIER_TOLERANCE = 1e-9
# Bumped when a rule of grading/rewards.py changes what the same weights pay (2: a repository diff that resolves no
# fail-to-pass test earns 0), so a reward never shares its version with one computed otherwise.
RULES = 2


class RewardError(ValueError):
    """A reward.toml that cannot be used; the message names the file and field."""


class RewardFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("tests-passed-fraction", min_length=1)
    compiles: float = Field(0.0, ge=0, le=1)
    tests_passed: float = Field(1.0, ge=0, le=1)
    all_passed: float = Field(0.0, ge=0, le=1)
    lint: float = Field(0.0, ge=0, description="subtracted per pyflakes finding")
    complexity: float = Field(0.0, ge=0, description="subtracted per unit of complexity over the budget")
    complexity_budget: int = Field(10, ge=1)
    turns: float = Field(0.0, ge=0, description="subtracted per turn after the first")
    tokens: float = Field(0.0, ge=0, description="subtracted per 1000 tokens written")

    @model_validator(mode="after")
    def _tiers_sum_to_one(self) -> RewardFunction:
        total = self.compiles + self.tests_passed + self.all_passed
        if abs(total - 1.0) > TIER_TOLERANCE:
            raise ValueError(f"the tier weights compiles + tests_passed + all_passed must sum to 1, not {total:g}")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def version(self) -> str:
        body = json.dumps({**self.model_dump(exclude={"version"}), "rules": RULES}, sort_keys=True)
        return f"{self.name}@{hashlib.sha256(body.encode()).hexdigest()[:12]}"

    def combine(self, c: dict[str, float]) -> float:
        """The reward of a scored, ungated grade's components (grading/rewards.py measures them)."""
        earned = (self.compiles * c["compiles"] + self.tests_passed * c["tests_passed_fraction"]
                  + self.all_passed * c["all_passed"])
        penalty = (self.lint * c.get("lint_findings", 0.0)
                   + self.complexity * max(0.0, c.get("complexity", 0.0) - self.complexity_budget)
                   + self.turns * max(0.0, c.get("turns", 1.0) - 1) + self.tokens * c.get("tokens", 0.0) / 1000)
        return max(0.0, round(earned - penalty, 12))


DEFAULT = RewardFunction()


def load_reward_function(task_set_dir: Path | None) -> RewardFunction:
    """The function a task set directory configures in reward.toml, else DEFAULT."""
    path = task_set_dir / CONFIG_FILE if task_set_dir is not None else None
    if path is None or not path.is_file():
        return DEFAULT
    try:
        return RewardFunction.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as e:
        raise RewardError(f"{path}: malformed TOML: {e}") from None
    except ValidationError as e:
        problems = [f"{path}: {'.'.join(map(str, err['loc'])) or 'reward'}: {err['msg']}" for err in e.errors()]
        raise RewardError("\n".join(problems)) from None


