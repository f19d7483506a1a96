"""Build an environment of a named Python: a virtual environment of the host's interpreter of that
version, its requirements, and the repository's own set-up (its install, steps its published
specification runs first, downloads its tests need), run once in a local sandbox.

Why in a sandbox, with the tree at ENVIRONMENT_ROOT and the repository at /workspace: a virtual
environment and an editable install record absolute paths (scripts' `#!`, pyvenv.cfg, the
editable finder's path to /workspace/src), so they are made where every session will see them.
The sandbox has the host's network (the one thing this build needs that grading must not have:
it is the only isolation it gives up) and runs as the sandbox user, so a repository's setup.py
never runs as root on the host.

What the setup leaves in the repository that was not there (egg-info, version files, built
extensions) becomes the environment's workspace layer (WORKSPACE_LAYER); its edits to the
repository's own files shape the build only, since grading starts from the repository as
published. `pip freeze --all` is kept as LOCK: what exactly was installed.
"""

from __future__ import annotations

import io
import os
import shlex
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

from environments.interpreters import Interpreter
from environments.spec import LOCK, VENV, WHEELS, WORKSPACE_LAYER, EnvironmentSpec
from sandbox.base import WORKSPACE, Mount, SandboxUnavailable
from sandbox.local import LocalSandbox
from sandbox.spec import ENVIRONMENT_ROOT, Limits, SandboxSpec
from statuses import ExecStatus

BUILD_DIR = "/crucible-build"  # the build's own inputs, read-only: its script and requirements
PIP_CACHE = "/pip-cache"  # the store's pip cache, shared by builds (wheels built once)
LIMITS = Limits(wall_s=3600, cpu_s=3600, memory_mb=8192, pids=1024, disk_mb=16384, inodes=1 << 20,
                output_bytes=256 << 20, excerpt_bytes=64 << 10)
SKIPPED = ("__pycache__", ".pytest_cache")  # never part of a workspace layer
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's: what an egress proxy's CA is added to
# The host's settings for reaching the package index, passed to the build as they are.
INDEX_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "HTTP_PROXY",
                  "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
ERROR_LINE = ("ERROR", "Error", "error:", "fatal", "No such file", "not found", "Traceback")


class SetupError(RuntimeError):
    """The build's script failed; the message names the step and the line that says why."""


def build_virtualenv(spec: EnvironmentSpec, interpreter: Interpreter, staging: Path,
                     repository: Mapping[str, str | bytes], cache: Path, progress: Callable[[str], None]) -> dict:
    """Fill `staging` (the environment's root) and return what the record adds: the workspace
    layer's files and the interpreter used. SetupError names what failed, the sandbox's own
    failure (no bubblewrap, not root) included."""
    try:
        return _build(spec, interpreter, staging, repository, cache, progress)
    except (OSError, SandboxUnavailable) as e:
        raise SetupError(f"the build's sandbox failed: {e}") from None


def _build(spec: EnvironmentSpec, interpreter: Interpreter, staging: Path, repository: Mapping[str, str | bytes],
           cache: Path, progress: Callable[[str], None]) -> dict:
    sandbox_user = SandboxSpec().uid
    for path in (staging, cache):
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, sandbox_user, sandbox_user)
    with tempfile.TemporaryDirectory(prefix="crucible-build-") as inputs:
        (Path(inputs) / "requirements.txt").write_text("".join(f"{line}\n" for line in spec.python))
        (Path(inputs) / "lock.txt").write_text("".join(f"{line}\n" for line in spec.lock))
        (Path(inputs) / "wheels.txt").write_text("".join(f"{line}\n" for line in spec.wheels))
        (Path(inputs) / "build.sh").write_text(_script(spec, interpreter))
        Path(inputs).chmod(0o755)
        mounts = [Mount(staging, ENVIRONMENT_ROOT, writable=True), Mount(Path(inputs), BUILD_DIR),
                  Mount(cache, PIP_CACHE, writable=True)]
        sandbox = LocalSandbox(_build_spec(spec, interpreter))
        with sandbox.session(repository, mounts, supervised=False) as session:
            result = session.exec(["/bin/sh", f"{BUILD_DIR}/build.sh"],
                                  on_output=lambda stream, data: _show(data, progress))
            if result.status is not ExecStatus.OK:
                raise SetupError(_failure(result))
            layer = _new_files(session.snapshot(), repository)
    for path in [staging, *staging.rglob("*")]:
        os.lchown(path, 0, 0)
    for name, data in layer.items():
        target = staging / WORKSPACE_LAYER / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return {"interpreter": {"version": interpreter.version, "executable": str(interpreter.executable),
                            "prefix": str(interpreter.prefix)},
            "workspace_layer": sorted(layer), "locked": (staging / LOCK).read_text().splitlines()}


def pins(locked: list[str]) -> tuple[str, ...]:
    """The exact pins of a `pip freeze --all`: its name==version lines, without the repository's
    own editable install (a comment and `-e /workspace`) or anything installed from a path."""
    return tuple(line for line in locked if "==" in line and not line.startswith(("#", "-")) and " @ " not in line)


def _build_spec(spec: EnvironmentSpec, interpreter: Interpreter) -> SandboxSpec:
    defaults = dict(SandboxSpec().env)
    env = {**defaults, **spec.env, "HOME": "/tmp", "PIP_CACHE_DIR": PIP_CACHE, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1", "PIP_PROGRESS_BAR": "off"}
    env.pop("PYTHONDONTWRITEBYTECODE")  # the environment is read-only later: compile it now
    if os.path.isfile(SYSTEM_CA_BUNDLE):  # pip and downloads trust the host's authorities, not only certifi's
        env.update(PIP_CERT=SYSTEM_CA_BUNDLE, SSL_CERT_FILE=SYSTEM_CA_BUNDLE, REQUESTS_CA_BUNDLE=SYSTEM_CA_BUNDLE)
    env.update({name: os.environ[name] for name in INDEX_SETTINGS if name in os.environ})
    # The network is the point of a build, and the local backend can only share the host's.
    return SandboxSpec(interpreter=str(interpreter.prefix), network=True, limits=LIMITS,
                       env=tuple(env.items()), allow_weak_isolation=True)


def _script(spec: EnvironmentSpec, interpreter: Interpreter) -> str:
    """The build as one shell script: each step echoed as "+ step" before it runs (set -x), the
    first that fails ends it."""
    venv = f"{ENVIRONMENT_ROOT}/{VENV}"
    lines = ["set -eu", f"{shlex.quote(str(interpreter.executable))} -m venv {venv}", f". {venv}/bin/activate",
             "set -x",
             # The venv's own pip is as old as its Python (pip 18 on 3.6); pip 25 dropped the
             # `setup.py develop` fall-back that repositories of their time rely on for `pip install
             # -e .` (a build backend without PEP 660's hook). The newest pip below 25 that runs there.
             "python -m pip install --upgrade 'pip<25'"]
    if spec.lock:  # resolved once: exactly these, nothing resolved again
        lines.append(f"python -m pip install --no-deps -r {BUILD_DIR}/lock.txt")
    elif spec.python:
        lines.append(f"python -m pip install -r {BUILD_DIR}/requirements.txt")
    if spec.wheels:
        lines.append(f"python -m pip download --only-binary=:all: --dest {ENVIRONMENT_ROOT}/{WHEELS} "
                     f"-r {BUILD_DIR}/wheels.txt")
    lines += [f"cd {WORKSPACE}", *spec.setup, "set +x",
              f"python -m pip freeze --all > {ENVIRONMENT_ROOT}/{LOCK}"]
    return "\n".join(lines) + "\n"


def _show(data: bytes, progress: Callable[[str], None]) -> None:
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("+ ") or line.startswith(("Successfully installed", "ERROR")):
            progress(f"  {line[:200]}")


def _failure(result) -> str:
    """The step that failed (the last "+ " line) and the line of its output that says why."""
    if result.status is ExecStatus.TO:
        return f"the build took longer than {LIMITS.wall_s:g} s"
    output = f"{result.stdout}\n{result.stderr}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    steps = [line for line in lines if line.startswith("+ ")]
    step = steps[-1][2:] if steps else "creating the virtual environment"
    after = lines[lines.index(steps[-1]) + 1:] if steps else lines
    why = next((line for line in reversed(after) if line.startswith(ERROR_LINE) or "rror" in line),
               after[-1] if after else result.error or f"exit {result.exit_code}")
    return f"`{step}` failed: {why[:300]}"


def _new_files(snapshot: bytes, repository: Mapping[str, str | bytes]) -> dict[str, bytes]:
    """The regular files of the workspace that the repository did not have."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(snapshot)) as tar:
        for member in tar:
            path = PurePosixPath(member.name)
            if not member.isfile() or member.name in repository or any(part in SKIPPED for part in path.parts):
                continue
            found[member.name] = tar.extractfile(member).read()
    return found
