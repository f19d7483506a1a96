"""The evidence an environment error is decided on (grading/diagnosis.py), case by case, without a
sandbox: a repository module that a pristine conftest.py fails to import is the environment's
to provide only where nothing of the pristine repository could have put it on sys.path; and
what a killed run was doing, read off the plugin's progress record and faulthandler's dump."""

from __future__ import annotations

import pytest

from grading.diagnosis import (
    Evidence,
    diagnose,
    environment_problem,
    installed_modules,
    installed_roots,
    what_it_was_doing,
)
from grading.test_report import TestOutcome
from sandbox.result import ExecResult
from statuses import ExecStatus, FailureReason, Outcome

SRC = {"src/calc/__init__.py": "", "src/calc/ops.py": "def add(a, b):\n    return a + b\n",
       "conftest.py": "import calc\n", "tests/test_ops.py": "from calc.ops import add\n"}
CONFTEST_FAILED = TestOutcome(
    name="conftest", outcome=Outcome.ERROR, message="collection failure", seconds=0.0, classname="",
    details="ImportError while loading conftest '/workspace/conftest.py'.\nconftest.py:1: in <module>\n"
            "    import calc\nE   ModuleNotFoundError: No module named 'calc'")
RUN = ExecResult(status=ExecStatus.RE, exit_code=4, signal=None, wall_s=0.5, cpu_s=0.4, peak_memory_bytes=None,
                 stdout="", stderr="", stdout_truncated=False, stderr_truncated=False, spec_hash="", backend="local",
                 command=("python3", "-m", "pytest"))


def problem(files=SRC, changed=("src/calc/ops.py",), command="python3 -m pytest -q tests", **more):
    evidence = Evidence(changed=changed, repository=SRC.keys() | more.pop("repository", set()),
                        installed=more.pop("installed", frozenset({"pytest", "os"})), grader_text=command,
                        files={**files, **more.pop("extra", {})}, **more)
    return environment_problem([CONFTEST_FAILED], RUN, True, evidence)


def test_a_src_package_nothing_puts_on_sys_path_is_the_environments():
    found = problem()
    assert found.reason is FailureReason.MISSING_MODULE and "(conftest.py)" in found.detail


@pytest.mark.parametrize("case", [
    {"import_roots": ("", "src")},  # the environment's PYTHONPATH, or an editable install's .pth
    {"command": "PYTHONPATH=src python3 -m pytest -q tests"},
    {"command": "cd src && python3 -m pytest -q ../tests"},
    {"command": "PYTHONPATH=$(pwd)/src python3 -m pytest"},  # cannot be told: never excused
    {"installed": frozenset({"calc"})},
    {"changed": ("src/calc/ops.py", "conftest.py")},  # the failing conftest is the submission's
])
def test_a_src_package_the_repository_or_environment_may_put_on_sys_path_is_not_excused(case):
    assert problem(**case) is None


def test_a_submission_that_deleted_part_of_the_package_is_not_excused():
    assert problem(files={path: text for path, text in SRC.items() if path != "src/calc/ops.py"}) is None


def test_a_test_file_inside_the_package_puts_src_on_sys_path_for_pytest():
    inside = {"src/calc/tests/__init__.py": "", "src/calc/tests/test_inner.py": "def test_x():\n    pass\n"}
    assert problem(extra=inside, repository=set(inside)) is None


def test_a_pristine_conftest_that_moves_sys_path_is_not_told_statically():
    moved = {**SRC, "conftest.py": "import sys\nsys.path.insert(0, 'src')\nimport calc\n"}
    assert problem(files=moved) is None


def test_an_import_the_conftest_makes_only_conditionally_is_not_its_failure():
    guarded = {**SRC, "conftest.py": "try:\n    import calc\nexcept ImportError:\n    calc = None\n"}
    assert problem(files=guarded) is None


def test_the_environments_editable_installs_count_as_installed_and_as_import_roots(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.9" / "site-packages"
    (site / "calc_dist-1.0.dist-info").mkdir(parents=True)
    (site / "calc_dist-1.0.dist-info" / "top_level.txt").write_text("calclib\n")
    (site / "__editable___calc_dist_1_0_finder.py").write_text("MAPPING = {'calc': '/workspace/src/calc'}\n")
    (site / "__editable__.other-2.0.pth").write_text("/workspace/lib\n")
    (site / "hook.pth").write_text("import _virtualenv\n")
    assert {"calc", "calclib"} <= installed_modules(str(tmp_path))
    assert installed_roots(str(tmp_path)) == {"lib"}


STACKS = """Timeout (0:00:30)!
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
Thread 0x00007f0000000000 (most recent call first):
  File "/usr/lib/python3.11/socket.py", line 836 in create_connection
  File "/app/tests/test_data.py", line 7 in <module>
  File "/usr/lib/python3/dist-packages/_pytest/python.py", line 617 in _importtestmodule
"""


def test_a_killed_run_says_what_it_was_collecting_and_where_it_stood():
    doing = what_it_was_doing({"stage": "collecting", "where": "tests/test_data.py"}, "stale\n" + STACKS,
                              ("/workspace", "/app"))
    assert doing == "while collecting tests/test_data.py (at tests/test_data.py:7 in <module>, inside socket.py:836 " \
                    "in create_connection)"


@pytest.mark.parametrize("progress, stacks, said", [
    ({"stage": "running", "where": "tests/test_x.py::test_y"}, "", "while running tests/test_x.py::test_y"),
    ({"stage": "starting", "where": ""}, "", "while pytest was starting (loading plugins and conftest.py files)"),
    ({"stage": "collecting", "where": ""}, "", ""),
    ({"stage": 3}, "", ""),
    (None, "nothing faulthandler wrote", ""),
])
def test_what_a_killed_run_was_doing_is_said_only_from_what_the_plugin_left(progress, stacks, said):
    assert what_it_was_doing(progress, stacks) == said


REQUESTS_DOWN = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='data.example.org', port=443): Max "
                 "retries exceeded with url: /t.csv (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection "
                 "object at 0x7f>: Failed to establish a new connection: [Errno -3] Temporary failure in name "
                 "resolution'))")


@pytest.mark.parametrize("message, details, reason", [
    (REQUESTS_DOWN, "", FailureReason.NETWORK_UNAVAILABLE),
    ("OSError: [Errno 101] Network is unreachable", "", FailureReason.NETWORK_UNAVAILABLE),
    ("", "Traceback (most recent call last):\n  File \"t.py\", line 3, in test_t\n    socket.getaddrinfo(h, 80)\n"
         "socket.gaierror: [Errno -2] Name or service not known", FailureReason.NETWORK_UNAVAILABLE),
    ("ConnectionRefusedError: [Errno 111] Connection refused", "", FailureReason.TESTS_FAILED),  # a local server
    # pytest quotes the test's source: a test about resolver errors that fails otherwise is not the network's
    ("assert 1 == 2", "    def test_t():\n        with pytest.raises(socket.gaierror):\n>           assert 1 == 2\n"
                      "E           assert 1 == 2", FailureReason.TESTS_FAILED),
])
def test_a_test_failure_is_the_networks_only_where_its_error_says_so(message, details, reason):
    report = [TestOutcome(name="test_t", outcome=Outcome.FAILED, message=message, seconds=0.0, classname="t",
                          details=details)]
    why = diagnose({"t.py::test_t": Outcome.FAILED}, {"t.py::test_t": message}, {"t.py::test_t": details}, report,
                   RUN, [], 10.0)
    assert why.reason is reason and why.detail.startswith("t.py::test_t needed the network" if reason is
                                                          FailureReason.NETWORK_UNAVAILABLE else "1 of 1")


def test_pytests_nameless_error_collecting_the_session_is_read_and_no_other_nameless_testcase():
    from grading.test_report import SESSION, ReportError, parse_junit

    session = ('<testsuites><testsuite name="pytest" tests="1"><testcase classname="" name="" file="" time="0">'
               '<error message="collection failure">tests/sub/conftest.py:1: in &lt;module&gt;</error></testcase>'
               '</testsuite></testsuites>')
    assert [(t.name, t.outcome, t.message) for t in parse_junit(session)] == [(SESSION, Outcome.ERROR,
                                                                              "collection failure")]
    with pytest.raises(ReportError, match="has no name"):
        parse_junit(session.replace('message="collection failure"', 'message="boom"'))
