"""What the tests that start a real server (dagster dev, transformers serve) share: a free port,
and waiting until the server answers, failing with its log if it exits or never does."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_answering(server: subprocess.Popen, name: str, answers: Callable[[], bool], log: Path,
                         timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"{name} exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            if answers():
                return
        time.sleep(0.5)
    pytest.fail(f"{name} did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")
