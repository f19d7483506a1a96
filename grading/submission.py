"""Grade a submission for a task, whatever its kind, in a fresh sandbox built from the pristine
task files plus the submission; then score it with the task set's reward function.

- Function task: `solution.py` (the task's prefix plus the submission) beside the task's files;
  the hidden tests run through the built-in harness.
- Repository task: the submission is a unified diff, applied on the host to the pristine
  repository. Protected paths are restored and hidden tests written in (grading/protection.py),
  then the task's test command runs in the sandbox. A diff that does not apply is a scored 0
  without a sandbox run (its ExecResult is the failed `git apply`).
"""

from __future__ import annotations

import ast
import dataclasses
import shlex
import time
from pathlib import Path, PurePosixPath

from environments.spec import EnvironmentSpec
from environments.store import EnvironmentStore, image_tag
from grading.diagnosis import Diagnosis, site_packages
from grading.protection import guard
from grading.rewards import ONE_TURN, Process, apply_reward
from grading.verdict import GradeResult, grade, grade_test_command
from sandbox import python_ast
from sandbox.backends import open_sandbox
from sandbox.base import Sandbox
from sandbox.result import ExecResult
from sandbox.spec import Limits, SandboxSpec
from statuses import ExecStatus, FailureReason, Outcome, RewardStatus
from task_sets.patches import PatchError, apply_patch, changed_paths
from task_sets.rewards import DEFAULT, RewardFunction
from task_sets.schema import SOLUTION_FILE, WORKSPACE_DIR, FunctionTask, RepositoryTask, Task

HIDDEN_TESTS_FILE = "test_hidden.py"


def sandbox_spec(task: Task, store: EnvironmentStore | None = None) -> SandboxSpec:
    """How `task` runs: its limits and network, in its environment where it declares one (the
    Docker image built for it, or on the local backend its built tree from `store`, which such a
    task needs)."""
    limits = task.limits
    environment = task.environment
    defaults = SandboxSpec()
    if environment and store is None:
        raise ValueError(f"task {task.id} declares an environment: give the store it is built in")
    built = store.get(environment.digest) if environment else None
    return SandboxSpec(
        image=image_tag(environment.digest) if environment else task.image,
        overlay=str(store.path(environment.digest)) if environment else "",
        interpreter=built.interpreter_prefix if built else "",
        env=_with_environment(defaults.env, environment),
        workspace_alias=_workspace_alias(task),
        network=task.network,
        limits=Limits(
            wall_s=limits.wall_s,
            cpu_s=limits.cpu_s,
            memory_mb=limits.memory_mb,
            pids=limits.pids,
            disk_mb=limits.disk_mb,
            **({"output_bytes": limits.output_mb << 20} if limits.output_mb else {}),
        ),
    )


def repository_files(task: RepositoryTask, spec: SandboxSpec) -> dict[str, str | bytes]:
    """What a repository task's workspace starts with in the sandbox `spec` runs: the files its
    environment's setup made (an editable install's metadata, generated version files), then
    the repository's own files over them."""
    built = EnvironmentStore(Path(spec.overlay).parent).get(Path(spec.overlay).name) if spec.overlay else None
    return {**(built.workspace_layer() if built else {}), **task.binary_contents(), **task.files}


def _environment_modules(spec: SandboxSpec) -> list[str]:
    """The top-level modules of the built environment the sandbox runs (its site-packages)."""
    return [path.name.split(".", 1)[0] for site in site_packages(spec.overlay) for path in site.iterdir()
            if not path.name.endswith((".dist-info", ".pth"))]


def _import_roots(task: RepositoryTask) -> tuple[str, ...]:
    """The repository's root and the folders of it its environment puts on PYTHONPATH."""
    paths = task.environment.python_path if task.environment else ()
    inside = (PurePosixPath(p).relative_to(WORKSPACE_DIR) for p in paths if PurePosixPath(p).is_relative_to(WORKSPACE_DIR))
    return ("", *(str(p) for p in inside if str(p) != "."))


def _workspace_alias(task: Task) -> str:
    """A repository task's own working directory, where it differs from the workspace."""
    workdir = task.workdir if isinstance(task, RepositoryTask) else WORKSPACE_DIR
    return "" if workdir == WORKSPACE_DIR else workdir


def _with_environment(env: tuple[tuple[str, str], ...], environment: EnvironmentSpec | None
                      ) -> tuple[tuple[str, str], ...]:
    if environment is None:
        return env
    path = dict(env)["PATH"]
    return (*((k, v) for k, v in env if k != "PATH"), ("PATH", f"{environment.path_prefix()}:{path}"),
            *environment.sandbox_env())


def grade_solution(
    task: Task, solution: str, sandbox: Sandbox | None = None, reward: RewardFunction = DEFAULT,
    process: Process = ONE_TURN,
) -> GradeResult:
    """Grade in a fresh session of `sandbox` (which must run `sandbox_spec(task)`; default: a
    local one); the hidden tests exist only inside this grading run."""
    sandbox = sandbox or open_sandbox("local", sandbox_spec(task))
    if isinstance(task, RepositoryTask):
        return _grade_repository(task, solution, sandbox, reward, process)
    return _grade_function(task, solution, sandbox, reward, process)


def _grade_function(
    task: FunctionTask, solution: str, sandbox: Sandbox, reward: RewardFunction, process: Process,
) -> GradeResult:
    source = task.solution_file(solution)
    workspace = {**task.files, SOLUTION_FILE: source}
    graded = grade(sandbox, workspace, {HIDDEN_TESTS_FILE: task.tests}, command=shlex.split(task.entry_command))
    return apply_reward(reward, graded, compiles=_defines(source, task.entry_point), code=[source], process=process)


def _grade_repository(
    task: RepositoryTask, diff: str, sandbox: Sandbox, reward: RewardFunction, process: Process,
) -> GradeResult:
    started = time.monotonic()
    try:
        submitted = apply_patch(task.files, diff)
    except PatchError as e:
        return apply_reward(reward, _not_applied(task, sandbox, str(e), time.monotonic() - started), compiles=False,
                            process=process)
    guarded = guard(task.files, submitted, task.guarded_paths, task.hidden_tests, _import_roots(task),
                    _environment_modules(sandbox.spec))
    changed = changed_paths(task.files, submitted)
    # Under the submitted tree: what the environment's setup made and the binary files, never the
    # repository's text files again (a file the submission deleted stays deleted).
    beneath = {path: content for path, content in repository_files(task, sandbox.spec).items() if path not in task.files}
    graded = grade_test_command(
        sandbox, {**beneath, **guarded.files}, task.expected_tests, task.test_command, grader_files=task.grader_files,
        verdict_file=task.verdict_file, tamper_flags=guarded.tamper_flags, sealed=guarded.sealed,
        changed=changed, repository=task.files.keys(), pytest_sessions=task.pytest_sessions,
    )
    if guarded.touched:
        graded.messages["_protected"] = "restored before grading: " + ", ".join(guarded.touched)
    graded = _repository_progress(graded, task)
    edited = [submitted[path] for path in sorted(changed) if path.endswith(".py") and path in submitted]
    compiles = bool(changed) and all(_parses(source) for source in edited)
    return apply_reward(reward, graded, compiles=compiles, code=edited, process=process)


def _repository_progress(graded: GradeResult, task: RepositoryTask) -> GradeResult:
    """For a repository, "tests passed" is progress on fail_to_pass scaled by what still passes
    of pass_to_pass: a diff that changes nothing earns 0, one that breaks half the old tests
    keeps half its progress."""
    if graded.reward_status is not RewardStatus.SCORED:
        return graded
    def fraction(tests: tuple[str, ...]) -> float:
        return sum(graded.outcomes.get(t) is Outcome.PASSED for t in tests) / len(tests) if tests else 1.0
    fail_to_pass, pass_to_pass = fraction(task.fail_to_pass), fraction(task.pass_to_pass)
    components = {**graded.reward_components, "fail_to_pass_fraction": fail_to_pass,
                  "pass_to_pass_fraction": pass_to_pass, "tests_passed_fraction": fail_to_pass * pass_to_pass}
    return dataclasses.replace(graded, reward_components=components)  # the reward function scores it


def _parses(source: str) -> bool:
    try:
        python_ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
        return False
    return True


def _defines(source: str, name: str) -> bool:
    """The module parses and defines `name` at top level (a function, class or assignment)."""
    try:
        tree = python_ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _not_applied(task: RepositoryTask, sandbox: Sandbox, reason: str, wall_s: float) -> GradeResult:
    """A scored 0: the model's diff is wrong, and nothing of it can be tested."""
    applying = ExecResult(
        status=ExecStatus.RE, exit_code=1, signal=None, wall_s=round(wall_s, 4), cpu_s=0.0,
        peak_memory_bytes=None, stdout="", stderr=reason, stdout_truncated=False, stderr_truncated=False,
        spec_hash=sandbox.spec.hash, backend="host", command=("git", "apply"),
    )
    expected = task.expected_tests
    return GradeResult(
        outcomes=dict.fromkeys(expected, Outcome.MISSING), tests_expected=len(expected), tests_collected=0,
        suite_ran=False, tamper_flags=(), reward_components={"tests_passed_fraction": 0.0, "all_passed": 0.0},
        reward=0.0, reward_status=RewardStatus.SCORED, exec=applying, messages={"_": f"the diff does not apply: {reason}"},
        failure=Diagnosis.of(FailureReason.DIFF_DOES_NOT_APPLY, reason),
    )
