"""Docker sessions spread over several daemons (sandbox/docker_fleet.py): the main daemon and a
second one on its own socket (scripts/docker-daemon with CRUCIBLE_DOCKERD_NAME), stopped in the
middle of a batch of MBPP gradings."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from patience import PATIENCE_S
from conftest import require

from grading.submission import grade_solution, sandbox_spec
from sandbox.pool import PoolConfig, SandboxPool
from statuses import RewardStatus
from task_sets.importers import ImportOptions, import_tasks

ROOT = Path(__file__).parent.parent
MBPP = Path(__file__).parent / "data" / "mbpp" / "sanitized-mbpp.json.gz"
SECOND = "test-second"  # scripts/docker-daemon's CRUCIBLE_DOCKERD_NAME
SECOND_URL = f"unix:///var/run/crucible-docker-{SECOND}.sock"
SECOND_TCP = "127.0.0.1:23751"  # the same daemon, reached as a daemon on another host would be
SECOND_PIDFILE = Path(f"/var/run/crucible-docker-{SECOND}.pid")


def test_hosts_setting_names_the_item_that_is_wrong():
    from sandbox.docker_hosts import DockerHost, parse_hosts

    assert parse_hosts("unix:///a.sock=2, tcp://10.0.0.7:2375=16") == (
        DockerHost("unix:///a.sock", 2), DockerHost("tcp://10.0.0.7:2375", 16))
    for text, reason in [("unix:///a.sock", "'unix:///a.sock' is not URL=CAPACITY"),
                         ("unix:///a.sock=0", "'unix:///a.sock=0' is not URL=CAPACITY"),
                         ("a.sock=2", "'a.sock=2' is not URL=CAPACITY"),
                         ("unix:///a.sock=1,unix:///a.sock=2", "listed twice"),
                         (" , ", "lists no daemon")]:
        with pytest.raises(ValueError, match=reason):
            parse_hosts(text)


def test_crucible_run_refuses_a_wrong_hosts_setting_in_one_line(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "CRUCIBLE_STORAGE_ROOT": str(tmp_path / "data"),
           "CRUCIBLE_SANDBOX": "docker", "CRUCIBLE_DOCKER_HOSTS": "unix:///var/run/docker.sock=many"}
    env.pop("CRUCIBLE_POSTGRES_URL", None)
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--experiment", "x", "--iterations", "1"],
                          env=env, capture_output=True, text=True, timeout=PATIENCE_S, cwd=ROOT)
    assert (done.returncode, done.stderr.strip()) == (2, (
        "error: CRUCIBLE_DOCKER_HOSTS: 'unix:///var/run/docker.sock=many' is not URL=CAPACITY (for example "
        "unix:///var/run/docker.sock=16; the capacity a whole number ≥ 1)"))


@pytest.fixture
def second_daemon():
    """A second Docker daemon on its own socket, holding the sandbox image; stopped afterwards."""
    require("docker")
    env = {**os.environ, "CRUCIBLE_DOCKERD_NAME": SECOND, "CRUCIBLE_DOCKERD_TCP": SECOND_TCP}
    started = subprocess.run([ROOT / "scripts" / "docker-daemon"], env=env, capture_output=True, text=True)
    if started.returncode:
        pytest.fail(f"the second Docker daemon did not start: {started.stderr[-2000:]}")
    from sandbox.docker import DEFAULT_IMAGE

    saved = subprocess.Popen(["docker", "save", DEFAULT_IMAGE], stdout=subprocess.PIPE)
    subprocess.run(["docker", "-H", SECOND_URL, "load", "-q"], stdin=saved.stdout, check=True, capture_output=True)
    assert saved.wait() == 0
    yield SECOND_URL
    _stop(SECOND_PIDFILE)


def _stop(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_sessions_go_to_the_daemon_with_room(second_daemon):
    from sandbox.docker import DockerSandbox
    from sandbox.docker_hosts import DockerHost

    token = secrets.token_hex(4)
    sandbox = DockerSandbox(hosts=(DockerHost("unix:///var/run/docker.sock", 1), DockerHost(second_daemon, 1)),
                            labels={"crucible.test": token})
    with sandbox.session() as first, sandbox.session() as second:
        assert {first.exec(["true"]).status.value, second.exec(["true"]).status.value} == {"OK"}
        assert sorted(d.live for d in sandbox.fleet.daemons) == [1, 1]  # one each, not two on one
    assert [d.live for d in sandbox.fleet.daemons] == [0, 0]
    assert sandbox.containers(**{"crucible.test": token}) == []


def test_a_daemon_stopped_in_the_middle_of_a_batch_loses_no_grading(second_daemon):
    from sandbox.docker import DockerSandbox
    from sandbox.docker_hosts import DockerHost

    tasks = import_tasks("mbpp", MBPP, ImportOptions("mbpp")).tasks[:20]
    work = [(task, solution, passes) for task in tasks
            for solution, passes in ((task.reference_solution, True), ("def nothing():\n    return None\n", False))]
    hosts = (DockerHost("unix:///var/run/docker.sock", 2), DockerHost(second_daemon, 2))
    token = secrets.token_hex(4)
    second = None

    def make(spec):
        nonlocal second
        sandbox = DockerSandbox(spec, hosts=hosts, labels={"crucible.test": token})
        second = sandbox.fleet.daemons[1]
        return sandbox

    finished = threading.Event()

    def stop_second_when_busy():
        while (second is None or second.placed < 6) and not finished.is_set():
            time.sleep(0.05)
        if not finished.is_set():
            _stop(SECOND_PIDFILE)

    stopper = threading.Thread(target=stop_second_when_busy, daemon=True)
    stopper.start()
    with SandboxPool(make, PoolConfig(cpu_slots=4),
                     is_infra_failure=lambda g: g.reward_status is RewardStatus.INFRA_ERROR) as pool:
        grades = list(pool.map(lambda item: sandbox_spec(item[0]),
                               lambda sandbox, item: grade_solution(item[0], item[1], sandbox), work))
    finished.set()
    stopper.join(timeout=PATIENCE_S)
    assert not stopper.is_alive()
    assert [(task.id, grade.reward_status, grade.passed) for (task, _, _), grade in zip(work, grades)] == [
        (task.id, RewardStatus.SCORED, passes) for task, _, passes in work]
    assert second.drained_until > 0 and second.placed >= 6


def test_a_daemon_reached_over_tcp_grades_with_the_files_copied_in(second_daemon):
    from sandbox.docker import DockerSandbox
    from sandbox.docker_hosts import DockerHost

    tasks = import_tasks("mbpp", MBPP, ImportOptions("mbpp")).tasks[:3]
    token = secrets.token_hex(4)
    hosts = (DockerHost(f"tcp://{SECOND_TCP}", 2),)
    grades = []
    for task in tasks:
        sandbox = DockerSandbox(sandbox_spec(task), hosts=hosts, labels={"crucible.test": token})
        assert not sandbox.fleet.daemons[0].sees_our_files()
        grades += [grade_solution(task, task.reference_solution, sandbox),
                   grade_solution(task, "def nothing():\n    return None\n", sandbox)]
    assert [(g.reward_status, g.passed) for g in grades] == [(RewardStatus.SCORED, True),
                                                             (RewardStatus.SCORED, False)] * 3
    assert all(g.suite_ran and g.tests_collected for g in grades)  # the report, copied back, was read


def test_a_session_whose_daemon_stops_fails_as_ours_and_the_next_goes_elsewhere(second_daemon):
    from sandbox.docker import DockerSandbox
    from sandbox.docker_hosts import DockerHost

    token = secrets.token_hex(4)
    sandbox = DockerSandbox(hosts=(DockerHost(second_daemon, 1), DockerHost("unix:///var/run/docker.sock", 1)),
                            labels={"crucible.test": token})
    second, main = sandbox.fleet.daemons
    with sandbox.session() as stranded:
        assert (second.live, main.live) == (1, 0)  # equal room: the first listed
        _stop(SECOND_PIDFILE)
        result = stranded.exec(["true"])
        assert result.status.value == "XX" and result.error
        assert second.drained_until > 0
        with sandbox.session() as next_one:
            assert next_one.exec(["true"]).status.value == "OK" and main.live == 1
    assert sandbox.containers(**{"crucible.test": token}) == []


def test_a_daemon_that_is_down_is_named_not_taken_for_a_missing_image():
    from sandbox.base import SandboxUnavailable
    from sandbox.docker import DockerSandbox
    from sandbox.docker_hosts import DockerHost

    with pytest.raises(SandboxUnavailable, match="no Docker daemon answers"):
        DockerSandbox(hosts=(DockerHost("unix:///nonexistent/docker.sock", 1),))


def test_over_tcp_the_report_directory_mirrors_what_the_sandbox_left(second_daemon, tmp_path):
    from sandbox.base import Mount
    from sandbox.docker import DockerSandbox
    from sandbox.docker_hosts import DockerHost

    report = tmp_path / "report"
    report.mkdir()
    (report / "token").write_text("the harness deletes this")
    os.chown(report, 65534, 65534)
    sandbox = DockerSandbox(hosts=(DockerHost(f"tcp://{SECOND_TCP}", 1),), labels={"crucible.test": secrets.token_hex(4)})
    with sandbox.session(mounts=[Mount(report, "/report", writable=True)]) as session:
        script = "rm /report/token && mkdir /report/d && echo y > /report/d/f && echo x > /report/new"
        assert session.exec(["sh", "-c", script]).status.value == "OK"
        assert sorted(str(p.relative_to(report)) for p in report.rglob("*")) == ["d", "d/f", "new"]
        # Made unreadable, it is missing, as a report the sandbox spoiled is: not our failure.
        assert session.exec(["chmod", "000", "/report/new"]).status.value == "OK"
        assert sorted(str(p.relative_to(report)) for p in report.rglob("*")) == ["d", "d/f"]


IN_A_CONTAINER = """
from pathlib import Path
from sandbox.docker import DockerSandbox
from task_sets.importers import ImportOptions, import_tasks
from grading.submission import grade_solution, sandbox_spec

task = import_tasks("mbpp", Path("/data/sanitized-mbpp.json.gz"), ImportOptions("mbpp")).tasks[0]
sandbox = DockerSandbox(sandbox_spec(task))
grades = [grade_solution(task, solution, sandbox) for solution in (task.reference_solution, "def f():\\n    pass\\n")]
print(sandbox.fleet.daemons[0].sees_our_files(), *[(g.reward_status.value, g.passed) for g in grades])
"""


def test_inside_a_container_through_the_hosts_socket_grading_copies_its_files(project_image):
    # A run's container: this host's daemon, whose data root it cannot see, so neither the
    # grading files it writes under its own /tmp.
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", "/var/run/docker.sock:/var/run/docker.sock",
                           "-v", f"{MBPP.parent}:/data:ro", project_image, "python", "-c", IN_A_CONTAINER],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "False ('scored', True) ('scored', False)"
