"""Load a task set from plain data files into validated `Task`s, all or nothing.

A task set is a single `.jsonl` file (one task per line), a single `.yaml`/`.yml` file (a
list of tasks, or a mapping whose only key is `tasks`), or a directory of such files read in
sorted order. A bare name such as "default" refers to an imported set in the library
(the `library` given: the `task_sets` setting, default `./.crucible/task_sets/<name>/`) or a built-in one
(`task_sets/builtin/<name>/`).

Every problem raises `TaskSetError` with a message that says where it is:
`default/generated.jsonl:14: task 'add_3': field 'difficulty': Input should be ...`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

import yaml
from pydantic import ValidationError

from environments.spec import EnvironmentSpec
from task_sets.rewards import DEFAULT, RewardError, RewardFunction, load_reward_function
from task_sets.schema import TASK_KINDS, Split, Task, parse_task

BUILTIN_DIR = Path(__file__).parent / "builtin"
TASK_FILE_SUFFIXES = (".jsonl", ".yaml", ".yml")
TASK_SET_NAME = re.compile(r"[A-Za-z0-9_\-]+")  # no dot or slash: anything else is a path

# A record is one task's raw data together with where it came from ("set/file.jsonl:14").
Record = tuple[str, object]


SYSTEM_MESSAGE_FILE = "system.md"  # optional, beside the task files
ENVIRONMENT_FILE = "environment.toml"  # optional: every task's environment, or what is added to a task's own


class TaskSetError(ValueError):
    """A task set could not be loaded; the message names the file, line, task and field."""


@dataclass(frozen=True)
class TaskSet:
    name: str
    tasks: tuple[Task, ...]
    reward: RewardFunction = DEFAULT  # configured by the set's reward.toml
    system_message: str | None = None  # the set's system.md: what every prompt of the set starts with
    built_in: bool = False  # one of Crucible's own sets, proven gradable by its test suite
    # Tasks left out of the splits, with why: not proven gradable where they are graded (grading/gradability.py).
    unusable: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def version(self) -> str:
        """Content hash over the task versions (and the system message, where the set has one):
        changes when any task is edited, added or removed."""
        task_versions = "\n".join(sorted(task.version for task in self.tasks))
        system = "" if self.system_message is None else f"\nsystem:{self.system_message}"
        return hashlib.sha256((task_versions + system).encode()).hexdigest()[:16]

    @cached_property
    def by_id(self) -> Mapping[str, Task]:
        return MappingProxyType({task.id: task for task in self.tasks})

    def train(self) -> list[Task]:
        return self._split("train")

    def eval(self) -> list[Task]:
        return self._split("eval")

    def _split(self, split: Split) -> list[Task]:
        return [task for task in self.tasks if task.split == split and task.id not in self.unusable]

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)


def builtin_task_set_names() -> list[str]:
    return _set_names(BUILTIN_DIR)


def library_task_set_names(library: Path) -> list[str]:
    """The sets imported into `library` (the task_sets setting's folder)."""
    return _set_names(library)


def _set_names(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.is_dir() and p.name[0] not in "._")


def load_task_set(name_or_path: str | os.PathLike[str], library: Path | None = None) -> TaskSet:
    """Load a set by bare name, imported into `library` or built in, or a task file or directory
    by path."""
    root, name = _resolve(name_or_path, library)
    environment = _set_environment(root) if root.is_dir() else None
    tasks = _validate_all((where, _with_environment(record, environment)) for where, record in _records(root))
    if not tasks:
        raise TaskSetError(f"{root.name}: task set is empty")
    try:
        reward = load_reward_function(root if root.is_dir() else None)
    except RewardError as e:
        raise TaskSetError(str(e)) from None
    system = root / SYSTEM_MESSAGE_FILE if root.is_dir() else None
    system_message = system.read_text(encoding="utf-8").strip() if system and system.is_file() else None
    return TaskSet(name=name, tasks=tuple(tasks), reward=reward, system_message=system_message or None,
                   built_in=root.is_relative_to(BUILTIN_DIR))


def _set_environment(root: Path) -> dict | None:
    """The set's environment.toml as an environment record: `python` (requirement lines) or
    `python_lock` (a requirements file beside it, hashes and all), `debian`, `[env]`."""
    path = root / ENVIRONMENT_FILE
    if not path.is_file():
        return None
    try:
        declared = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskSetError(f"{root.name}/{ENVIRONMENT_FILE}: malformed TOML: {e}") from None
    lock = declared.pop("python_lock", None)
    if lock is not None:
        lock_path = root / str(lock)
        if "python" in declared or not lock_path.is_file() or not lock_path.resolve().is_relative_to(root.resolve()):
            raise TaskSetError(f"{root.name}/{ENVIRONMENT_FILE}: python_lock {lock!r} must name a requirements file "
                               "beside it, instead of `python`")
        declared["python"] = [line for line in _lock_lines(lock_path.read_text(encoding="utf-8"))]
    try:
        return EnvironmentSpec(**declared).model_dump(mode="json")
    except (ValidationError, TypeError) as e:
        reasons = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()) \
            if isinstance(e, ValidationError) else str(e)
        raise TaskSetError(f"{root.name}/{ENVIRONMENT_FILE}: {reasons}") from None


def _lock_lines(text: str) -> list[str]:
    """A requirements file's requirements, continuation lines joined, comments dropped."""
    joined = text.replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _with_environment(record: object, environment: dict | None) -> object:
    """The set's environment for a task that declares none; added to what a task declares (an
    imported Harbor task's Dockerfile, say): its lists joined, its mappings merged, the task's
    own entries winning."""
    if environment is None or not isinstance(record, dict):
        return record
    own = record.get("environment")
    if own is None:
        return {**record, "environment": environment}
    if not isinstance(own, dict):
        return record  # validation says why
    merged = {**environment, **own}
    for key in ("python", "debian", "wheels", "python_path"):
        merged[key] = list(dict.fromkeys([*environment.get(key, ()), *own.get(key, ())]))
    for key in ("env", "files", "context"):
        merged[key] = {**environment.get(key, {}), **own.get(key, {})}
    return {**record, "environment": merged}


def _resolve(name_or_path: str | os.PathLike[str], library: Path | None) -> tuple[Path, str]:
    """The set's root file or directory, and the set's name."""
    if isinstance(name_or_path, str) and TASK_SET_NAME.fullmatch(name_or_path):
        for directory in filter(None, (library, BUILTIN_DIR)):
            if (Path(directory) / name_or_path).is_dir():
                return Path(directory) / name_or_path, name_or_path
        imported = library_task_set_names(Path(library)) if library else []
        available = ", ".join(sorted({*imported, *builtin_task_set_names()})) or "none"
        where = f" (imported sets are looked up in {library})" if library else ""
        raise TaskSetError(f"unknown task set {name_or_path!r}{where}; available: {available}")
    root = Path(name_or_path).resolve()
    if root.is_dir():
        return root, root.name
    if not root.is_file():
        raise TaskSetError(f"{name_or_path}: no such task set file or directory")
    if root.suffix not in TASK_FILE_SUFFIXES:
        raise TaskSetError(f"{root.name}: not a task file (expected {', '.join(TASK_FILE_SUFFIXES)})")
    return root, root.stem


def _records(root: Path) -> Iterator[Record]:
    """Raw task records of every task file in the set, with their locations, in load order."""
    if root.is_file():
        yield from _file_records(root, shown=root.name)
        return
    for path in sorted(root.iterdir()):
        if path.is_file() and path.suffix in TASK_FILE_SUFFIXES:
            yield from _file_records(path, shown=f"{root.name}/{path.name}")


def _file_records(path: Path, shown: str) -> Iterator[Record]:
    text = path.read_text(encoding="utf-8")
    records = _jsonl_records(text, shown) if path.suffix == ".jsonl" else _yaml_records(text, shown)
    for where, record in records:
        yield where, _with_repository_files(record, path.parent, where)


def _with_repository_files(record: object, base: Path, where: str) -> object:
    """A record's `repository: DIR` (relative to its task file) becomes its `files`: every
    file under DIR, so a repository task set can keep its repository as a real directory."""
    if not (isinstance(record, dict) and "repository" in record):
        return record
    record = dict(record)
    relative = record.pop("repository")
    root = (base / str(relative)).resolve()
    if not isinstance(relative, str) or not root.is_dir() or not root.is_relative_to(base.resolve()):
        raise TaskSetError(f"{where}: field 'repository': {relative!r} is not a directory beside the task file")
    if "files" in record:
        raise TaskSetError(f"{where}: fields 'repository' and 'files' both give the starting files; keep one")
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            try:
                files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise TaskSetError(f"{where}: field 'repository': {path} is not UTF-8 text") from None
    record["files"] = files
    return record


def _jsonl_records(text: str, shown: str) -> Iterator[Record]:
    # split("\n") rather than splitlines(): a JSON string may hold U+2028 and friends raw.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{shown}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise TaskSetError(f"{where}: malformed JSON: {err.msg} (column {err.colno})") from None
        yield where, record


def _yaml_records(text: str, shown: str) -> Iterator[Record]:
    # Composing the node tree alongside the data gives each task the line it starts on.
    loader = yaml.SafeLoader(text)
    try:
        document = loader.get_single_node()
        data = loader.construct_document(document) if document is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        reason = getattr(err, "problem", None) or err
        raise TaskSetError(f"{where}: malformed YAML: {reason}") from None
    finally:
        loader.dispose()
    if data is None:
        return
    if isinstance(data, dict) and list(data) == ["tasks"]:
        document = next(value for key, value in document.value if key.value == "tasks")
        data = data["tasks"]
    if not isinstance(data, list):
        raise TaskSetError(f"{shown}: expected a list of tasks, or a mapping whose only key is 'tasks'")
    for node, record in zip(document.value, data):
        yield f"{shown}:{node.start_mark.line + 1}", record


def _validate_all(records: Iterator[Record]) -> list[Task]:
    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for where, record in records:
        task = _validate(where, record)
        if task.id in first_seen:
            first = first_seen[task.id]
            raise TaskSetError(f"{where}: task {task.id!r}: duplicate id, first defined at {first}")
        first_seen[task.id] = where
        tasks.append(task)
    return tasks


def _validate(where: str, record: object) -> Task:
    try:
        return parse_task(record)
    except ValidationError as err:
        task_id = record.get("id") if isinstance(record, dict) else None
        prefix = f"{where}: task {task_id!r}" if isinstance(task_id, str) else where
        problems = [_describe(prefix, _field_path(error["loc"]), error["msg"]) for error in err.errors()]
        raise TaskSetError("\n".join(problems)) from None


def _field_path(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A location without the task kind's tag ("function", ...) that pydantic puts first."""
    return loc[1:] if loc and loc[0] in TASK_KINDS else loc


def _describe(prefix: str, loc: tuple[int | str, ...], reason: str) -> str:
    field = ".".join(str(part) for part in loc)
    return f"{prefix}: field {field!r}: {reason}" if field else f"{prefix}: {reason}"
