"""The supervisor of a local sandbox session: runs inside the session's namespaces for its whole
life and starts each exec, so an exec costs a fork instead of a new sandbox.

Started by bubblewrap as root without any capability but CAP_SETUID, CAP_SETGID and CAP_KILL,
under the session's seccomp filter: the sandbox user (uid 65534) can neither signal, trace nor
read it. It talks to the host over one SOCK_SEQPACKET socket (fd number in argv[1]), one message
per packet (marshal, version 4: readable by both interpreters):

  host -> {"op": "exec", "argv", "env", "cwd", "uid", "gid", "rlimits"} + fds [stdout, stderr]
  sup  -> {"started": pid}                  the command is about to exec: the sandbox is up
  host -> {"op": "kill"}                     optional, while it runs: a limit was hit
  sup  -> {"exit": wait status, "cpu_s", "max_rss_kb"}   after the command and every process
                                             it left behind are dead

Standard library only; runs under `python3 -I -S`.
"""

import array
import ctypes
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


def receive(control: socket.socket) -> tuple[dict | None, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = control.recvmsg(_MESSAGE_BYTES, socket.CMSG_SPACE(2 * fds.itemsize))
    if not data:
        return None, []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return marshal.loads(data), list(fds)


def send(control: socket.socket, message: dict) -> None:
    control.send(marshal.dumps(message, 4))


def run(control: socket.socket, request: dict, fds: list[int]) -> None:
    pid = os.fork()
    if pid == 0:
        become_command(request, fds)  # never returns
    for fd in fds:
        os.close(fd)  # the command's output ends when the command's side closes
    send(control, {"started": pid})
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([control, pidfd], [], [])
            if pidfd in ready:
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


def kill_everyone() -> None:
    """SIGKILL every process in the sandbox but this one and init (kill(-1) spares both)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nobody left


def become_command(request: dict, fds: list[int]) -> None:
    """In the forked child: drop to the sandbox user with no privileges, then exec."""
    try:
        os.setsid()
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
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.closerange(3, 1 << 16)
        os.execvpe(request["argv"][0], request["argv"], request["env"])
    except OSError as e:
        # Like a shell: 127 for a command that cannot be found, 126 for one that cannot run.
        os.write(2, f"{request['argv'][0]}: {e.strerror}\n".encode())
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)
    except BaseException as e:  # a bug of ours, reported on the command's stderr
        os.write(2, f"crucible supervisor: {type(e).__name__}: {e}\n".encode())
        os._exit(125)


def drop_bounding_set() -> None:
    """No capability can ever come back, whatever the command execs (needs CAP_SETPCAP)."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1  # stops at the first number the kernel does not know (EINVAL)


def clear_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


if __name__ == "__main__":
    main(int(sys.argv[1]))
