"""A warm worker of the local sandbox (sandbox/harness/zygote.py) serves run after run, each in
a sandbox of its own: nothing one run leaves (files, processes) reaches the next, the grader's
files cannot be changed, and the run loads the deny-list itself. (The whole sandbox contract
runs on it too: the `local-warm` backend of tests/test_sandbox.py.)"""

from __future__ import annotations

import secrets
from pathlib import Path

import psutil
import pytest

from sandbox.base import Mount
from sandbox.local import LocalSandbox
from sandbox.pool import PoolConfig, SandboxPool
from sandbox.spec import Limits, SandboxSpec
from statuses import ExecStatus

from conftest import residue

LEAVE_BEHIND = """
import os, subprocess
for place in ("/workspace", "/tmp", "/dev/shm"):
    open(f"{place}/left-{os.environ.get('RUN', 'x')}", "w").write("left")
subprocess.Popen(["setsid", "sleep", "300"], start_new_session=True)
print(os.getpid())
"""
SHARED_MEMORY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x5EC12E7, 1 << 20, 0o1666))  # IPC_CREAT | 0666, left behind
"""
UNSHARE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for flags in (0x10000000, 0x00020000, 0x20000000):  # a new user, mount, pid namespace
    print(libc.unshare(flags), ctypes.get_errno())
print(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
"""


@pytest.fixture
def warm(local_backend, tmp_path):
    (tmp_path / "scratch").mkdir()
    sandbox = LocalSandbox(SandboxSpec(limits=Limits(wall_s=5.0)), scratch_dir=tmp_path / "scratch",
                           cgroup_parent=f"crucible-test-{secrets.token_hex(4)}", warm_workers=True)
    yield sandbox
    sandbox.close()
    assert residue(sandbox) == []


def python(code: str) -> list[str]:
    return ["/usr/bin/python3", "-I", "-S", "-c", code]


def test_a_run_is_forked_by_the_zygote(warm):
    """Its pid 1 is the run's init, a fork of the zygote's interpreter (a one-shot run's is bwrap)."""
    done = warm.run(["ps", "-o", "comm=", "-p", "1"], {})
    assert done.stdout.strip() == "python3", done


def test_what_a_run_leaves_is_gone_before_the_next_run_of_the_same_worker(warm):
    first = warm.run(python(LEAVE_BEHIND), {"mine.txt": "1"})
    assert first.ok, first
    second = warm.run(["sh", "-c", "ls -A /workspace /tmp /dev/shm"], {})
    assert second.ok, second
    assert "left-" not in second.stdout and "mine.txt" not in second.stdout
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "300"]]


def test_sysv_ipc_a_run_leaves_is_not_the_next_runs(warm):
    made = warm.run(python(SHARED_MEMORY), {})
    assert made.ok and made.stdout.strip().isdigit(), made
    assert warm.run(["ipcs", "-m"], {}).stdout.count("0x") == 0  # a fresh IPC namespace


def test_the_grader_files_cannot_be_changed(warm, tmp_path):
    grader = tmp_path / "grader"
    grader.mkdir()
    (grader / "test_hidden.py").write_text("def test_x():\n    assert True\n")
    done = warm.run(["sh", "-c", "cat /grader/test_hidden.py >/dev/null && echo read; "
                                 "echo x > /grader/test_hidden.py || echo refused; rm /grader/test_hidden.py || echo kept"],
                    {}, [Mount(grader, "/grader")])
    assert done.stdout.split() == ["read", "refused", "kept"], done
    assert (grader / "test_hidden.py").read_text() == "def test_x():\n    assert True\n"


def test_a_run_cannot_make_namespaces_or_mount(warm):
    done = warm.run(python(UNSHARE), {})
    assert done.stdout.split("\n")[:4] == ["-1 1"] * 4, done  # EPERM: the deny-list the run loaded


def test_a_writable_mount_or_a_protected_file_runs_in_a_one_shot_sandbox(warm, tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    report.chmod(0o777)
    done = warm.run(["sh", "-c", "ps -eo comm; echo ok > /report/r"], {}, [Mount(report, "/report", writable=True)])
    assert done.ok and (report / "r").read_text() == "ok\n", done
    assert "python3" not in done.stdout  # a sandbox of bwrap's own, no zygote in it


def test_a_pool_closes_its_warm_workers(local_backend, tmp_path):
    made = []

    def make(spec: SandboxSpec) -> LocalSandbox:
        made.append(LocalSandbox(spec, scratch_dir=tmp_path, cgroup_parent=f"crucible-test-{secrets.token_hex(4)}",
                                 warm_workers=True))
        return made[-1]

    with SandboxPool(make, PoolConfig(cpu_slots=2)) as pool:
        results = [future.result() for future in [pool.submit(SandboxSpec(), lambda sb: sb.run(["true"], {}))
                                                  for _ in range(6)]]
    assert [r.status for r in results] == [ExecStatus.OK] * 6
    assert residue(made[0]) == []
    assert not list(Path(tmp_path).glob("crucible-*"))
