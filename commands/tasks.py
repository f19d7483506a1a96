"""`crucible tasks import|list|show|validate`: task sets from the shell."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

from rich.table import Table

from commands.console import console, errors
from commands.env import ensure_built
from commands.errors import UserError
from commands.hints import crucible_command
from commands.settings import BACKEND_HELP, Settings, load_settings, sandbox_hosts
from environments.store import EnvironmentStore
from grading.gradability import ProofLedger, lock_environments, needs_proof, prove
from grading.validation import DEFAULT_REPEATS, VERDICTS, ValidationReport, validate
from grading.verdict import GradeResult
from sandbox.backends import BACKENDS, open_sandbox
from sandbox.base import SandboxUnavailable
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.importers import FORMATS, SPLITS, ImportError_, ImportOptions, import_tasks, write_task_set
from task_sets.loader import (
    TASK_SET_NAME,
    TaskSet,
    TaskSetError,
    builtin_task_set_names,
    library_task_set_names,
    load_task_set,
)
from task_sets.schema import RepositoryTask, Task
from task_sets.separation import NEAR_DUPLICATE_THRESHOLD, separation

MAX_REJECTIONS_SHOWN = 20


def add_commands(commands: argparse._SubParsersAction) -> None:
    tasks = commands.add_parser("tasks", help="import, list and show task sets").add_subparsers(
        dest="action", required=True)
    importer = tasks.add_parser("import", help="import a task set from a public format")
    importer.add_argument("path", type=Path)
    importer.add_argument("--format", required=True, choices=FORMATS)
    importer.add_argument("--name", required=True, help="the new task set's name")
    importer.add_argument("--split", choices=SPLITS, default="eval",
                          help="eval (default: benchmarks are for evaluation), train, hash (80/20 by id), or "
                          "source (the format's own split: MBPP's paper split)")
    importer.add_argument("--repos", type=Path, help="swebench: the folder holding each instance's repository "
                          "as a git clone named OWNER__NAME, or snapshots OWNER__NAME-<commit>.tar.xz (default: "
                          "PATH's folder/repos)")
    importer.add_argument("--specs", type=Path, help="swebench: environment specifications per repository and "
                          "version over SWE-bench's published ones, as JSON in their shape: {\"OWNER/NAME\": "
                          "{\"VERSION\": {\"python\": \"3.9\", \"install\": \"...\", ...}}}")
    importer.add_argument("--no-proof", action="store_true",
                          help="skip building the environments and proving each task gradable (reference passes, "
                          "empty fails) now; the first iteration's task_set, or crucible tasks validate, does it")
    importer.add_argument("--backend", choices=BACKENDS,
                          help=f"the backend the tasks are proven gradable on; {BACKEND_HELP}")
    importer.add_argument("--workers", type=int, default=2)
    importer.set_defaults(handler=command_import)

    listing = tasks.add_parser("list", help="task sets, or the tasks of one set")
    listing.add_argument("--task-set", help="list this set's tasks")
    listing.add_argument("--backend", choices=BACKENDS, help=f"whose proofs of gradability to show; {BACKEND_HELP}")
    listing.set_defaults(handler=command_list)

    show = tasks.add_parser("show", help="one task in full")
    show.add_argument("task_id", help="e.g. default/add_k/0000 (the set is the id's first part)")
    show.add_argument("--task-set", help="the set holding the task (default: the id's first part)")
    show.set_defaults(handler=command_show)

    check = tasks.add_parser("validate", help="check that every task can judge: reference passes, "
                             "wrong submissions fail, nothing flaky")
    check.add_argument("task_set")
    check.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="reference runs per task (default 3)")
    check.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    check.add_argument("--workers", type=int, default=2)
    check.add_argument("--out", type=Path, help="also write the report here (JSON)")
    check.set_defaults(handler=command_validate)


# -- tasks import --------------------------------------------------------------------------


def command_import(args: argparse.Namespace) -> int:
    if not TASK_SET_NAME.fullmatch(args.name):
        raise UserError(f"--name {args.name!r}: use letters, digits, '-' and '_' only")
    if args.name in builtin_task_set_names():
        raise UserError(f"--name {args.name!r} is a built-in task set; choose another name")
    try:
        imported = import_tasks(args.format, args.path, ImportOptions(args.name, args.split, args.repos, args.specs))
    except ImportError_ as e:
        raise UserError(str(e)) from None
    for rejection in imported.rejected[:MAX_REJECTIONS_SHOWN]:
        errors.print(f"[yellow]rejected[/yellow] {rejection}", highlight=False, markup=True)
    if len(imported.rejected) > MAX_REJECTIONS_SHOWN:
        errors.print(f"… and {len(imported.rejected) - MAX_REJECTIONS_SHOWN} more rejected records")
    for warning in imported.warnings:
        errors.print(f"[yellow]note[/yellow] {warning}", highlight=False, markup=True)
    if not imported.tasks:
        raise UserError(f"{args.path}: no valid {args.format} records; nothing imported")
    settings = load_settings()
    store = EnvironmentStore(settings.environments)
    tasks = imported.tasks if args.no_proof else lock_environments(imported.tasks, store, progress=_note)
    target = write_task_set(tasks, Path(settings.task_sets) / args.name)
    splits = Counter(task.split for task in tasks)
    console.print(f"imported {len(tasks)} tasks ({splits['train']} train, {splits['eval']} eval), "
                  f"rejected {len(imported.rejected)}: task set {args.name!r} in {target}", highlight=False)
    if not args.no_proof:
        task_set = load(args.name, settings)
        with grading_pool(args.backend, args.workers, settings) as pool:
            report = prove(task_set, args.backend, pool, ProofLedger(store), progress=_note, task_set=task_set.name)
        _print_proofs(report, args.backend)
    return 0


def _note(line: str) -> None:
    errors.print(line, highlight=False)


def _print_proofs(report: ValidationReport, backend: str) -> None:
    usable = report.count("ok")
    console.print(f"proven gradable on the {backend} backend: {usable} of {len(report.tasks)} tasks usable; the "
                  f"{len(report.tasks) - usable} others are left out of sampling and evaluation", highlight=False)
    if report.problems:
        console.print(_validation_table(report))


# -- tasks list / show ---------------------------------------------------------------------


def command_list(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.task_set:
        ledger = ProofLedger(EnvironmentStore(settings.environments))
        console.print(_tasks_table(load(args.task_set, settings), args.backend, ledger))
        return 0
    table = Table(title="task sets")
    for column in ("name", "source", "tasks", "train", "eval", "difficulty (easy/medium/hard)", "version", "reward"):
        table.add_column(column, justify="right" if column in ("tasks", "train", "eval") else "left")
    library = Path(settings.task_sets)
    sources = {**{n: "built-in" for n in builtin_task_set_names()}, **dict.fromkeys(library_task_set_names(library),
                                                                                     str(library))}
    for name, source in sorted(sources.items()):
        task_set = load(name, settings)
        difficulty = Counter(task.difficulty for task in task_set)
        table.add_row(name, source, str(len(task_set)), str(len(task_set.train())), str(len(task_set.eval())),
                      f"{difficulty['easy']}/{difficulty['medium']}/{difficulty['hard']}", task_set.version,
                      task_set.reward.version)
    console.print(table)
    return 0


def _tasks_table(task_set: TaskSet, backend: str, ledger: ProofLedger) -> Table:
    table = Table(title=f"task set {task_set.name!r} ({len(task_set)} tasks, version {task_set.version}, "
                        f"reward {task_set.reward.version})")
    for column in ("id", "kind", "split", "difficulty", "family", "what is graded", "version", f"gradable ({backend})"):
        table.add_column(column)
    for task in task_set:
        status, reason = ledger.status(task_set, task, backend)
        table.add_row(task.id, task.kind, task.split, task.difficulty, task.family, _graded(task), task.version,
                      f"{status.value}: {reason}" if reason else status.value)
    return table


def _graded(task: Task) -> str:
    if isinstance(task, RepositoryTask):
        return f"{len(task.fail_to_pass)} fail-to-pass, {len(task.pass_to_pass)} pass-to-pass tests"
    return f"{task.entry_point}()"


def command_show(args: argparse.Namespace) -> int:
    task_set = load(args.task_set or args.task_id.split("/", 1)[0], load_settings())
    task = task_set.by_id.get(args.task_id)
    if task is None:
        raise UserError(f"no task {args.task_id!r} in task set {task_set.name!r} "
                        f"({crucible_command('tasks', 'list', '--task-set', task_set.name)})")
    sys.stdout.write(_describe(task) + "\n")  # plain text: prompts and code must not be re-wrapped
    return 0


def _describe(task: Task) -> str:
    limits = task.limits
    command = task.test_command if isinstance(task, RepositoryTask) else task.entry_command
    header = (f"{task.id}  version {task.version}\n"
              f"{task.kind} task · split {task.split} · difficulty {task.difficulty} · family {task.family} · "
              f"domain {task.domain} · language {task.language} · network {'yes' if task.network else 'no'}\n"
              f"limits: wall {limits.wall_s}s, cpu {limits.cpu_s}s, memory {limits.memory_mb} MB, "
              f"pids {limits.pids}, disk {limits.disk_mb} MB · grading command: {command}")
    sections = [("prompt", task.prompt)]
    if isinstance(task, RepositoryTask):
        sections += [
            ("reference submission (diff)", task.reference_solution),
            ("tests that must start passing", "\n".join(task.fail_to_pass)),
            ("tests that must keep passing", "\n".join(task.pass_to_pass) or "(none)"),
            ("protected paths (restored before grading)", "\n".join(task.guarded_paths)),
            ("repository", "\n".join(sorted(task.files))),
        ]
        sections += [(f"hidden test file {name}", body) for name, body in sorted(task.hidden_tests.items())]
        sections += [(f"grader file /tests/{name}", body) for name, body in sorted(task.grader_files.items())]
        return _sections(header, sections)
    if task.solution_prefix:
        sections.append(("solution.py starts with (the submission follows)", task.solution_prefix))
    sections += [("reference submission", task.reference_solution), ("hidden tests", task.tests)]
    sections += [(f"workspace file {name}", body) for name, body in sorted(task.files.items())]
    return _sections(header, sections)


def _sections(header: str, sections: list[tuple[str, str]]) -> str:
    return header + "".join(f"\n\n── {title} ──\n{body.rstrip()}" for title, body in sections)


def load(name: str, settings: Settings) -> TaskSet:
    """The set `name` (imported into the settings' library, or built in, or at a path)."""
    try:
        return load_task_set(name, Path(settings.task_sets))
    except TaskSetError as e:
        raise UserError(str(e)) from None


# -- tasks validate ------------------------------------------------------------------------


def command_validate(args: argparse.Namespace) -> int:
    """Exit 0 when every task is fit to judge with and no eval prompt is copied into train, else 1."""
    settings = load_settings()
    store = EnvironmentStore(settings.environments)
    task_set = load(args.task_set, settings)
    if not needs_proof(task_set):
        ensure_built(task_set.tasks, args.backend, store)
    with grading_pool(args.backend, args.workers, settings) as pool:
        if needs_proof(task_set):  # what it finds is recorded: unusable tasks are left out of sampling
            report = prove(task_set, args.backend, pool, ProofLedger(store), repeats=args.repeats, progress=_note,
                           task_set=task_set.name)
        else:
            report = validate(task_set, pool, store, args.repeats, task_set.name,
                              progress=_show_progress("validated"))
    if report.problems:
        console.print(_validation_table(report))
    else:
        console.print(f"task set {report.task_set!r}: all {len(report.tasks)} tasks fit to judge with (reference "
                      f"passed {report.repeats} of {report.repeats} times; every wrong submission failed)",
                      highlight=False)
    split = separation(task_set)
    console.print(f"splits: {len(split.exact_duplicates)} eval tasks copied into train"
                  + "".join(f"\n  {train_id} = {eval_id} (the same {same})"
                            for train_id, eval_id, same in split.exact_duplicates)
                  + f"; {len(split.near_duplicates)} train/eval pairs of near-duplicates "
                  f"(prompts and workspaces similarity >= {NEAR_DUPLICATE_THRESHOLD})", highlight=False)
    if args.out:
        document = {**dataclasses.asdict(report), "separation": dataclasses.asdict(split)}
        args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 1 if report.problems or split.leaks else 0


def _show_progress(verb: str):
    def show(done: int, total: int) -> None:
        if done % 25 == 0 or done == total:
            errors.print(f"{verb} {done}/{total} tasks", highlight=False)
    return show


def _validation_table(report: ValidationReport) -> Table:
    counts = ", ".join(f"{report.count(v)} {v}" for v in VERDICTS)
    table = Table(title=f"task set {report.task_set!r}: {len(report.tasks)} tasks ({counts}); "
                        f"reference run {report.repeats}x each")
    for column in ("task", "verdict", "why", "tests that varied"):
        table.add_column(column)
    for task in report.problems:
        table.add_row(task.task_id, task.verdict, "; ".join(task.reasons), ", ".join(task.flaky_tests))
    return table


def grading_pool(backend: str, workers: int, settings: Settings) -> SandboxPool:
    hosts = sandbox_hosts(settings)
    try:
        open_sandbox(backend, hosts=hosts)  # fail once, clearly, rather than once per submission
    except SandboxUnavailable as e:
        raise UserError(f"the {backend} sandbox is unavailable: {e}") from None
    return SandboxPool(lambda spec: open_sandbox(backend, spec, hosts, warm_workers=True), PoolConfig(cpu_slots=workers),
                       is_infra_failure=GradeResult.infra_failed)
