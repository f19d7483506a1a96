"""Task environments built for real: pip from the registry for the sandbox's own python3, a
`docker build` from the base image with Debian packages, cached by digest, safe to build twice
at once; and tasks whose tests need a package pass in their environment and are environment
errors without it, on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from environments.build import BuildError, build, build_all, images, remove_image
from environments.spec import EnvironmentSpec
from environments.store import EnvironmentStore, image_tag
from grading.submission import grade_solution, sandbox_spec
from sandbox.backends import open_sandbox
from statuses import FailureReason, RewardStatus
from task_sets.loader import load_task_set
from task_sets.schema import parse_task

pytestmark = pytest.mark.usefixtures("local_backend")
TOMLI_W = EnvironmentSpec(python=("tomli_w==1.0.0",), env={"GREETING": "hello"}, files={"data/answer.txt": "42\n"})
TESTS = ("import os\nimport tomli_w\nfrom solution import dump\n\n"
         "def test_dump():\n    assert dump({'a': 1}) == 'a = 1\\n'\n\n"
         "def test_the_environment_is_there():\n"
         "    assert os.environ['GREETING'] == 'hello'\n"
         "    assert open(os.environ['CRUCIBLE_ENV'] + '/data/answer.txt').read() == '42\\n'\n")
SOLUTION = "import tomli_w\n\ndef dump(value):\n    return tomli_w.dumps(value)\n"


@pytest.fixture
def store(tmp_path) -> Iterator[EnvironmentStore]:
    store = EnvironmentStore(tmp_path / "environments")
    yield store
    for digest in images(store):  # the daemon outlives the test's store
        remove_image(digest)


def function_task(environment: EnvironmentSpec | None):
    return parse_task({"id": "env/dump", "prompt": "Write dump(value) with tomli_w.", "entry_point": "dump",
                       "reference_solution": SOLUTION, "tests": TESTS, "difficulty": "easy", "family": "env",
                       "split": "eval", "environment": environment and environment.model_dump()})


def repository_task(environment: EnvironmentSpec | None):
    files = {"writer.py": "def dump(value):\n    raise NotImplementedError\n",
             "tests/test_writer.py": TESTS.replace("from solution import dump", "from writer import dump")}
    fix = ("--- a/writer.py\n+++ b/writer.py\n@@ -1,2 +1,4 @@\n+import tomli_w\n+\n def dump(value):\n"
           "-    raise NotImplementedError\n+    return tomli_w.dumps(value)\n")
    return parse_task({"id": "env/writer", "kind": "repository", "prompt": "Implement dump.", "files": files,
                       "reference_solution": fix, "fail_to_pass": ["tests/test_writer.py::test_dump"],
                       "pass_to_pass": ["tests/test_writer.py::test_the_environment_is_there"],
                       "test_command": "python3 -m pytest -q tests", "difficulty": "easy", "family": "env",
                       "split": "eval", "protected_paths": ["tests/*"], "limits": {"wall_s": 30, "cpu_s": 30},
                       "environment": environment and environment.model_dump()})


def test_the_digest_names_the_declaration_and_nothing_else():
    same = EnvironmentSpec(python=("tomli_w==1.0.0",), files={"data/answer.txt": "42\n"}, env={"GREETING": "hello"})
    assert same.digest == TOMLI_W.digest
    assert len({TOMLI_W.digest, TOMLI_W.model_copy(update={"env": {}}).digest,
                EnvironmentSpec(python=("tomli_w==1.0.1",)).digest, EnvironmentSpec(debian=("sl",)).digest}) == 4


def test_a_task_without_an_environment_keeps_the_version_it_had_before_environments():
    shopcart = load_task_set("shopcart")
    assert (shopcart.by_id["shopcart/negative-money"].version, shopcart.version) == \
        ("32810e77e899cdfc", "d2c3b9505d5cf544")  # as computed before the field existed
    assert function_task(None).version != function_task(TOMLI_W).version


def test_a_second_build_of_the_same_spec_costs_nothing(store):
    first = build(TOMLI_W, store)
    second = build(TOMLI_W, store)
    assert second.record["built_at"] == first.record["built_at"]  # the store's, not a rebuild
    assert first.record["installed"] == ["tomli_w-1.0.0"]
    assert (first.path / "site-packages" / "tomli_w").is_dir()


def test_two_builds_of_one_spec_at_once_build_it_once(store):
    results = []
    threads = [threading.Thread(target=lambda: results.append(build(TOMLI_W, store))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({r.record["built_at"] for r in results}) == 1 and len(store.all()) == 1
    assert not list(store.root.glob(".staging-*"))


def test_a_failed_build_names_the_package_and_pips_line_and_leaves_nothing(store):
    with pytest.raises(BuildError, match=r"pip could not install no-such-package-crucible==1\.0: Could not find a "
                                         r"version that satisfies the requirement"):
        build(EnvironmentSpec(python=("no-such-package-crucible==1.0",)), store)
    assert store.all() == [] and not list(store.root.glob(".staging-*"))


def test_the_local_backend_refuses_debian_packages_this_host_lacks(store):
    with pytest.raises(BuildError, match="needs Debian package.* sl, which this host does not have"):
        build(EnvironmentSpec(debian=("sl",)), store, "local")


def test_a_debian_package_is_installed_into_the_docker_image(store):
    from tests.conftest import require

    require("docker")
    spec = EnvironmentSpec(debian=("sl",))
    build(spec, store, "docker")
    session = open_sandbox("docker", sandbox_spec(parse_task({
        "id": "env/sl", "prompt": "p", "entry_point": "f", "reference_solution": "def f():\n    pass\n",
        "tests": "def test_f():\n    pass\n", "difficulty": "easy", "family": "env", "split": "eval",
        "environment": spec.model_dump()}), store)).session({})
    with session:
        assert session.exec(["test", "-x", "/usr/games/sl"]).ok
    assert image_tag(spec.digest) == f"crucible-env:{spec.digest[:16]}"


@pytest.mark.parametrize("make_task", [function_task, repository_task], ids=["function", "repository"])
def test_tests_that_need_a_package_pass_in_their_environment_on_every_backend(make_task, backend_name, store):
    task = make_task(TOMLI_W)
    build_all([TOMLI_W], backend_name, store)
    graded = grade_solution(task, task.reference_solution, open_sandbox(backend_name, sandbox_spec(task, store)))
    assert (graded.passed, graded.failure) == (True, None)


@pytest.mark.parametrize("make_task", [function_task, repository_task], ids=["function", "repository"])
def test_without_the_environment_the_same_tests_are_an_environment_error(make_task, backend_name):
    task = make_task(None)
    graded = grade_solution(task, task.reference_solution, open_sandbox(backend_name, sandbox_spec(task)))
    assert (graded.reward_status, graded.failure.reason) == (RewardStatus.ENV_ERROR, FailureReason.MISSING_MODULE)
    assert "tomli_w" in graded.failure.detail


def test_an_unbuilt_environment_is_refused_with_the_command_that_builds_it(store):
    from sandbox.base import SandboxUnavailable

    with pytest.raises(SandboxUnavailable, match="crucible env build"):
        open_sandbox("local", sandbox_spec(function_task(TOMLI_W), store))


# -- a task set's environment.toml and the commands --------------------------------------------


def crucible(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def test_a_sets_environment_toml_applies_to_its_tasks_and_the_commands_build_list_show_and_prune(tmp_path):
    library, environments = tmp_path / "library", tmp_path / "environments"
    folder = library / "needs-tomli"
    folder.mkdir(parents=True)
    record = function_task(None).model_dump(mode="json", exclude={"version", "environment"})
    (folder / "tasks.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "requirements.lock").write_text("# pinned\ntomli_w==1.0.0 \\\n    # the writer\n")
    (folder / "environment.toml").write_text('python_lock = "requirements.lock"\n[env]\nGREETING = "hello"\n'
                                             '[files]\n"data/answer.txt" = "42\\n"\n')
    env = {"CRUCIBLE_TASK_SETS": str(library), "CRUCIBLE_ENVIRONMENTS": str(environments)}
    task = load_task_set(folder).tasks[0]
    assert task.environment.python == ("tomli_w==1.0.0",) and task.environment.digest == TOMLI_W.digest

    built = crucible("env", "build", "needs-tomli", "--backend", "local", env=env)
    assert built.returncode == 0, built.stderr
    assert TOMLI_W.digest[:16] in built.stdout
    listed = crucible("env", "list", env=env)
    assert TOMLI_W.digest[:16] in listed.stdout and "needs-tomli" in listed.stdout
    shown = json.loads(crucible("env", "show", TOMLI_W.digest[:8], env=env).stdout)
    assert shown["installed"] == ["tomli_w-1.0.0"] and shown["spec"]["env"] == {"GREETING": "hello"}
    validated = crucible("tasks", "validate", "needs-tomli", "--repeats", "1", "--backend", "local", env=env)
    assert validated.returncode == 0 and "all 1 tasks fit to judge with" in validated.stdout, validated.stdout

    kept = crucible("env", "prune", env=env)
    assert "removed 0 environment(s)" in kept.stdout and (environments / TOMLI_W.digest).is_dir()
    (folder / "environment.toml").unlink()  # no known set declares it now
    pruned = crucible("env", "prune", env=env)
    assert f"removed 1 environment(s): {TOMLI_W.digest[:16]}" in pruned.stdout
    assert not (environments / TOMLI_W.digest).exists()


def test_a_bad_environment_toml_names_the_file_and_field(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "tasks.jsonl").write_text(json.dumps(function_task(None).model_dump(mode="json",
                                                                                  exclude={"version"})) + "\n")
    (folder / "environment.toml").write_text('debian = ["not a package"]\n')
    done = crucible("tasks", "list", "--task-set", str(folder), env={})
    assert done.returncode == 2 and "bad/environment.toml: debian" in done.stderr and "Traceback" not in done.stderr

