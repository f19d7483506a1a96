"""Task sets: the built-in default set, its generator, and the loader's error messages."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from patience import PATIENCE_S

from task_sets import compositions as compose
from task_sets import repairs
from task_sets.generator import (
    DEFAULT_OUTPUT,
    FAMILIES,
    INSTANCES_PER_FAMILY,
    generate_tasks,
)
from task_sets.generator import main as generate
from task_sets.loader import TaskSet, TaskSetError, load_task_set
from task_sets.schema import DIFFICULTIES, MAX_PROMPT_CHARS, TaskBase


@pytest.fixture(scope="module")
def default_set() -> TaskSet:
    return load_task_set("default")


def _record(task_id: str = "demo/a", drop: tuple[str, ...] = (), **changes: object) -> dict:
    """A valid task record, with some fields changed or dropped."""
    record = {
        "id": task_id,
        "prompt": "Write a Python function `add_one(x)` that returns x plus 1.",
        "entry_point": "add_one",
        "reference_solution": "def add_one(x):\n    return x + 1\n",
        "tests": "from solution import add_one\n\n\ndef test_two():\n    assert add_one(1) == 2\n",
        "difficulty": "easy",
        "family": "demo",
        "split": "train",
        **changes,
    }
    return {key: value for key, value in record.items() if key not in drop}


def _jsonl(*records: object) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def _yaml(*records: object) -> str:
    # JSON is YAML, so each task sits on one known line (the first line holds `tasks:`).
    return "tasks:\n" + "".join(f"  - {json.dumps(record)}\n" for record in records)


def _write_set(root: Path, files: dict[str, str]) -> Path:
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


# --- the built-in default set -------------------------------------------------------------


def test_default_set_has_three_tiers_and_both_splits(default_set: TaskSet) -> None:
    assert default_set.name == "default"
    assert len(default_set) >= 160
    assert {task.difficulty for task in default_set} == set(DIFFICULTIES)
    assert len(default_set.train()) + len(default_set.eval()) == len(default_set)
    assert 0.15 <= len(default_set.eval()) / len(default_set) <= 0.3


def test_every_family_appears_in_both_splits(default_set: TaskSet) -> None:
    splits_by_family: dict[str, set[str]] = {}
    for task in default_set:
        splits_by_family.setdefault(task.family, set()).add(task.split)
    assert set(FAMILIES) <= set(splits_by_family)
    assert all(splits == {"train", "eval"} for splits in splits_by_family.values()), splits_by_family


def test_generated_tasks_are_small_and_regular(default_set: TaskSet) -> None:
    generated = [task for task in default_set if task.family in FAMILIES]
    assert Counter(task.family for task in generated) == {family: INSTANCES_PER_FAMILY for family in FAMILIES}
    assert 8 <= len(FAMILIES) <= 10
    for task in generated:
        assert task.id.startswith(f"default/{task.family}/")
        assert task.difficulty == FAMILIES[task.family][0]
        assert task.domain == "python-functions"
        assert len(task.prompt) <= 200 and f"`{task.entry_point}(" in task.prompt
        assert len(task.reference_solution) <= 150
        assert task.reference_solution.startswith(f"def {task.entry_point}(")
        assert "\n    return " in task.reference_solution
        assert 3 <= task.tests.count("\ndef test_") <= 5


def test_generator_reproduces_the_committed_file_byte_for_byte(tmp_path: Path) -> None:
    regenerated = tmp_path / "generated.jsonl"
    generate(["--out", str(regenerated)])
    assert regenerated.read_bytes() == DEFAULT_OUTPUT.read_bytes()


def test_split_depends_on_task_id_not_on_seed() -> None:
    seed_0, seed_1 = generate_tasks(seed=0), generate_tasks(seed=1)
    assert [(t.id, t.split) for t in seed_0] == [(t.id, t.split) for t in seed_1]
    assert [t.reference_solution for t in seed_0] != [t.reference_solution for t in seed_1]


def test_by_id_and_content_version(default_set: TaskSet, tmp_path: Path) -> None:
    first = default_set.tasks[0]
    assert default_set.by_id[first.id] is first
    assert load_task_set("default").version == default_set.version

    single = tmp_path / "one.jsonl"
    single.write_text(_jsonl(_record()))
    before = load_task_set(single).version
    single.write_text(_jsonl(_record(prompt="Write `add_one(x)`: return x + 1.")))
    assert load_task_set(single).version != before


# --- reference solutions against their hidden tests --------------------------------------

# Runs every task's tests against its reference solution and against a stub that returns
# None, all in one interpreter; prints {task id: [[reference results], [stub results]]}.
_GRADING_SCRIPT = """
import json, sys, types

def run(solution, tests):
    sys.modules["solution"] = module = types.ModuleType("solution")
    namespace = {"__name__": "hidden_tests"}
    try:
        exec(solution, module.__dict__)
        exec(tests, namespace)
    except Exception:
        return [False]
    results = []
    for name, test in list(namespace.items()):
        if name.startswith("test_") and callable(test):
            try:
                test()
                results.append(True)
            except Exception:
                results.append(False)
    return results

report = {}
for task in json.load(open(sys.argv[1])):
    stub = f"def {task['entry_point']}(*args):\\n    return None\\n"
    report[task["id"]] = [run(task["reference_solution"], task["tests"]), run(stub, task["tests"])]
print(json.dumps(report))
"""


@pytest.mark.parametrize("name", ["default", "compose"])
def test_reference_solutions_pass_and_a_stub_fails(name: str, tmp_path: Path) -> None:
    task_set = load_task_set(name)
    (tmp_path / "grade.py").write_text(_GRADING_SCRIPT)
    (tmp_path / "tasks.json").write_text(json.dumps([task.model_dump(mode="json") for task in task_set]))
    completed = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "grade.py", "tasks.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=PATIENCE_S,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert set(report) == set(task_set.by_id)
    failing_references = [task_id for task_id, (reference, _) in report.items() if not all(reference)]
    passing_stubs = [task_id for task_id, (_, stub) in report.items() if all(stub)]
    assert failing_references == [] and passing_stubs == []


# --- the built-in compose set -------------------------------------------------------------


def test_compose_eval_tasks_are_unseen_combinations_of_phrases_seen_in_training() -> None:
    """Every eval task combines phrases that each appear, in the same slot, in some train task
    of its family, so it can be solved by reading the prompt, and never by recalling a train answer."""
    task_set = load_task_set("compose")
    assert {family.name for family in compose.FAMILIES} == {task.family for task in task_set.eval()}
    assert 40 <= len(task_set.eval()) <= 70 and len(task_set) > 800
    split_of = {task.prompt: task.split for task in task_set}
    for family in compose.FAMILIES:
        combos = [(phrases, split_of[prompt]) for phrases, prompt, _ in compose.combinations(family)]
        seen = [{phrases[slot] for phrases, split in combos if split == "train"} for slot in range(len(family.slots))]
        unseen = [phrases for phrases, split in combos
                  if split == "eval" and any(phrase not in seen[slot] for slot, phrase in enumerate(phrases))]
        assert not unseen, f"{family.name}: eval combinations with a phrase no train task shows: {unseen}"
    assert len({t.reference_solution for t in task_set}) == len(task_set)
    assert task_set.reward.version.startswith("all-or-nothing@")


def test_compose_generator_reproduces_the_committed_file(tmp_path: Path) -> None:
    compose.main(["--out", str(tmp_path / "generated.jsonl")])
    assert (tmp_path / "generated.jsonl").read_bytes() == compose.DEFAULT_OUTPUT.read_bytes()


# --- the built-in repair set ----------------------------------------------------------------

_CHECKING_SCRIPT = """
import contextlib, io, json, sys, types
def check(task, solution):
    module = types.ModuleType("solution")
    exec(solution, module.__dict__)
    sys.modules["solution"] = module
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(task["files"]["check.py"], {"__name__": "__main__"})
        code = 0
    except SystemExit as stop:
        code = stop.code
    return code, out.getvalue()
print(json.dumps({t["id"]: [check(t, t["files"]["solution.py"]), check(t, t["reference_solution"])]
                  for t in json.load(open(sys.argv[1]))}))
"""


def test_repair_tasks_need_their_check_run_the_start_fails_it_and_the_reference_passes(tmp_path: Path) -> None:
    """What the hidden tests expect is in what check.py prints, never in the prompt; the starting
    solution.py fails the check with the call, both values and the behaviour wanted; the
    reference passes it."""
    task_set = load_task_set("repair")
    (tmp_path / "check.py").write_text(_CHECKING_SCRIPT)
    (tmp_path / "tasks.json").write_text(json.dumps([task.model_dump(mode="json") for task in task_set]))
    completed = subprocess.run(["/usr/bin/python3", "-I", "-S", "check.py", "tasks.json"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=PATIENCE_S)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    prompts = {(task.family, task.prompt) for task in task_set}
    assert len(prompts) == len(compose.FAMILIES)  # one prompt per family: it says nothing of the combination
    for task in task_set:
        (start_code, start_output), (reference_code, reference_output) = report[task.id]
        fail, want = start_output.splitlines()
        assert start_code == 1 and fail.startswith(f"FAIL {task.entry_point}(") and ", got " in fail, task.id
        assert want.startswith(f"want: {task.entry_point}(") and task.check_command == "python3 check.py"
        assert reference_code == 0 and reference_output == "all 2 checks passed\n", task.id


def test_repair_eval_tasks_are_combinations_no_train_task_shows() -> None:
    task_set = load_task_set("repair")
    specs = {task.id: task.files["check.py"].split("EXPECTED = ", 1)[1].split("\n", 1)[0] for task in task_set}
    train = {specs[task.id] for task in task_set.train()}
    assert not [task.id for task in task_set.eval() if specs[task.id] in train]
    assert {task.family for task in task_set.eval()} == {family.name for family in compose.FAMILIES}
    assert 40 <= len(task_set.eval()) <= 70 and len(set(specs.values())) == len(task_set) > 800
    assert task_set.reward.version.startswith("all-or-nothing@")


def test_repair_generator_reproduces_the_committed_file(tmp_path: Path) -> None:
    repairs.main(["--out", str(tmp_path / "generated.jsonl")])
    assert (tmp_path / "generated.jsonl").read_bytes() == repairs.DEFAULT_OUTPUT.read_bytes()


# --- loading from files -------------------------------------------------------------------


def test_jsonl_yaml_list_and_yaml_mapping_load_the_same_tasks(tmp_path: Path) -> None:
    records = [_record("demo/a"), _record("demo/b", split="eval")]
    (tmp_path / "tasks.jsonl").write_text(_jsonl(*records))
    (tmp_path / "mapping.yaml").write_text(_yaml(*records))
    (tmp_path / "list.yml").write_text("".join(f"- {json.dumps(record)}\n" for record in records))
    loaded = [load_task_set(tmp_path / name) for name in ("tasks.jsonl", "mapping.yaml", "list.yml")]
    assert [task_set.name for task_set in loaded] == ["tasks", "mapping", "list"]
    assert len({task_set.version for task_set in loaded}) == 1
    assert [task.id for task in loaded[0].eval()] == ["demo/b"]


def test_directory_loads_task_files_in_sorted_order(tmp_path: Path) -> None:
    root = _write_set(
        tmp_path / "mixed",
        {"b.jsonl": _jsonl(_record("demo/b")), "a.yaml": _yaml(_record("demo/a")), "notes.txt": "not tasks"},
    )
    task_set = load_task_set(root)
    assert task_set.name == "mixed"
    assert [task.id for task in task_set] == ["demo/a", "demo/b"]
    assert all(isinstance(task, TaskBase) for task in task_set)


# --- error messages -----------------------------------------------------------------------

_ERROR_CASES = {
    "wrong literal": (
        {"tasks.jsonl": _jsonl(_record("demo/a")) + "\n" + _jsonl(_record("demo/b", difficulty="tough"))},
        "bad/tasks.jsonl:3: task 'demo/b': field 'difficulty': Input should be 'easy', 'medium' or 'hard'",
    ),
    "malformed json": (
        {"tasks.jsonl": _jsonl(_record()) + '{"id": "demo/b",\n'},
        "bad/tasks.jsonl:2: malformed JSON: Expecting property name enclosed in double quotes (column 17)",
    ),
    "unknown field": (
        {"tasks.jsonl": _jsonl(_record(colour="red"))},
        "bad/tasks.jsonl:1: task 'demo/a': field 'colour': Extra inputs are not permitted",
    ),
    "missing field": (
        {"tasks.jsonl": _jsonl(_record(drop=("tests",)))},
        "bad/tasks.jsonl:1: task 'demo/a': field 'tests': Field required",
    ),
    "missing id": (
        {"tasks.jsonl": _jsonl(_record(drop=("id",)))},
        "bad/tasks.jsonl:1: field 'id': Field required",
    ),
    "wrong nested type": (
        {"tasks.jsonl": _jsonl(_record(limits={"wall_s": "slow"}))},
        "bad/tasks.jsonl:1: task 'demo/a': field 'limits.wall_s': "
        "Input should be a valid number, unable to parse string as a number",
    ),
    "not a mapping": (
        {"tasks.jsonl": _jsonl(["demo/a"])},
        "bad/tasks.jsonl:1: Input should be a valid dictionary or instance of FunctionTask",
    ),
    "entry point not defined": (
        {"tasks.jsonl": _jsonl(_record(entry_point="add_two"))},
        "bad/tasks.jsonl:1: task 'demo/a': field 'reference_solution': "
        "does not define 'add_two' at top level",
    ),
    "no test functions": (
        {"tasks.jsonl": _jsonl(_record(tests="from solution import add_one\nassert add_one(1) == 2\n"))},
        "bad/tasks.jsonl:1: task 'demo/a': field 'tests': defines no top-level test_* function",
    ),
    "yaml task error": (
        {"tasks.yaml": _yaml(_record("demo/a"), _record("demo/b", split="test"))},
        "bad/tasks.yaml:3: task 'demo/b': field 'split': Input should be 'train' or 'eval'",
    ),
    "malformed yaml": (
        {"tasks.yaml": "tasks:\n  - id: demo/a\n   prompt: [unclosed\n"},
        "bad/tasks.yaml:3: malformed YAML: expected <block end>, but found '<block mapping start>'",
    ),
    "yaml wrong shape": (
        {"tasks.yaml": "tasks: []\nowner: me\n"},
        "bad/tasks.yaml: expected a list of tasks, or a mapping whose only key is 'tasks'",
    ),
    "duplicate id": (
        {"a.jsonl": _jsonl(_record("demo/x")), "b.yaml": _yaml(_record("demo/y"), _record("demo/x"))},
        "bad/b.yaml:3: task 'demo/x': duplicate id, first defined at bad/a.jsonl:1",
    ),
    "starting files beyond the workspace": (
        {"tasks.jsonl": _jsonl(_record(files={"data.txt": "x" * (2 << 20)}, limits={"disk_mb": 1}))},
        "bad/tasks.jsonl:1: task 'demo/a': its starting files take 2.0 MiB, more than its workspace holds "
        "(limits.disk_mb = 1): raise limits.disk_mb or start from fewer files",
    ),
    "prompt beyond any context window": (
        {"tasks.jsonl": _jsonl(_record(prompt="x" * (MAX_PROMPT_CHARS + 1)))},
        f"bad/tasks.jsonl:1: task 'demo/a': field 'prompt': String should have at most {MAX_PROMPT_CHARS} characters",
    ),
    "empty set": (
        {"tasks.jsonl": "\n", "tasks.yaml": "# nothing yet\n"},
        "bad: task set is empty",
    ),
}


@pytest.mark.parametrize("files, expected", _ERROR_CASES.values(), ids=_ERROR_CASES.keys())
def test_bad_task_set_names_file_line_task_and_field(
    tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    root = _write_set(tmp_path / "bad", files)
    with pytest.raises(TaskSetError) as raised:
        load_task_set(root)
    assert str(raised.value) == expected


def test_an_unknown_set_says_where_it_was_looked_for_and_what_there_is(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    with pytest.raises(TaskSetError, match=rf"^unknown task set 'nope' \(imported sets are looked up in {tmp_path}\); "
                                           "available: compose, default, mine, repair, shopcart$"):
        load_task_set("nope", tmp_path)
    with pytest.raises(TaskSetError, match=r"^unknown task set 'nope'; available: compose, default, repair, shopcart$"):
        load_task_set("nope")  # no library: built-in sets only


def test_missing_path_is_reported(tmp_path: Path) -> None:
    with pytest.raises(TaskSetError, match="no such task set file or directory"):
        load_task_set(tmp_path / "absent.jsonl")
