"""`crucible sandbox exec` as a user runs it: a subprocess, JSON on stdout, exit status."""

from __future__ import annotations

import json
import subprocess
import sys

from patience import PATIENCE_S


def crucible(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, timeout=PATIENCE_S)


def test_exec_prints_the_result_as_json(backend_name, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello from', __name__)")
    done = crucible("sandbox", "exec", "--backend", backend_name, "--file", str(script), "--", "python3", "hello.py")
    result = json.loads(done.stdout)
    assert (done.returncode, result["status"], result["stdout"], result["backend"]) == (
        0, "OK", "hello from __main__\n", backend_name)


def test_exec_limits_come_from_the_options(backend_name):
    done = crucible("sandbox", "exec", "--backend", backend_name, "--timeout", "0.5", "--", "sleep", "30")
    assert (done.returncode, json.loads(done.stdout)["status"]) == (1, "TO")


def test_exec_without_a_command_is_a_clear_error():
    done = crucible("sandbox", "exec", "--backend", "local")
    assert done.returncode == 2 and "no command given" in done.stderr and "Traceback" not in done.stderr
