"""Crucible's deployment settings: one typed object, read once, passed down as values.

Each field is read from its CRUCIBLE_<FIELD> environment variable, else from the optional TOML
file CRUCIBLE_SETTINGS names (default ./.crucible/settings.toml; the same names, lower case),
else it has its default. The CLI builds it (a command's --storage over both) and so do the Dagster
definitions, and pass its values down: no library module reads a setting from the environment. A
process this one starts (the daemon, a run's container) gets them back as variables
(`environment()`), relative paths made absolute.

Other tools' conventions stay theirs: DOCKER_HOST, torchrun's rank variables, DAGSTER_HOME, and
the API key variable an inference server's settings name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from commands.errors import UserError
from sandbox.docker_hosts import DockerHost, parse_hosts

PREFIX = "CRUCIBLE_"
FILE_VARIABLE = "CRUCIBLE_SETTINGS"
BACKEND_HELP = "sandbox backend (default: the sandbox setting, CRUCIBLE_SANDBOX, else local)"
DEFAULT_HOME = Path(".crucible")

TrainClient = Literal["subprocess", "docker", "kubernetes"]  # where the training jobs run: assets/training_step.py


class Settings(BaseSettings):
    """Where this deployment keeps things and how it runs them."""

    # Unknown CRUCIBLE_* variables are ignored (some are tests'); an unknown key in the file is a typo.
    model_config = SettingsConfigDict(env_prefix=PREFIX, frozen=True, extra="forbid")

    storage_root: str = Field(str(DEFAULT_HOME / "data"), description="datasets: a directory or any fsspec URI (s3://…)")
    checkpoint_root: str = Field(str(DEFAULT_HOME / "checkpoints"), description="checkpoints: a local directory")
    task_sets: str = Field(str(DEFAULT_HOME / "task_sets"), description="the imported task-set library (task_sets/loader.py)")
    environments: str = Field(str(DEFAULT_HOME / "environments"),
                              description="built task environments, by digest (environments/store.py)")
    sandbox: Literal["local", "docker"] = Field("local", description="the sandbox backend (sandbox/backends.py)")
    docker_hosts: str = Field("", description="the docker backend's daemons, URL=CAPACITY,… (sandbox/docker_hosts.py); "
                                              "empty: DOCKER_HOST's alone")
    train_launcher: str = Field("", description="what launches the training step's module: empty is this Python; e.g. "
                                                "'torchrun --standalone --nproc-per-node 8'")
    train_client: TrainClient = Field(
        "subprocess", description="where the training step runs (assets/training_step.py)")
    train_pod_template: str = Field("", description="the kubernetes training step's PodTemplate file (assets/training_pod.py)")
    train_image: str = Field("", description="the docker (or kubernetes) training step's image "
                                             "(scripts/build-project-image prints its tag)")
    train_gpus: int = Field(0, ge=-1, description="GPUs the docker training step asks its daemon for (-1: all)")
    step_processes: int = Field(1, ge=1, description="processes a run's steps may use at once (pipelines/executors.py)")
    grading_shards: int = Field(1, ge=1, description="slices of an iteration's rollouts graded by steps of their own "
                                                     "(assets/verification.py)")
    postgres_url: str = Field("", description="the instance's database, a libpq URL (pipelines/instance.py); "
                                              "empty: SQLite files in DAGSTER_HOME")
    run_launcher: Literal["process", "docker"] = Field(
        "process", description="where the daemon launches runs: a process each, or a container each "
                               "(pipelines/docker_run_launcher.py)")
    run_image: str = Field("", description="the docker run launcher's image (scripts/build-project-image prints its tag)")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, **_: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=settings_file())

    @field_validator("storage_root", "checkpoint_root", "task_sets", "environments")
    @classmethod
    def _absolute(cls, value: str) -> str:
        """Relative paths are this working directory's, wherever a process that is given them starts."""
        return value if "://" in value else str(Path(value).resolve())

    @field_validator("docker_hosts")
    @classmethod
    def _hosts_parse(cls, value: str) -> str:
        if value.strip():
            parse_hosts(value)  # its ValueError names the variable and the entry that is wrong
        return value.strip()

    @field_validator("postgres_url")
    @classmethod
    def _libpq(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if value.strip() and (parts.scheme not in ("postgresql", "postgres") or not parts.hostname
                              or not parts.path.strip("/")):
            raise ValueError("not a libpq URL with a host and a database (postgresql://user:password@host:5432/database)")
        return value.strip()

    @model_validator(mode="after")
    def _complete(self) -> Settings:
        if self.train_client == "docker" and not self.train_image:
            raise ValueError("CRUCIBLE_TRAIN_CLIENT=docker needs CRUCIBLE_TRAIN_IMAGE: the tag scripts/build-project-image "
                             "prints")
        if self.train_client == "kubernetes" and not self.train_pod_template:
            raise ValueError("CRUCIBLE_TRAIN_CLIENT=kubernetes needs CRUCIBLE_TRAIN_POD_TEMPLATE: a PodTemplate file "
                             "such as deploy/kubernetes/training-step.yaml")
        if self.run_launcher == "docker" and not self.run_image:
            raise ValueError("CRUCIBLE_RUN_LAUNCHER=docker needs CRUCIBLE_RUN_IMAGE: the tag scripts/build-project-image "
                             "prints")
        return self

    def environment(self) -> dict[str, str]:
        """These settings as the variables a process started from this one reads them from (the
        unset ones too, so that a file's or this command's values are the ones it sees)."""
        values = {f"{PREFIX}{name.upper()}": str(value) for name, value in self.model_dump().items()}
        return {**values, FILE_VARIABLE: str(settings_file().resolve())}  # the same file, wherever it starts


def settings_file() -> Path:
    return Path(os.environ.get(FILE_VARIABLE) or DEFAULT_HOME / "settings.toml")


def sandbox_hosts(settings: Settings) -> tuple[DockerHost, ...]:
    """The docker backend's daemons the settings list (none: open_sandbox uses DOCKER_HOST's)."""
    return parse_hosts(settings.docker_hosts) if settings.docker_hosts else ()


def load_settings(**given: str | None) -> Settings:
    """The settings, with a command's own options (those given) over the environment and the file;
    what is wrong, one line per setting."""
    try:
        return Settings(**{name: value for name, value in given.items() if value is not None})
    except ValidationError as error:
        raise UserError("\n".join(_problem(problem) for problem in error.errors())) from None


def settings_for(args: object) -> Settings:
    """A command's settings: its --storage (where it has one) over the environment and the file."""
    return load_settings(storage_root=getattr(args, "storage", None))


def _problem(problem: dict) -> str:
    message = str(problem["msg"]).removeprefix("Value error, ")
    if not problem["loc"]:  # a rule across settings: its message names them
        return message
    field = str(problem["loc"][0])
    if problem["type"] == "extra_forbidden":  # only the file can name a field that does not exist
        return f"{settings_file()}: {field!r} is not a setting; the settings are {', '.join(Settings.model_fields)}"
    if problem["type"] == "literal_error":
        message = f"choose one of {', '.join(get_args(Settings.model_fields[field].annotation))}"
    variable = f"{PREFIX}{field.upper()}"
    if message.startswith(variable):  # a message that names its setting already
        return message
    return f"{variable}={problem['input']!r}: {message}"
