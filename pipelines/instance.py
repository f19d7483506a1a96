"""The Dagster instance every Crucible command shares: DAGSTER_HOME and its dagster.yaml.

DAGSTER_HOME defaults to ./.crucible/dagster. Crucible writes its dagster.yaml there from
pipelines/dagster.yaml (run queue, limits, monitoring), with run, event-log and schedule storage
in SQLite files beside it (the embedded default), or, when CRUCIBLE_POSTGRES_URL holds a libpq
URL, in that PostgreSQL database (pipelines/dagster-postgres.yaml): the instance several
machines, the daemon and the UI can share. The URL stays in the environment, never in the file.
Every run is queued; the daemon launches each in a run worker process on its machine, or, with
CRUCIBLE_RUN_LAUNCHER=docker, in a container of CRUCIBLE_RUN_IMAGE (pipelines/dagster-docker.yaml).

A dagster.yaml Crucible did not write (it lacks the first line Crucible's have) is the
operator's own and is used as it is. One Crucible wrote is brought up to date with the template,
but never switched between SQLite and Postgres, or between run launchers, by a command whose
environment differs: a shell without the URL beside a UI with it would split the runs (and the
pools) between two instances, and one without the launcher would launch in a process
what the daemon launches in containers. To switch, remove the file. Run history does not move between
SQLite and Postgres; the datasets and checkpoints, in the storage root, do not depend on it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from assets.pools import POOLS
from commands.errors import UserError
from commands.settings import Settings, load_settings

POSTGRES_URL_ENV = "CRUCIBLE_POSTGRES_URL"  # Dagster reads the URL from here: dagster.yaml names the variable
RUN_LAUNCHER_ENV, RUN_IMAGE_ENV = "CRUCIBLE_RUN_LAUNCHER", "CRUCIBLE_RUN_IMAGE"
MARK = "# Written by Crucible"
INITIALIZED = ".initialized"  # in DAGSTER_HOME, per storage and pools: its tables and the pools exist
WRITTEN_BY = f"{MARK} (pipelines/instance.py): edit pipelines/dagster.yaml, or remove this line to keep your edits.\n"
_TEMPLATES = Path(__file__).parent


def prepare_instance(settings: Settings | None = None) -> Path:
    """Point DAGSTER_HOME at ./.crucible/dagster (unless set), give it Crucible's dagster.yaml
    for the settings (these, or those of the environment), and check that a Postgres instance answers."""
    settings = settings or load_settings()
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".crucible/dagster").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    url, launcher = settings.postgres_url or None, settings.run_launcher
    if url is not None:  # from the settings file, perhaps: Dagster, in this process, reads it here
        os.environ[POSTGRES_URL_ENV] = url
    config, wanted = home / "dagster.yaml", instance_yaml(postgres=url is not None, docker=launcher == "docker")
    current = config.read_text() if config.exists() else None
    if current is None or current.startswith(MARK) and current != wanted:
        if current is not None and _keeps_runs_in_postgres(current) != (url is not None):
            raise UserError(_switch_refused(config, url is not None))
        if current is not None and _launches_in_docker(current) != (launcher == "docker"):
            raise UserError(_launcher_switch_refused(config, launcher))
        _write_atomically(config, wanted)
    if url is not None:
        check_postgres(url)
    # Named for the storage (its password left out: the name is on disk for anyone to read).
    storage = _without_password(url) if url else "sqlite"
    marker = home / f"{INITIALIZED}-{hashlib.sha256(' '.join((storage, *POOLS)).encode()).hexdigest()[:12]}"
    if not marker.exists():
        _initialize(home, marker)
    return home


def _initialize(home: Path, marker: Path) -> None:
    """Dagster creates an instance's tables when it is first opened, and a pool's slots when a
    step first claims one: two processes doing either at once (a UI and a `crucible run` started
    together, two runs' first steps of a pool) collide ("table runs already exists", a unique
    violation on the pool's limit) and one fails. One process at a time does both here, once per
    DAGSTER_HOME, and never resets a pool limit an operator set."""
    from dagster import DagsterInstance

    with (home / ".create-tables.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return
        with DagsterInstance.get() as instance:  # opening it is what creates the tables
            storage = instance.event_log_storage
            limited = {limit.name for limit in storage.get_pool_limits()}
            for pool in set(POOLS) - limited:
                storage.initialize_concurrency_limit_to_default(pool)
        marker.touch()


def _keeps_runs_in_postgres(config_text: str) -> bool:
    return "postgres" in ((yaml.safe_load(config_text) or {}).get("storage") or {})


def _switch_refused(config: Path, postgres: bool) -> str:
    if postgres:
        return (f"the instance in {config.parent} keeps its runs in SQLite files, and {POSTGRES_URL_ENV} is set: "
                f"unset it, or remove {config} to move this DAGSTER_HOME to Postgres")
    return (f"the instance in {config.parent} keeps its runs in Postgres, and {POSTGRES_URL_ENV} is not set here: "
            f"export it as the UI and daemon have it, or remove {config} to move this DAGSTER_HOME to SQLite")


def _launches_in_docker(config_text: str) -> bool:
    return "docker" in str(((yaml.safe_load(config_text) or {}).get("run_launcher") or {}).get("module", ""))


def _launcher_switch_refused(config: Path, launcher: str) -> str:
    """A shell without the setting beside a daemon with it would launch in a process what the
    daemon launches in containers, on the same instance."""
    if launcher == "docker":
        return (f"the instance in {config.parent} launches its runs in processes on this machine, and "
                f"{RUN_LAUNCHER_ENV}=docker is set: unset it, or remove {config} to launch runs in containers")
    return (f"the instance in {config.parent} launches its runs in Docker containers, and {RUN_LAUNCHER_ENV} is not "
            f"docker here: export it (and {RUN_IMAGE_ENV}) as the UI and daemon have it, or remove {config}")


def _write_atomically(config: Path, text: str) -> None:
    """A UI starting now reads the old file or the new, never half of one; two commands writing
    at once each rename a whole file of their own."""
    handle, scratch = tempfile.mkstemp(dir=config.parent, prefix=".dagster.yaml.")
    with os.fdopen(handle, "w") as f:
        f.write(text)
    os.replace(scratch, config)


def instance_yaml(postgres: bool, docker: bool = False) -> str:
    parts = ["dagster.yaml"] + ["dagster-postgres.yaml"] * postgres + ["dagster-docker.yaml"] * docker
    return WRITTEN_BY + "\n".join((_TEMPLATES / part).read_text() for part in parts)


def check_postgres(url: str) -> None:
    """Connect once, so that a server that is down is one sentence before any run starts."""
    import psycopg2

    try:
        psycopg2.connect(url, connect_timeout=10).close()
    except psycopg2.Error as error:  # down, refused, a wrong password or an unknown parameter
        reason = " ".join(str(error).split())
        raise UserError(f"the Postgres instance {_without_password(url)} ({POSTGRES_URL_ENV}) does not answer: "
                        f"{reason}") from None


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    user, _, where = parts.netloc.rpartition("@")
    return f"{parts.scheme}://{user.split(':')[0] + '@' if user else ''}{where}{parts.path}"
