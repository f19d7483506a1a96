"""The Task contract: one programming problem with hidden tests.

A task file holds plain data (JSONL or YAML); `Task` validates it. The solution the model
writes becomes `solution.py` in the workspace; hidden tests import it and appear only at
grading time.
"""

from __future__ import annotations

import ast
import hashlib
import json
import keyword
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, computed_field, field_validator
from pydantic_core import PydanticCustomError

Difficulty = Literal["easy", "medium", "hard"]
Split = Literal["train", "eval"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")


class TaskLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float = Field(10.0, gt=0)
    cpu_s: int = Field(10, gt=0)
    memory_mb: int = Field(512, gt=0)
    pids: int = Field(64, gt=0)
    disk_mb: int = Field(64, gt=0)


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-/]+$")
    prompt: str = Field(min_length=1)
    entry_point: str = Field(min_length=1, description="function the tests call")
    solution_prefix: str = Field("", description="text solution.py starts with before the submission "
                                 "(HumanEval: the prompt, which the submission completes)")
    reference_solution: str = Field(min_length=1, description="a submission that passes")
    tests: str = Field(min_length=1, description="hidden test module (test_* functions)")
    files: dict[str, str] = Field(default_factory=dict, description="starting workspace")
    protected_paths: tuple[str, ...] = ()
    entry_command: str = "python3 -I -S /grader/run_tests.py"
    difficulty: Difficulty
    domain: str = "python-functions"
    family: str = Field(min_length=1, description="generator family, for per-family analytics")
    language: Literal["python"] = "python"
    limits: TaskLimits = Field(default_factory=TaskLimits)
    network: bool = False
    image: str = "host"
    split: Split

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

    def solution_file(self, submission: str) -> str:
        """The solution.py that grading runs for `submission`."""
        return self.solution_prefix + submission

    @field_validator("tests")
    @classmethod
    def _tests_define_test_functions(cls, source: str) -> str:
        if not any(name.startswith("test_") for name in _top_level_definitions(source)):
            raise _source_error("defines no top-level test_* function")
        return source

    @computed_field  # type: ignore[prop-decorator]
    @property
    def version(self) -> str:
        """Content hash: changes whenever anything the model or grader sees changes."""
        body = self.model_dump(exclude={"version"}, mode="json")
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _top_level_definitions(source: str) -> list[str]:
    """Names of the functions and classes a module defines at top level."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise _source_error(f"is not valid Python: {err.msg} (line {err.lineno})") from None
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in tree.body if isinstance(node, definitions)]


def _source_error(reason: str) -> PydanticCustomError:
    # A custom error keeps pydantic's "Value error, " prefix out of loader messages; the
    # reason travels as context because source snippets may contain braces.
    return PydanticCustomError("python_source", "{reason}", {"reason": reason})
