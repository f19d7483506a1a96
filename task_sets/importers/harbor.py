"""Harbor format (Terminal-Bench's successor): task directories with instruction.md, task.toml,
environment/, solution/solve.sh and tests/test.sh. PATH is one task directory or a directory
of them.

Each task becomes a repository task:
- the prompt is instruction.md; difficulty, category and limits come from task.toml
  ([metadata] difficulty, category; [verifier] timeout_sec; [environment] memory_mb,
  storage_mb, docker_image);
- the starting workspace is environment/ without its Dockerfile and compose files; the Docker
  backend builds the task's Dockerfile (environment/ is its context) when its base image is on
  the daemon, and otherwise says which base is missing, or runs the task's prebuilt
  docker_image; the local backend runs it on this host; the workspace is also seen at the task's working directory, as Harbor runs
  its commands there ([environment] workdir, else the Dockerfile's last WORKDIR: /app in most
  tasks), so solve.sh and tests that name /app/... find it;
- grading runs `bash /tests/test.sh` with tests/ shown read-only at /tests and its verdict read
  from /logs/verifier/reward.txt, as Harbor's verifier does; the expected tests are the
  `def test*` functions of tests/test_*.py, as node ids relative to /tests;
- the reference solution is the diff solution/solve.sh makes: the importer runs it in a local
  sandbox session over the starting workspace and records what changed.
- the verdict is reward.json where test.sh writes one (every metric >= 1 is a pass), else
  reward.txt; the other file is never read, so code under test cannot plant it; [environment] allow_internet gives the task the network.
A test.sh that fetches its tools from the network (curl, uv, pip, apt-get) in a task without
the network cannot run here: the import says so, naming the line, and grading it is an
environment error (network_unavailable or missing_command), never a failure of the submission.
"""

from __future__ import annotations

import re
import tempfile
import tomllib
from functools import partial
from pathlib import Path

from pydantic import ValidationError

from sandbox.base import Mount, SandboxUnavailable
from sandbox.harness.run_tests import test_names
from sandbox.harness.session_files import MAX_SESSIONS
from sandbox.local import LocalSandbox
from sandbox.spec import Limits, SandboxSpec
from task_sets.importers.records import (
    Imported,
    ImportError_,
    ImportOptions,
    RecordError,
    collect,
)
from task_sets.patches import make_patch, text_files_from_tar
from task_sets.schema import DIFFICULTIES, NETWORK_FETCH, WORKSPACE_DIR, RepositoryTask, TaskLimits

VERDICT_FILE = "/logs/verifier/reward.txt"
VERDICT_JSON = "/logs/verifier/reward.json"
TEST_COMMAND = "bash /tests/test.sh"
NOT_WORKSPACE = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml", "compose.yaml", ".dockerignore")
SOLVE_TIMEOUT_S = 120
PYTEST_RUN = re.compile(r"(?<![\w.=-])(py\.test|pytest)(?![\w.=-])")  # a command, not `--with pytest==8.4.1`


def import_harbor(path: Path, options: ImportOptions) -> Imported:
    if not path.is_dir():
        raise ImportError_(f"{path}: not a directory (a Harbor task directory, or a directory of them)")
    task_dirs = [path] if (path / "task.toml").exists() else sorted(p for p in path.iterdir() if p.is_dir())
    warnings: list[str] = []
    imported = collect(((d.name, partial(_fields, d, options.name, warnings)) for d in task_dirs), RepositoryTask,
                       options.split)
    imported.warnings += warnings
    return imported


def _fields(task_dir: Path, name: str, warnings: list[str]) -> dict:
    config = _config(task_dir)
    prompt = _text(task_dir / "instruction.md")
    tests = _tree(task_dir / "tests")
    if "test.sh" not in tests:
        raise RecordError("tests/test.sh is missing")
    expected = tuple(f"{file}::{test}" for file, source in sorted(tests.items())
                     if file.startswith("test_") and file.endswith(".py") for test in _test_names(file, source))
    if not expected:
        raise RecordError("tests/ defines no test function (tests/test_*.py with def test_*)")
    environment_dir = _tree(task_dir / "environment")
    workspace = {p: text for p, text in environment_dir.items() if p not in NOT_WORKSPACE}
    limits = _limits(config)
    metadata, environment = config.get("metadata", {}), config.get("environment", {})
    category = str(metadata.get("category") or "harbor")
    workdir = str(environment.get("workdir") or _last_workdir(environment_dir.get("Dockerfile", "")) or WORKSPACE_DIR)
    network = bool(environment.get("allow_internet", False))
    fetches = _network_line(tests["test.sh"])
    if fetches and not network:
        warnings.append(f"{task_dir.name}: tests/test.sh fetches from the network (line {fetches[0]}: {fetches[1]}) "
                        "and the task allows none: grading it will be an environment error until its environment "
                        "provides what it fetches")
    fields = {
        "id": f"{name}/{task_dir.name}", "kind": "repository", "prompt": prompt, "files": workspace,
        "reference_solution": _reference_diff(task_dir, workspace, limits, workdir), "grader_files": tests,
        "workdir": workdir, "network": network, "pytest_sessions": _pytest_runs(tests["test.sh"]),
        "fail_to_pass": expected, "test_command": TEST_COMMAND,
        # The verdict test.sh writes: reward.json (one number per metric) where it writes one, as Harbor reads it.
        "verdict_file": VERDICT_JSON if "reward.json" in tests["test.sh"] else VERDICT_FILE,
        "difficulty": metadata.get("difficulty") if metadata.get("difficulty") in DIFFICULTIES else "medium",
        "domain": category, "family": category, "limits": limits,
    }
    if environment.get("docker_image"):  # a prebuilt image, as Harbor uses it instead of building
        fields["image"] = str(environment["docker_image"])
    elif environment_dir.get("Dockerfile"):
        context = {p: text for p, text in environment_dir.items() if p != "Dockerfile"}
        fields["environment"] = {"dockerfile": environment_dir["Dockerfile"], "context": context}
    return fields


def _config(task_dir: Path) -> dict:
    try:
        config = tomllib.loads(_text(task_dir / "task.toml"))
    except tomllib.TOMLDecodeError as e:
        raise RecordError(f"task.toml: malformed TOML: {e}") from None
    for section in ("metadata", "verifier", "environment"):
        if not isinstance(config.get(section, {}), dict):
            raise RecordError(f"task.toml: [{section}] must be a table")
    return config


def _limits(config: dict) -> TaskLimits:
    verifier, environment = config.get("verifier", {}), config.get("environment", {})
    try:
        return TaskLimits(
            wall_s=float(verifier.get("timeout_sec", 120.0)), cpu_s=int(float(verifier.get("timeout_sec", 120.0))),
            memory_mb=int(environment.get("memory_mb", 1024)), pids=256,
            disk_mb=min(int(environment.get("storage_mb", 512)), 4096),
        )
    except (TypeError, ValueError, OverflowError, ValidationError) as e:
        raise RecordError(f"task.toml: bad limits: {e}") from None


def _last_workdir(dockerfile: str) -> str | None:
    """The Dockerfile's last absolute WORKDIR (where Harbor's commands run)."""
    found = [line.split(None, 1)[1].strip() for line in dockerfile.splitlines()
             if line.strip().upper().startswith("WORKDIR ") and len(line.split(None, 1)) == 2]
    return found[-1] if found and found[-1].startswith("/") and "$" not in found[-1] else None


def _pytest_runs(script: str) -> int:
    """How many times a test.sh starts pytest (each time it names it as a command), 1 at least."""
    runs = sum(len(PYTEST_RUN.findall(line)) for line in script.splitlines() if not line.lstrip().startswith("#"))
    return min(max(runs, 1), MAX_SESSIONS)


def _network_line(script: str) -> tuple[int, str] | None:
    """The first line of a script that fetches from the network, with its number."""
    for number, line in enumerate(script.splitlines(), start=1):
        if not line.lstrip().startswith("#") and NETWORK_FETCH.search(line):
            return number, line.strip()[:120]
    return None


def _reference_diff(task_dir: Path, workspace: dict[str, str], limits: TaskLimits, workdir: str) -> str:
    """What solution/solve.sh changes in the workspace, run in a local sandbox session."""
    solution = _tree(task_dir / "solution")
    if "solve.sh" not in solution:
        raise RecordError("solution/solve.sh is missing: without a reference the task cannot be validated")
    spec = SandboxSpec(limits=Limits(wall_s=SOLVE_TIMEOUT_S, cpu_s=SOLVE_TIMEOUT_S, memory_mb=limits.memory_mb,
                                     pids=limits.pids, disk_mb=limits.disk_mb),
                       workspace_alias="" if workdir == WORKSPACE_DIR else workdir)
    try:
        sandbox = LocalSandbox(spec)
    except SandboxUnavailable as e:
        raise ImportError_(f"importing Harbor tasks runs their solution/solve.sh in the local sandbox, "
                           f"which is unavailable: {e}") from None
    with tempfile.TemporaryDirectory(prefix="crucible-harbor-", dir=sandbox.scratch_dir) as tmp:
        for file, text in solution.items():
            (Path(tmp) / file).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / file).write_text(text)
        Path(tmp).chmod(0o755)
        for path in Path(tmp).rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        with sandbox.session(workspace, [Mount(Path(tmp), "/solution")]) as session:
            result = session.exec(["bash", "/solution/solve.sh"])
            if not result.ok:
                tail = (result.stderr or result.stdout or result.error or "").strip()[-300:]
                raise RecordError(f"solution/solve.sh failed ({result.status.value}, exit {result.exit_code}): {tail}")
            solved = text_files_from_tar(session.snapshot())
    diff = make_patch(workspace, solved)
    if not diff:
        raise RecordError("solution/solve.sh changes no file in the workspace")
    return diff


def _test_names(file: str, source: str) -> list[str]:
    try:
        return test_names(source, file)
    except SyntaxError as e:
        raise RecordError(f"tests/{file} does not parse: {e.msg} (line {e.lineno})") from None


def _tree(directory: Path) -> dict[str, str]:
    """The text files under `directory` by relative path ({} if it does not exist)."""
    if not directory.is_dir():
        return {}
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[path.relative_to(directory).as_posix()] = _text(path, directory.parent)
    return files


def _text(path: Path, root: Path | None = None) -> str:
    shown = path.relative_to(root).as_posix() if root else path.name
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{shown} is missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{shown}: cannot read as UTF-8 text: {e}") from None
