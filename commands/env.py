"""`crucible env build|list|show|prune`: the task environments of task sets (environments/)."""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from rich.table import Table

from commands.console import console, errors
from commands.errors import UserError
from commands.hints import crucible_command
from commands.settings import BACKEND_HELP, load_settings
from environments.build import BuildError, build_all, images, remove_image
from environments.spec import EnvironmentSpec
from environments.store import EnvironmentStore, image_tag
from grading.gradability import repositories_of
from sandbox.backends import BACKENDS
from task_sets.loader import TaskSetError, builtin_task_set_names, library_task_set_names, load_task_set
from task_sets.schema import Task


def add_commands(commands: argparse._SubParsersAction) -> None:
    env = commands.add_parser("env", help="build, list, show and prune task environments").add_subparsers(
        dest="action", required=True)
    builder = env.add_parser("build", help="build every environment a task set declares (cached by digest)")
    builder.add_argument("task_set")
    builder.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    builder.set_defaults(handler=command_build)
    env.add_parser("list", help="built environments").set_defaults(handler=command_list)
    show = env.add_parser("show", help="one built environment's record")
    show.add_argument("digest", help="a digest or its first characters")
    show.set_defaults(handler=command_show)
    prune = env.add_parser("prune", help="remove environments no known task set declares, and their images")
    prune.add_argument("--all", action="store_true", help="remove every built environment")
    prune.set_defaults(handler=command_prune)


def environments_of(tasks: list[Task] | tuple[Task, ...]) -> dict[str, tuple[EnvironmentSpec, int]]:
    """Each distinct environment of `tasks`, by digest, with how many tasks declare it."""
    found: dict[str, tuple[EnvironmentSpec, int]] = {}
    for task in tasks:
        if task.environment is not None:
            spec, count = found.get(task.environment.digest, (task.environment, 0))
            found[spec.digest] = (spec, count + 1)
    return found


def ensure_built(tasks: list[Task] | tuple[Task, ...], backend: str, store: EnvironmentStore) -> None:
    """Build what the tasks' environments lack for `backend` into `store` (nothing when all are built)."""
    specs = [spec for spec, _ in environments_of(tasks).values()]
    try:
        build_all(specs, backend, store, progress=lambda line: errors.print(line, highlight=False),
                  repositories=repositories_of(tasks))
    except BuildError as e:
        raise UserError(str(e)) from None


def command_build(args: argparse.Namespace) -> int:
    settings = load_settings()
    store = EnvironmentStore(settings.environments)
    try:
        task_set = load_task_set(args.task_set, Path(settings.task_sets))
    except TaskSetError as e:
        raise UserError(str(e)) from None
    found = environments_of(task_set.tasks)
    if not found:
        console.print(f"task set {task_set.name!r} declares no environment: its tasks run in the sandbox image as it is",
                      highlight=False)
        return 0
    ensure_built(task_set.tasks, args.backend, store)
    table = Table(title=f"task set {task_set.name!r}: {len(found)} environment(s) built for {args.backend}")
    for column in ("environment", "tasks", "interpreter", "requirements", "debian", "packages installed", "build s"):
        table.add_column(column)
    for digest, (spec, count) in found.items():
        record = store.get(digest).record
        interpreter = record.get("interpreter", {}).get("version", "the sandbox's python3")
        table.add_row(digest[:16], str(count), interpreter, str(len(spec.python)), " ".join(spec.debian) or "-",
                      str(len(record["installed"])), str(record["build_s"]))
    console.print(table)
    return 0


def command_list(args: argparse.Namespace) -> int:
    settings = load_settings()
    store, users = EnvironmentStore(settings.environments), _users(Path(settings.task_sets))
    docker_images = images(store)
    built = store.all()
    table = Table(title=f"{len(built)} built environment(s) in {store.root}")
    for column in ("environment", "built", "packages", "MB", "docker image", "declared by"):
        table.add_column(column)
    for environment_ in built:
        when = datetime.datetime.fromtimestamp(environment_.record["built_at"]).strftime("%Y-%m-%d %H:%M")
        table.add_row(environment_.digest[:16], when, str(len(environment_.record["installed"])),
                      f"{environment_.size_bytes / 1e6:.1f}",
                      image_tag(environment_.digest) if environment_.digest in docker_images else "-",
                      ", ".join(sorted(users.get(environment_.digest, ()))) or "-")
    console.print(table)
    return 0


def command_show(args: argparse.Namespace) -> int:
    store = EnvironmentStore(load_settings().environments)
    found = store.find(args.digest)
    if found is None:
        raise UserError(f"no single built environment starts with {args.digest!r} ({crucible_command('env', 'list')})")
    console.print_json(json.dumps({**found.record, "path": str(found.path),
                                   "docker_image": image_tag(found.digest) if found.digest in images(store)
                                   else None}))
    return 0


def command_prune(args: argparse.Namespace) -> int:
    settings = load_settings()
    store, users = EnvironmentStore(settings.environments), ({} if args.all else _users(Path(settings.task_sets)))
    docker_images, removed = images(store), []
    for digest in sorted({built.digest for built in store.all()} | set(docker_images)):
        if digest not in users:
            store.remove(digest)
            if digest in docker_images:
                remove_image(digest)
            removed.append(digest[:16])
    console.print(f"removed {len(removed)} environment(s)" + (f": {', '.join(removed)}" if removed else ""),
                  highlight=False)
    return 0


def _users(library: Path) -> dict[str, set[str]]:
    """Digest -> the known task sets (imported into `library`, and built-in) that declare it."""
    users: dict[str, set[str]] = {}
    for name in sorted({*library_task_set_names(library), *builtin_task_set_names()}):
        try:
            tasks = load_task_set(name, library).tasks
        except TaskSetError:
            continue  # a broken set declares nothing it could run
        for digest in environments_of(tasks):
            users.setdefault(digest, set()).add(name)
    return users
