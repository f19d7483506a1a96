"""Harbor tasks as published (tests/data/harbor/: two of harbor-cookbook's recipes, unchanged):
the workspace seen at the task's /app, solve.sh writing there, a test.sh that fetches its
tools from the network reported at import and graded as an environment error, and
reward.json read as Harbor's multi-metric verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.build import BuildError, build_all, images, remove_image
from environments.store import EnvironmentStore
from grading.submission import grade_solution, sandbox_spec
from sandbox.backends import open_sandbox
from sandbox.docker import DEFAULT_IMAGE
from sandbox.pool import PoolConfig, SandboxPool
from statuses import FailureReason, RewardStatus
from task_sets.importers import ImportOptions, import_tasks
from task_sets.schema import parse_task
from tests.conftest import require

pytestmark = pytest.mark.usefixtures("local_backend")


@pytest.fixture
def environments(tmp_path) -> Iterator[EnvironmentStore]:
    store = EnvironmentStore(tmp_path / "environments")
    yield store
    for digest in images(store):
        remove_image(digest)
COOKBOOK = Path(__file__).parent / "data" / "harbor"


@pytest.fixture(scope="module")
def imported():
    return import_tasks("harbor", COOKBOOK, ImportOptions("cookbook"))


def test_solve_sh_writing_under_app_gives_the_reference_diff(imported):
    tasks = {t.id: t for t in imported.tasks}
    assert sorted(tasks) == ["cookbook/multi-reward", "cookbook/simple-task"] and imported.rejected == []
    assert {t.workdir for t in imported.tasks} == {"/app"}  # the Dockerfiles' WORKDIR
    assert "+++ b/deduplicate.py" in tasks["cookbook/multi-reward"].reference_solution
    assert "+Hello, world!" in tasks["cookbook/simple-task"].reference_solution
    # Both pytest files of the task are its expected tests (its test.sh runs pytest once per file).
    expected = tasks["cookbook/multi-reward"].fail_to_pass
    assert len(expected) == 8 and expected[-1] == "test_performance.py::test_handles_100k_records_under_2s"


def test_a_test_sh_that_fetches_from_the_network_is_reported_at_import(imported):
    assert len(imported.warnings) == 2
    assert imported.warnings[0].startswith("multi-reward: tests/test.sh fetches from the network (line 3: "
                                           "apt-get update) and the task allows none")


def test_grading_it_without_the_network_is_an_environment_error(imported, environments):
    task = next(t for t in imported.tasks if t.id == "cookbook/simple-task")
    build_all([task.environment], "local", environments)
    graded = grade_solution(task, task.reference_solution, open_sandbox("local", sandbox_spec(task, environments)))
    assert (graded.reward_status, graded.reward, graded.tamper_flags) == (RewardStatus.ENV_ERROR, None, ())
    assert graded.failure.reason in (FailureReason.NETWORK_UNAVAILABLE, FailureReason.MISSING_COMMAND)


def test_on_docker_the_tasks_dockerfile_is_built_or_its_missing_base_named(imported, environments, tmp_path):
    require("docker")
    with pytest.raises(BuildError, match="the task's Dockerfile is FROM ubuntu:24.04, which this Docker daemon "
                                         "does not have"):
        build_all([imported.tasks[0].environment], "docker", environments)
    task_dir = tmp_path / "own-image"
    for path, text in {"instruction.md": "Say hello.", "task.toml": "[verifier]\ntimeout_sec = 60.0\n",
                       "environment/Dockerfile": f"FROM {DEFAULT_IMAGE}\nCOPY data.txt /opt/data.txt\nWORKDIR /app\n",
                       "environment/data.txt": "from the image\n", "solution/solve.sh": "echo hi > /app/hi.txt\n",
                       "tests/test.sh": "python3 -m pytest -q /tests/test_state.py && echo 1 > /logs/verifier/reward.txt"
                       " || echo 0 > /logs/verifier/reward.txt\n",
                       "tests/test_state.py": "from pathlib import Path\n\ndef test_image_and_answer():\n"
                       "    assert Path('/opt/data.txt').read_text() == 'from the image\\n'\n"
                       "    assert Path('/app/hi.txt').read_text() == 'hi\\n'\n"}.items():
        (task_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (task_dir / path).write_text(text)
    [task] = import_tasks("harbor", task_dir, ImportOptions("own")).tasks
    build_all([task.environment], "docker", environments)
    sandbox = open_sandbox("docker", sandbox_spec(task, environments))
    assert grade_solution(task, task.reference_solution, sandbox).passed
    assert not grade_solution(task, "", sandbox).passed


def test_the_workspace_is_seen_at_the_tasks_working_directory_on_every_backend(backend_name):
    task = parse_task({
        "id": "h/app", "kind": "repository", "prompt": "p", "difficulty": "easy", "family": "h", "split": "eval",
        "files": {"hello.txt": "hi\n"}, "workdir": "/app/site",
        "reference_solution": "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hi\n+hello\n",
        "grader_files": {"test_state.py": "from pathlib import Path\n\ndef test_hello():\n"
                                          "    assert Path('/app/site/hello.txt').read_text() == 'hello\\n'\n"},
        "fail_to_pass": ["test_state.py::test_hello"], "test_command": "python3 -m pytest -q /tests/test_state.py"})
    sandbox = open_sandbox(backend_name, sandbox_spec(task))
    assert grade_solution(task, task.reference_solution, sandbox).passed
    assert not grade_solution(task, "", sandbox).passed


REWARD_JSON = ("python3 -m pytest -q /tests/test_state.py; python3 -c \"import json; "
               "json.dump({'correctness': 1, 'performance': %s}, open('/logs/verifier/reward.json', 'w'))\"")


@pytest.mark.parametrize(("performance", "runner_passes"), [(1, True), (0, False)])
def test_reward_json_is_the_verdict_every_metric_must_reach_one(performance, runner_passes):
    """The runner's verdict must agree with the report: a metric at 0 while every test passed is
    a verdict that disagrees."""
    task = parse_task({
        "id": "h/metrics", "kind": "repository", "prompt": "p", "difficulty": "easy", "family": "h", "split": "eval",
        "files": {"x.txt": "x\n"}, "reference_solution": "--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-x\n+y\n",
        "grader_files": {"test_state.py": "def test_ok():\n    pass\n"}, "fail_to_pass": ["test_state.py::test_ok"],
        "test_command": REWARD_JSON % performance, "verdict_file": "/logs/verifier/reward.json"})
    graded = grade_solution(task, task.reference_solution)
    assert graded.passed is runner_passes
    assert [flag.value for flag in graded.tamper_flags] == ([] if runner_passes else ["exit_code_disagrees"])


def test_validate_names_the_environment_error_of_both_tasks(imported, environments):
    from grading.validation import validate

    build_all([t.environment for t in imported.tasks], "local", environments)
    with SandboxPool(lambda spec: open_sandbox("local", spec), PoolConfig(cpu_slots=2)) as pool:
        report = validate(imported.tasks, pool, environments, repeats=1, task_set="cookbook")
    assert [(t.verdict, t.reasons[0].split(":")[0]) for t in report.tasks] == [
        ("broken", "reference fails (env_error, network_unavailable)")] * 2


TWO_FILES = {"test_a.py": "def test_a():\n    pass\n", "test_b.py": "import os\n\ndef test_b():\n"
             "    assert os.path.exists('/app/y.txt')\n"}
TWO_RUNS = ("python3 -m pytest -q /tests/test_a.py && a=1; python3 -m pytest -q /tests/test_b.py && b=1; "
            "echo \"{\\\"a\\\": ${a:-0}, \\\"b\\\": ${b:-0}}\" > /logs/verifier/reward.json")


def two_run_task(sessions: int):
    return parse_task({
        "id": "h/two-runs", "kind": "repository", "prompt": "p", "difficulty": "easy", "family": "h", "split": "eval",
        "files": {"x.txt": "x\n"}, "workdir": "/app", "grader_files": TWO_FILES, "pytest_sessions": sessions,
        "reference_solution": "--- /dev/null\n+++ b/y.txt\n@@ -0,0 +1 @@\n+y\n",
        "fail_to_pass": ["test_a.py::test_a", "test_b.py::test_b"], "test_command": TWO_RUNS,
        "verdict_file": "/logs/verifier/reward.json"})


def test_a_test_command_running_pytest_twice_has_both_sessions_vouched_for_and_kept(backend_name):
    task = two_run_task(2)
    sandbox = open_sandbox(backend_name, sandbox_spec(task))
    graded = grade_solution(task, task.reference_solution, sandbox)
    assert (graded.passed, graded.tamper_flags, graded.tests_collected) == (True, (), 2)
    empty = grade_solution(task, "", sandbox)  # test_b fails in the second session
    assert (empty.passed, empty.tamper_flags, empty.failure.reason) == (False, (), FailureReason.TESTS_FAILED)
    assert empty.outcomes == {"test_a.py::test_a": "passed", "test_b.py::test_b": "failed"}


def test_a_second_session_the_task_did_not_declare_is_not_believed():
    graded = grade_solution(two_run_task(1), two_run_task(1).reference_solution)
    assert not graded.passed and graded.tamper_flags == ("forged_output",)


def test_harbor_counts_the_pytest_runs_of_a_test_sh_and_reads_the_verdict_it_writes(imported):
    assert {t.id: (t.pytest_sessions, t.verdict_file) for t in imported.tasks} == {
        "cookbook/multi-reward": (2, "/logs/verifier/reward.json"), "cookbook/simple-task": (1, "/logs/verifier/reward.txt")}


def test_a_planted_verdict_the_test_command_never_writes_is_not_read():
    """Code under test writes reward.json; the task's verdict is reward.txt, which says 0."""
    task = parse_task({
        "id": "h/plant", "kind": "repository", "prompt": "p", "difficulty": "easy", "family": "h", "split": "eval",
        "files": {"x.txt": "x\n"}, "reference_solution": "--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-x\n+y\n",
        "grader_files": {"test_state.py": "import json\n\ndef test_ok():\n"
                         "    json.dump({'reward': 1}, open('/logs/verifier/reward.json', 'w'))\n"},
        "fail_to_pass": ["test_state.py::test_ok"], "verdict_file": "/logs/verifier/reward.txt",
        "test_command": "python3 -m pytest -q /tests/test_state.py; echo 0 > /logs/verifier/reward.txt"})
    graded = grade_solution(task, task.reference_solution)
    assert not graded.passed and graded.tamper_flags == ("exit_code_disagrees",)


OFFLINE_TOOLS = '''\
# What the cookbook's test.sh fetches at test time, provided without the network.
python = ["uv==0.9.7"]
wheels = ["pytest==8.4.1", "pytest-json-ctrf==0.3.5"]
[env]
UV_OFFLINE = "1"
UV_NO_INDEX = "1"
UV_FIND_LINKS = "/opt/crucible/env/wheels"
UV_CACHE_DIR = "/tmp/uv-cache"
UV_PYTHON = "/usr/bin/python3"
'''


def test_with_what_test_sh_fetches_provided_both_recipes_judge_cleanly(imported, environments, tmp_path):
    """The set's environment.toml adds uv and a wheelhouse to each task's own environment (its
    Dockerfile): test.sh's network lines fail harmlessly, `uvx --with pytest` installs offline,
    and both recipes judge: the reference passes (multi-reward: two pytest sessions, both
    vouched for, and its reward.json), the empty diff fails."""
    from grading.validation import validate
    from task_sets.importers import write_task_set
    from task_sets.loader import load_task_set

    write_task_set(imported.tasks, tmp_path / "cookbook")
    (tmp_path / "cookbook" / "environment.toml").write_text(OFFLINE_TOOLS)
    tasks = load_task_set(tmp_path / "cookbook").tasks
    assert all(t.environment.dockerfile and "uv==0.9.7" in t.environment.python for t in tasks)
    build_all([t.environment for t in tasks], "local", environments)
    with SandboxPool(lambda spec: open_sandbox("local", spec), PoolConfig(cpu_slots=2)) as pool:
        report = validate(tasks, pool, environments, repeats=1, task_set="cookbook")
    assert [(t.task_id, t.verdict) for t in report.tasks] == [("cookbook/multi-reward", "ok"),
                                                              ("cookbook/simple-task", "ok")]
    multi = next(t for t in tasks if t.id == "cookbook/multi-reward")
    graded = grade_solution(multi, multi.reference_solution, open_sandbox("local", sandbox_spec(multi, environments)))
    assert (graded.passed, graded.tests_collected, graded.tamper_flags) == (True, 8, ())
