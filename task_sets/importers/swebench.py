"""SWE-bench format: instances (JSON list, JSONL or JSONL.gz) with instance_id, repo,
base_commit, patch, test_patch, problem_statement, FAIL_TO_PASS and PASS_TO_PASS, as in the
SWE-bench datasets (the test lists may be JSON-encoded strings, as there).

Each instance becomes a repository task:
- the starting files are the repository at `base_commit`, read with `git archive` from a clone
  in the repositories folder named like SWE-bench's own (`astropy/astropy` -> `astropy__astropy`);
  binary files and symlinks are left out (a task's files are text);
- the hidden tests are the files `test_patch` creates or changes, as it leaves them;
- the reference solution is the gold `patch`, checked to apply at import;
- the test command is the instance's `test_command` (or `test_cmd`), else `python3 -m pytest
  -q`, followed by the files of the test patch, as SWE-bench's harness runs them.
SWE-bench's Docker images (one per repository version) are not used: the tests run in
Crucible's sandbox image, so an instance whose dependencies it lacks fails `tasks validate`.
Only pytest node ids ("path.py::test") are understood; instances of other runners (Django's)
are rejected with that reason.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from functools import cache, partial
from pathlib import Path

from task_sets.importers.records import (
    Imported,
    ImportError_,
    ImportOptions,
    RecordError,
    collect,
    json_records,
)
from task_sets.patches import (
    PatchError,
    apply_patch,
    changed_paths,
    text_files_from_tar,
)
from task_sets.schema import Difficulty, RepositoryTask, TaskLimits

FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
DEFAULT_TEST_COMMAND = "python3 -m pytest -q"
MAX_REPOSITORY_BYTES = 64 << 20
# SWE-bench Verified's annotated time to fix, where the instance has one.
VERIFIED_DIFFICULTY: dict[str, Difficulty] = {"<15 min fix": "easy", "15 min - 1 hour": "medium"}
EASY_MAX_CHANGED_LINES, MEDIUM_MAX_CHANGED_LINES = 6, 30
LIMITS = TaskLimits(wall_s=300, cpu_s=300, memory_mb=2048, pids=256, disk_mb=1024)
REPOSITORY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*")
COMMIT = re.compile(r"[0-9a-f]{7,40}")  # never an option: git archive takes it as an argument
GIT_TIMEOUT_S = 120


def import_swebench(path: Path, options: ImportOptions) -> Imported:
    repos = options.repos or path.parent / "repos"
    if not repos.is_dir():
        raise ImportError_(f"{repos}: no such folder of repositories (give --repos DIR, holding a git clone "
                           "per repository named OWNER__NAME)")
    return collect(((where, partial(_fields, record, repos, options.name)) for where, record in json_records(path)),
                   RepositoryTask, options.split)


def _fields(record: object, repos: Path, name: str) -> dict:
    """The RepositoryTask fields of one instance (all but the split)."""
    if not isinstance(record, dict):
        raise RecordError(record if isinstance(record, str) else "expected a JSON object")
    missing = [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f].strip()]
    if missing:
        raise RecordError(f"missing or empty field(s): {', '.join(missing)}")
    instance = record["instance_id"]
    if not REPOSITORY.fullmatch(record["repo"]):
        raise RecordError(f"instance {instance!r}: repo {record['repo']!r} is not OWNER/NAME")
    if not COMMIT.fullmatch(record["base_commit"]):
        raise RecordError(f"instance {instance!r}: base_commit {record['base_commit']!r} is not a commit hash")
    command = record.get("test_command") or record.get("test_cmd") or DEFAULT_TEST_COMMAND
    if not isinstance(command, str):
        raise RecordError(f"instance {instance!r}: test_command must be a string")
    if not isinstance(record.get("difficulty", ""), str):
        raise RecordError(f"instance {instance!r}: difficulty must be a string")
    fail_to_pass, pass_to_pass = (_test_ids(record, key) for key in TEST_LISTS)
    if not fail_to_pass:
        raise RecordError(f"instance {instance!r}: FAIL_TO_PASS is empty")
    files = _snapshot(repos / record["repo"].replace("/", "__"), record["base_commit"])
    try:
        apply_patch(files, record["patch"])
        with_tests = apply_patch(files, record["test_patch"])
    except PatchError as e:
        raise RecordError(f"instance {instance!r}: a patch does not apply at {record['base_commit'][:12]}: {e}") from None
    hidden = {p: with_tests[p] for p in sorted(changed_paths(files, with_tests)) if p in with_tests}
    return {
        "id": f"{name}/{instance}", "kind": "repository", "prompt": record["problem_statement"], "files": files,
        "reference_solution": record["patch"], "hidden_tests": hidden, "fail_to_pass": fail_to_pass,
        "pass_to_pass": pass_to_pass, "test_command": " ".join([command, *map(shlex.quote, hidden)]),
        "protected_paths": tuple(hidden), "difficulty": _difficulty(record), "family": record["repo"],
        "base_commit": record["base_commit"], "limits": LIMITS,
    }


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
def _snapshot(clone: Path, commit: str) -> dict[str, str]:
    """The text files of `clone` at `commit` (cached: instances share base commits)."""
    if not (clone / ".git").exists() and not (clone / "HEAD").exists():
        raise RecordError(f"no git clone at {clone}")
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
    if len(archive) > MAX_REPOSITORY_BYTES:
        raise RecordError(f"{clone.name} at {commit[:12]} is larger than {MAX_REPOSITORY_BYTES >> 20} MiB")
    return text_files_from_tar(archive)


def _difficulty(record: dict) -> Difficulty:
    annotated = record.get("difficulty")
    if isinstance(annotated, str) and annotated:
        return VERIFIED_DIFFICULTY.get(annotated, "hard")
    changed = sum(line[:1] in "+-" and line[:3] not in ("+++", "---") for line in record["patch"].splitlines())
    if changed <= EASY_MAX_CHANGED_LINES:
        return "easy"
    return "medium" if changed <= MEDIUM_MAX_CHANGED_LINES else "hard"
