"""SWE-bench as its users have it: twelve real instances of SWE-bench Lite and its dev split from
nine repositories (records unchanged in tests/data/swebench/instances.jsonl and published.jsonl,
where from in SOURCES.md), each repository at its base commit as `git archive` wrote it
(tests/data/swebench/repos/), environments derived from SWE-bench's published specifications,
every instance proven gradable or refused with its reason on both backends, and the ids SWE-bench's
log parser cut at whitespace matched as its grader does."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from environments import interpreters
from environments.build import images, remove_image
from environments.store import EnvironmentStore
from grading.gradability import ProofLedger, build_environments, prove
from grading.submission import grade_solution, sandbox_spec
from grading.verdict import GradeResult
from sandbox.backends import open_sandbox
from sandbox.pool import PoolConfig, SandboxPool
from statuses import Outcome
from task_sets.importers import ImportError_, ImportOptions, import_tasks
from task_sets.schema import parse_task

pytestmark = pytest.mark.usefixtures("local_backend")
DATA = Path(__file__).parent / "data" / "swebench"
INSTANCES, PUBLISHED, REPOS = DATA / "instances.jsonl", DATA / "published.jsonl", DATA / "repos"


@pytest.fixture(scope="module")
def tasks():
    """Every instance; this machine has each one's Python (pyenv's 3.8 to 3.11), else the
    refusal says which it lacks."""
    imported = [import_tasks("swebench", path, ImportOptions("swe", repos=REPOS)) for path in (INSTANCES, PUBLISHED)]
    assert [r for i in imported for r in i.rejected] == []
    return [task for i in imported for task in i.tasks]


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    """A store of its own for the module, its Docker images removed after."""
    store = EnvironmentStore(tmp_path_factory.mktemp("environments"))
    yield store
    for digest in images(store):
        remove_image(digest)


def test_the_instances_import_as_published_with_binary_files_and_environments(tasks):
    records = [json.loads(line) for path in (INSTANCES, PUBLISHED) for line in path.read_text().splitlines()]
    assert [t.id for t in tasks] == [f"swe/{r['instance_id']}" for r in records]
    assert len({t.family for t in tasks}) == 9
    flask = tasks[0]
    assert "artwork/logo-full.svg" in flask.files and "docs/_static/flask-icon.png" in flask.binary_files
    # SWE-bench's specification of flask 2.3: Python 3.11, requirements/dev.txt, then its pins; installed editable.
    assert flask.environment.python_version == "3.11" and "Werkzeug==2.3.7" in flask.environment.python
    assert flask.environment.setup == ("python -m pip install -e .",)
    assert flask.environment.repository == f"pallets/flask@{records[0]['base_commit']}"
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


# What proving each instance finds here: usable, or the reason it is left out (a gold patch that
# does not pass in an environment built as published is never scored).
EXPECTED = {
    "pallets__flask-4992": "ok", "pallets__flask-5063": "ok", "marshmallow-code__marshmallow-1359": "ok",
    "pylint-dev__astroid-1978": "ok", "pylint-dev__astroid-1866": "ok",
    "pytest-dev__pytest-5413": "ok", "pytest-dev__pytest-7432": "ok",
    "sqlfluff__sqlfluff-1625": "ok",  # -rA reports its passing tests' logs: over the 1 MiB default limit
    "pylint-dev__pylint-5859": "ok", "mwaskom__seaborn-2848": "ok",
    # Two of its pass-to-pass tests connect to 10.255.255.1 and expect a timeout: no network here.
    "psf__requests-3362": "reference fails .*TestTimeout",
    # The specification installs pytest unpinned: pytest 8 no longer runs nose-style setup().
    "pydicom__pydicom-1139": "reference fails",
}


def test_every_instance_is_proven_gradable_or_left_out_with_its_reason_on_every_backend(tasks, environments,
                                                                                         backend_name):
    with SandboxPool(lambda spec: open_sandbox(backend_name, spec), PoolConfig(cpu_slots=2),
                     is_infra_failure=GradeResult.infra_failed) as pool:  # as the product proves
        report = prove(tasks, backend_name, pool, ProofLedger(environments), task_set="swe")
    found = {t.task_id.removeprefix("swe/"): "; ".join(t.reasons) or t.verdict for t in report.tasks}
    assert sorted(found) == sorted(EXPECTED)
    for instance, expected in EXPECTED.items():
        assert re.search(expected, found[instance]), (instance, found[instance])
    ledger = ProofLedger(environments)
    assert {t.id.removeprefix("swe/"): ledger.get(t, backend_name).usable for t in tasks} == \
        {instance: expected == "ok" for instance, expected in EXPECTED.items()}


def test_an_empty_patch_says_which_test_failed(tasks, environments):
    assert build_environments([tasks[0]], "local", environments) == {}
    graded = grade_solution(tasks[0], "", open_sandbox("local", sandbox_spec(tasks[0], environments)))
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


def flask_record(**changes) -> dict:
    return {**json.loads(INSTANCES.read_text().splitlines()[0]), **changes}


PATHS = textwrap.dedent('''\
    import pytest

    from calc import check


    @pytest.mark.parametrize("path", ["/tmp/build/data.txt", "relative/data.txt"])
    def test_reads(path):
        assert check(path)
''')


def test_an_id_whose_path_parameter_swebench_shortened_matches_the_test_it_stands_for():
    task = parse_task({
        "id": "cut/paths", "kind": "repository", "prompt": "p", "difficulty": "easy", "family": "cut",
        "split": "eval", "files": {"calc.py": "x = 0\ndef check(path):\n    return path.startswith('/')\n",
                                   "tests/test_calc.py": PATHS},
        "reference_solution": "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 0\n+x = 1\n",
        "fail_to_pass": ["tests/test_calc.py::test_reads[/data.txt]", "tests/test_calc.py::test_reads[relative/data.txt]"],
        "test_command": "python3 -m pytest -rA tests"})
    graded = grade_solution(task, "")
    assert graded.outcomes == {"tests/test_calc.py::test_reads[/data.txt]": Outcome.PASSED,
                               "tests/test_calc.py::test_reads[relative/data.txt]": Outcome.FAILED}


def test_a_users_specification_replaces_the_published_one_and_a_malformed_file_is_refused(tmp_path):
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"pallets/flask": {"2.3": {"python": "3.11", "pip_packages": ["Werkzeug==2.3.8"],
                                                           "install": "python -m pip install -e .",
                                                           "test_cmd": "pytest -rA"}}}))
    mine = import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS, specs=specs)).tasks[0]
    assert mine.environment.python == ("Werkzeug==2.3.8",)
    specs.write_text("{not json")
    with pytest.raises(ImportError_, match="specs.json: malformed JSON"):
        import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS, specs=specs))
    specs.write_text(json.dumps({"pallets/flask": {"2.3": {"python": "3.11", "packages": ["pytest"]}}}))
    with pytest.raises(ImportError_, match=r"specs.json: \['pallets/flask'\]\['2.3'\]: 'packages' must be a string"):
        import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS, specs=specs))


def test_an_instance_the_specifications_do_not_cover_is_refused_in_one_sentence(tmp_path):
    instances = tmp_path / "instances.jsonl"
    instances.write_text(json.dumps(flask_record(version="9.9")) + "\n")
    imported = import_tasks("swebench", instances, ImportOptions("swe", repos=REPOS))
    assert imported.tasks == [] and imported.rejected == [
        "instances.jsonl:1: instance 'pallets__flask-4992': no published SWE-bench specification for pallets/flask 9.9"]


def test_an_instance_whose_python_this_host_lacks_is_refused_in_one_sentence(tmp_path):
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"pallets/flask": {"2.3": {"python": "3.4", "test_cmd": "pytest -rA"}}}))
    imported = import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=REPOS, specs=specs))
    have = ", ".join(sorted(interpreters.available(), key=lambda v: tuple(map(int, v.split(".")))))
    assert imported.rejected[0] == f"instances.jsonl:1: instance 'pallets__flask-4992': needs Python 3.4; available: {have}"


def test_a_swe_smith_instance_is_refused_for_what_it_is():
    imported = import_tasks("swebench", DATA / "swe-smith.jsonl", ImportOptions("swe", repos=REPOS))
    assert imported.tasks == [] and imported.rejected == [
        "swe-smith.jsonl:1: instance 'pandas-dev__pandas.95280573.pr_53652' is a SWE-smith instance (its patch "
        "introduces the bug, its environment is the image swesmith.x86_64.pandas-dev__pandas.95280573), "
        "which this importer does not read: it imports SWE-bench's format"]


def test_a_missing_repository_names_the_clone_and_the_snapshot_it_looked_for(tmp_path):
    imported = import_tasks("swebench", INSTANCES, ImportOptions("swe", repos=tmp_path))
    assert imported.tasks == [] and len(imported.rejected) == 5
    assert "no snapshot pallets__flask-4c288bc97ea371817199908d0d9b12de9dae327e.tar.xz" in imported.rejected[0]


def test_a_module_in_src_named_like_the_standard_librarys_shadows_nothing(tasks, environments):
    """flask's package is installed editable, after the standard library on the path: a
    src/argparse.py the submission adds is never imported in place of the real one."""
    flask = tasks[0]
    assert build_environments([flask], "local", environments) == {}
    shadow = "--- /dev/null\n+++ b/src/argparse.py\n@@ -0,0 +1,2 @@\n+import os\n+os._exit(0)\n"
    sandbox = open_sandbox("local", sandbox_spec(flask, environments))
    graded = grade_solution(flask, flask.reference_solution + shadow, sandbox)
    assert (graded.passed, graded.tamper_flags) == (True, ())
