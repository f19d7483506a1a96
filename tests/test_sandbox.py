"""LocalSandbox against real bubblewrap and cgroups (no mocks). Needs root and /usr/bin/bwrap."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import tempfile
import textwrap
from pathlib import Path

import pytest

from sandbox.base import Mount
from sandbox.local import BWRAP, LocalSandbox
from sandbox.result import ExecStatus
from sandbox.spec import Limits, SandboxSpec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(BWRAP, os.X_OK), reason="LocalSandbox needs root and bubblewrap"
)
PY = ["/usr/bin/python3", "-I", "-S", "-c"]


@pytest.fixture
def make_sandbox(tmp_path):
    """LocalSandbox factory with its own scratch dir and cgroup parent, removed afterwards."""
    made: list[LocalSandbox] = []

    def make(**limits) -> LocalSandbox:
        spec = SandboxSpec(limits=Limits(**{"wall_s": 5.0, **limits}))
        scratch = tmp_path / f"scratch{len(made)}"
        scratch.mkdir()
        sb = LocalSandbox(spec, scratch_dir=scratch, cgroup_parent=f"crucible-test-{secrets.token_hex(4)}")
        made.append(sb)
        return sb

    yield make
    for sb in made:
        for parent in _cgroup_parents(sb):
            if parent.exists():
                parent.rmdir()  # fails (loudly) if a run cgroup was left inside


@pytest.fixture
def sandbox(make_sandbox) -> LocalSandbox:
    return make_sandbox()


def _cgroup_parents(sb: LocalSandbox) -> set[Path]:
    host = sb.cgroup_host
    return {p for p in (host.memory_parent, host.pids_parent) if p} if host else set()


def _run_cgroups(sb: LocalSandbox) -> list[Path]:
    return [d for p in _cgroup_parents(sb) if p.exists() for d in p.iterdir() if d.is_dir()]


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
        ExecStatus.OK, 0, "hello\n", "local", sandbox.spec.hash
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
    r = sandbox.run(py("import os; print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())"), {})
    assert r.stdout == "65534 65534 65534 []\n"


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
    if sandbox.cgroup_host is None or sandbox.cgroup_host.memory_parent is None:
        pytest.skip("no memory cgroup on this host")
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
    sandbox = make_sandbox(wall_s=0.5)
    for command in (["true"], ["false"], ["sleep", "5"]):
        sandbox.run(command, {"f.txt": "x"})
    assert (list(sandbox.scratch_dir.iterdir()), _run_cgroups(sandbox)) == ([], [])


# -- machinery -------------------------------------------------------------------------------


def test_sandbox_setup_failure_is_XX(sandbox, tmp_path):
    r = sandbox.run(["true"], {}, [Mount(tmp_path / "does-not-exist", "/x")])
    assert r.status is ExecStatus.XX and "bwrap" in r.error


def test_command_cannot_fake_a_sandbox_failure(sandbox):
    r = sandbox.run(["sh", "-c", "echo 'bwrap: Can't mount proc' >&2; exit 1"], {})
    assert r.status is ExecStatus.RE


def test_workspace_paths_must_stay_inside(sandbox):
    with pytest.raises(ValueError):
        sandbox.run(["true"], {"../escape.txt": "x"})
