"""`transformers serve`: the transformers CLI's OpenAI-compatible server (FastAPI + uvicorn),
serving one checkpoint on CPU on a free port. Nobody on this project wrote it: it answers the
chat API with text alone (no token ids, no log-probs) and one choice per request."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests


@contextlib.contextmanager
def transformers_serve(checkpoint: Path, log: Path) -> Iterator[str]:
    """Yields the server's base URL once /health answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(checkpoint), "--host", "127.0.0.1",
               "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_healthy(server, url, log)
            yield url
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=20)
            server.kill()
            server.wait()


def _wait_until_healthy(server: subprocess.Popen, url: str, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"transformers serve exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"transformers serve did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")
