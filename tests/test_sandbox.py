"""The sandbox contract and the adversarial suite, run on every backend (conftest.py): real
bubblewrap and cgroups, a real Docker daemon; no mocks. Each attack must be contained with the
expected status, and the `make_sandbox` fixture asserts that nothing is left on the host."""

from __future__ import annotations

import errno
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from patience import PATIENCE_S
from conftest import require, residue, skip_unless_required

from sandbox.base import Mount, SandboxUnavailable, WorkspacePathError
from statuses import ExecStatus

PY = ["/usr/bin/python3", "-I", "-S", "-c"]


@pytest.fixture
def sandbox(make_sandbox):
    return make_sandbox()


def _processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def py(code: str) -> list[str]:
    return PY + [textwrap.dedent(code)]


# -- basics ----------------------------------------------------------------------------------


def test_echo_output_is_captured(sandbox):
    r = sandbox.run(["echo", "hello"], {})
    assert (r.status, r.exit_code, r.stdout, r.backend, r.spec_hash) == (
        ExecStatus.OK, 0, "hello\n", sandbox.name, sandbox.spec.hash
    )


def test_files_land_in_workspace_including_subdirectories(sandbox):
    files = {"a.txt": "alpha", "sub/dir/b.bin": b"\x00\x01"}
    code = """
        import os
        print(os.getcwd(), open("a.txt").read(), open("/workspace/sub/dir/b.bin", "rb").read())
    """
    r = sandbox.run(py(code), files)
    assert r.stdout == "/workspace alpha b'\\x00\\x01'\n"


def test_runs_as_uid_and_gid_65534(sandbox):
    r = sandbox.run(py("import os; print(os.getuid(), os.geteuid(), os.getgid(), set(os.getgroups()) <= {65534})"), {})
    assert r.stdout == "65534 65534 65534 True\n"


def test_files_written_are_owned_by_65534_on_host(sandbox, tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    r = sandbox.run(["sh", "-c", "echo x > /out/made"], {}, [Mount(out, "/out", writable=True)])
    assert r.ok, r.stderr
    st = (out / "made").stat()
    assert (st.st_uid, st.st_gid) == (65534, 65534)


def test_workspace_files_belong_to_sandbox_user(sandbox):
    # No user namespace: the uid seen inside is the host uid.
    r = sandbox.run(["sh", "-c", "touch new && stat -c %u:%g /workspace /workspace/given new"], {"given": ""})
    assert r.stdout.split() == ["65534:65534"] * 3


def test_environment_is_exactly_the_allowlist(sandbox):
    os.environ["CRUCIBLE_TEST_SECRET"] = "leak"
    try:
        r = sandbox.run(py("import json, os; print(json.dumps(dict(os.environ)))"), {})
    finally:
        del os.environ["CRUCIBLE_TEST_SECRET"]
    assert json.loads(r.stdout) == dict(sandbox.spec.env)


def test_system_is_read_only(sandbox):
    r = sandbox.run(["sh", "-c", "touch /usr/crucible-test 2>/dev/null || echo refused"], {})
    assert r.stdout == "refused\n"


def test_tmp_starts_empty(sandbox):
    r = sandbox.run(["sh", "-c", "ls -A /tmp; echo end"], {})
    assert r.stdout == "end\n"


# -- isolation -------------------------------------------------------------------------------

CONNECT = """
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
        print("connected")
    except OSError as e:
        print("blocked", type(e).__name__)
"""


def test_no_connection_to_the_internet(sandbox):
    r = sandbox.run(py(CONNECT) + ["1.1.1.1", "80"], {})
    assert r.stdout.startswith("blocked"), r.stdout


def test_no_connection_to_a_server_on_host_loopback(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        r = sandbox.run(py(CONNECT) + ["127.0.0.1", str(server.getsockname()[1])], {})
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody ever connected
    assert r.stdout.startswith("blocked"), r.stdout


READ = """
    import sys
    try:
        print("read", open(sys.argv[1]).read())
    except OSError as e:
        print("denied", type(e).__name__)
"""


@pytest.mark.parametrize("parent", ["/root", "/work"])
def test_host_file_outside_workspace_is_invisible(sandbox, parent):
    secret_dir = Path(tempfile.mkdtemp(dir=parent, prefix="crucible-secret-"))
    try:
        secret = secret_dir / "secret.txt"
        secret.write_text("TOPSECRET")
        secret.chmod(0o644)
        secret_dir.chmod(0o755)  # readable by anyone on the host: only isolation can stop it
        r = sandbox.run(py(READ) + [str(secret)], {})
    finally:
        shutil.rmtree(secret_dir)
    assert r.stdout.startswith("denied"), r.stdout


def test_etc_shadow_is_unreadable(sandbox):
    r = sandbox.run(py(READ) + ["/etc/shadow"], {})
    assert r.stdout.startswith("denied"), r.stdout


def test_other_processes_environment_is_invisible(sandbox):
    marker = "crucible-env-" + secrets.token_hex(4)
    os.environ["CRUCIBLE_TEST_SECRET"] = marker
    code = """
        import glob, sys
        for path in glob.glob("/proc/*/environ"):
            try:
                if sys.argv[1].encode() in open(path, "rb").read():
                    print("found", path)
            except OSError:
                pass
    """
    try:
        r = sandbox.run(py(code) + [marker], {})
    finally:
        del os.environ["CRUCIBLE_TEST_SECRET"]
    assert r.ok and r.stdout == ""


# -- limits ----------------------------------------------------------------------------------


def test_timeout_kills_a_detached_grandchild(make_sandbox):
    sandbox = make_sandbox(wall_s=1.0)  # the grandchild must start first
    marker = f"crucible-sleeper-{secrets.token_hex(4)}"
    code = """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                print("grandchild up", flush=True)
                os.execv("/bin/sh", ["sh", "-c", "sleep 60", sys.argv[1]])
            os._exit(0)
        time.sleep(60)
    """
    r = sandbox.run(py(code) + [marker], {})
    assert (r.status, r.stdout) == (ExecStatus.TO, "grandchild up\n")
    assert _processes_with(marker) == []


def test_memory_bomb_is_ML(make_sandbox):
    sandbox = make_sandbox(memory_mb=64)
    r = sandbox.run(py("x = bytearray(1 << 30)"), {})
    assert r.status is ExecStatus.ML
    assert 0 < r.peak_memory_bytes <= 64 << 20


def test_fork_bomb_is_contained(make_sandbox):
    sandbox = make_sandbox(wall_s=0.5, pids=16)
    marker = f"crucible-bomb-{secrets.token_hex(4)}"
    code = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    r = sandbox.run(py(code) + [marker], {})
    assert r.status is ExecStatus.TO
    assert _processes_with(marker) == []
    assert sandbox.run(["true"], {}).ok  # the machine still works


def test_output_flood_is_OL_with_a_truncated_excerpt(make_sandbox):
    sandbox = make_sandbox(output_bytes=1 << 16, excerpt_bytes=1024)
    r = sandbox.run(py("import sys\nwhile True: sys.stdout.buffer.write(b'\\xff' * 4096)"), {})
    assert (r.status, r.stdout_truncated, r.stdout) == (ExecStatus.OL, True, "\ufffd" * 1024)


def test_nonzero_exit_is_RE(sandbox):
    r = sandbox.run(["sh", "-c", "exit 3"], {})
    assert (r.status, r.exit_code, r.signal) == (ExecStatus.RE, 3, None)


def test_death_by_signal_is_SG(sandbox):
    r = sandbox.run(["sh", "-c", "kill -SEGV $$"], {})
    assert (r.status, r.signal) == (ExecStatus.SG, 11)


def test_nothing_is_left_behind(make_sandbox):
    """By a run, or (local-warm) by the warm workers once the sandbox is closed."""
    sandbox = make_sandbox(wall_s=0.5)
    for command in (["true"], ["false"], ["sleep", "5"]):
        sandbox.run(command, {"f.txt": "x"})
    if hasattr(sandbox, "close"):
        sandbox.close()
    assert residue(sandbox) == []


# -- machinery -------------------------------------------------------------------------------


def test_sandbox_setup_failure_is_XX(sandbox, tmp_path):
    r = sandbox.run(["true"], {}, [Mount(tmp_path / "does-not-exist", "/x")])
    assert r.status is ExecStatus.XX and "does-not-exist" in r.error


def test_command_cannot_fake_a_sandbox_failure(sandbox):
    r = sandbox.run(["sh", "-c", "echo 'bwrap: Can't mount proc' >&2; exit 1"], {})
    assert r.status is ExecStatus.RE


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/escape.txt", "a/../../escape.txt", ""])
def test_workspace_paths_must_stay_inside(sandbox, path):
    with pytest.raises(WorkspacePathError):
        sandbox.run(["true"], {path: "x"})


# -- more attacks ----------------------------------------------------------------------------


@pytest.mark.parametrize("host, port", [
    ("169.254.169.254", "80"),  # cloud metadata service
    ("2606:4700:4700::1111", "53"),  # IPv6 internet
])
def test_no_connection_to_metadata_or_ipv6(sandbox, host, port):
    r = sandbox.run(py(CONNECT) + [host, port], {})
    assert r.stdout.startswith("blocked"), r.stdout


def test_no_connection_to_a_server_on_host_ipv6_loopback(sandbox):
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as server:
        server.setblocking(False)
        r = sandbox.run(py(CONNECT) + ["::1", str(server.getsockname()[1])], {})
        with pytest.raises(BlockingIOError):
            server.accept()
    assert r.stdout.startswith("blocked"), r.stdout


def test_credentials_and_the_docker_socket_are_invisible(sandbox):
    paths = ["/var/run/docker.sock", "/run/docker.sock", "/root/.ssh", "/root/.aws", "/root/.docker",
             "/home", "/proc/1/root/etc/shadow", "/work"]
    r = sandbox.run(["sh", "-c", 'for p; do [ -r "$p" ] && [ -n "$(ls -A "$p" 2>/dev/null)" ] && echo "$p"; done; true', "sh", *paths], {})
    assert (r.status, r.stdout) == (ExecStatus.OK, "")


def test_cpu_spin_is_TO(make_sandbox):
    r = make_sandbox(wall_s=0.5).run(py("while True: pass"), {})
    assert r.status is ExecStatus.TO


def test_cpu_time_limit_is_TO(make_sandbox):
    r = make_sandbox(wall_s=10, cpu_s=1).run(py("while True: pass"), {})
    assert (r.status, r.signal) == (ExecStatus.TO, 24)  # SIGXCPU


def test_sleep_forever_ignoring_sigterm_is_TO(make_sandbox):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)"
    r = make_sandbox(wall_s=0.5).run(py(code), {})
    assert r.status is ExecStatus.TO


def test_disk_exhaustion_is_ENOSPC_inside_the_sandbox(make_sandbox):
    sandbox = make_sandbox(disk_mb=8)
    r = sandbox.run(["sh", "-c", "cat /dev/zero > fill; df -k /workspace | tail -1"], {})
    assert r.status is ExecStatus.OK
    assert any(m in r.stderr for m in ("No space left", "File too large", "File size limit exceeded")), r.stderr


def test_inode_exhaustion_is_ENOSPC_inside_the_sandbox(make_sandbox):
    code = """
        import errno, os
        try:
            for i in range(100000):
                open(f"f{i}", "w").close()
        except OSError as e:
            print(errno.errorcode[e.errno], i < 100000)
    """
    r = make_sandbox(inodes=500).run(py(code), {})
    assert r.stdout == "ENOSPC True\n"


def test_kill_everything_spares_the_host_and_the_supervisor(sandbox):
    """kill -9 -1 reaches only the sandbox's own processes; killing the parent or init does
    not break the backend."""
    host_sleeper = subprocess.Popen(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "sleep", "30"])
    try:
        r = sandbox.run(["sh", "-c", "kill -9 -1; kill -9 1; echo alive; kill -9 $PPID"], {})
        assert host_sleeper.poll() is None, "a host process of the sandbox uid was killed"
    finally:
        host_sleeper.kill()
        host_sleeper.wait()
    assert r.status is not ExecStatus.XX and r.stdout.startswith("alive"), r
    assert sandbox.run(["true"], {}).ok


LATE_WRITER = """
    import os, signal, sys, time
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            time.sleep(1)
            open("/workspace/late.txt", "w").write("late")
            os.execv("/bin/sh", ["sh", "-c", "sleep 60", sys.argv[1]])
        os._exit(0)
    print("parent done")
"""


def test_a_process_left_behind_cannot_act_after_the_run(sandbox):
    marker = f"crucible-late-{secrets.token_hex(4)}"
    with sandbox.session() as session:
        r = session.exec(py(LATE_WRITER) + [marker])
        assert (r.status, r.stdout) == (ExecStatus.OK, "parent done\n")
        assert _processes_with(marker) == []
        time.sleep(1.5)
        assert session.exec(["ls", "-A"]).stdout == ""


def test_a_symlink_planted_by_the_command_cannot_lead_put_or_get_outside(sandbox):
    with sandbox.session() as session:
        session.exec(["sh", "-c", "ln -s /etc etc; ln -s /etc/passwd passwd; ln -s / root"])
        for attempt in (
            lambda: session.put_files({"etc/crucible-owned": "x"}),
            lambda: session.put_files({"passwd": "x"}),
            lambda: session.get_files(["etc/passwd"]),
            lambda: session.get_files(["passwd"]),
            lambda: session.get_files(["root/etc/shadow"]),
        ):
            with pytest.raises(WorkspacePathError):
                attempt()
    assert not Path("/etc/crucible-owned").exists()


def test_a_fifo_planted_by_the_command_does_not_hang_get_files(sandbox):
    with sandbox.session() as session:
        session.exec(["mkfifo", "pipe"])
        with pytest.raises(WorkspacePathError):
            session.get_files(["pipe"])


# -- sessions --------------------------------------------------------------------------------


def test_session_keeps_the_workspace_between_execs(sandbox):
    with sandbox.session({"n.txt": "1"}) as session:
        session.exec(["sh", "-c", "echo $(( $(cat n.txt) + 1 )) > n.txt"])
        session.put_files({"sub/extra.txt": b"\x00"})
        r = session.exec(["sh", "-c", "cat n.txt; ls sub"])
        assert r.stdout == "2\nextra.txt\n"
        assert session.get_files(["n.txt", "sub/extra.txt"]) == {"n.txt": b"2\n", "sub/extra.txt": b"\x00"}


def test_a_session_starts_in_a_process_holding_more_than_1024_descriptors(sandbox):
    """A run of 1,024 live episodes (128 tasks x 8) holds a session each: select() cannot watch a
    descriptor numbered 1024 or more, and the 1,024th session failed to start. Its supervisor is
    handed the control socket under the host's number, so it must not use select() either."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with sandbox.session({"n.txt": "1"}) as session:
            result = session.exec(["cat", "n.txt"])
            assert (result.status, result.error, result.stdout) == (ExecStatus.OK, None, "1")
    finally:
        for fd in held:
            os.close(fd)


def test_snapshot_restore_and_reset(sandbox):
    with sandbox.session({"a.txt": "original\n"}) as session:
        session.exec(["sh", "-c", "echo edited > a.txt; mkdir d; echo new > d/b.txt"])
        snapshot = session.snapshot()
        session.exec(["sh", "-c", "rm -r a.txt d; echo other > c.txt; echo t > /tmp/t"])
        session.restore(snapshot)
        assert session.exec(["sh", "-c", "cat a.txt d/b.txt; ls"]).stdout == "edited\nnew\na.txt\nd\n"
        session.reset()
        assert session.exec(["sh", "-c", "cat a.txt; ls; ls -A /tmp"]).stdout == "original\na.txt\n"


IPC_PROBE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0, 4096, 0o1600) >= 0)  # IPC_PRIVATE, IPC_CREAT | 0600
print(libc.mq_open(b"/crucible", 0o102, 0o600, None), ctypes.get_errno())  # O_CREAT | O_RDWR
"""


def test_reset_removes_sysv_ipc_objects_and_message_queues_cannot_be_made(sandbox):
    """What a reset cannot see in files: SysV objects are removed, POSIX queues refused (EPERM)."""
    with sandbox.session({"probe.py": IPC_PROBE}) as session:
        assert session.exec(["python3", "probe.py"]).stdout == f"True\n-1 {errno.EPERM}\n"
        assert len(session.exec(["cat", "/proc/sysvipc/shm"]).stdout.splitlines()) == 2  # the header and one
        session.reset()
        assert len(session.exec(["cat", "/proc/sysvipc/shm"]).stdout.splitlines()) == 1


def test_reset_to_other_files_serves_another_task_and_becomes_what_reset_returns_to(sandbox):
    with sandbox.session({"a.txt": "first task\n"}) as session:
        session.exec(["sh", "-c", "echo t > /tmp/t; echo s > /dev/shm/s; echo w > written.txt"])
        session.reset({"b/c.txt": "second task\n"})
        listing = "b\nb/c.txt\n"
        assert session.exec(["sh", "-c", "find . -mindepth 1 | sed s,^./,, | sort; ls -A /tmp /dev/shm"]).stdout == (
            listing + "/dev/shm:\n\n/tmp:\n")
        session.exec(["sh", "-c", "rm b/c.txt"])
        session.reset()
        assert session.get_files(["b/c.txt"]) == {"b/c.txt": b"second task\n"}


def archive(*members: tuple[str, str | None]) -> bytes:
    """A tar of (name, symlink target or None for a one-byte file) members, in order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, link_target in members:
            info = tarfile.TarInfo(name)
            if link_target is None:
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, link_target
                tar.addfile(info)
    return buffer.getvalue()


def test_restore_refuses_an_archive_that_escapes(sandbox):
    with sandbox.session() as session:
        with pytest.raises(WorkspacePathError):
            session.restore(archive(("../../escaped.txt", None)))
        assert "escaped" not in session.exec(["ls", "-A", "/", "/workspace"]).stdout


def test_exec_streams_output_and_keeps_a_log(sandbox):
    chunks = []
    with sandbox.session() as session:
        session.exec(["sh", "-c", "echo one; echo two >&2"], on_output=lambda stream, data: chunks.append((stream, data)))
        session.exec(["sleep", "5"], timeout_s=0.3)
        log = [(r.command, r.status, r.session_id) for r in session.log]
    assert sorted(chunks) == [("stderr", b"two\n"), ("stdout", b"one\n")]
    assert log == [(("sh", "-c", "echo one; echo two >&2"), ExecStatus.OK, session.id),
                   (("sleep", "5"), ExecStatus.TO, session.id)]
    assert all(r.started_at and r.wall_s > 0 for r in session.log)


def test_close_is_idempotent_and_final(make_sandbox):
    sandbox = make_sandbox()
    session = sandbox.session({"a.txt": "x"})
    session.close()
    session.close()
    assert residue(sandbox) == []
    with pytest.raises(RuntimeError):
        session.exec(["true"])


ORPHAN_OWNER = """
import sys, time
from pathlib import Path
backend, scratch, tag = sys.argv[1:4]
if backend == "local":
    from sandbox.local import LocalSandbox
    sandbox = LocalSandbox(scratch_dir=Path(scratch), cgroup_parent=tag)
else:
    from sandbox.docker import DockerSandbox
    sandbox = DockerSandbox(scratch_dir=Path(scratch), labels={"crucible.test": tag})
session = sandbox.session({"a.txt": "x"})
print("open", flush=True)
time.sleep(60)
"""


def test_reap_removes_the_sessions_of_an_owner_killed_without_closing(sandbox):
    tag = sandbox.cgroup_parent if sandbox.name == "local" else sandbox.labels["crucible.test"]
    owner = subprocess.Popen([sys.executable, "-c", ORPHAN_OWNER, sandbox.name, str(sandbox.scratch_dir), tag],
                             stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    try:
        assert owner.stdout.readline() == "open\n"
    finally:
        owner.kill()
        owner.wait()
    assert residue(sandbox) != []  # the owner died holding a session
    assert len(sandbox.reap()) == 1
    assert residue(sandbox) == []


OPENER = """
import sys
from pathlib import Path
backend, scratch, tag = sys.argv[1:4]
if backend == "local":
    from sandbox.local import LocalSandbox
    LocalSandbox(scratch_dir=Path(scratch), cgroup_parent=tag)
else:
    from sandbox.docker import DockerSandbox
    DockerSandbox(scratch_dir=Path(scratch), labels={"crucible.test": tag})
"""


def test_a_process_first_sandbox_removes_what_a_killed_owner_left(sandbox):
    tag = sandbox.cgroup_parent if sandbox.name == "local" else sandbox.labels["crucible.test"]
    args = [sandbox.name, str(sandbox.scratch_dir), tag]
    owner = subprocess.Popen([sys.executable, "-c", ORPHAN_OWNER, *args], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parent.parent)
    try:
        assert owner.stdout.readline() == "open\n"
    finally:
        owner.kill()
        owner.wait()
    assert residue(sandbox) != []
    subprocess.run([sys.executable, "-c", OPENER, *args], check=True, cwd=Path(__file__).parent.parent)
    assert residue(sandbox) == []


def test_local_refuses_network_it_cannot_isolate():
    require("local")
    from sandbox.local import LocalSandbox
    from sandbox.spec import SandboxSpec

    with pytest.raises(SandboxUnavailable, match="share the host's"):
        LocalSandbox(SandboxSpec(network=True))


def test_docker_refuses_network_it_cannot_give():
    require("docker")
    from sandbox.docker import DockerSandbox
    from sandbox.spec import SandboxSpec

    with pytest.raises(SandboxUnavailable, match="no bridge network"):
        DockerSandbox(SandboxSpec(network=True))


WEAK_HOST = """
import json
from sandbox.base import SandboxUnavailable
from sandbox.local import LocalSandbox
from sandbox.spec import Limits, SandboxSpec
try:
    LocalSandbox()
    refused = None
except SandboxUnavailable as e:
    refused = str(e)
weak = LocalSandbox(SandboxSpec(limits=Limits(memory_mb=64), allow_weak_isolation=True))
bomb = ["/usr/bin/python3", "-c", "x = bytearray(1 << 30)"]
one_shot = weak.run(bomb, {})
with weak.session() as session:
    in_session = session.exec(bomb)
print(json.dumps({"refused": refused, "results": [[r.status.value, "MemoryError" in r.stderr, len(r.notes)]
                                                   for r in (one_shot, in_session)]}))
"""


def test_a_host_without_cgroup_limits_is_refused_unless_weak_isolation_is_allowed():
    """In a mount namespace where the memory and pids hierarchies are read-only (as on hosts
    that do not delegate cgroups): refused by default; with allow_weak_isolation, rlimits
    hold the memory bomb and every result says so."""
    require("local")
    mounts = Path("/proc/self/mounts").read_text()
    if " /sys/fs/cgroup/memory cgroup " not in mounts or " /sys/fs/cgroup/pids cgroup " not in mounts:
        skip_unless_required("local", "this check hides cgroup v1 hierarchies, and this host has none")
    hide = ("mount -o remount,bind,ro /sys/fs/cgroup/memory && mount -o remount,bind,ro /sys/fs/cgroup/pids"
            f' && exec {sys.executable} -c "$0"')
    done = subprocess.run(["unshare", "--mount", "sh", "-c", hide, WEAK_HOST], capture_output=True, text=True,
                          timeout=PATIENCE_S, cwd=Path(__file__).parent.parent)
    report = json.loads(done.stdout)
    assert "no writable memory cgroup" in report["refused"] and "allow_weak_isolation" in report["refused"]
    assert report["results"] == [["RE", True, 2], ["RE", True, 2]]


def test_snapshot_refuses_sparse_files_bigger_than_the_workspace(make_sandbox):
    sandbox = make_sandbox(disk_mb=8)
    with sandbox.session() as session:
        r = session.exec(py("for i in range(50):\n    with open(f'f{i}', 'w') as f:\n        f.truncate(7 << 20)"))
        assert r.ok, r.stderr
        with pytest.raises(WorkspacePathError):
            session.snapshot()


def test_restore_never_writes_through_a_symlink_in_the_archive(sandbox):
    with sandbox.session() as session:
        with pytest.raises(WorkspacePathError):
            session.restore(archive(("etc", "/etc"), ("etc/crucible-owned", None)))
    assert not Path("/etc/crucible-owned").exists()


def test_snapshot_keeps_modes_and_symlinks(sandbox):
    with sandbox.session() as session:
        session.exec(["sh", "-c", "printf '#!/bin/sh\\necho run' > s.sh; chmod 755 s.sh; ln -s s.sh link"])
        snapshot = session.snapshot()
        session.exec(["sh", "-c", "rm s.sh link"])
        session.restore(snapshot)
        assert session.exec(["sh", "-c", "./link; readlink link"]).stdout == "run\ns.sh\n"


def test_protected_files_cannot_be_changed_but_new_files_can_be_added(sandbox):
    if sandbox.name == "docker":
        pytest.skip("Docker's protect is weaker by design (no root with CAP_CHOWN under no-new-privileges): "
                    "grading detects changes instead (tests/test_repository_tasks.py)")
    with sandbox.session({"tests/test_a.py": "sealed\n", "tests/helper.py": "mine\n", "README": "x\n"}) as session:
        session.protect(["tests/test_a.py"])
        attempts = ["echo changed > tests/test_a.py", "chmod 644 tests/test_a.py", "rm -f tests/test_a.py",
                    "mv tests/test_a.py tests/b.py", "mv tests moved", "ln -sf /etc/passwd tests/test_a.py"]
        for attempt in attempts:
            assert session.exec(["sh", "-c", attempt]).status is ExecStatus.RE, attempt
        assert session.exec(["sh", "-c", "echo new > tests/new.py && echo more >> tests/helper.py"]).ok
        assert session.get_files(["tests/test_a.py"]) == {"tests/test_a.py": b"sealed\n"}
        session.reset()  # back to the sandbox user's own workspace
        assert session.exec(["sh", "-c", "echo changed > tests/test_a.py && mv tests moved"]).ok
