"""Environments of a named Python: a virtual environment of this host's interpreter of that
version, the repository installed in it the way its tests expect (editable, `src/` layout,
generated metadata laid into every workspace), on both backends; and a Python the host lacks
refused in one sentence before anything is built."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from environments import interpreters
from environments.build import BuildError, build, images, locked, remove_image
from environments.spec import EnvironmentSpec
from environments.store import EnvironmentStore
from environments.virtualenv import pins
from grading.submission import grade_solution, sandbox_spec
from sandbox.backends import open_sandbox
from task_sets.schema import parse_task

pytestmark = pytest.mark.usefixtures("local_backend")
SANDBOX_PYTHON = "3.11"  # Debian's python3, what an environment without python_version runs
REPOSITORY = "crucible/greeter@0123abcd"
FILES = {
    "pyproject.toml": ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
                       '[project]\nname = "greeter"\nversion = "0.1"\n'),
    "src/greeter/__init__.py": "import sys\n\ndef greet():\n    return 'hello'\n\nVERSION = sys.version_info[:2]\n",
    "tests/conftest.py": "import greeter  # noqa: F401 (a src/ package: importable only once installed)\n",
    "tests/test_greet.py": ("from importlib.metadata import version\n\nimport greeter\n\n"
                            "def test_greet():\n    assert greeter.greet() == 'hi'\n\n"
                            "def test_installed():\n    assert version('greeter') == '0.1'\n"),
}
FIX = ("--- a/src/greeter/__init__.py\n+++ b/src/greeter/__init__.py\n@@ -1,6 +1,6 @@\n import sys\n\n"
       " def greet():\n-    return 'hello'\n+    return 'hi'\n\n VERSION = sys.version_info[:2]\n")


def other_python() -> str:
    """A Python of this host other than the sandbox's own where there is one (3.11 else)."""
    others = sorted(v for v in interpreters.available() if v != SANDBOX_PYTHON)
    return others[0] if others else SANDBOX_PYTHON


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[EnvironmentStore]:
    store = EnvironmentStore(tmp_path_factory.mktemp("environments"))
    yield store
    for digest in images(store):
        remove_image(digest)


@pytest.fixture(scope="module")
def spec() -> EnvironmentSpec:
    return EnvironmentSpec(python_version=other_python(), python=("pytest==7.4.4",), repository=REPOSITORY,
                           setup=("python -m pip install -e .",))


def task(spec: EnvironmentSpec):
    return parse_task({"id": "venv/greeter", "kind": "repository", "prompt": "Say hi.", "files": FILES,
                       "reference_solution": FIX, "fail_to_pass": ["tests/test_greet.py::test_greet"],
                       "pass_to_pass": ["tests/test_greet.py::test_installed"], "test_command": "pytest -rA tests",
                       "difficulty": "easy", "family": "venv", "split": "eval", "protected_paths": ["tests/*"],
                       "limits": {"wall_s": 60, "cpu_s": 60}, "environment": spec.model_dump(mode="json")})


def test_the_build_records_its_interpreter_its_lock_and_the_files_the_install_made(spec, store):
    built = build(spec, store, repositories={REPOSITORY: FILES})
    assert built.record["interpreter"]["version"].startswith(f"{spec.python_version}.")
    assert "pytest==7.4.4" in built.record["locked"]
    assert "src/greeter.egg-info/PKG-INFO" in built.workspace_layer()


def test_gold_passes_and_the_empty_diff_fails_in_the_environments_python_on_every_backend(spec, store,
                                                                                          backend_name):
    build(spec, store, backend_name, repositories={REPOSITORY: FILES})
    graded = {name: grade_solution(task(spec), diff, open_sandbox(backend_name, sandbox_spec(task(spec), store)))
              for name, diff in (("gold", FIX), ("empty", ""))}
    assert (graded["gold"].passed, graded["gold"].failure) == (True, None), graded["gold"].exec.stdout[-2000:]
    assert (graded["empty"].reward, graded["empty"].failure.reason.value) == (0.0, "tests_failed")
    assert f"Python {spec.python_version}." in graded["gold"].exec.stdout  # pytest's header: the venv's Python


def test_a_python_the_host_lacks_is_refused_in_one_sentence_before_anything_is_built(store):
    have = ", ".join(sorted(interpreters.available(), key=lambda v: tuple(map(int, v.split(".")))))
    spec = EnvironmentSpec(python_version="3.4", repository=REPOSITORY, setup=("python -m pip install -e .",))
    with pytest.raises(BuildError, match=rf"needs Python 3\.4; available: {have}$"):
        build(spec, store, repositories={REPOSITORY: FILES})
    assert store.get(spec.digest) is None and not list(store.root.glob(".staging-*"))


def test_a_setup_step_that_fails_is_named_with_the_line_that_says_why(store):
    spec = EnvironmentSpec(python_version=other_python(), repository=REPOSITORY,
                           setup=("python -m pip install -e ./no-such-folder",))
    with pytest.raises(BuildError, match=r"`python -m pip install -e \./no-such-folder` failed: .*no-such-folder"):
        build(spec, store, repositories={REPOSITORY: FILES})
    assert store.get(spec.digest) is None


@pytest.mark.parametrize("bad", ["three", "3", "python"])
def test_a_python_version_that_is_not_one_is_refused(bad):
    with pytest.raises(ValueError, match="is not a Python version"):
        EnvironmentSpec(python_version=bad)


def test_a_spec_is_locked_once_to_what_it_resolved_and_the_lock_builds_the_same(spec, store, tmp_path):
    pinned = locked(spec, store, repositories={REPOSITORY: FILES})
    assert "pytest==7.4.4" in pinned.lock and any(line.startswith("pluggy==") for line in pinned.lock)
    assert not any("greeter" in line or line.startswith("-e") for line in pinned.lock)  # the repository is set up
    assert store.get(pinned.digest).record["resolved_from"] == spec.digest  # the resolving build is the lock's
    assert locked(spec, store) == pinned  # resolved once: no build, no repository needed
    elsewhere = EnvironmentStore(tmp_path / "elsewhere")
    rebuilt = build(pinned, elsewhere, repositories={REPOSITORY: FILES})
    assert pins(rebuilt.record["locked"]) == pinned.lock


def test_what_a_setup_step_downloads_into_the_repository_is_there_offline_at_test_time(store):
    """A prefetch: the build has the network, the tests do not; the file it fetched is laid
    into every workspace with the install's own files."""
    prefetch = EnvironmentSpec(python_version=other_python(), python=("pytest==7.4.4",), repository=REPOSITORY,
                               setup=("python -m pip download --no-deps tomli_w==1.0.0 -d tests/data",
                                      "python -m pip install -e ."))
    offline = task(prefetch).model_copy(update={"hidden_tests": {"tests/test_data.py": (
        "import pathlib, socket\n\nimport pytest\n\n"
        "def test_the_fetched_wheel_is_here():\n"
        "    assert [p.name for p in pathlib.Path('tests/data').iterdir()] == ['tomli_w-1.0.0-py3-none-any.whl']\n\n"
        "def test_there_is_no_network():\n"
        "    with pytest.raises(OSError):\n"
        "        socket.create_connection(('pypi.org', 443), timeout=5)\n")},
        "pass_to_pass": ("tests/test_data.py::test_the_fetched_wheel_is_here", "tests/test_data.py::test_there_is_no_network")})
    build(prefetch, store, repositories={REPOSITORY: FILES})
    graded = grade_solution(offline, FIX, open_sandbox("local", sandbox_spec(offline, store)))
    assert (graded.passed, graded.failure) == (True, None), graded.exec.stdout[-2000:]
