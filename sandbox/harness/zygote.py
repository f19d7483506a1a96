"""The zygote of a local grading worker: a sandboxed interpreter, started once, that forks every
run into a sandbox of its own, so a run costs a fork instead of an interpreter start and a new
bubblewrap sandbox.

Started by bubblewrap like the supervisor (sandbox/harness/supervisor.py), as root with the
supervisor's capabilities and CAP_SYS_ADMIN, CAP_SYS_CHROOT and CAP_CHOWN besides, to make each
run's namespaces and mounts; and with no seccomp filter of its own: each run loads it before
anything of the run executes. Per run (docs/sandboxes.md, "Warm grading workers"):

  zygote (root)   enters a new mount, pid and IPC namespace, forks the run's init there, and goes
                  back to its own namespaces; it never reads the run's files (every later run is
                  a copy of its memory)
  init            pid 1 of the new pid namespace: closes the zygote's descriptors, mounts one
                  fresh size-capped tmpfs shown at /workspace, /tmp and /dev/shm, writes the files
                  (the workspace the sandbox user's), shows each grader tree on a tmpfs of its own,
                  root's and read-only, mounts its /proc; then uid 65534, no capability (bounding
                  set empty), no_new_privs, the seccomp deny-list, rlimits. The built-in
                  harness it runs itself (the copy this zygote imported: the same file); any other
                  command it forks (pid 2: a pid 1 ignores the signals it sends itself) and execs,
                  reaps what is orphaned, and reports the command's wait status

The init's exit ends the pid namespace and every process left in it; the zygote holds the mount
namespace until it has reported, and lets it go while the host reads the result. Host protocol:
the supervisor's (one SOCK_SEQPACKET message each way, marshal version 4), with
  host -> {"op": "run", "argv", "env", "cwd", "uid", "gid", "rlimits", "tmpfs", "trees",
           "harness"} + fds [stdout, stderr, files]
where files is a memfd holding marshal {"workspace": {path: bytes}, "trees": {mount: {path: bytes}}}.

Standard library only; runs under `python3 -I -S`.
"""

import ctypes
import marshal
import os
import select
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_tests  # noqa: E402 (imported once here: every run that grades with it skips its start-up)
import supervisor  # noqa: E402

# Imported once here too: the standard library modules solutions and tests of Python coding tasks
# import most (typing alone takes ~14 ms to import). A run still imports anything else itself,
# and its process is a fork: what it does to a module is its own. (random reseeds in every fork.)
PRELOADED = ("typing", "re", "math", "cmath", "collections", "itertools", "functools", "operator", "string",
             "random", "heapq", "bisect", "array", "copy", "hashlib", "json", "datetime", "fractions", "decimal",
             "statistics")
for _module in PRELOADED:
    __import__(_module)
import gc  # noqa: E402
gc.freeze()

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWIPC = 0x00020000, 0x20000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
# The parts of the run's tmpfs and where each is shown (the workspace last: it covers the tmpfs).
SHOWN_AT = {"t": "/tmp", "s": "/dev/shm", "w": "/workspace"}
_libc = supervisor._libc
# The zygote's own mount and pid namespaces, which it goes back to after forking each run's init.
_OWN_NAMESPACES = {kind: os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in ("mnt", "pid", "ipc")}


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def main(control_fd: int) -> None:
    control = supervisor.socket.socket(fileno=control_fd)
    control.set_inheritable(False)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    supervisor.send(control, {"ready": True})
    seccomp_program = None
    while True:
        request, fds = supervisor.receive(control, fds=3)
        if request is None:
            return  # the host closed the session
        if request.get("op") == "seccomp" and len(fds) == 1:
            seccomp_program = supervisor.read_to_end(fds[0])
        elif request.get("op") == "run" and len(fds) == 3 and seccomp_program:
            run(control, request, fds, seccomp_program)
        else:
            for fd in fds:
                os.close(fd)


def run(control, request: dict, fds: list[int], seccomp_program: bytes) -> None:
    for path in request["trees"]:
        os.makedirs(path, mode=0o755, exist_ok=True)  # in the zygote's own root: empty, and stays so
    setup_r, setup_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    try:
        init, mounts = fork_init(request, fds, setup_w, status_w, seccomp_program)
    except OSError as e:
        init, mounts = None, None
        os.write(setup_w, f"{type(e).__name__}: {e}".encode())
    for fd in (*fds, setup_w, status_w):
        os.close(fd)
    failure = supervisor.read_to_end(setup_r)  # empty: the command got as far as its start
    try:
        if failure:
            os.close(status_r)
            if init is not None:
                os.waitpid(init, 0)
            supervisor.send(control, {"spawn_failed": failure.decode(errors="replace")})
        else:
            supervisor.send(control, {"started": init})
            report_exit(control, init, status_r)
    finally:
        if mounts is not None:
            os.close(mounts)  # the run's mount namespace, torn down now: after the host has its result


def fork_init(request: dict, fds: list[int], setup_w: int, status_w: int, seccomp_program: bytes) -> tuple[int, int]:
    """The run's init, forked into new mount, pid and IPC namespaces; and a descriptor of that
    mount namespace, which outlives the run until the zygote closes it. The run's files are read
    and written by the init alone: nothing of a run ever enters the zygote's memory, which every
    later run is a copy of."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        mounts = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            init = os.fork()
        except OSError:
            os.close(mounts)
            raise
        if init == 0:
            try:
                start_init(request, fds, setup_w, status_w, seccomp_program)
            finally:
                os._exit(125)  # never back into the zygote's code, whatever happened
    finally:
        go_home()
    return init, mounts


def go_home() -> None:
    """Back to the zygote's own namespaces; a zygote that cannot go back serves no other run."""
    for kind, flag in (("mnt", CLONE_NEWNS), ("pid", CLONE_NEWPID), ("ipc", CLONE_NEWIPC)):
        if _libc.setns(_OWN_NAMESPACES[kind], flag) != 0:
            os._exit(1)


def report_exit(control, init: int, status_r: int) -> None:
    """Wait for the run's init (killing the run when the host asks), then report the command's
    wait status and what the run used. Once the init is reaped, every process of the run is."""
    pidfd = os.pidfd_open(init)
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    try:
        while not any(fd == pidfd for fd, _ in poller.poll()):
            message, extra = supervisor.receive(control)
            for fd in extra:
                os.close(fd)
            if message is None or message.get("op") == "kill":
                supervisor.kill_everyone()
    finally:
        os.close(pidfd)
    _, ended, usage = os.wait4(init, 0)
    said = supervisor.read_to_end(status_r)  # a command's own status, where the init forked one (closes it)
    supervisor.send(control, {"exit": int(said) if said else ended, "cpu_s": usage.ru_utime + usage.ru_stime,
                              "max_rss_kb": usage.ru_maxrss})


def lay_out(tmpfs: str, files: dict, uid: int, gid: int) -> None:
    """One fresh tmpfs at /workspace, its parts shown at /workspace, /tmp and /dev/shm (one disk
    cap for all three, as a session has), the workspace the sandbox user's; each grader tree on a
    tmpfs of its own, root's and read-only."""
    _mount("tmpfs", "/workspace", "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
    for part in SHOWN_AT:
        os.mkdir(f"/workspace/{part}")
        os.chmod(f"/workspace/{part}", 0o755 if part == "w" else 0o1777)  # not narrowed by the umask
    _write_tree("/workspace/w", files["workspace"], (uid, gid))
    for part, shown in SHOWN_AT.items():
        _mount(f"/workspace/{part}", shown, None, MS_BIND)
    for path, tree in files["trees"].items():
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0755")
        _write_tree(path, tree)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _write_tree(root: str, files: dict, owner: tuple[int, int] | None = None) -> None:
    """The files under `root` (each path checked by the host), then all of it given to `owner`
    (else left root's): written first, as the zygote holds no CAP_DAC_OVERRIDE."""
    made = [root]
    for name, content in files.items():
        target = os.path.join(root, name)
        parts = os.path.relpath(os.path.dirname(target), root).split(os.sep)
        for end in range(1, len(parts) + 1):
            folder = os.path.join(root, *parts[:end])
            if parts[0] != "." and not os.path.isdir(folder):
                os.mkdir(folder)
                os.chmod(folder, 0o755)
                made.append(folder)
        with open(target, "wb") as f:
            f.write(content)
        os.chmod(target, 0o755 if name.endswith(".sh") else 0o644)
        made.append(target)
    for path in made if owner else ():
        os.chown(path, *owner)


def mount_proc() -> None:
    """A /proc of the run's own pid namespace, its kernel settings read-only (as bubblewrap's)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for covered in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"):
        if os.path.exists(covered):
            _mount(covered, covered, None, MS_BIND | MS_REC)
            _mount(None, covered, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def start_init(request: dict, fds: list[int], setup_w: int, status_w: int, seccomp_program: bytes) -> None:
    """Pid 1 of the run's namespace: the run's limits, privileges and filter; then the harness, or
    the command it forks and waits for (see the module docstring)."""
    try:
        keep_only((*fds, setup_w, status_w))  # not the control socket, nor the zygote's own
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as pid 1: ignored when the run sends it
        lay_out(request["tmpfs"], marshal.loads(supervisor.read_to_end(fds[2])), request["uid"], request["gid"])
        mount_proc()
        os.setsid()
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the run, not the zygote, is what the kernel kills first
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for name, soft, hard in request["rlimits"]:
            supervisor.resource.setrlimit(getattr(supervisor.resource, name), (soft, hard))
        supervisor.drop_bounding_set()
        os.setgroups([])
        os.setresgid(request["gid"], request["gid"], request["gid"])
        os.setresuid(request["uid"], request["uid"], request["uid"])  # clears effective/permitted
        supervisor.clear_capabilities()  # and the inheritable set
        _check(_libc.prctl(supervisor.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        program = _SockFprog(len(seccomp_program) // 8, seccomp_program)
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0), "seccomp")
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # an exec'd command is again
        os.chdir(request["cwd"])
        for fd in (*fds[:2], null):  # fds[2], the files, was read to its end and closed
            os.close(fd)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        if request["harness"]:
            os.close(status_w)
            run_harness(request, setup_w)  # never returns
        command = os.fork()
    except BaseException as e:
        os.write(setup_w, f"{type(e).__name__}: {e}".encode())
        os._exit(125)
    if command == 0:
        os.close(status_w)
        exec_command(request, setup_w)  # never returns
    os.close(setup_w)
    for fd in (0, 1, 2):
        os.close(fd)  # the command's output ends when the command's side closes
    while True:
        pid, status = os.wait()
        if pid == command:
            os.write(status_w, str(status).encode())
            os._exit(0)


def keep_only(kept: tuple[int, ...]) -> None:
    """Close every descriptor of this process above stderr but `kept`."""
    low = 3
    for fd in sorted(fd for fd in kept if fd >= low):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def run_harness(request: dict, setup_w: int) -> None:
    """python3 -I -S <launcher> ARGS, the launcher the built-in one: as that interpreter would."""
    keep_only((setup_w,))
    argv = request["argv"]
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = argv[3:]
    sys.path[:] = [os.path.join(os.path.dirname(argv[3]), "harness"), *sys.path[1:]]
    os.close(setup_w)
    run_tests.run()  # never returns


def exec_command(request: dict, setup_w: int) -> None:
    keep_only((setup_w,))
    argv = request["argv"]
    try:
        os.execvpe(argv[0], argv, request["env"])
    except OSError as e:  # like a shell: 127 for a command that cannot be found, 126 for one that cannot run
        os.write(2, f"{argv[0]}: {e.strerror}\n".encode())
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


def _mount(source, target: str, kind, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), kind and kind.encode(), flags,
                       data and data.encode()), f"mount {target}")


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
