"""SWE-bench as its users have it: five real instances of SWE-bench Lite (three repositories,
records unchanged in tests/data/swebench/instances.jsonl), each repository at its base commit
as `git archive` wrote it (tests/data/swebench/repos/), environments from the install recipes,
and the ids SWE-bench's log parser cut at whitespace matched as its grader does."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from environments.build import build_all, images, remove_image
from environments.store import EnvironmentStore
from sandbox.backends import open_sandbox
from sandbox.pool import PoolConfig, SandboxPool
from sandbox.test_report import Outcome
from task_sets.importers import ImportError_, ImportOptions, import_tasks
from task_sets.schema import parse_task
from task_sets.submission import grade_solution
from task_sets.validation import validate

pytestmark = pytest.mark.usefixtures("local_backend")
DATA = Path(__file__).parent / "data" / "swebench"
INSTANCES, REPOS = DATA / "instances.jsonl", DATA / "repos"


@pytest.fixture(scope="module")
def tasks():
    return import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS)).tasks


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    """A store of its own for the module (CRUCIBLE_ENVIRONMENTS), its Docker images removed after."""
    root = tmp_path_factory.mktemp("environments")
    patch = pytest.MonkeyPatch()
    patch.setenv("CRUCIBLE_ENVIRONMENTS", str(root))
    yield EnvironmentStore(root)
    for digest in images(EnvironmentStore(root)):
        remove_image(digest)
    patch.undo()


def test_the_instances_import_as_published_with_binary_files_and_environments(tasks):
    records = [json.loads(line) for line in INSTANCES.read_text().splitlines()]
    assert [t.id for t in tasks] == [f"swe/{r['instance_id']}" for r in records]
    assert {t.family for t in tasks} == {"pallets/flask", "marshmallow-code/marshmallow", "pylint-dev/astroid"}
    flask = tasks[0]
    assert "artwork/logo-full.svg" in flask.files and "docs/_static/flask-icon.png" in flask.binary_files
    assert flask.environment.python_path == ("/workspace/src",) and "Werkzeug==2.3.7" in flask.environment.python
    # The test patch's data file is a hidden test, never an argument to pytest.
    assert "tests/static/config.toml" in flask.hidden_tests and flask.test_command.endswith(" tests/test_config.py")
    assert all(t.pass_to_pass == tuple(json.loads(r["PASS_TO_PASS"])) for t, r in zip(tasks, records))


def test_the_cut_ids_are_kept_as_published(tasks):
    by_id = {t.id: t for t in tasks}
    marshmallow = by_id["swe/marshmallow-code__marshmallow-1359"]
    cut = [t for t in marshmallow.pass_to_pass if t.count("[") > t.count("]")]
    assert len(cut) == 8 and "tests/test_fields.py::TestErrorMessages::test_make_error[required-Missing" in cut
    assert by_id["swe/pylint-dev__astroid-1866"].fail_to_pass == (
        "tests/unittest_brain_builtin.py::TestStringNodes::test_string_format_uninferable[\\n",)


def test_gold_patches_pass_and_empty_patches_fail_on_every_backend(tasks, environments, backend_name):
    build_all([t.environment for t in tasks], backend_name, environments)
    with SandboxPool(lambda spec: open_sandbox(backend_name, spec), PoolConfig(cpu_slots=2)) as pool:
        report = validate(tasks, pool, repeats=1, task_set="swe")
    assert [(t.task_id, t.verdict, t.reasons) for t in report.problems] == []


def test_an_empty_patch_says_which_test_failed(tasks, environments):
    build_all([tasks[0].environment], "local", environments)
    graded = grade_solution(tasks[0], "")
    assert (graded.reward, graded.failure.reason.value) == (0.0, "tests_failed")
    assert "tests/test_config.py::test_config_from_file_toml" in graded.failure.detail


PARAMETRIZED = textwrap.dedent('''\
    import pytest

    from calc import check


    @pytest.mark.parametrize("text", ["Missing data", "Missing value"])
    def test_message(text):
        assert check(text)
''')


def cut_id_task(check: str):
    return parse_task({
        "id": "cut/messages", "kind": "repository", "prompt": "p", "difficulty": "easy", "family": "cut",
        "split": "eval", "files": {"calc.py": check, "tests/test_calc.py": PARAMETRIZED},
        "reference_solution": "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 0\n+x = 1\n",
        "fail_to_pass": ["tests/test_calc.py::test_message[Missing"], "test_command": "python3 -m pytest -rA tests"})


@pytest.mark.parametrize(("check", "passes"), [
    ("x = 0\ndef check(text):\n    return True\n", True),
    ("x = 0\ndef check(text):\n    return text.endswith('data')\n", False),  # one of the two fails
])
def test_a_cut_id_passes_only_when_every_test_it_stands_for_passes(check, passes):
    task = cut_id_task(check)
    graded = grade_solution(task, "")
    assert graded.outcomes == {"tests/test_calc.py::test_message[Missing": Outcome.PASSED if passes else Outcome.FAILED}
    assert graded.tests_collected == 2


def test_a_users_recipe_replaces_crucibles_and_an_unknown_field_is_refused(tmp_path):
    recipes = tmp_path / "recipes.toml"
    recipes.write_text('["pallets/flask"."2.3"]\npython = ["Werkzeug==2.3.8"]\npython_path = ["/workspace/src"]\n')
    mine = import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS, recipes=recipes)).tasks[0]
    assert mine.environment.python == ("Werkzeug==2.3.8",)
    recipes.write_text('["pallets/flask"."2.3"]\npip = ["Werkzeug==2.3.8"]\n')
    with pytest.raises(ImportError_, match="unknown field.*pip; a recipe has"):
        import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS, recipes=recipes))


def test_an_instance_without_a_recipe_imports_and_the_import_says_so(tmp_path):
    record = json.loads(INSTANCES.read_text().splitlines()[0])
    instances = tmp_path / "instances.jsonl"
    instances.write_text(json.dumps({**record, "version": "9.9"}) + "\n")
    imported = import_tasks("swebench", instances, ImportOptions("swe", repos=REPOS))
    assert imported.tasks[0].environment is None
    assert imported.warnings == ["no install recipe for pallets/flask 9.9: those instances run in the sandbox image "
                                 "as it is (add recipes with --recipes FILE)"]


def test_a_missing_repository_names_the_clone_and_the_snapshot_it_looked_for(tmp_path):
    imported = import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=tmp_path))
    assert imported.tasks == [] and len(imported.rejected) == 5
    assert "no snapshot pallets__flask-4c288bc97ea371817199908d0d9b12de9dae327e.tar.xz" in imported.rejected[0]


def test_a_module_in_src_shadowing_the_standard_library_is_flagged(tasks, environments):
    """flask's environment puts /workspace/src on PYTHONPATH, before the standard library: a
    src/argparse.py would run before pytest's plugin takes its token."""
    flask = tasks[0]
    build_all([flask.environment], "local", environments)
    shadow = "--- /dev/null\n+++ b/src/argparse.py\n@@ -0,0 +1,2 @@\n+import os\n+os._exit(0)\n"
    graded = grade_solution(flask, flask.reference_solution + shadow)
    assert graded.tamper_flags == ("shadows_runner_module",) and graded.reward == 0.0
    assert graded.passed is False and graded.suite_ran  # graded without it: the gold patch's tests ran
