"""EnvironmentSpec: what a task's tests need installed, declared as data, identified by digest.

A task (or its set, in `environment.toml` beside the task files) declares:
- `python`: requirement lines as pip reads them (`numpy==1.26.4`; a lock's lines, hashes and
  all, make pip check every hash);
- `debian`: Debian packages;
- `files`: extra files, by path relative to the environment's root (ENVIRONMENT_ROOT inside the
  sandbox; CRUCIBLE_ENV names it), e.g. data the tests read;
- `env`: environment variables for every command;
- `python_path`: more directories on PYTHONPATH after the packages, e.g. /workspace/src where a
  repository keeps its own package under src/;
- `wheels`: requirement lines downloaded as wheels (with their dependencies) into `wheels/`
  under the root, for test commands that install at test time (`uvx --with pytest`, `pip
  install`) on a sandbox without the network: point them there (UV_FIND_LINKS, PIP_FIND_LINKS);
- `dockerfile` and `context`: the task's own Dockerfile (a Harbor task's environment/Dockerfile)
  and the files its COPY and ADD read: the Docker backend builds the image from it instead of
  from the sandbox base (its FROM must exist on the daemon); the local backend, which runs on
  this host, does not use it;
- `python_version` ("3.9"): the environment is a virtual environment of that Python (the host's
  interpreter of that version, environments/interpreters.py), at VENV under the root, first on
  PATH, so `python`, `python3`, `pip` and the scripts packages install are its own; `python`
  requirements go into it. Without it, packages are installed for the sandbox's own python3.
- `repository` and `setup` (with `python_version`): shell commands run once at build time, with
  the network, as the sandbox user, in a copy of the repository `repository` names
  ("OWNER/NAME@commit": the build is given its files), with the virtual environment active:
  the repository's own install (`pip install -e .`), steps the published specification runs
  before it, and downloads its tests would otherwise make at run time (prefetch). Files the
  setup creates in the repository (egg-info, generated version files, built extensions) are
  kept under WORKSPACE_LAYER and laid into every workspace of the task, under the repository's
  own files; its edits to the repository's own files shape the build only;
- `lock` (with `python_version`): the exact pins the requirements and the setup resolved to
  once (environments/build.py, `locked`): a build installs exactly these, without resolving
  again, so a build next month is the same build; `python` stays as declared, for the reader.
The digest is the SHA-256 of that declaration and of the build recipe's version: the same
spec always names the same built environment, and a changed spec (or recipe) a new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from environments.interpreters import minor_version
from sandbox.spec import ENVIRONMENT_ROOT

RECIPE_VERSION = 1  # bump when a build's result changes for the same spec
SITE_PACKAGES = "site-packages"  # under the root: pip's --target
WHEELS = "wheels"  # under the root: pip download's --dest
VENV = "venv"  # under the root: the virtual environment of `python_version`
WORKSPACE_LAYER = "workspace"  # under the root: the files `setup` created in the repository
LOCK = "requirements.lock"  # under the root: `pip freeze --all` of the virtual environment, after the build
BUILT = (SITE_PACKAGES, WHEELS, VENV, WORKSPACE_LAYER, LOCK)  # what a build writes under the root
# Fields added after digests were first published: left out of the digest while unset, so an
# environment declared before them keeps its digest (and its build).
LATER_FIELDS = ("python_version", "repository", "setup", "lock")
RESERVED_ENV = ("PATH", "PYTHONPATH", "HOME", "CRUCIBLE_ENV", "VIRTUAL_ENV")


class EnvironmentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    python: tuple[str, ...] = Field((), description="requirement lines, as in a requirements file or lock")
    debian: tuple[str, ...] = Field((), description="Debian package names")
    files: dict[str, str] = Field(default_factory=dict, description="files under the environment's root")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables")
    python_path: tuple[str, ...] = Field((), description="absolute directories on PYTHONPATH after the packages")
    wheels: tuple[str, ...] = Field((), description="requirement lines downloaded as wheels into <root>/wheels")
    dockerfile: str = Field("", description="the task's own Dockerfile, built on the Docker backend")
    context: dict[str, str] = Field(default_factory=dict, description="the files the Dockerfile's COPY and ADD read")
    python_version: str = Field("", description="a virtual environment of this Python (3.9); '': the sandbox's python3")
    repository: str = Field("", description="the repository `setup` runs in, as OWNER/NAME@commit")
    setup: tuple[str, ...] = Field((), description="shell commands run at build time in the repository, with the network")
    lock: tuple[str, ...] = Field((), description="exact pins (name==version) installed instead of resolving `python`")

    @field_validator("python_version")
    @classmethod
    def _a_version(cls, version: str) -> str:
        return minor_version(version) if version else version

    @model_validator(mode="after")
    def _setup_in_a_virtual_environment(self) -> EnvironmentSpec:
        if self.setup and not self.python_version:
            raise ValueError("setup runs in a virtual environment: give python_version")
        if self.lock and not self.python_version:
            raise ValueError("a lock is installed into a virtual environment: give python_version")
        if self.repository and not self.setup:
            raise ValueError("a repository is only given for setup to run in")
        return self

    @field_validator("python_path")
    @classmethod
    def _absolute(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not PurePosixPath(path).is_absolute() or ":" in path:
                raise ValueError(f"{path!r} must be an absolute directory (without ':')")
        return paths

    @field_validator("debian")
    @classmethod
    def _debian_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not name or not all(c.isalnum() or c in "+-.:" for c in name) or name.startswith("-"):
                raise ValueError(f"{name!r} is not a Debian package name")
        return names

    @field_validator("files")
    @classmethod
    def _files_inside(cls, files: dict[str, str]) -> dict[str, str]:
        for name in files:
            path = PurePosixPath(name)
            if not name or path.is_absolute() or ".." in path.parts or path.parts[0] in BUILT:
                raise ValueError(f"{name!r} must be a relative path under the environment's root, "
                                 f"outside {', '.join(f'{b}/' for b in BUILT)}")
        return files

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        taken = [name for name in env if name in RESERVED_ENV or not name.isidentifier()]
        if taken:
            raise ValueError(f"cannot set {', '.join(taken)}: the environment sets {', '.join(RESERVED_ENV)} itself")
        return env

    @property
    def digest(self) -> str:
        unset = {name for name in LATER_FIELDS if not getattr(self, name)}
        body = {"recipe": RECIPE_VERSION, **self.model_dump(mode="json", exclude=unset)}
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def short(self) -> str:
        return self.digest[:16]

    def sandbox_env(self) -> tuple[tuple[str, str], ...]:
        """What every command in this environment sees beside the sandbox's own variables."""
        packages = [] if self.python_version else [f"{ENVIRONMENT_ROOT}/{SITE_PACKAGES}"]
        python_path = ":".join([*packages, *self.python_path])
        venv = (("VIRTUAL_ENV", f"{ENVIRONMENT_ROOT}/{VENV}"),) if self.python_version else ()
        return (*((("PYTHONPATH", python_path),) if python_path else ()), ("CRUCIBLE_ENV", ENVIRONMENT_ROOT), *venv,
                *sorted(self.env.items()))

    def path_prefix(self) -> str:
        return f"{ENVIRONMENT_ROOT}/{VENV if self.python_version else SITE_PACKAGES}/bin"
