"""Importing repository-level formats from real files: SWE-bench instances over a real git
clone, and Harbor task directories; the imported tasks are then graded in the sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from patience import PATIENCE_S

from environments.build import build_all, images, remove_image
from environments.store import EnvironmentStore
from grading.gradability import build_environments
from grading.submission import grade_solution, sandbox_spec
from sandbox.backends import open_sandbox
from sandbox.docker import DEFAULT_IMAGE
from task_sets.importers import ImportOptions, import_tasks
from task_sets.loader import load_task_set
from task_sets.schema import RepositoryTask

OPS = '''\
def add(a, b):
    return a + b


def divide(a, b):
    return a / b
'''
OPS_FIXED = OPS.replace("    return a / b\n", '''\
    if b == 0:
        raise ValueError("division by zero")
    return a / b
''')
TESTS = '''\
from calc.ops import add, divide


def test_add():
    assert add(2, 3) == 5


def test_divide():
    assert divide(6, 3) == 2
'''
TESTS_NEW = TESTS + '''

def test_divide_by_zero_raises_value_error():
    import pytest

    with pytest.raises(ValueError):
        divide(1, 0)
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture(scope="module")
def swebench(tmp_path_factory) -> Iterator[Path]:
    """A folder holding repos/acme__calc (a git clone) and instances.jsonl: one good instance,
    then one bad instance per way an instance can be wrong."""
    root = tmp_path_factory.mktemp("swebench")
    clone = root / "repos" / "acme__calc"
    clone.mkdir(parents=True)
    git(clone, "init", "-q")
    write(clone, {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS, "logo.png": ""})
    (clone / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "base")
    base = git(clone, "rev-parse", "HEAD").strip()
    write(clone, {"calc/ops.py": OPS_FIXED})
    gold = git(clone, "diff")
    git(clone, "checkout", "-q", ".")
    write(clone, {"tests/test_ops.py": TESTS_NEW})
    test_patch = git(clone, "diff")
    git(clone, "checkout", "-q", ".")
    good = {
        "instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "patch": gold,
        "test_patch": test_patch, "problem_statement": "divide(1, 0) should raise ValueError, not ZeroDivisionError.",
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_divide_by_zero_raises_value_error"]),
        "PASS_TO_PASS": ["tests/test_ops.py::test_add", "tests/test_ops.py::test_divide"],
        "difficulty": "<15 min fix", "version": "1.0",
    }
    bad = [
        {k: v for k, v in good.items() if k != "patch"},
        good | {"instance_id": "acme__calc-2", "repo": "acme/missing"},
        good | {"instance_id": "acme__calc-3", "base_commit": "0" * 40},
        good | {"instance_id": "acme__calc-4", "FAIL_TO_PASS": ["test_divide (tests.test_ops.OpsTest)"]},
        good | {"instance_id": "acme__calc-5", "patch": gold.replace("return a / b", "return a // b")},
    ]
    lines = [json.dumps(good), *map(json.dumps, bad), "{not json"]
    (root / "instances.jsonl").write_text("\n".join(lines) + "\n")
    # Its specification, in the shape SWE-bench publishes them (acme/calc is not in the table).
    (root / "specs.json").write_text(json.dumps(SPECS))
    patch = pytest.MonkeyPatch()  # its environment built in a store of its own (the CLI's setting too)
    patch.setenv("CRUCIBLE_ENVIRONMENTS", str(store_of(root).root))
    yield root
    patch.undo()


def store_of(root: Path) -> EnvironmentStore:
    """The environment store of a module's tasks."""
    return EnvironmentStore(root / ".environments")


def local(task, root: Path):
    """A local sandbox for `task`, in its environment built in `root`'s store."""
    return open_sandbox("local", sandbox_spec(task, store_of(root)))


SPECS = {"acme/calc": {"1.0": {"python": "3.11", "pip_packages": ["pytest==7.4.4"], "test_cmd": "python -m pytest -rA"}}}


def options(swebench: Path) -> ImportOptions:
    return ImportOptions("swe", specs=swebench / "specs.json")


def test_a_swebench_instance_becomes_a_repository_task(swebench):
    imported = import_tasks("swebench", swebench / "instances.jsonl", options(swebench))
    [task] = imported.tasks
    assert isinstance(task, RepositoryTask) and task.id == "swe/acme__calc-1"
    assert set(task.files) == {"calc/__init__.py", "calc/ops.py", "tests/test_ops.py"}
    assert list(task.binary_files) == ["logo.png"] and task.binary_contents()["logo.png"].startswith(b"\x89PNG")
    assert task.files["tests/test_ops.py"] == TESTS and task.hidden_tests == {"tests/test_ops.py": TESTS_NEW}
    assert task.test_command == "python -m pytest -rA tests/test_ops.py"
    assert task.environment.python_version == "3.11" and task.environment.python == ("pytest==7.4.4",)
    assert (task.difficulty, task.split, task.family) == ("easy", "eval", "acme/calc")
    assert task.fail_to_pass == ("tests/test_ops.py::test_divide_by_zero_raises_value_error",)


def test_bad_swebench_instances_are_rejected_with_position_and_reason(swebench):
    rejected = import_tasks("swebench", swebench / "instances.jsonl", options(swebench)).rejected
    assert len(rejected) == 6
    for position, reason in zip(rejected, [
        "instances.jsonl:2: missing or empty field(s): patch",
        "instances.jsonl:3: no git clone at",
        "instances.jsonl:4: acme__calc: cannot read commit 000000000000",
        "instances.jsonl:5: FAIL_TO_PASS has ids that are not pytest node ids",
        "instances.jsonl:6: instance 'acme__calc-5': a patch does not apply",
        "instances.jsonl:7: malformed JSON",
    ]):
        assert position.startswith(reason), position


def test_the_imported_gold_patch_passes_in_the_sandbox_and_nothing_fails(swebench):
    [task] = import_tasks("swebench", swebench / "instances.jsonl", options(swebench)).tasks
    assert build_environments([task], "local", store_of(swebench)) == {}
    gold, empty = (grade_solution(task, solution, local(task, swebench)) for solution in (task.reference_solution, ""))
    assert (gold.reward, gold.tamper_flags, set(gold.outcomes.values())) == (1.0, (), {"passed"})
    assert empty.outcomes == {"tests/test_ops.py::test_divide_by_zero_raises_value_error": "failed",
                              "tests/test_ops.py::test_add": "passed", "tests/test_ops.py::test_divide": "passed"}
    assert empty.reward == 0.0


def test_the_import_command_reports_rejections_and_writes_a_loadable_set(swebench, tmp_path):
    env = {**os.environ, "CRUCIBLE_TASK_SETS": str(tmp_path / "library")}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "tasks", "import", "--format", "swebench",
                           str(swebench / "instances.jsonl"), "--name", "swe", "--split", "train",
                           "--specs", str(swebench / "specs.json")],
                          capture_output=True, text=True, env=env, timeout=PATIENCE_S)
    assert done.returncode == 0, done.stderr
    assert "imported 1 tasks (1 train, 0 eval), rejected 6" in done.stdout
    assert "proven gradable on the local backend: 1 of 1 tasks usable" in done.stdout
    [task] = load_task_set(tmp_path / "library" / "swe").tasks
    assert "pytest==7.4.4" in task.environment.lock  # resolved once, at import
    assert "rejected instances.jsonl:5: FAIL_TO_PASS" in " ".join(done.stderr.split())
    assert load_task_set(tmp_path / "library" / "swe").by_id["swe/acme__calc-1"].kind == "repository"


def test_a_missing_repositories_folder_is_a_clear_error(swebench, tmp_path):
    env = {**os.environ, "CRUCIBLE_TASK_SETS": str(tmp_path / "library")}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "tasks", "import", "--format", "swebench",
                           str(swebench / "instances.jsonl"), "--name", "swe", "--repos", str(tmp_path / "none")],
                          capture_output=True, text=True, env=env, timeout=PATIENCE_S)
    assert done.returncode == 2 and "no such folder of repositories" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


# -- Harbor ----------------------------------------------------------------------------------

HARBOR_TEST_SH = """\
#!/bin/bash
cd /workspace
python3 -m pytest /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
HARBOR_TESTS = """\
from greet import greet


def test_greets_by_name():
    assert greet("Ada") == "Hello, Ada!"


def test_strips_whitespace():
    assert greet("  Bob ") == "Hello, Bob!"
"""


def harbor_task(root: Path, name: str, **overrides: str | None) -> Path:
    files = {
        "instruction.md": "Make `greet(name)` in greet.py return 'Hello, NAME!' with NAME stripped of spaces.\n",
        "task.toml": 'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\ncategory = "python"\n\n'
                     "[verifier]\ntimeout_sec = 60.0\n\n[environment]\nmemory_mb = 1024\nstorage_mb = 256\n",
        "environment/Dockerfile": f"FROM {DEFAULT_IMAGE}\nWORKDIR /workspace\nCOPY greet.py .\n",
        "environment/greet.py": 'def greet(name):\n    return "Hi"\n',
        "solution/solve.sh": "#!/bin/bash\ncat > greet.py <<'PY'\ndef greet(name):\n"
                             "    return f\"Hello, {name.strip()}!\"\nPY\n",
        "tests/test.sh": HARBOR_TEST_SH,
        "tests/test_outputs.py": HARBOR_TESTS,
    }
    files.update(overrides)
    write(root / name, {path: text for path, text in files.items() if text is not None})
    return root / name


@pytest.fixture(scope="module")
def harbor(tmp_path_factory) -> Iterator[Path]:
    """Harbor task directories, and a store of their own for the environments their Dockerfiles
    make (removed with their Docker images after the module)."""
    root = tmp_path_factory.mktemp("harbor")
    harbor_task(root, "greet")
    harbor_task(root, "no-instruction", **{"instruction.md": None})
    harbor_task(root, "bad-toml", **{"task.toml": "[metadata\n"})
    harbor_task(root, "solve-fails", **{"solution/solve.sh": "#!/bin/bash\necho cannot >&2\nexit 3\n"})
    harbor_task(root, "no-tests", **{"tests/test_outputs.py": "def helper():\n    pass\n"})
    yield root
    for digest in images(store_of(root)):
        remove_image(digest)


def greet_task(harbor: Path, backend: str = "local"):
    """The greet task, its environment built for `backend`."""
    task = import_tasks("harbor", harbor / "greet", ImportOptions("hb")).tasks[0]
    build_all([task.environment], backend, store_of(harbor))
    return task


def test_harbor_task_directories_import_with_a_reference_diff_from_solve_sh(harbor):
    imported = import_tasks("harbor", harbor, ImportOptions("hb"))
    [task] = imported.tasks
    assert task.id == "hb/greet" and task.files == {"greet.py": 'def greet(name):\n    return "Hi"\n'}
    assert task.fail_to_pass == ("test_outputs.py::test_greets_by_name", "test_outputs.py::test_strips_whitespace")
    assert (task.test_command, task.verdict_file) == ("bash /tests/test.sh", "/logs/verifier/reward.txt")
    assert set(task.grader_files) == {"test.sh", "test_outputs.py"}
    assert (task.difficulty, task.domain, task.limits.wall_s, task.limits.disk_mb) == ("easy", "python", 60.0, 256)
    assert '+    return f"Hello, {name.strip()}!"' in task.reference_solution
    assert sorted(imported.rejected) == [
        "bad-toml: task.toml: malformed TOML: Expected ']' at the end of a table declaration (at line 1, column 10)",
        "no-instruction: instruction.md is missing",
        "no-tests: tests/ defines no test function (tests/test_*.py with def test_*)",
        "solve-fails: solution/solve.sh failed (RE, exit 3): cannot",
    ]


def test_a_harbor_task_is_graded_by_its_test_sh_and_verdict_file(harbor):
    task = greet_task(harbor)
    solved, untouched = (grade_solution(task, solution, local(task, harbor))
                         for solution in (task.reference_solution, ""))
    assert (solved.reward, solved.tamper_flags, set(solved.outcomes.values())) == (1.0, (), {"passed"})
    assert (untouched.reward, untouched.tamper_flags, set(untouched.outcomes.values())) == (0.0, (), {"failed"})
    half = task.reference_solution.replace("name.strip()", "name")
    assert grade_solution(task, half, local(task, harbor)).outcomes == {
        "test_outputs.py::test_greets_by_name": "passed", "test_outputs.py::test_strips_whitespace": "failed"}


def test_a_harbor_submission_cannot_write_the_verdict_for_failing_tests(harbor):
    task = greet_task(harbor)
    cheat = textwrap.dedent("""\
        --- a/greet.py
        +++ b/greet.py
        @@ -1,2 +1,8 @@
        +import atexit
        +
        +def _claim_success():
        +    open("/logs/verifier/reward.txt", "w").write("1")
        +
        +atexit.register(_claim_success)
         def greet(name):
             return "Hi"
        """)
    g = grade_solution(task, cheat, local(task, harbor))
    assert set(g.outcomes.values()) == {"failed"} and g.reward == 0.0


def test_a_harbor_reference_passes_on_every_backend(harbor, backend_name):
    task = greet_task(harbor, backend_name)  # on Docker, an image built from the task's Dockerfile
    sandbox = open_sandbox(backend_name, sandbox_spec(task, store_of(harbor)))
    g = grade_solution(task, task.reference_solution, sandbox)
    assert (g.reward, g.exec.backend) == (1.0, backend_name)


def test_hostile_or_odd_swebench_fields_are_rejected_not_obeyed(swebench, tmp_path):
    good = json.loads((swebench / "instances.jsonl").read_text().splitlines()[0])
    planted = tmp_path / "planted"
    odd = [
        good | {"base_commit": f"--output={planted}"},
        good | {"repo": ".."},
        good | {"difficulty": ["hard"]},
    ]
    instances = tmp_path / "odd.jsonl"
    instances.write_text("".join(json.dumps(record) + "\n" for record in odd))
    imported = import_tasks("swebench", instances, ImportOptions("swe", repos=swebench / "repos"))
    assert not planted.exists()
    assert [r.split(": ", 2)[-1][:40] for r in imported.rejected] == [
        f"base_commit '--output={planted}' is not a"[:40], "repo '..' is not OWNER/NAME",
        "difficulty must be a string",
    ]


@pytest.mark.parametrize(("toml", "reason"), [
    ('metadata = "x"\n', "task.toml: [metadata] must be a table"),
    ("[verifier]\ntimeout_sec = inf\n", "task.toml: bad limits"),
])
def test_odd_harbor_task_toml_is_rejected_with_its_reason(tmp_path, toml, reason):
    harbor_task(tmp_path, "odd", **{"task.toml": toml})
    imported = import_tasks("harbor", tmp_path, ImportOptions("hb"))
    assert imported.tasks == [] and imported.rejected[0].startswith(f"odd: {reason}")
