"""The Dagster instance every Crucible command shares: DAGSTER_HOME and its dagster.yaml.

DAGSTER_HOME defaults to ./.crucible/dagster. Crucible writes its dagster.yaml there from
pipelines/dagster.yaml (run queue, limits, monitoring), with run, event-log and schedule storage
in SQLite files beside it (the embedded default), or, when CRUCIBLE_POSTGRES_URL holds a libpq
URL, in that PostgreSQL database (pipelines/dagster-postgres.yaml): the instance several
machines, the daemon and the UI can share. The URL stays in the environment, never in the file.

A dagster.yaml Crucible did not write (it lacks the first line Crucible's have) is the
operator's own and is used as it is; one Crucible wrote follows the setting, so that setting or
unsetting CRUCIBLE_POSTGRES_URL switches the instance. Run history does not move between the
two: the datasets and checkpoints, which live in the storage root, do not depend on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pipelines.errors import UserError

POSTGRES_URL_ENV = "CRUCIBLE_POSTGRES_URL"
WRITTEN_BY = "# Written by Crucible (pipelines/instance.py): edit pipelines/dagster.yaml, or remove this line to keep your edits.\n"
# The first line of the copies Crucible made before it marked them (2026-12): also its own.
_EARLIER_FIRST_LINE = "# Instance settings for Crucible's embedded default;"
_TEMPLATES = Path(__file__).parent


def prepare_instance() -> Path:
    """Point DAGSTER_HOME at ./.crucible/dagster (unless set), give it Crucible's dagster.yaml
    for the current setting, and check that a Postgres instance answers."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".crucible/dagster").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    url = postgres_url()
    config, wanted = home / "dagster.yaml", instance_yaml(postgres=url is not None)
    if not config.exists() or _written_by_crucible(config) and config.read_text() != wanted:
        scratch = config.with_suffix(".yaml.tmp")
        scratch.write_text(wanted)
        scratch.replace(config)  # a UI starting now reads the old file or the new, never half of one
    if url is not None:
        check_postgres(url)
    return home


def instance_yaml(postgres: bool) -> str:
    text = WRITTEN_BY + (_TEMPLATES / "dagster.yaml").read_text()
    return text + "\n" + (_TEMPLATES / "dagster-postgres.yaml").read_text() if postgres else text


def postgres_url() -> str | None:
    """CRUCIBLE_POSTGRES_URL, checked to be a libpq URL; None when unset."""
    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname or not parts.path.strip("/"):
        raise UserError(f"{POSTGRES_URL_ENV} is not a libpq URL with a host and a database "
                        "(postgresql://user:password@host:5432/database)")
    return url


def check_postgres(url: str) -> None:
    """Connect once, so that a server that is down is one sentence before any run starts."""
    import psycopg2

    try:
        psycopg2.connect(url, connect_timeout=10).close()
    except psycopg2.OperationalError as error:
        reason = " ".join(str(error).split())
        raise UserError(f"the Postgres instance {_without_password(url)} ({POSTGRES_URL_ENV}) does not answer: "
                        f"{reason}") from None


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{user}{parts.hostname}{port}{parts.path}"


def _written_by_crucible(config: Path) -> bool:
    with config.open() as f:
        first = f.readline()
    return first == WRITTEN_BY or first.startswith(_EARLIER_FIRST_LINE)
