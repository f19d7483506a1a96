"""The grading protocol end to end, with real sandbox runs, plus the JUnit report parser."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap

import pytest
from patience import PATIENCE_S

from grading.test_report import ReportError, parse_junit, read_report
from grading.verdict import grade
from sandbox.base import Mount
from sandbox.harness.bundle import harness_files
from sandbox.local import LocalSandbox
from sandbox.spec import Limits, SandboxSpec
from statuses import ExecStatus

needs_sandbox = pytest.mark.usefixtures("local_backend")

TESTS = {
    "test_task.py": textwrap.dedent(
        """
        from solution import add

        def test_small():
            assert add(1, 2) == 3

        def test_zero():
            assert add(0, 0) == 0

        def test_negative():
            assert add(-2, -3) == -5

        def test_large():
            assert add(10**12, 1) == 10**12 + 1
        """
    )
}
CORRECT = "def add(a, b):\n    return a + b\n"
HALF_WRONG = "def add(a, b):\n    return a + b if a >= 0 and b >= 0 and a < 100 else 0\n"


@pytest.fixture(params=("one-shot", "warm"))
def make_sandbox(request, tmp_path):
    """Sandboxes that grade in a one-shot sandbox, then (the grading pools') forked by warm
    workers, where the harness runs in-process as the run's init."""
    made: list[LocalSandbox] = []

    def make(**limits) -> LocalSandbox:
        spec = SandboxSpec(limits=Limits(**{"wall_s": 5.0, **limits}))
        sb = LocalSandbox(spec, scratch_dir=tmp_path, cgroup_parent=f"crucible-test-{secrets.token_hex(4)}",
                          warm_workers=request.param == "warm")
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.close()
        host = sb.cgroup_host
        for parent in {p for p in (host.memory_parent, host.pids_parent) if p} if host else ():
            if parent.exists():
                parent.rmdir()


@pytest.fixture
def sandbox(make_sandbox) -> LocalSandbox:
    return make_sandbox()


def _grade(sandbox, solution: str, **kwargs):
    return grade(sandbox, {"solution.py": solution}, TESTS, **kwargs)


# -- rewards ---------------------------------------------------------------------------------


@needs_sandbox
def test_correct_solution_scores_one(sandbox):
    g = _grade(sandbox, CORRECT)
    assert (g.reward, g.reward_status, g.suite_ran, g.tamper_flags) == (1.0, "scored", True, ())
    assert set(g.outcomes.values()) == {"passed"} and g.tests_expected == g.tests_collected == 4


@needs_sandbox
def test_half_wrong_solution_scores_half(sandbox):
    g = _grade(sandbox, HALF_WRONG)
    assert (g.reward, g.reward_components) == (0.5, {"tests_passed_fraction": 0.5, "all_passed": 0.0})
    assert g.outcomes["test_task.py::test_negative"] == "failed"


@needs_sandbox
def test_syntax_error_is_scored_zero_with_errors(sandbox):
    g = _grade(sandbox, "def add(a, b) return a + b\n")
    assert (g.reward, g.reward_status, set(g.outcomes.values())) == (0.0, "scored", {"error"})


@needs_sandbox
def test_sys_exit_in_solution_is_not_a_pass(sandbox):
    g = _grade(sandbox, "import sys\nsys.exit(0)\n" + CORRECT)
    assert (g.reward, set(g.outcomes.values())) == (0.0, {"error"})


@needs_sandbox
def test_os_exit_in_solution_is_not_a_pass(sandbox):
    # The submission's process ends; the harness, in another process, reports every test as an error.
    g = _grade(sandbox, "import os\nos._exit(0)\n" + CORRECT)
    assert (g.reward, g.reward_status, g.suite_ran, set(g.outcomes.values())) == (0.0, "scored", True, {"error"})


FORGED_REPORT = (
    '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite>'
    + "".join(f'<testcase classname="test_task" name="{n}" time="0" />'
              for n in ("test_small", "test_zero", "test_negative", "test_large"))
    + "</testsuite></testsuites>"
)


@needs_sandbox
@pytest.mark.parametrize("forgery", [
    # print a passing report, then end the run with exit code 0
    f"import os, sys\nsys.stdout.write({FORGED_REPORT!r})\nsys.stdout.flush()\nos._exit(0)\n",
    # write it through the harness's stdout via /proc, then kill the harness
    f"import glob, os\nfor fd in glob.glob(f'/proc/{{os.getppid()}}/fd/*'):\n"
    f"    try:\n        open(fd, 'w').write({FORGED_REPORT!r})\n    except OSError:\n        pass\n"
    "os.kill(os.getppid(), 9)\n",
    # write a report file where a pytest-style command would have put it
    f"open('/report/junit.xml', 'w').write({FORGED_REPORT!r})\nimport os\nos._exit(0)\n",
])
def test_a_submission_cannot_forge_the_report(sandbox, forgery):
    """The forged report (every test passed) never counts. (A harness that survives the kill, as
    a warm worker's does as its run's pid 1, grades honestly: add(0, 0) == 0 passes.)"""
    g = _grade(sandbox, forgery + "def add(a, b):\n    return 0\n")
    wrong = ("test_task.py::test_small", "test_task.py::test_negative", "test_task.py::test_large")
    assert g.reward < 1.0 and all(g.outcomes[test] != "passed" for test in wrong), g


@needs_sandbox
def test_an_object_equal_to_everything_cannot_pass(sandbox):
    always_equal = "class Anything:\n    def __eq__(self, other):\n        return True\n\ndef add(a, b):\n    return Anything()\n"
    g = _grade(sandbox, always_equal)
    assert (g.reward, set(g.outcomes.values())) == (0.0, {"error"})
    assert "not plain data" in next(iter(g.messages.values()))


@needs_sandbox
def test_patching_the_interpreter_does_not_reach_the_tests(sandbox):
    # In the harness's process this would turn every failed assert into an error of another kind.
    patch = "import builtins\nbuiltins.AssertionError = KeyError\n"
    g = _grade(sandbox, patch + "def add(a, b):\n    return 0\n")
    assert g.reward == 0.25 and sorted(g.outcomes.values()) == ["failed", "failed", "failed", "passed"]


@needs_sandbox
def test_infinite_loop_times_out_and_scores_zero(make_sandbox):
    g = _grade(make_sandbox(wall_s=0.5), "while True:\n    pass\n")
    assert (g.exec.status, g.reward, g.reward_status) == (ExecStatus.TO, 0.0, "scored")


@needs_sandbox
def test_timeout_after_some_passes_gives_no_credit(make_sandbox):
    # The first tests pass quickly, then test_negative hangs.
    solution = CORRECT + textwrap.dedent(
        """
        import time
        _add = add
        def add(a, b):
            if a < 0:
                time.sleep(60)
            return _add(a, b)
        """
    )
    g = _grade(make_sandbox(wall_s=0.5), solution)
    assert (g.exec.status, g.reward) == (ExecStatus.TO, 0.0)


# -- tampering -------------------------------------------------------------------------------


@needs_sandbox
def test_solution_cannot_rewrite_hidden_tests(sandbox):
    overwrite = textwrap.dedent(
        """
        import glob, os
        for path in glob.glob("/grader/tests/*.py") + ["/grader/run_tests.py"]:
            for attempt in (lambda: open(path, "w").write("def test_ok(): pass\\n"),
                            lambda: os.unlink(path), lambda: os.chmod(path, 0o777)):
                try:
                    attempt()
                except OSError:
                    pass
        def add(a, b):
            return -1
        """
    )
    g = _grade(sandbox, overwrite)
    assert (g.reward, g.outcomes["test_task.py::test_small"]) == (0.0, "failed")


@needs_sandbox
def test_solution_cannot_reach_another_runs_report(sandbox, tmp_path):
    other = tmp_path / "other-run" / "report"
    other.mkdir(parents=True)
    (other / "junit.xml").write_text("original")
    other.chmod(0o777)
    attack = textwrap.dedent(
        f"""
        import glob
        targets = glob.glob("/*/crucible-grade-*/report/junit.xml") + glob.glob("/dev/shm/crucible-*/**")
        for path in [{str(other / "junit.xml")!r}] + targets:
            try:
                open(path, "w").write("forged")
            except OSError:
                pass
        """
    ) + CORRECT
    g = _grade(sandbox, attack)
    assert ((other / "junit.xml").read_text(), g.reward) == ("original", 1.0)


@needs_sandbox
def test_hidden_tests_are_absent_from_workspace(sandbox):
    test = "from solution import listing\n\ndef test_only_solution():\n    assert listing() == ['solution.py']\n"
    tests = {"test_look.py": test}
    solution = "import os\ndef listing():\n    return sorted(os.listdir('/workspace'))\n"
    g = grade(sandbox, {"solution.py": solution}, tests)
    assert g.reward == 1.0, g.messages


@needs_sandbox
def test_report_claiming_passes_with_failing_exit_is_tamper(sandbox):
    forge = _forger(TESTS, outcome="passed", exit_code=1)
    g = grade(sandbox, {"solution.py": CORRECT}, TESTS, command=forge)
    assert (g.reward, g.tamper_flags) == (0.0, ("exit_code_disagrees",))


@needs_sandbox
def test_report_claiming_failures_with_exit_zero_is_tamper(sandbox):
    forge = _forger(TESTS, outcome="failed", exit_code=0)
    g = grade(sandbox, {"solution.py": CORRECT}, TESTS, command=forge)
    assert (g.reward, g.tamper_flags) == (0.0, ("exit_code_disagrees",))


def _forger(tests, outcome: str, exit_code: int) -> list[str]:
    """A command that writes a report with every test at `outcome`, then exits `exit_code`."""
    child = "" if outcome == "passed" else '<failure message="no"/>'
    cases = "".join(f'<testcase classname="test_task" name="{n}" time="0">{child}</testcase>'
                    for n in ("test_small", "test_zero", "test_negative", "test_large"))
    xml = f"<testsuites><testsuite>{cases}</testsuite></testsuites>"
    code = f"open('/report/junit.xml', 'w').write({xml!r}); raise SystemExit({exit_code})"
    return ["/usr/bin/python3", "-I", "-S", "-c", code]


# -- invalid and infrastructure --------------------------------------------------------------


@needs_sandbox
def test_tests_without_test_functions_are_invalid(sandbox):
    g = grade(sandbox, {"solution.py": CORRECT}, {"test_task.py": "x = 1\n"})
    assert (g.reward, g.reward_status) == (None, "invalid")


def test_sandbox_failure_is_infra_error(tmp_path):
    broken = LocalSandbox(SandboxSpec(image="not-a-local-image"), scratch_dir=tmp_path)
    g = grade(broken, {"solution.py": CORRECT}, TESTS)
    assert (g.reward, g.reward_status, g.exec.status) == (None, "infra_error", ExecStatus.XX)


@needs_sandbox
def test_grade_result_serialises_to_json(sandbox):
    d = json.loads(json.dumps(_grade(sandbox, CORRECT).to_dict()))
    assert (d["reward"], d["exec"]["status"]) == (1.0, "OK")


@needs_sandbox
def test_grading_leaves_no_directories_behind(sandbox, tmp_path):
    """Once the sandbox is closed (its warm workers live until then)."""
    _grade(sandbox, CORRECT)
    sandbox.close()
    assert list(tmp_path.iterdir()) == []


# -- report parser ---------------------------------------------------------------------------


def test_parser_reads_pytest_junitxml(tmp_path):
    (tmp_path / "test_mod.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_fail(): assert 1 == 2\n"
        "def test_skip(): pytest.skip('later')\n"
        "@pytest.fixture\ndef broken(): raise RuntimeError('x')\n"
        "def test_err(broken): pass\n"
    )
    report = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                    str(tmp_path / "test_mod.py")], check=False, cwd=tmp_path, capture_output=True, timeout=PATIENCE_S)
    outcomes = {t.name: t.outcome for t in read_report(report)}
    assert outcomes == {"test_ok": "passed", "test_fail": "failed", "test_skip": "skipped", "test_err": "error"}


def test_parser_reads_our_harness_report(tmp_path):
    from sandbox.harness.run_tests import Case, junit_xml

    bad = Case("test_x", "test_b")
    bad.outcome, bad.message = "failed", "nope \x00 <&>"
    outcomes = parse_junit(junit_xml([Case("test_x", "test_a"), bad], 0.1))
    assert [(t.classname, t.name, t.outcome) for t in outcomes] == [
        ("test_x", "test_a", "passed"), ("test_x", "test_b", "failed")
    ]


@pytest.mark.parametrize("text", ["<testsuites><testsuite>", "<html/>", "<testsuite><testcase/></testsuite>",
                                  '<!DOCTYPE x [<!ENTITY a "b">]><testsuites/>'])
def test_malformed_report_raises_report_error(text):
    with pytest.raises(ReportError):
        parse_junit(text)


def test_report_that_is_a_symlink_is_refused(tmp_path):
    (tmp_path / "junit.xml").symlink_to("/etc/hostname")
    with pytest.raises(ReportError):
        read_report(tmp_path / "junit.xml")


@needs_sandbox
def test_the_sandbox_loads_the_harness_from_byte_code_compiled_in_advance(sandbox, tmp_path):
    grader = tmp_path / "grader"
    for name, content in harness_files().items():
        (grader / name).parent.mkdir(parents=True, exist_ok=True)
        (grader / name).write_bytes(content.encode() if isinstance(content, str) else content)
    for path in [grader, *grader.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    probe = "import sys; sys.path.insert(0, '/grader/harness'); import run_tests"
    result = sandbox.run(["/usr/bin/python3", "-I", "-S", "-v", "-c", probe], {}, [Mount(grader, "/grader")])
    assert "code object from '/grader/harness/__pycache__/run_tests.cpython-" in result.stderr
