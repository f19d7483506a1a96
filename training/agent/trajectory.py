"""From graded rollouts to the rows of the `trajectories`, `evaluations` and `regrades` datasets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from datastore.schema import Observations
from grading.verdict import GradeResult
from task_sets.schema import Task
from training.agent.extraction import ExtractionMethod
from training.agent.rollout import Rollout
from training.policy.lineage import code_version


@dataclass(frozen=True)
class VerifiedRollout:
    rollout: Rollout
    task: Task
    grade: GradeResult
    verify_s: float  # grading wall time: sandbox set-up, tests, report parsing
    queue_s: float = 0.0  # from handing it to the sandbox pool until the grading that counted began


def trajectory_row(verified: VerifiedRollout, iteration: int | None = None) -> dict:
    """One row of the `trajectories` dataset (schema: datastore/schema.py), of `iteration` (None:
    sampled outside one)."""
    rollout, task, grade = verified.rollout, verified.task, verified.grade
    sampler = rollout.policy_iteration
    execution = grade.exec
    return {
        "task_id": task.id,
        "task_version": task.version,
        "split": task.split,
        "difficulty": task.difficulty,
        "family": task.family,
        "group_id": rollout.group_id,
        "sample_index": rollout.sample_index,
        "policy_version": rollout.policy_version,
        "policy_iteration": sampler,
        "staleness": None if iteration is None or sampler is None else iteration - 1 - sampler,
        "prompt_token_ids": rollout.prompt_ids,
        "response_token_ids": rollout.response_ids,
        "loss_mask": rollout.loss_mask or [1] * len(rollout.response_ids),
        "behaviour_logprobs": rollout.behaviour_logprobs,
        "response_text": rollout.response_text,
        "turns": _turns(rollout),
        "patch": rollout.solution,
        "test_results": _test_results(grade),
        "reward_components": grade.reward_components,
        "reward": grade.reward,
        "reward_status": grade.reward_status.value,
        "reward_version": grade.reward_version,
        "passed": grade.passed,
        "tamper_flags": [flag.value for flag in grade.tamper_flags],
        **failure_columns(grade),
        "exec_status": execution.status.value,
        "timings": {
            "generate_s": rollout.generate_s,
            "queue_s": verified.queue_s,
            "exec_s": execution.wall_s,
            "verify_s": verified.verify_s,
        },
        "prompt_tokens": len(rollout.prompt_ids),
        "sampled_tokens": rollout.sampled_tokens,
        "observation_tokens": len(rollout.response_ids) - rollout.sampled_tokens,
        "finish_reason": rollout.finish_reason,
        "error_class": execution.error.split(":", 1)[0] if execution.error else None,
        "sandbox_backend": execution.backend,
        "sandbox_spec_hash": execution.spec_hash,
        "environment": task.environment.digest if task.environment else None,
    }


def regrade_row(trajectory: dict, task: Task, grade: GradeResult, trajectory_file: str, at: datetime) -> dict:
    """One row of the `regrades` dataset: a stored submission (`trajectory`, a row of
    `trajectory_file`) graded again, beside what it was trained with."""
    return {
        "task_id": task.id, "group_id": trajectory["group_id"], "sample_index": trajectory["sample_index"],
        "task_version": task.version, "trajectory_file": trajectory_file,
        "original_reward": trajectory["reward"], "original_passed": trajectory["passed"],
        "original_reward_version": trajectory["reward_version"],
        "reward": grade.reward, "reward_status": grade.reward_status.value, "reward_version": grade.reward_version,
        "passed": grade.passed, "tamper_flags": [flag.value for flag in grade.tamper_flags],
        **failure_columns(grade), "exec_status": grade.exec.status.value, "test_results": _test_results(grade),
        "code_version": code_version(), "regraded_at": at,
    }


def failure_columns(grade: GradeResult) -> dict:
    return {"failure_reason": grade.failure.reason.value if grade.failure else None,
            "failure_detail": grade.failure.detail if grade.failure else ""}


def _test_results(grade: GradeResult) -> list[dict]:
    return [{"name": name, "outcome": outcome.value, "message": grade.messages.get(name, "")}
            for name, outcome in grade.outcomes.items()]


def _turns(rollout: Rollout) -> list[dict]:
    if not rollout.turns:  # single-turn: the reply is the submission, its detail how it was extracted
        extraction = rollout.extraction
        found = extraction is None or extraction.method != ExtractionMethod.EMPTY
        return [{"index": 0, "reply": rollout.response_text, "action": "submit",
                 "detail": extraction.note if extraction else "", "status": "submitted" if found else "error",
                 "exit_code": None, "observation_excerpt": "", "generate_s": rollout.generate_s, "exec_s": 0.0,
                 "sampled_tokens": len(rollout.response_ids)}]
    return [{"index": index, "reply": t.reply, "action": t.action, "detail": t.detail[:2000], "status": t.status,
             "exit_code": t.exit_code, "observation_excerpt": t.observation[:2000], "generate_s": t.generate_s,
             "exec_s": t.exec_s, "sampled_tokens": t.sampled_tokens} for index, t in enumerate(rollout.turns)]


def evaluation_row(verified: VerifiedRollout, observations: Observations = Observations.SHOWN) -> dict:
    """One row of the `evaluations` dataset: one answer to a held-out task, its policy shown
    its actions' results or not (`observations`)."""
    return {
        "observations": observations.value,
        "turns": _turns(verified.rollout),
        "task_id": verified.task.id,
        "sample_index": verified.rollout.sample_index,
        "difficulty": verified.task.difficulty,
        "family": verified.task.family,
        "policy_version": verified.rollout.policy_version,
        "response_text": verified.rollout.response_text,
        "reward": verified.grade.reward,
        "passed": verified.grade.passed,
        "reward_status": verified.grade.reward_status.value,
        "reward_version": verified.grade.reward_version,
    }
