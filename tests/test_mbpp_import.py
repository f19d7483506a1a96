"""MBPP as published (tests/data/mbpp/: google-research's mbpp.jsonl and sanitized-mbpp.json,
gzipped, bytes unchanged): integer ids, CRLF code, the paper's split, and ten problems that
judge cleanly on both backends."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from grading.validation import validate
from grading.verdict import GradeResult
from sandbox.backends import open_sandbox
from sandbox.pool import PoolConfig, SandboxPool
from task_sets.importers import ImportError_, ImportOptions, import_tasks

DATA = Path(__file__).parent / "data" / "mbpp"
SANITIZED, FULL = DATA / "sanitized-mbpp.json.gz", DATA / "mbpp.jsonl.gz"


def test_both_published_files_import_whole_with_their_integer_ids():
    sanitized = import_tasks("mbpp", SANITIZED, ImportOptions("mbpp"))
    full = import_tasks("mbpp", FULL, ImportOptions("mbpp"))
    assert (len(sanitized.tasks), sanitized.rejected, len(full.tasks), full.rejected) == (427, [], 974, [])
    first = full.tasks[0]
    assert (first.id, first.entry_point) == ("mbpp/1", "min_cost") and "\r" not in first.reference_solution
    assert "Your code should pass these tests:\n\nassert min_cost(" in first.prompt


def test_the_source_split_is_the_papers_test_ids_11_to_510():
    tasks = import_tasks("mbpp", FULL, ImportOptions("mbpp", split="source")).tasks
    evaluated = sorted(int(t.id.split("/")[1]) for t in tasks if t.split == "eval")
    assert evaluated == list(range(11, 511))


def test_a_format_without_a_split_of_its_own_refuses_the_source_split(tmp_path):
    with pytest.raises(ImportError_, match="publishes none"):
        import_tasks("humaneval", tmp_path / "x.jsonl", ImportOptions("x", split="source"))


def test_challenge_tests_are_hidden_tests_too():
    tasks = {t.id: t for t in import_tasks("mbpp", FULL, ImportOptions("mbpp")).tasks}
    assert tasks["mbpp/11"].tests.count("def test_") == 5  # 3 tests and 2 challenge tests


def test_test_list_as_a_lists_repr_imports_like_the_list(tmp_path):
    with gzip.open(FULL, "rt") as lines:
        record = json.loads(next(lines))
    as_repr = tmp_path / "repr.jsonl"
    as_repr.write_text(json.dumps({**record, "test_list": repr(record["test_list"])}) + "\n")
    [from_repr] = import_tasks("mbpp", as_repr, ImportOptions("mbpp")).tasks
    [from_list] = import_tasks("mbpp", FULL, ImportOptions("mbpp")).tasks[:1]
    assert from_repr.tests == from_list.tests


def test_a_record_without_tests_is_rejected_with_its_position(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": 7, "text": "x", "code": "def f():\n    pass\n", "test_list": []}) + "\n")
    imported = import_tasks("mbpp", bad, ImportOptions("mbpp"))
    assert imported.tasks == [] and imported.rejected == ["bad.jsonl:1: task 7: test_list is empty"]


def test_ten_problems_validate_clean_on_every_backend(backend_name):
    tasks = import_tasks("mbpp", SANITIZED, ImportOptions("mbpp")).tasks[:10]
    with SandboxPool(lambda spec: open_sandbox(backend_name, spec), PoolConfig(cpu_slots=2),
                     is_infra_failure=GradeResult.infra_failed) as pool:  # as the product proves
        report = validate(tasks, pool, repeats=1, task_set="mbpp")
    assert [(t.task_id, t.verdict, t.reasons) for t in report.problems] == []
    assert len(report.tasks) == 10


def test_samples_naming_mbpps_integer_ids_verify(tmp_path):
    from grading.samples import read_samples
    from task_sets.importers import write_task_set
    from task_sets.loader import load_task_set

    tasks = import_tasks("mbpp", SANITIZED, ImportOptions("mbpp")).tasks[:2]
    write_task_set(tasks, tmp_path / "mbpp")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": 2, "solution": tasks[0].reference_solution}) + "\n")
    read = read_samples(samples, load_task_set(tmp_path / "mbpp"))
    assert ([s.task.id for s in read.samples], read.invalid) == (["mbpp/2"], {})
