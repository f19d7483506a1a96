"""The Task contract: a programming problem with hidden tests, in one of two kinds.

- `FunctionTask` (kind "function", the default): the submission is Python source that becomes
  `solution.py`; hidden test functions import it through the built-in harness.
- `RepositoryTask` (kind "repository"): a starting repository, a task statement, and hidden
  tests split into tests that must start passing (`fail_to_pass`) and tests that must keep
  passing (`pass_to_pass`), run by the task's own test command (pytest, a test.sh). The
  submission is a unified diff against the repository.

A task file holds plain data (JSONL or YAML); `parse_task` validates one record into the kind
its `kind` field names.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import keyword
import re
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationInfo,
    computed_field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from environments.spec import EnvironmentSpec
from sandbox import python_ast
from sandbox.harness.session_files import MAX_SESSIONS

Difficulty = Literal["easy", "medium", "hard"]
Split = Literal["train", "eval"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")
# Files that steer a test runner: restored to the pristine repository before grading and, when
# a submission adds one anywhere, removed and flagged. A pattern without "/" matches a file
# name at any depth; one with "/" matches the whole path ("*" crosses directories).
RUNNER_CONFIGURATION = (
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
    "pyproject.toml", "sitecustomize.py", "usercustomize.py", "*.pth", "noxfile.py",
)
CI_FILES = (".github/*", ".gitlab-ci.yml", ".circleci/*", "Makefile")
WORKSPACE_DIR = "/workspace"
# Longer than any model's context window (about a million tokens): a prompt no policy can read.
MAX_PROMPT_CHARS = 4_000_000
# A function task's submission, as the hidden tests import it.
SOLUTION_FILE = "solution.py"
# A script line that fetches from the network: a task whose test script has one needs `network`
# (task_sets/importers/harbor.py), and a run of it that found no network failed for that reason
# (grading/diagnosis.py).
NETWORK_FETCH = re.compile(r"\b(curl|wget)\b|astral\.sh|\b(pip3?|uv) install\b|\buvx\b|\buv run\b|"
                           r"apt(-get)? (update|install)|\bnpm (install|ci)\b|git clone|urlopen|requests\.get")
SYSTEM_DIRS = ("/usr", "/etc", "/proc", "/dev", "/tmp", "/bin", "/sbin", "/lib", "/lib64", "/opt/crucible", "/report",
               "/tests", "/grader", "/logs", "/solution")


LATER_FIELDS = {"environment": None, "binary_files": {}, "workdir": WORKSPACE_DIR, "pytest_sessions": 1,
                "check_command": None}


class TaskLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float = Field(10.0, gt=0)
    cpu_s: int = Field(10, gt=0)
    memory_mb: int = Field(512, gt=0)
    pids: int = Field(64, gt=0)
    disk_mb: int = Field(64, gt=0)
    # Output beyond this kills a run (None: the sandbox's 1 MiB). A real repository's suite run
    # with -rA reports every passing test's captured logs: megabytes.
    output_mb: int | None = Field(None, gt=0)


class TaskBase(BaseModel):
    """What every task carries, whatever its kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-/]+$")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    files: dict[str, str] = Field(default_factory=dict, description="starting workspace")
    protected_paths: tuple[str, ...] = ()
    difficulty: Difficulty
    domain: str = "python-functions"
    family: str = Field(min_length=1, description="generator family, for per-family analytics")
    language: Literal["python"] = "python"
    limits: TaskLimits = Field(default_factory=TaskLimits)
    network: bool = False
    image: str = "host"
    environment: EnvironmentSpec | None = Field(None, description="what the tests need installed (environments/); "
                                                "None: the sandbox image as it is")
    split: Split
    check_command: str | None = Field(None, description="what the starting workspace runs to show what the tests "
                                      "expect (its visible tests); the warm-up's demonstrations run it before "
                                      "writing the fix")

    @field_validator("files")
    @classmethod
    def _files_stay_inside_the_workspace(cls, files: dict[str, str]) -> dict[str, str]:
        for name in files:
            _check_relative_path(name)
        return files

    @model_validator(mode="after")
    def _starting_files_fit_the_workspace(self) -> TaskBase:
        """The workspace is a filesystem of limits.disk_mb: starting files that do not fit it
        could never be written there, so no sample of the task could be graded."""
        size = self.starting_bytes()
        if size > self.limits.disk_mb << 20:
            raise PydanticCustomError("workspace_size", "{reason}", {"reason": (
                f"its starting files take {size / (1 << 20):.1f} MiB, more than its workspace holds "
                f"(limits.disk_mb = {self.limits.disk_mb}): raise limits.disk_mb or start from fewer files")})
        return self

    def starting_bytes(self) -> int:
        """What the starting files take in the workspace."""
        return sum(len(text.encode()) for text in self.files.values())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def version(self) -> str:
        """Content hash: changes whenever anything the model or grader sees changes."""
        # Fields added later count only when set, so versions computed before them still hold.
        unset = {name for name, absent in LATER_FIELDS.items() if getattr(self, name, absent) == absent}
        excluded: dict = {name: True for name in {"version", *unset}}
        if self.limits.output_mb is None:
            excluded["limits"] = {"output_mb": True}
        body = self.model_dump(exclude=excluded, mode="json")
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class FunctionTask(TaskBase):
    """Write a function; hidden test functions call it through the built-in harness."""

    kind: Literal["function"] = "function"
    entry_point: str = Field(min_length=1, description="function the tests call")
    solution_prefix: str = Field("", description="text solution.py starts with before the submission "
                                 "(HumanEval: the prompt, which the submission completes)")
    reference_solution: str = Field(min_length=1, description="a submission that passes")
    tests: str = Field(min_length=1, description="hidden test module (test_* functions)")
    entry_command: str = "python3 -I -S /grader/run_tests.py"

    @field_validator("entry_point")
    @classmethod
    def _entry_point_is_identifier(cls, name: str) -> str:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise _source_error(f"{name!r} is not a Python identifier")
        return name

    @field_validator("reference_solution")
    @classmethod
    def _reference_defines_entry_point(cls, source: str, info: ValidationInfo) -> str:
        entry_point = info.data.get("entry_point")  # absent when entry_point itself was invalid
        prefix = info.data.get("solution_prefix", "")
        if entry_point is not None and entry_point not in _top_level_definitions(prefix + source):
            raise _source_error(f"does not define {entry_point!r} at top level")
        return source

    @model_validator(mode="after")
    def _starting_solution_without_prefix(self) -> FunctionTask:
        # solution.py among the files is the module an episode starts from (a defect to fix, a
        # stub); a prefix would be put in front of whatever the policy writes over it.
        if "solution.py" in self.files and self.solution_prefix:
            raise PydanticCustomError("starting_solution", "{reason}", {"reason": "solution.py is among the starting "
                                      "files, so solution_prefix must be empty"})
        return self

    def solution_file(self, submission: str) -> str:
        """The solution.py that grading runs for `submission`."""
        return self.solution_prefix + submission

    @field_validator("tests")
    @classmethod
    def _tests_define_test_functions(cls, source: str) -> str:
        if not any(name.startswith("test_") for name in _top_level_definitions(source)):
            raise _source_error("defines no top-level test_* function")
        return source

class RepositoryTask(TaskBase):
    """Change a repository (several files if need be) so that `fail_to_pass` start passing and
    `pass_to_pass` keep passing. Test ids are pytest node ids relative to the directory the
    test command runs pytest from ("tests/test_cart.py::test_total" or
    "test_outputs.py::TestX::test_y")."""

    kind: Literal["repository"]
    reference_solution: str = Field(min_length=1, description="a unified diff that passes")
    binary_files: dict[str, str] = Field(default_factory=dict, description="files of the starting repository that "
                                         "are not UTF-8 text (fixtures, images), base64-encoded; a diff does not "
                                         "change them")
    hidden_tests: dict[str, str] = Field(default_factory=dict, description="test files written into the "
                                         "repository at grading, over whatever the submission left there")
    grader_files: dict[str, str] = Field(default_factory=dict, description="files shown read-only at /tests "
                                         "during grading only (a Harbor task's tests/ directory)")
    fail_to_pass: tuple[str, ...] = Field(min_length=1)
    pass_to_pass: tuple[str, ...] = ()
    test_command: str = Field(min_length=1, description="run in the repository root by /bin/sh")
    verdict_file: str | None = Field(None, description="where the test command writes its own verdict (a "
                                     "number, 1 = pass) instead of an exit code, e.g. /logs/verifier/reward.txt")
    base_commit: str | None = None
    pytest_sessions: int = Field(1, ge=1, le=MAX_SESSIONS, description="how many times the test command runs "
                                 "pytest (a Harbor test.sh running one session per test file): each is vouched for")
    workdir: str = Field(WORKSPACE_DIR, description="where the task's commands expect the repository (a Harbor "
                         "task's /app): the workspace is also seen there")
    domain: str = "python-repositories"

    @field_validator("workdir")
    @classmethod
    def _workdir_of_its_own(cls, path: str) -> str:
        pure = PurePosixPath(path)
        if not pure.is_absolute() or ".." in pure.parts or pure == PurePosixPath("/") or \
                any(pure.is_relative_to(d) or PurePosixPath(d).is_relative_to(pure) for d in SYSTEM_DIRS) or \
                (path != WORKSPACE_DIR and pure.is_relative_to(WORKSPACE_DIR)):
            raise PydanticCustomError("workdir", "{reason}", {"reason": f"{path!r} must be an absolute directory outside "
                                      f"{', '.join(SYSTEM_DIRS)} and the workspace"})
        return path

    def binary_contents(self) -> dict[str, bytes]:
        return {path: base64.b64decode(data) for path, data in self.binary_files.items()}

    def starting_bytes(self) -> int:
        return super().starting_bytes() + sum(len(data) * 3 // 4 for data in self.binary_files.values())

    @field_validator("hidden_tests", "grader_files", "binary_files")
    @classmethod
    def _test_files_are_relative(cls, files: dict[str, str]) -> dict[str, str]:
        for name in files:
            _check_relative_path(name)
        return files

    @field_validator("verdict_file")
    @classmethod
    def _verdict_file_has_a_folder_of_its_own(cls, path: str | None) -> str | None:
        if path is None:
            return path
        pure = PurePosixPath(path)
        taken = ("/workspace", "/report", "/tests", "/grader", "/tmp", "/dev", "/proc", "/usr", "/etc")
        if not pure.is_absolute() or ".." in pure.parts or len(pure.parts) < 3 or \
                any(pure.is_relative_to(t) for t in taken):
            raise PydanticCustomError("verdict_file", "{reason}", {"reason": f"{path!r} must be an absolute path "
                                      f"in a folder of its own, outside {', '.join(taken)}"})
        return path

    @field_validator("pass_to_pass")
    @classmethod
    def _test_ids_are_distinct(cls, pass_to_pass: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        fail_to_pass = info.data.get("fail_to_pass", ())
        overlap = set(pass_to_pass) & set(fail_to_pass)
        if overlap:
            raise PydanticCustomError("test_ids", "{reason}", {"reason": f"also in fail_to_pass: {sorted(overlap)}"})
        return _listed_once(pass_to_pass)

    @field_validator("fail_to_pass")
    @classmethod
    def _fail_to_pass_listed_once(cls, fail_to_pass: tuple[str, ...]) -> tuple[str, ...]:
        return _listed_once(fail_to_pass)

    @property
    def expected_tests(self) -> tuple[str, ...]:
        return self.fail_to_pass + self.pass_to_pass

    @property
    def guarded_paths(self) -> tuple[str, ...]:
        """Patterns a submission may not change: the task's own, runner configuration, CI."""
        return (*self.protected_paths, *RUNNER_CONFIGURATION, *CI_FILES)


TASK_KINDS = ("function", "repository")


def _task_kind(record: object) -> object:
    # An unknown kind is passed through, so that pydantic names the kinds it accepts.
    return record.get("kind", "function") if isinstance(record, dict) else getattr(record, "kind", "function")


Task = Annotated[
    Annotated[FunctionTask, Tag("function")] | Annotated[RepositoryTask, Tag("repository")],
    Discriminator(_task_kind, custom_error_type="task_kind",
                  custom_error_message=f"kind must be one of {', '.join(map(repr, TASK_KINDS))}"),
]
_TASK = TypeAdapter(Task)


def parse_task(record: object) -> FunctionTask | RepositoryTask:
    """Validate one task record into its kind (a record without `kind` is a function task)."""
    return _TASK.validate_python(record)


def _listed_once(test_ids: tuple[str, ...]) -> tuple[str, ...]:
    repeated = sorted({t for t in test_ids if test_ids.count(t) > 1})
    if repeated:
        raise PydanticCustomError("test_ids", "{reason}", {"reason": f"listed twice: {repeated}"})
    return test_ids


def _check_relative_path(name: str) -> None:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or name.endswith("/"):
        raise PydanticCustomError("file_path", "{reason}", {"reason": f"{name!r} is not a relative file path "
                                                            "inside the repository"})


def _top_level_definitions(source: str) -> list[str]:
    """Names of the functions and classes a module defines at top level."""
    try:
        tree = python_ast.parse(source)
    except SyntaxError as err:
        raise _source_error(f"is not valid Python: {err.msg} (line {err.lineno})") from None
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in tree.body if isinstance(node, definitions)]


def _source_error(reason: str) -> PydanticCustomError:
    # A custom error keeps pydantic's "Value error, " prefix out of loader messages; the
    # reason travels as context because source snippets may contain braces.
    return PydanticCustomError("python_source", "{reason}", {"reason": reason})
