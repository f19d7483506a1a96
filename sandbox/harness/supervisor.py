"""The supervisor of a local sandbox session: runs inside the session's namespaces for its whole
life and starts each exec, so an exec costs a fork instead of a new sandbox.

Started by bubblewrap as root without any capability but CAP_SETUID, CAP_SETGID and CAP_KILL,
under the session's seccomp filter: the sandbox user (uid 65534) can neither signal, trace nor
read it. It talks to the host over one SOCK_SEQPACKET socket (fd number in argv[1]), one message
per packet (marshal, version 4: readable by both interpreters):

  host -> {"op": "exec", "argv", "env", "cwd", "uid", "gid", "rlimits"} + fds [stdout, stderr]
  sup  -> {"started": pid}                  the command is about to exec: the sandbox is up
       or {"spawn_failed": reason}           setting the command up failed (ours, not its)
  host -> {"op": "kill"}                     optional, while it runs: a limit was hit
  sup  -> {"exit": wait status, "cpu_s", "max_rss_kb"}   after the command and every process
                                             it left behind are dead

Standard library only; runs under `python3 -I -S`.
"""

import array
import ctypes
import errno
import marshal
import os
import resource
import select
import signal
import socket
import sys
import warnings  # noqa: F401 (os.execvpe imports it: once here, not in every child)

_MESSAGE_BYTES = 1 << 20
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


def main(control_fd: int) -> None:
    control = socket.socket(fileno=control_fd)
    control.set_inheritable(False)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    send(control, {"ready": True})
    while True:
        request, fds = receive(control)
        if request is None:
            return  # the host closed the session
        if request.get("op") == "exec" and len(fds) == 2:
            run(control, request, fds)
        else:
            for fd in fds:
                os.close(fd)


def receive(control: socket.socket, fds: int = 2) -> tuple[dict | None, list[int]]:
    """A message and the file descriptors (up to `fds`) that came with it."""
    received = array.array("i")
    data, ancillary, _, _ = control.recvmsg(_MESSAGE_BYTES, socket.CMSG_SPACE(fds * received.itemsize))
    if not data:
        return None, []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
    return marshal.loads(data), list(received)


def send(control: socket.socket, message: dict) -> None:
    control.send(marshal.dumps(message, 4))


def run(control: socket.socket, request: dict, fds: list[int]) -> None:
    setup_r, setup_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(setup_r)
        become_command(request, fds, setup_w)  # never returns
    os.close(setup_w)
    for fd in fds:
        os.close(fd)  # the command's output ends when the command's side closes
    failure = read_to_end(setup_r)  # empty: the child got as far as exec
    if failure:
        os.waitpid(pid, 0)
        send(control, {"spawn_failed": failure.decode(errors="replace")})
        return
    send(control, {"started": pid})
    pidfd = os.pidfd_open(pid)
    poller = select.poll()  # not select(): the host may pass a control fd numbered past 1024
    poller.register(control, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    try:
        while True:
            if any(fd == pidfd for fd, _ in poller.poll()):
                break
            message, extra = receive(control)
            for fd in extra:
                os.close(fd)
            if message is None or message.get("op") == "kill":
                kill_everyone()
    finally:
        os.close(pidfd)
    _, status, usage = os.wait4(pid, 0)
    kill_everyone()  # nothing the command started may outlive it
    send(control, {"exit": status, "cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_kb": usage.ru_maxrss})


def read_to_end(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def kill_everyone() -> None:
    """SIGKILL every process in the sandbox but this one and init (kill(-1) spares both)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nobody left


def become_command(request: dict, fds: list[int], setup_w: int) -> None:
    """In the forked child: drop to the sandbox user with no privileges, then exec. A failure
    before the exec is ours and goes to `setup_w`; one of the exec itself (no such command) is
    the command's, reported as a shell would."""
    try:
        os.setsid()
        # The command, not this supervisor, is what the kernel kills first when memory runs out.
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for name, soft, hard in request["rlimits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        drop_bounding_set()
        os.setgroups([])
        os.setresgid(request["gid"], request["gid"], request["gid"])
        os.setresuid(request["uid"], request["uid"], request["uid"])  # clears effective/permitted
        clear_capabilities()  # and the inheritable set
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.closerange(3, setup_w)
        os.closerange(setup_w + 1, 1 << 16)
    except BaseException as e:
        os.write(setup_w, f"{type(e).__name__}: {e}".encode())
        os._exit(125)
    try:
        os.execvpe(request["argv"][0], request["argv"], request["env"])
    except OSError as e:
        # Like a shell: 127 for a command that cannot be found, 126 for one that cannot run.
        os.write(2, f"{request['argv'][0]}: {e.strerror}\n".encode())
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


def drop_bounding_set() -> None:
    """No capability can ever come back, whatever the command execs (needs CAP_SETPCAP)."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: past the last capability the kernel knows
        raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


def clear_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


if __name__ == "__main__":
    main(int(sys.argv[1]))
