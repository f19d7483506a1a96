"""Sandbox backends for the tests: every backend-neutral test runs once per backend, and the
local backend three times: its one-shot `run`, its supervised sessions (`local-session`) and
its `run` forked by warm workers (`local-warm`).

A backend that cannot run on this host is skipped loudly: the reason goes into the skip and a
banner at the end of the run. Where CRUCIBLE_REQUIRE_BACKENDS names it (CI sets
"local,docker,browser,postgres"; `browser` is the UI test's Chromium, `postgres` the server
scripts/postgres-server starts), it is a failure instead.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import functools
import os
import re
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sandbox.base import NO_TREES, SandboxUnavailable, run_once
from sandbox.spec import Limits, SandboxSpec

BACKENDS = ("local", "local-session", "local-warm", "docker")
REQUIRED = {b for b in os.environ.get("CRUCIBLE_REQUIRE_BACKENDS", "").split(",") if b}
UNTESTED = re.compile(r"Skipped: (\S+) (?:sandbox backend|test dependency) unavailable: (.*)")
# The server `make test` starts (scripts/postgres-server); its role may create databases.
POSTGRES_SERVER = os.environ.get("CRUCIBLE_TEST_POSTGRES_URL", "postgresql://crucible:crucible@127.0.0.1:5433/crucible")


@functools.cache
def unavailable(backend: str) -> str | None:
    """Why `backend` cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (bwrap without a user namespace, cgroups, mounts, the Docker socket)"
    try:
        if backend.startswith("local"):
            from sandbox.local import LocalSandbox

            LocalSandbox()
        else:
            from sandbox.docker import DockerSandbox

            DockerSandbox()
    except SandboxUnavailable as e:
        return str(e)
    return None


def require(backend: str) -> None:
    reason = unavailable(backend)
    if reason is not None:
        skip_unless_required(backend, reason)


def skip_unless_required(backend: str, reason: str) -> None:
    """Skip, loudly, what this host cannot test of `backend` (a sandbox backend, or `browser` for
    the UI); fail where it is required."""
    kind = "sandbox backend" if backend in BACKENDS else "test dependency"
    if backend in REQUIRED:
        pytest.fail(f"the {backend} {kind} is required here (CRUCIBLE_REQUIRE_BACKENDS) but: {reason}")
    pytest.skip(f"{backend} {kind} unavailable: {reason}")


@pytest.fixture
def local_backend() -> None:
    """For tests that run the local sandbox directly."""
    require("local")


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's workers (the suite runs on `-n 2`) set COLUMNS=80 and LINES=24: the commands
    a test runs print as they do when piped (commands/console.py), not at 80 columns."""
    if hasattr(config, "workerinput"):
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers: a test not marked `unit` is `integration` (it may start a process, a server, a
    sandbox or a Dagster run); `slow` ones (whole runs) are marked in their modules."""
    for item in items:
        if item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def unit_tests_start_no_process(request, monkeypatch) -> None:
    """Keeps the `unit` tier what it says: a unit test (its body and its function-scoped fixtures)
    that starts a process fails, naming how. Every way Python starts one ends in one of these."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refused(how: str):
        def start(*args, **options):
            raise AssertionError(f"a unit test starts no process, but this one called {how}{args[:2]!r}: "
                                 "leave it unmarked (integration)")
        return start

    monkeypatch.setattr(_posixsubprocess, "fork_exec", refused("fork_exec"))  # multiprocessing's spawn
    monkeypatch.setattr(subprocess, "_fork_exec", refused("subprocess"))  # its own reference to fork_exec
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
        monkeypatch.setattr(os, name, refused(f"os.{name}"))


def pytest_terminal_summary(terminalreporter):
    """Name each backend the run could not test. Read from the skip reports, which reach the
    controlling process also when pytest-xdist's workers ran the tests."""
    untested = dict(match.groups() for report in terminalreporter.stats.get("skipped", [])
                    if isinstance(report.longrepr, tuple) and (match := UNTESTED.match(report.longrepr[2])))
    if not untested:
        return
    terminalreporter.write_sep("!", "BACKENDS NOT TESTED ON THIS HOST", red=True, bold=True)
    for backend, reason in untested.items():
        terminalreporter.write_line(f"  {backend}: {reason}", red=True)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    require(request.param)
    return request.param


@pytest.fixture(params=("local", "docker"))
def backend_name(request) -> str:
    """A backend as users name it (CLI, settings)."""
    require(request.param)
    return request.param


@pytest.fixture
def make_sandbox(backend, tmp_path):
    """Factory of sandboxes of the current backend with their own scratch space (and cgroup
    parent or container label); at teardown, asserts that they left nothing behind."""
    made = []
    token = secrets.token_hex(4)

    def make(**limits):
        spec = SandboxSpec(limits=Limits(**{"wall_s": 5.0, **limits}))
        scratch = Path(tempfile.mkdtemp(prefix="scratch", dir=tmp_path))  # pools call this from threads
        if backend.startswith("local"):
            from sandbox.local import LocalSandbox

            sb = LocalSandbox(spec, scratch_dir=scratch, cgroup_parent=f"crucible-test-{token}",
                              warm_workers=backend == "local-warm")
            if backend == "local-session":
                sb = ThroughSessions(sb)
        else:
            from sandbox.docker import DockerSandbox

            sb = DockerSandbox(spec, scratch_dir=scratch, labels={"crucible.test": token})
        made.append(sb)
        return sb

    yield make
    for sb in made:
        if hasattr(sb, "close"):
            sb.close()  # its warm workers
        assert residue(sb) == [], "the sandbox left things behind"


class ThroughSessions:
    """The local backend with `run` going through a full (supervised) session, the path agents
    take, instead of the one-shot sandbox; everything else is the sandbox itself."""

    def __init__(self, sandbox):
        self._sandbox = sandbox

    def __getattr__(self, name):
        return getattr(self._sandbox, name)

    def run(self, command, files, mounts=(), protected=(), trees=NO_TREES):
        return run_once(self._sandbox, command, files, mounts, protected, trees=trees)


def residue(sb) -> list[str]:
    """Everything of `sb`'s sessions still on the host: files, mounts, cgroups, containers."""
    left = [str(p) for p in sb.scratch_dir.iterdir()]
    left += [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
             if str(sb.scratch_dir) in line]
    if sb.name == "local":
        host = sb.cgroup_host
        parents = {p for p in (host.memory_parent, host.pids_parent) if p} if host else set()
        cgroups = [str(d) for p in parents if p.exists() for d in p.iterdir() if d.is_dir()]
        if not cgroups:
            for parent in parents:
                if parent.exists():
                    parent.rmdir()
        left += cgroups
    else:
        left += [c.name for c in sb.containers(**{"crucible.test": sb.labels["crucible.test"]})]
    return left


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS) for the whole session, on free ports, with its own directory."""
    from datastore.seaweedfs import seaweedfs

    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def s3_root(s3_server, monkeypatch) -> str:
    """A fresh prefix in the test bucket, with the AWS variables pointing this process at it."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3_server.bucket}/{secrets.token_hex(6)}"


@pytest.fixture(params=("local", "s3"))
def storage_root(request, tmp_path) -> str:
    """A storage root on the local disk, then on the S3 server."""
    return str(tmp_path / "data") if request.param == "local" else request.getfixturevalue("s3_root")


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The URL of a real PostgreSQL server, or a loud skip (a failure where it is required)."""
    import psycopg2

    try:
        psycopg2.connect(POSTGRES_SERVER, connect_timeout=5).close()
    except psycopg2.OperationalError as e:
        skip_unless_required("postgres", f"no PostgreSQL server answers at {POSTGRES_SERVER} "
                                         f"(scripts/postgres-server starts one): {' '.join(str(e).split())}")
    return POSTGRES_SERVER


@contextlib.contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A database of its own on `server` for one instance, dropped afterwards (connections too)."""
    import psycopg2

    name = f"crucible_test_{secrets.token_hex(6)}"
    admin = psycopg2.connect(server)
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlsplit(server)._replace(path=f"/{name}").geturl()
        finally:
            with admin.cursor() as cursor:
                cursor.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        admin.close()


@pytest.fixture
def postgres_url(postgres_server) -> Iterator[str]:
    with fresh_database(postgres_server) as url:
        yield url


@pytest.fixture(scope="session")
def project_image() -> str:
    """The project's image (Dockerfile), built from this working tree once a session; its tag."""
    require("docker")
    built = subprocess.run([Path(__file__).parent.parent / "scripts" / "build-project-image"], capture_output=True,
                           text=True, timeout=1200)
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.split()[-1]
