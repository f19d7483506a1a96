"""SWE-bench format: instances (JSON list, JSONL or JSONL.gz) with instance_id, repo,
base_commit, patch, test_patch, problem_statement, FAIL_TO_PASS and PASS_TO_PASS, as in the
SWE-bench datasets (the test lists may be JSON-encoded strings, as there).

Each instance becomes a repository task:
- the starting files are the repository at `base_commit`, from the repositories folder: a git
  clone named like SWE-bench's own (`astropy/astropy` -> `astropy__astropy/`, read with `git
  archive`), or a snapshot of exactly that commit (`astropy__astropy-<base_commit>.tar.xz`, .gz or
  .tar, as `git archive` writes it) for a machine without the clones; binary files (fixtures,
  images) are kept as the task's `binary_files`, symlinks are left out;
- the hidden tests are the files `test_patch` creates or changes, as it leaves them;
- the reference solution is the gold `patch`, checked to apply at import;
- the environment is derived from SWE-bench's published specification of the instance's
  repository and `version` (swebench_specs.py: its Python, requirements, pre-install steps and
  the repository's own install, run once at build time), with a user's specifications given as
  --specs over the published ones; an instance the specification does not cover, or whose Python
  this host does not have ("needs Python 3.5; available: 3.9, 3.11"), is refused with that
  sentence, never run in an environment it was not made for;
- the test command is the specification's, followed by the Python files of the test patch, as
  SWE-bench's harness runs them (its data files, a config.toml say, are hidden tests too, never
  arguments).
FAIL_TO_PASS and PASS_TO_PASS are kept as published, including the ids SWE-bench's log parser
cut at their first whitespace (`test_make_error[required-Missing`): the grader matches those as
SWE-bench effectively does (docs/grading.md, rule 4). Only pytest node ids ("path.py::test")
are understood; instances of other runners (Django's) are rejected with that reason.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import lzma
import re
import shlex
import subprocess
import tarfile
from functools import cache, partial
from pathlib import Path

from environments import interpreters
from task_sets.importers.records import (
    Imported,
    ImportError_,
    ImportOptions,
    RecordError,
    collect,
    json_records,
)
from task_sets.importers.swebench_specs import SpecRefused, Table, derive, load_specs
from task_sets.patches import (
    PatchError,
    apply_patch,
    changed_paths,
    files_from_tar,
)
from task_sets.schema import Difficulty, RepositoryTask, TaskLimits

FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
SNAPSHOT_SUFFIXES = (".tar.xz", ".tar.gz", ".tar")
MAX_REPOSITORY_BYTES = 64 << 20
# SWE-bench Verified's annotated time to fix, where the instance has one.
VERIFIED_DIFFICULTY: dict[str, Difficulty] = {"<15 min fix": "easy", "15 min - 1 hour": "medium"}
EASY_MAX_CHANGED_LINES, MEDIUM_MAX_CHANGED_LINES = 6, 30
LIMITS = TaskLimits(wall_s=300, cpu_s=300, memory_mb=2048, pids=256, disk_mb=1024, output_mb=64)
REPOSITORY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*")
COMMIT = re.compile(r"[0-9a-f]{7,40}")  # never an option: git archive takes it as an argument
GIT_TIMEOUT_S = 120


def import_swebench(path: Path, options: ImportOptions) -> Imported:
    repos = options.repos or path.parent / "repos"
    if not repos.is_dir():
        raise ImportError_(f"{repos}: no such folder of repositories (give --repos DIR, holding a git clone "
                           "per repository named OWNER__NAME, or snapshots OWNER__NAME-<commit>.tar.xz)")
    table, notes = specifications(options.specs), set()
    imported = collect(((where, partial(_fields, record, repos, options.name, table, notes))
                        for where, record in json_records(path)), RepositoryTask, options.split)
    imported.warnings += sorted(notes)
    return imported


def specifications(extra: Path | None) -> Table:
    """SWE-bench's published table, with a user's file of specifications over it: JSON in the
    table's own shape, {"OWNER/NAME": {"VERSION": {"python": "3.9", "install": ..., ...}}}."""
    table = load_specs()
    if extra is None:
        return table
    try:
        document = json.loads(extra.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImportError_(f"--specs {extra}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ImportError_(f"{extra}: malformed JSON: {e}") from None
    if not isinstance(document, dict) or not all(isinstance(v, dict) and all(isinstance(s, dict) for s in v.values())
                                                 for v in document.values()):
        raise ImportError_(f"{extra}: expected {{\"OWNER/NAME\": {{\"VERSION\": {{specification}}}}}}")
    for repo, versions in document.items():
        for version, spec in versions.items():
            problem = _spec_problem(spec)
            if problem:
                raise ImportError_(f"{extra}: [{repo!r}][{version!r}]: {problem}")
    specs = {repo: dict(versions) for repo, versions in table.specs.items()}
    for repo, versions in document.items():
        specs.setdefault(repo, {}).update(versions)
    return dataclasses.replace(table, specs=specs)


SPEC_STRINGS = ("python", "packages", "install", "test_cmd")
SPEC_LISTS = ("pip_packages", "pre_install", "eval_commands")


def _spec_problem(spec: dict) -> str | None:
    """Why a user's specification cannot be read (None when it can): the fields SWE-bench's
    table has, of the types it gives them."""
    if not isinstance(spec.get("python"), str):
        return "needs \"python\", the Python version as a string (\"3.9\")"
    for name in SPEC_STRINGS:
        if name in spec and not isinstance(spec[name], str):
            return f"{name!r} must be a string"
    for name in SPEC_LISTS:
        if name in spec and not (isinstance(spec[name], list) and all(isinstance(v, str) for v in spec[name])):
            return f"{name!r} must be a list of strings"
    return None


def _fields(record: object, repos: Path, name: str, table: Table, notes: set[str]) -> dict:
    """The RepositoryTask fields of one instance (all but the split)."""
    if not isinstance(record, dict):
        raise RecordError(record if isinstance(record, str) else "expected a JSON object")
    if record.get("image_name") and not record.get("test_patch"):
        raise RecordError(f"instance {record.get('instance_id')!r} is a SWE-smith instance (its patch introduces "
                          f"the bug, its environment is the image {record['image_name']}), which this importer "
                          "does not read: it imports SWE-bench's format")
    missing = [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f].strip()]
    if missing:
        raise RecordError(f"missing or empty field(s): {', '.join(missing)}")
    instance = record["instance_id"]
    if not REPOSITORY.fullmatch(record["repo"]):
        raise RecordError(f"instance {instance!r}: repo {record['repo']!r} is not OWNER/NAME")
    if not COMMIT.fullmatch(record["base_commit"]):
        raise RecordError(f"instance {instance!r}: base_commit {record['base_commit']!r} is not a commit hash")
    if not isinstance(record.get("difficulty", ""), str):
        raise RecordError(f"instance {instance!r}: difficulty must be a string")
    fail_to_pass, pass_to_pass = (_test_ids(record, key) for key in TEST_LISTS)
    if not fail_to_pass:
        raise RecordError(f"instance {instance!r}: FAIL_TO_PASS is empty")
    files, binary = _snapshot(repos, record["repo"].replace("/", "__"), record["base_commit"])
    environment, command = _environment(record, files, table, notes)
    try:
        apply_patch(files, record["patch"])
        with_tests = apply_patch(files, record["test_patch"])
    except PatchError as e:
        raise RecordError(f"instance {instance!r}: a patch does not apply at {record['base_commit'][:12]}: {e}") from None
    hidden = {p: with_tests[p] for p in sorted(changed_paths(files, with_tests)) if p in with_tests}
    return {
        "id": f"{name}/{instance}", "kind": "repository", "prompt": record["problem_statement"], "files": files,
        "reference_solution": record["patch"], "hidden_tests": hidden, "fail_to_pass": fail_to_pass,
        "pass_to_pass": pass_to_pass, "test_command": " ".join([command, *(shlex.quote(p) for p in hidden if p.endswith(".py"))]),
        "protected_paths": tuple(hidden), "difficulty": _difficulty(record), "family": record["repo"],
        "base_commit": record["base_commit"], "limits": LIMITS,
        "binary_files": {path: base64.b64encode(data).decode() for path, data in sorted(binary.items())},
        "environment": environment,
    }


def _environment(record: dict, files: dict[str, str], table: Table, notes: set[str]) -> tuple[dict, str]:
    """The instance's environment, derived from its repository's published specification and
    set up in the repository at its base commit, and the test command; refused where the
    specification does not cover it or this host lacks its Python."""
    instance, version = record["instance_id"], str(record.get("version", ""))
    try:
        derived = derive(record["repo"], version, files, table)
        interpreters.find(derived.environment["python_version"])
    except (SpecRefused, interpreters.NoInterpreter) as e:
        raise RecordError(f"instance {instance!r}: {e}") from None
    notes.update(f"{record['repo']} {version}: {note}" for note in derived.notes)
    # The repository comes without its git history: setuptools-scm, which reads the version from
    # git tags (pytest's, say), is told the instance's version instead.
    env = {"SETUPTOOLS_SCM_PRETEND_VERSION": version, **derived.environment["env"]}
    environment = {**derived.environment, "env": env}
    if environment["setup"]:  # run in the repository at its base commit
        environment["repository"] = f"{record['repo']}@{record['base_commit']}"
    return environment, derived.test_command


def _test_ids(record: dict, key: str) -> tuple[str, ...]:
    value = record.get(key, [])
    if isinstance(value, str):  # the SWE-bench datasets store the lists JSON-encoded
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RecordError(f"{key} is neither a list nor a JSON-encoded list") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise RecordError(f"{key} must be a list of test ids")
    foreign = [t for t in value if "::" not in t]
    if foreign:
        raise RecordError(f"{key} has ids that are not pytest node ids (e.g. {foreign[0]!r}); "
                          "only pytest-based instances import")
    return tuple(value)


@cache
def _snapshot(repos: Path, name: str, commit: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """The text and binary files of repository `name` at `commit`, from its clone or its
    snapshot of that commit (cached: instances share base commits)."""
    for suffix in SNAPSHOT_SUFFIXES:
        snapshot = repos / f"{name}-{commit}{suffix}"
        if snapshot.is_file():
            return _files(snapshot.read_bytes() if suffix == ".tar" else _decompress(snapshot), f"{snapshot.name}")
    clone = repos / name
    if not (clone / ".git").exists() and not (clone / "HEAD").exists():
        raise RecordError(f"no git clone at {clone}, and no snapshot {name}-{commit}.tar.xz beside it")
    try:
        archive = subprocess.run(["git", "-C", str(clone), "archive", "--format=tar", commit],
                                 capture_output=True, check=True, timeout=GIT_TIMEOUT_S).stdout
    except subprocess.CalledProcessError as e:
        raise RecordError(f"{clone.name}: cannot read commit {commit[:12]}: "
                          f"{e.stderr.decode(errors='replace').strip()}") from None
    except subprocess.TimeoutExpired:
        raise RecordError(f"{clone.name}: git archive took longer than {GIT_TIMEOUT_S} s") from None
    except FileNotFoundError:
        raise ImportError_("importing SWE-bench instances needs git on the PATH") from None
    return _files(archive, f"{clone.name} at {commit[:12]}")


def _decompress(snapshot: Path) -> bytes:
    opener = lzma.open if snapshot.name.endswith(".xz") else gzip.open
    try:
        with opener(snapshot) as f:
            return f.read(MAX_REPOSITORY_BYTES + 1)
    except (OSError, lzma.LZMAError, EOFError) as e:
        raise RecordError(f"{snapshot.name}: cannot read: {e}") from None


def _files(archive: bytes, shown: str) -> tuple[dict[str, str], dict[str, bytes]]:
    if len(archive) > MAX_REPOSITORY_BYTES:
        raise RecordError(f"{shown} is larger than {MAX_REPOSITORY_BYTES >> 20} MiB")
    try:
        return files_from_tar(archive)
    except tarfile.TarError as e:
        raise RecordError(f"{shown}: not a tar archive: {e}") from None


def _difficulty(record: dict) -> Difficulty:
    annotated = record.get("difficulty")
    if isinstance(annotated, str) and annotated:
        return VERIFIED_DIFFICULTY.get(annotated, "hard")
    changed = sum(line[:1] in "+-" and line[:3] not in ("+++", "---") for line in record["patch"].splitlines())
    if changed <= EASY_MAX_CHANGED_LINES:
        return "easy"
    return "medium" if changed <= MEDIUM_MAX_CHANGED_LINES else "hard"
