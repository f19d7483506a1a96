"""A task set's reward function applied to one grade: the code's measures, then the rules.

The weights are the task set's (task_sets/rewards.py, its reward.toml); here they meet the
evidence. A grade the rules of grading/verdict.py zeroed (tampering, a kill, no report) stays 0
whatever the weights, and an unscored grade (invalid, infra_error) stays None. A repository task
(a SWE-bench instance, say) whose diff makes none of its fail-to-pass tests pass resolves nothing
and earns 0, however many pass-to-pass tests it keeps (keeping them is what an empty diff does).
Both quality tools (pyflakes, McCabe) parse the code; neither runs it, and each runs only when its
weight is not 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import mccabe
import pyflakes.checker

from grading.verdict import GradeResult
from sandbox import python_ast
from statuses import RewardStatus
from task_sets.rewards import RewardFunction


@dataclass(frozen=True)
class Process:
    """How the policy got to its submission (the single-turn loop: one turn)."""

    turns: int = 1
    tokens: int = 0


ONE_TURN = Process()


def apply_reward(function: RewardFunction, grade: GradeResult, compiles: bool, code: Iterable[str] = (),
                 process: Process = ONE_TURN) -> GradeResult:
    """`grade` with `function`'s reward and version, and its measures in the components.

    `compiles`: tier 1, as the task's kind defines it (grading/submission.py); `code`: the
    submitted Python sources, for the quality terms."""
    if grade.reward_status is not RewardStatus.SCORED:
        return dataclasses.replace(grade, reward_version=function.version)
    sources = list(code)
    measures = {"compiles": float(compiles)}
    if function.lint:
        measures["lint_findings"] = float(sum(_lint_findings(s) for s in sources))
    if function.complexity:
        measures["complexity"] = float(max((_complexity(s) for s in sources), default=0))
    if function.turns or function.tokens:
        measures |= {"turns": float(process.turns), "tokens": float(process.tokens)}
    components = {**grade.reward_components, **measures}
    resolves_nothing = components.get("fail_to_pass_fraction") == 0.0  # a repository task's: see above
    reward = 0.0 if grade.gated or resolves_nothing else function.combine(components)
    return dataclasses.replace(grade, reward=reward, reward_components=components, reward_version=function.version)


def _lint_findings(source: str) -> int:
    try:
        return len(pyflakes.checker.Checker(python_ast.parse(source)).messages)
    except (SyntaxError, ValueError, RecursionError):
        return 0  # tier 1 already withholds its share from code that does not parse


def _complexity(source: str) -> int:
    try:
        visitor = mccabe.PathGraphingAstVisitor()
        visitor.preorder(python_ast.parse(source), visitor)
    except (SyntaxError, ValueError, RecursionError):
        return 0
    return max((graph.complexity() for graph in visitor.graphs.values()), default=0)

