"""Every grading that does not pass says why: one FailureReason and a detail, each produced
here by a real grading in the sandbox; and an environment that cannot run the tests is an
environment error (unscored), never a failure of the submission or a tamper flag."""

from __future__ import annotations

import pytest

from grading.submission import grade_solution
from grading.verdict import grade
from sandbox.local import LocalSandbox
from sandbox.spec import SandboxSpec
from statuses import FailureReason, RewardStatus
from task_sets.schema import parse_task

pytestmark = pytest.mark.usefixtures("local_backend")

ADD_TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\ndef test_zero():\n" \
            "    assert add(0, 0) == 0\n"
FUNCTION = parse_task({"id": "reasons/add", "prompt": "Write add(a, b).", "entry_point": "add",
                       "reference_solution": "def add(a, b):\n    return a + b\n", "tests": ADD_TESTS,
                       "difficulty": "easy", "family": "reasons", "split": "eval",
                       "limits": {"wall_s": 5, "cpu_s": 5}})
REPOSITORY_FILES = {"calc/__init__.py": "", "calc/ops.py": "def add(a, b):\n    return a - b\n",
                    "tests/test_ops.py": "from calc.ops import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"}
FIX = ("--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n"
       "+    return a + b\n")


def repository(**overrides) -> object:
    record = {"id": "reasons/calc", "kind": "repository", "prompt": "Fix add.", "files": REPOSITORY_FILES,
              "reference_solution": FIX, "fail_to_pass": ["tests/test_ops.py::test_add"],
              "test_command": "python3 -m pytest -q tests", "difficulty": "easy", "family": "reasons",
              "split": "eval", "protected_paths": ["tests/*"], "limits": {"wall_s": 20, "cpu_s": 20}}
    return parse_task(record | overrides)


def change(path: str, before: str | None, after: str) -> str:
    """A one-file diff: `after` replaces `before` (None: a new file)."""
    old = before.splitlines() if before is not None else []
    new = after.splitlines()
    header = f"--- a/{path}\n" if before is not None else "--- /dev/null\n"
    hunk = f"@@ -{1 if old else 0},{len(old)} +1,{len(new)} @@\n"
    return header + f"+++ b/{path}\n" + hunk + "".join(f"-{line}\n" for line in old) + \
        "".join(f"+{line}\n" for line in new)


def failure(task, solution: str):
    grade = grade_solution(task, solution)
    assert not grade.passed and grade.failure is not None
    return grade, grade.failure


def test_a_passing_grade_has_no_failure():
    grade = grade_solution(FUNCTION, FUNCTION.reference_solution)
    assert grade.passed and grade.failure is None and grade.to_dict()["failure_reason"] is None


def test_a_wrong_answer_names_the_first_failing_test_and_its_assertion():
    grade, why = failure(FUNCTION, "def add(a, b):\n    return a * b\n")
    assert why.reason is FailureReason.TESTS_FAILED
    assert "test_hidden.py::test_small" in why.detail and "assert add(1, 2) == 3" in why.detail


def test_an_error_the_submission_raises_is_told_once_with_its_class():
    _, why = failure(FUNCTION, 'def add(a, b):\n    raise ValueError("no sum of " + repr((a, b)))\n')
    assert why.detail.endswith("first: test_hidden.py::test_small: ValueError: no sum of (1, 2)")
    _, why = failure(FUNCTION, "class Odd(Exception):\n    pass\n\ndef add(a, b):\n    raise Odd('no')\n")
    assert why.detail.endswith("first: test_hidden.py::test_small: SubmissionError: Odd: no")


def test_a_failure_reads_as_typed_with_the_characters_a_report_escapes():
    """The reports are JUnit XML; their escaping (&quot; &lt; &amp;) never reaches the reason."""
    typed = 'a "quoted" <tag> & \'more\''
    _, why = failure(FUNCTION, f"def add(a, b):\n    raise ValueError({typed!r})\n")
    assert why.detail.endswith(f"ValueError: {typed}")
    broken = change("calc/ops.py", "def add(a, b):\n    return a - b", f"def add(a, b):\n    raise ValueError({typed!r})")
    _, why = failure(repository(), broken)
    assert f"ValueError: {typed}" in why.detail, why.detail


def test_a_submission_that_does_not_parse_is_told_so():
    _, why = failure(FUNCTION, "def add(a, b) return a + b\n")
    assert why.reason is FailureReason.COLLECTION_ERROR and "SyntaxError" in why.detail


def test_a_submission_importing_what_is_not_installed_is_its_own_missing_module():
    grade, why = failure(FUNCTION, "import numpy_not_installed\n\ndef add(a, b):\n    return a + b\n")
    assert (grade.reward_status, grade.reward) == (RewardStatus.SCORED, 0.0)  # the submission's fault
    assert why.reason is FailureReason.MISSING_MODULE and "numpy_not_installed" in why.detail


def test_hidden_tests_needing_an_uninstalled_module_are_an_environment_error():
    task = FUNCTION.model_copy(update={"tests": "import yaml_not_installed\n" + ADD_TESTS})
    grade = grade_solution(task, task.reference_solution)
    assert (grade.reward_status, grade.reward) == (RewardStatus.ENV_ERROR, None)
    assert grade.failure.reason is FailureReason.MISSING_MODULE and "yaml_not_installed" in grade.failure.detail


def test_an_infinite_loop_is_called_a_timeout_with_its_limit():
    _, why = failure(FUNCTION, "def add(a, b):\n    while True:\n        pass\n")
    assert why.reason is FailureReason.TIMEOUT and "limit 5 s" in why.detail


def test_output_past_the_limit_is_called_an_output_limit():
    _, why = failure(FUNCTION, "import sys\nsys.stderr.write('x' * (4 << 20))\n\ndef add(a, b):\n    return a + b\n")
    assert why.reason is FailureReason.OUTPUT_LIMIT


def test_memory_past_the_limit_is_called_a_memory_limit():
    task = FUNCTION.model_copy(update={"limits": FUNCTION.limits.model_copy(update={"memory_mb": 64})})
    _, why = failure(task, "hog = bytearray(256 << 20)\n\ndef add(a, b):\n    return a + b\n")
    assert why.reason is FailureReason.MEMORY_LIMIT


def test_a_diff_that_does_not_apply_says_which_hunk():
    _, why = failure(repository(), FIX.replace("return a - b", "return a // b"))
    assert why.reason is FailureReason.DIFF_DOES_NOT_APPLY and "calc/ops.py" in why.detail


def test_tests_the_submission_removed_are_missing():
    # Deleting a protected test file is restored before grading; renaming the test inside the
    # expected list's file cannot be done either, so the task itself expects a test that is not there.
    task = repository(fail_to_pass=["tests/test_ops.py::test_add", "tests/test_ops.py::test_subtract"])
    _, why = failure(task, FIX)
    assert why.reason is FailureReason.TESTS_MISSING and "test_subtract" in why.detail


def test_a_repository_module_the_submission_broke_is_its_own_collection_error():
    grade, why = failure(repository(), change("calc/ops.py", REPOSITORY_FILES["calc/ops.py"], "def add(a, b)\n"))
    assert grade.reward_status is RewardStatus.SCORED
    assert why.reason is FailureReason.COLLECTION_ERROR and "tests.test_ops could not be collected" in why.detail


def test_a_submission_deleting_a_repository_module_is_scored_not_an_environment_error():
    deleted = "--- a/calc/ops.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-def add(a, b):\n-    return a - b\n"
    grade, why = failure(repository(), deleted)
    assert (grade.reward_status, why.reason) == (RewardStatus.SCORED, FailureReason.MISSING_MODULE)


def test_a_module_the_submission_imports_is_its_own_fault_in_a_repository():
    broken = change("calc/ops.py", REPOSITORY_FILES["calc/ops.py"], "import attr_not_installed\ndef add(a, b):\n"
                    "    return a + b")
    grade, why = failure(repository(), broken)
    assert (grade.reward_status, why.reason) == (RewardStatus.SCORED, FailureReason.MISSING_MODULE)


def test_unchanged_tests_importing_an_uninstalled_module_are_an_environment_error():
    files = {**REPOSITORY_FILES, "tests/test_ops.py": "import hypothesis_not_installed\n"
             + REPOSITORY_FILES["tests/test_ops.py"]}
    grade = grade_solution(repository(files=files), FIX)
    assert (grade.reward_status, grade.failure.reason) == (RewardStatus.ENV_ERROR, FailureReason.MISSING_MODULE)
    assert "hypothesis_not_installed" in grade.failure.detail and "tests/test_ops.py" in grade.failure.detail


def test_a_test_command_whose_program_is_missing_is_an_environment_error():
    grade = grade_solution(repository(test_command="tox_not_installed -e py && python3 -m pytest -q tests"), FIX)
    assert (grade.reward_status, grade.reward) == (RewardStatus.ENV_ERROR, None)
    assert grade.failure.reason is FailureReason.MISSING_COMMAND and "tox_not_installed" in grade.failure.detail
    assert grade.tamper_flags == ()  # not "no_report": nothing of the submission ran


def test_a_test_command_that_needs_the_network_is_an_environment_error():
    command = "python3 -c \"import urllib.request; urllib.request.urlopen('http://pypi.org')\" && python3 -m pytest"
    grade = grade_solution(repository(test_command=command), FIX)
    assert (grade.reward_status, grade.failure.reason) == (RewardStatus.ENV_ERROR, FailureReason.NETWORK_UNAVAILABLE)


def test_a_submission_that_ends_pytest_early_is_not_excused_by_what_it_prints():
    """It prints what a missing program would, then exits: pytest had started (the token is gone),
    so this is the submission's doing, scored 0 with a tamper flag."""
    exits = change("calc/ops.py", REPOSITORY_FILES["calc/ops.py"],
                   "import os, sys\nsys.stderr.write('sh: 1: tox: not found\\n')\nos._exit(127)")
    grade, why = failure(repository(), exits)
    assert (grade.reward_status, grade.reward) == (RewardStatus.SCORED, 0.0)
    assert why.reason in (FailureReason.TAMPERED, FailureReason.NO_REPORT)


def test_a_suite_that_leaves_no_report_says_what_it_printed():
    grade, why = failure(repository(test_command="echo 'no tests here' >&2; exit 3"), FIX)
    assert why.reason is FailureReason.NO_REPORT and "no tests here" in why.detail


def test_a_tamper_flag_is_the_reason_and_named():
    conftest = change("conftest.py", None, "import pytest")
    grade, why = failure(repository(), FIX + conftest)
    assert why.reason is FailureReason.TAMPERED and "runner_config_added" in why.detail


def test_tests_without_a_test_function_are_an_invalid_task():
    graded = grade(LocalSandbox(), {"solution.py": FUNCTION.reference_solution}, {"test_task.py": "x = 1\n"})
    assert (graded.reward_status, graded.failure.reason) == (RewardStatus.INVALID, FailureReason.INVALID_TASK)


def test_a_sandbox_that_fails_is_an_infrastructure_failure_with_its_error(tmp_path):
    broken = LocalSandbox(SandboxSpec(image="not-a-local-image"), scratch_dir=tmp_path)
    graded = grade(broken, {"solution.py": FUNCTION.reference_solution}, {"test_task.py": ADD_TESTS})
    assert (graded.reward_status, graded.failure.reason) == (RewardStatus.INFRA_ERROR, FailureReason.INFRASTRUCTURE)
    assert graded.failure.detail == " ".join(graded.exec.error.split())[:500]


def test_every_reason_is_produced_by_a_test_here():
    source = open(__file__).read()
    assert [r.name for r in FailureReason if f"FailureReason.{r.name})" not in source
            and f"FailureReason.{r.name}\n" not in source and f"FailureReason.{r.name} " not in source] == []


def test_a_missing_module_the_environment_does_provide_is_the_submissions_doing():
    """The submission hides an installed module (the standard library's colorsys) from the
    unchanged tests, which then fail to import it: a module the environment installs is never
    blamed on the environment, whatever the traceback says."""
    hides = change("calc/__init__.py", "", "import sys\nclass _Hide:\n    def find_spec(self, name, path=None, target=None):\n"
                   "        if name == 'colorsys':\n            raise ModuleNotFoundError(\"No module named 'colorsys'\")\n"
                   "sys.meta_path.insert(0, _Hide())")
    files = {**REPOSITORY_FILES, "tests/test_ops.py": REPOSITORY_FILES["tests/test_ops.py"].replace(
        "from calc.ops import add\n", "from calc.ops import add\nimport colorsys\n")}
    grade, why = failure(repository(files=files), FIX + hides)
    assert (grade.reward_status, grade.reward, why.reason) == (RewardStatus.SCORED, 0.0, FailureReason.MISSING_MODULE)


def test_a_missing_program_named_by_the_submission_not_the_test_command_is_not_excused():
    runs_script = change("run.sh", None, "#!/bin/sh\nnot_a_program_xyz")
    grade = grade_solution(repository(test_command="sh run.sh && python3 -m pytest -q tests"), FIX + runs_script)
    assert grade.reward_status is RewardStatus.SCORED and grade.reward == 0.0


# -- a conftest.py that does not import, a run killed while collecting, a test without the network ----------------

SRC_FILES = {"src/calc/__init__.py": "", "src/calc/ops.py": REPOSITORY_FILES["calc/ops.py"],
             "conftest.py": "import calc\n", "tests/test_ops.py": REPOSITORY_FILES["tests/test_ops.py"]}
SRC_FIX = FIX.replace("calc/ops.py", "src/calc/ops.py")


def test_a_pristine_conftest_importing_a_src_package_the_environment_does_not_install_is_an_environment_error():
    """pytest loads the root conftest.py before its session and ends at once when it does not
    import: the plugin reports that import error itself, and the package, which lies under src/
    where nothing puts it on sys.path, is the environment's to install."""
    grade = grade_solution(repository(files=SRC_FILES), SRC_FIX)
    assert (grade.reward_status, grade.reward, grade.tamper_flags) == (RewardStatus.ENV_ERROR, None, ())
    assert grade.failure.reason is FailureReason.MISSING_MODULE
    assert "'calc'" in grade.failure.detail and "(conftest.py)" in grade.failure.detail


def test_a_submission_deleting_the_src_package_a_pristine_conftest_imports_is_scored():
    deleted = "".join(f"--- a/{path}\n+++ /dev/null\n@@ -1,{len(SRC_FILES[path].splitlines())} +0,0 @@\n"
                      + "".join(f"-{line}\n" for line in SRC_FILES[path].splitlines())
                      for path in ("src/calc/ops.py",))
    grade, why = failure(repository(files=SRC_FILES), deleted)
    assert (grade.reward_status, grade.reward, grade.tamper_flags) == (RewardStatus.SCORED, 0.0, ())
    assert why.reason is FailureReason.MISSING_MODULE and "conftest could not be collected" in why.detail


def test_a_submission_editing_the_conftest_that_does_not_import_is_scored_and_flagged():
    edited = change("conftest.py", "import calc", "import calc_not_installed")
    grade, _ = failure(repository(files=SRC_FILES), SRC_FIX + edited)
    assert (grade.reward_status, grade.reward) == (RewardStatus.SCORED, 0.0)
    assert grade.tamper_flags == ("protected_path_modified",)


def test_a_conftest_the_submission_broke_by_deleting_a_root_package_is_its_own_collection_error():
    """Not "no_report" and a tamper flag: pytest ended before its session, and the plugin said why."""
    files = {**REPOSITORY_FILES, "conftest.py": "import calc.ops\n"}
    deleted = "--- a/calc/ops.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-def add(a, b):\n-    return a - b\n"
    grade, why = failure(repository(files=files), deleted)
    assert (grade.reward_status, grade.reward, grade.tamper_flags) == (RewardStatus.SCORED, 0.0, ())
    assert why.reason is FailureReason.MISSING_MODULE and "No module named 'calc.ops'" in why.detail


RETRYING_DOWNLOAD = ("import time\n\nfor attempt in range(1000):\n    print('download failed, retrying', attempt)\n"
                     "    time.sleep(0.2)\n\n\ndef test_data():\n    pass\n")


def test_a_run_killed_while_collecting_names_the_module_and_the_line_it_was_at():
    files = {**REPOSITORY_FILES, "tests/test_data.py": RETRYING_DOWNLOAD}
    task = repository(files=files, limits={"wall_s": 4, "cpu_s": 20})
    _, why = failure(task, FIX)
    assert why.reason is FailureReason.TIMEOUT and "(limit 4 s)" in why.detail
    assert "while collecting tests/test_data.py" in why.detail
    assert "at tests/test_data.py:5 in <module>" in why.detail  # the sleep between attempts


def test_a_run_killed_while_running_a_test_names_the_test():
    forever = change("calc/ops.py", REPOSITORY_FILES["calc/ops.py"], "def add(a, b):\n    while True: pass")
    _, why = failure(repository(limits={"wall_s": 4, "cpu_s": 20}), forever)
    assert why.reason is FailureReason.TIMEOUT
    assert "while running tests/test_ops.py::test_add (at calc/ops.py:2 in add)" in why.detail


DOWNLOADING_TEST = ("import urllib.request\n\nfrom calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
                    "\n\ndef test_remote_table():\n    urllib.request.urlopen('https://files.pythonhosted.org/x.csv', "
                    "timeout=5)\n")


def test_a_test_that_needed_the_network_is_network_unavailable_and_still_scored():
    """The code under test may open sockets itself: nothing independent of the submission says
    the download was the test's, so the grade stays scored, the reason says what happened."""
    task = repository(files={**REPOSITORY_FILES, "tests/test_ops.py": DOWNLOADING_TEST},
                      pass_to_pass=["tests/test_ops.py::test_remote_table"])
    grade, why = failure(task, FIX)
    assert (grade.reward_status, grade.tamper_flags) == (RewardStatus.SCORED, ())
    assert grade.reward_components["fail_to_pass_fraction"] == 1.0 and grade.outcomes[
        "tests/test_ops.py::test_remote_table"] == "failed"
    assert why.reason is FailureReason.NETWORK_UNAVAILABLE
    assert why.detail.startswith("tests/test_ops.py::test_remote_table needed the network")
    assert "URLError" in why.detail and "name resolution" in why.detail


def test_a_conftest_pytest_loads_while_collecting_that_imports_an_uninstalled_src_package_is_an_environment_error():
    """pytest reports that import error as its session's own collection error, a testcase
    without a name: read as such, not as an unreadable report."""
    files = {**{path: text for path, text in SRC_FILES.items() if path != "conftest.py"},
             "tests/sub/conftest.py": "import calc\n", "tests/sub/test_more.py": "def test_more():\n    pass\n"}
    grade = grade_solution(repository(files=files), SRC_FIX)
    assert (grade.reward_status, grade.tamper_flags) == (RewardStatus.ENV_ERROR, ())
    assert grade.failure.reason is FailureReason.MISSING_MODULE and "(tests/sub/conftest.py)" in grade.failure.detail
