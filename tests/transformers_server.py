"""`transformers serve`: the transformers CLI's OpenAI-compatible server (FastAPI + uvicorn),
serving one checkpoint on CPU on a free port. Nobody on this project wrote it: it answers the
chat API with text alone (no token ids, no log-probs) and one choice per request."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import requests
from servers import free_port, wait_until_answering


@contextlib.contextmanager
def transformers_serve(checkpoint: Path, log: Path) -> Iterator[str]:
    """Yields the server's base URL once /health answers."""
    port = free_port()
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(checkpoint), "--host", "127.0.0.1",
               "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_answering(server, "transformers serve",
                                 lambda: requests.get(f"{url}/health", timeout=2).status_code == 200, log)
            yield url
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=20)
            server.kill()
            server.wait()
