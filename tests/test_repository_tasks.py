"""Repository tasks graded for real: the bundled shopcart repository, diffs applied with git,
pytest in the sandbox, and submissions that try to break each grading rule."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import textwrap

import pytest

from grading.protection import guard
from grading.submission import grade_solution, sandbox_spec
from grading.verdict import _junit_key
from sandbox.backends import open_sandbox
from task_sets.loader import load_task_set
from task_sets.patches import PatchError, apply_patch

SHOPCART = load_task_set("shopcart")
TASK = SHOPCART.by_id["shopcart/negative-money"]
MONEY = "shopcart/money.py"
JUNIT_ALL_PASSED = "".join(
    ['<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="14">']
    + [f'<testcase classname="{_junit_key(t)[0]}" name="{_junit_key(t)[1]}" time="0.001"/>' for t in TASK.expected_tests]
    + ["</testsuite></testsuites>"]
)


def diff(changes: dict[str, str | None], files=TASK.files) -> str:
    """A unified diff from `files` to `changes` (None deletes a file)."""
    out = []
    for path, after in changes.items():
        before = files.get(path)
        out += difflib.unified_diff(
            before.splitlines(keepends=True) if before is not None else [],
            after.splitlines(keepends=True) if after is not None else [],
            f"a/{path}" if before is not None else "/dev/null", f"b/{path}" if after is not None else "/dev/null",
        )
    return "".join(out)


def grade(solution: str, backend: str = "local"):
    return grade_solution(TASK, solution, open_sandbox(backend, sandbox_spec(TASK)), SHOPCART.reward)


def money_with(prelude: str, fixed: bool = True) -> str:
    """money.py (fixed, or as the task starts) with code that runs when the tests import it."""
    money = apply_patch(TASK.files, TASK.reference_solution)[MONEY] if fixed else TASK.files[MONEY]
    future = "from __future__ import annotations\n"
    return money.replace(future, future + textwrap.dedent(prelude))


# -- the happy path and partial credit -------------------------------------------------------


def test_the_reference_diff_scores_one_on_every_backend(backend_name):
    g = grade(TASK.reference_solution, backend_name)
    assert (g.reward_status, g.reward, g.tamper_flags) == ("scored", 1.0, ())
    assert set(g.outcomes) == set(TASK.expected_tests) and set(g.outcomes.values()) == {"passed"}
    assert g.reward_version == SHOPCART.reward.version and g.reward_version.startswith("shopcart-tiered@")
    assert g.exec.backend == backend_name


def test_an_empty_diff_earns_nothing_though_the_old_tests_pass():
    g = grade("")
    assert g.reward == 0.0 and g.tamper_flags == ()
    assert g.reward_components["pass_to_pass_fraction"] == 1.0
    assert (g.reward_components["fail_to_pass_fraction"], g.reward_components["compiles"]) == (0.0, 0.0)


def test_half_a_fix_earns_the_tiers_it_reached():
    fixed = apply_patch(TASK.files, TASK.reference_solution)[MONEY]
    parse_only = fixed.replace('        sign = "-" if self.cents < 0 else ""\n', '        sign = ""\n')
    g = grade(diff({MONEY: parse_only}))
    assert g.outcomes["tests/test_money.py::test_parse_negative_amounts"] == "passed"
    assert g.outcomes["tests/test_money.py::test_format_negative_amounts"] == "failed"
    assert g.reward == pytest.approx(0.1 + 0.5 * 0.5)  # compiles, half of fail_to_pass, not all passed


def test_breaking_old_tests_scales_the_progress_down():
    broken_addition = money_with("").replace("return Money(self.cents + other.cents)", "return Money(0)")
    g = grade(diff({MONEY: broken_addition}))
    kept = g.reward_components["pass_to_pass_fraction"]
    assert g.reward_components["fail_to_pass_fraction"] == 1.0 and 0 < kept < 1
    assert g.outcomes["tests/test_money.py::test_arithmetic_is_exact"] == "failed"
    assert g.reward == pytest.approx(0.1 + 0.5 * kept)


def test_a_diff_that_does_not_apply_is_a_scored_zero_without_a_sandbox_run():
    g = grade(TASK.reference_solution.replace("whole, _, fraction", "whole, _, fractions"))
    assert (g.reward_status, g.reward, g.suite_ran) == ("scored", 0.0, False)
    assert g.exec.backend == "host" and g.exec.command == ("git", "apply")
    assert g.messages["_"].startswith("the diff does not apply")
    assert set(g.outcomes.values()) == {"missing"}


def test_python_that_does_not_parse_fails_tier_one():
    g = grade(diff({MONEY: money_with("def broken(:\n")}))
    assert g.reward_components["compiles"] == 0.0 and g.reward == 0.0


# -- tampering -------------------------------------------------------------------------------


def test_an_edited_hidden_test_is_restored_and_the_grade_zeroed():
    hidden = TASK.hidden_tests["tests/test_money.py"]
    gutted = hidden.replace('assert Money.parse("-1.50") == Money(-150)', "return")
    g = grade(TASK.reference_solution + diff({"tests/test_money.py": gutted}))
    assert g.tamper_flags == ("protected_path_modified",) and g.reward == 0.0
    assert "tests/test_money.py" in g.messages["_protected"]
    assert g.reward_components["all_passed"] == 1.0  # the restored tests ran and passed: still 0


@pytest.mark.parametrize("path", ["conftest.py", "shopcart/conftest.py", "sitecustomize.py", "pytest.ini",
                                  ".pytest.ini", "pytest.toml", "evil.pth"])
def test_added_runner_configuration_is_removed_and_flagged(path):
    force_pass = "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n    return True\n"
    g = grade(diff({path: force_pass}))
    assert g.tamper_flags == ("runner_config_added",) and g.reward == 0.0
    assert g.outcomes["tests/test_money.py::test_parse_negative_amounts"] == "failed"  # the conftest never ran


@pytest.mark.parametrize("attack", ["rewrite", "rename the folder", "delete"])
def test_code_run_by_the_tests_cannot_change_hidden_tests(backend_name, attack):
    """cart.py is imported while tests/test_cart.py is collected, before tests/test_money.py
    is. The local backend seals the hidden tests (each attempt fails); Docker cannot, and the
    session record reports the change."""
    attempts = {
        "rewrite": 'os.chmod(hidden, 0o644); hidden.write_text(hidden.read_text().replace("assert ", "assert True or "))',
        "rename the folder": 'os.rename("tests", "tests_moved")',
        "delete": "hidden.unlink()",
    }
    code = f"""\
        import os, pathlib
        hidden = pathlib.Path("tests/test_money.py")
        try:
            {attempts[attack]}
        except OSError:
            pass
        """
    cart = TASK.files["shopcart/cart.py"]
    future = "from __future__ import annotations\n"
    g = grade(diff({"shopcart/cart.py": cart.replace(future, future + textwrap.dedent(code))}), backend_name)
    assert g.outcomes["tests/test_money.py::test_parse_negative_amounts"] != "passed" or g.reward == 0.0
    if backend_name == "local":
        assert g.tamper_flags == () and g.outcomes["tests/test_money.py::test_parse_negative_amounts"] == "failed"
    else:
        assert g.tamper_flags == ("protected_path_modified",) and g.reward == 0.0


@pytest.mark.parametrize("path", ["json.py", "attr.py", "attr/__init__.py",  # stdlib, and pytest's dependency
                                  "session_files.py", "session_signature.py"])  # the grader's plugin's own modules
def test_a_module_shadowing_the_standard_library_is_removed_and_flagged(path):
    g = grade(TASK.reference_solution + diff({path: "import os\nos._exit(0)\n"}))
    assert g.tamper_flags == ("shadows_runner_module",) and g.reward == 0.0
    assert g.suite_ran and set(g.outcomes.values()) == {"passed"}  # json.py was gone before the run


def test_a_forged_report_then_an_early_exit_is_flagged():
    forge = f"""\
        import os
        with open("/report/junit.xml", "w") as report:
            report.write({JUNIT_ALL_PASSED!r})
        os._exit(0)
        """
    g = grade(diff({MONEY: money_with(forge)}))
    assert g.suite_ran and set(g.outcomes.values()) == {"passed"}  # the forged report was read...
    assert g.tamper_flags == ("early_exit",) and g.reward == 0.0  # ...and not believed


def test_a_forged_session_record_is_flagged():
    forge = f"""\
        import json, os
        with open("/report/junit.xml", "w") as report:
            report.write({JUNIT_ALL_PASSED!r})
        with open("/report/session.json", "w") as session:
            json.dump({{"token": "guessed", "exitstatus": 0, "collected": 14}}, session)
        os._exit(0)
        """
    g = grade(diff({MONEY: money_with(forge)}))
    assert g.tamper_flags == ("forged_output",) and g.reward == 0.0


def test_a_report_rewritten_after_the_session_ended_is_flagged():
    rewrite_at_exit = f"""\
        import atexit, os

        def _forge():
            with open("/report/junit.xml", "w") as report:
                report.write({JUNIT_ALL_PASSED!r})
            os._exit(0)

        atexit.register(_forge)
        """
    g = grade(diff({MONEY: money_with(rewrite_at_exit, fixed=False)}))
    assert set(g.outcomes.values()) == {"passed"} and g.exec.exit_code == 0  # a consistent forgery...
    assert g.tamper_flags == ("forged_output",) and g.reward == 0.0  # ...that the session record exposes


def test_patching_pytest_to_report_passes_is_flagged():
    always_pass = """\
        import _pytest.reports as reports

        _original = reports.TestReport.from_item_and_call.__func__

        def _passed(cls, item, call):
            report = _original(cls, item, call)
            report.outcome, report.longrepr = "passed", None
            return report

        reports.TestReport.from_item_and_call = classmethod(_passed)
        """
    g = grade(diff({MONEY: money_with(always_pass, fixed=False)}))
    assert set(g.outcomes.values()) == {"passed"}
    assert g.tamper_flags == ("forged_output",) and g.reward == 0.0


def test_an_exit_code_that_contradicts_the_report_is_flagged():
    fail_after_passing = """\
        import atexit, os
        atexit.register(lambda: os._exit(1))
        """
    g = grade(diff({MONEY: money_with(fail_after_passing)}))
    assert set(g.outcomes.values()) == {"passed"}
    assert g.tamper_flags == ("exit_code_disagrees",) and g.reward == 0.0


# -- the pieces ------------------------------------------------------------------------------


def test_apply_patch_refuses_paths_outside_the_tree_symlinks_and_garbage():
    files = {"a.py": "x = 1\n"}
    outside = "--- a/../x.py\n+++ b/../x.py\n@@ -0,0 +1 @@\n+x\n"
    symlink = "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/passwd\n"
    for bad in (outside, symlink, "not a diff\n"):
        with pytest.raises(PatchError):
            apply_patch(files, bad)
    assert apply_patch(files, "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2") == {"a.py": "x = 2\n"}


def test_guard_restores_protected_files_and_names_what_was_touched():
    pristine = {"src/m.py": "v = 1\n", "tests/test_m.py": "old\n", "setup.cfg": "[tool]\n"}
    submitted = {"src/m.py": "v = 2\n", "tests/test_m.py": "gutted\n", "src/conftest.py": "hook\n"}
    guarded = guard(pristine, submitted, ("tests/*", "setup.cfg", "conftest.py"), {"tests/test_new.py": "hidden\n"})
    assert guarded.files == {"src/m.py": "v = 2\n", "tests/test_m.py": "old\n", "setup.cfg": "[tool]\n",
                             "tests/test_new.py": "hidden\n"}
    assert guarded.tamper_flags == ("protected_path_modified", "runner_config_added")
    assert guarded.touched == ("setup.cfg", "src/conftest.py", "tests/test_m.py")


def test_junit_keys_follow_pytest_node_ids():
    assert _junit_key("tests/test_cart.py::test_total") == ("tests.test_cart", "test_total")
    assert _junit_key("tests/test_cart.py::TestCart::test_total[2]") == ("tests.test_cart.TestCart", "test_total[2]")
    assert _junit_key("tests/test_a.py::test_f[a::b]") == ("tests.test_a", "test_f[a::b]")


def test_guard_drops_files_in_the_way_of_a_protected_file():
    submitted = {"t/old.py": "x\n", "t/new.py/x.txt": "blocks the hidden test\n", "t/old.py/y": "z\n"}
    guarded = guard({"t/old.py": "x\n"}, submitted, ("t/old.py",), {"t/new.py": "hidden\n"})
    assert guarded.files == {"t/old.py": "x\n", "t/new.py": "hidden\n"}
    assert guarded.tamper_flags == ("protected_path_modified",)


def test_line_endings_survive_a_diff():
    files = {"win.txt": "a\r\nb\r\n", "m.py": "x = 1\n"}
    after = apply_patch(files, "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert after == {"win.txt": "a\r\nb\r\n", "m.py": "x = 2\n"}


def test_every_shopcart_task_needs_its_diff_and_the_diff_suffices():
    for task in SHOPCART:
        reference = grade_solution(task, task.reference_solution, reward=SHOPCART.reward)
        empty = grade_solution(task, "", reward=SHOPCART.reward)
        assert (task.id, reference.reward) == (task.id, 1.0)
        assert (task.id, empty.reward_components["all_passed"]) == (task.id, 0.0)


def test_verify_grades_diffs_and_reports_the_reward_version(tmp_path):
    lines = [{"task_id": TASK.id, "solution": TASK.reference_solution}, {"task_id": TASK.id, "solution": ""}]
    solutions = tmp_path / "solutions.jsonl"
    solutions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", "--task-set", "shopcart", "--solutions",
                           str(solutions), "--backend", "local"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    solved, untouched = map(json.loads, done.stdout.splitlines())
    assert (solved["reward"], solved["reward_version"]) == (1.0, SHOPCART.reward.version)
    assert untouched["reward"] == 0.0 and untouched["reward_components"]["pass_to_pass_fraction"] == 1.0
    assert "2 solutions: 1 passed, 1 failed" in done.stderr
