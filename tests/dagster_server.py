"""`dagster dev` (the UI's web server and the daemon, as `crucible ui` starts them) on a free port,
for the tests that drive Crucible as an operator does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import requests
from servers import free_port, wait_until_answering

ROOT = Path(__file__).parent.parent


@contextlib.contextmanager
def dagster_dev(environment: dict[str, str], log: Path) -> Iterator[str]:
    """Yields the server's base URL once its GraphQL endpoint answers."""
    port = free_port()
    with open(log, "w") as out:
        # A session of its own: the web server and the daemon it starts go down with it.
        server = subprocess.Popen([sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
                                   "-p", str(port)], cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_answering(server, "dagster dev", lambda: requests.post(
                f"{url}/graphql", json={"query": "{ version }"}, timeout=2).ok, log)
            yield url
        finally:
            _stop_group(server)


def _stop_group(server: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # whatever outlived the polite request
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()
