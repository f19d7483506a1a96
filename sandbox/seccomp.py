"""The seccomp deny-list every backend applies: one list, compiled to BPF for bubblewrap and
written as a Docker seccomp profile.

A deny-list on top of uid 65534 with no capabilities: the calls below are either kernel attack
surface that a test program never needs (bpf, io_uring, userfaultfd, perf_event_open, keyctl),
ways to see or steer other processes (ptrace, process_vm_*), ways out of the sandbox's
namespaces (unshare, setns, mount, new user namespaces through clone), POSIX message queues
(state that would outlive a session's reset: nothing lists or removes them without mounting the
mqueue filesystem), or host-wide switches
(kexec, modules, reboot, swap, clock). A denied call fails with EPERM so the program sees an
ordinary error instead of dying; clone3 answers ENOSYS, which makes libc fall back to clone,
whose flags (unlike clone3's) the filter can read. Other architectures' system call tables
(i386, x32) are killed outright, since their numbers would bypass the list.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

DENIED_SYSCALLS = (
    # seeing or steering other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # leaving the sandbox's namespaces and mounts
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_by_handle_at",
    "name_to_handle_at",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "lookup_dcookie", "fanotify_init",
    # state a session reset cannot remove: a message queue is reachable only by its name
    "mq_open",
    # the host itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "quotactl", "vhangup", "iopl", "ioperm",
)

# ioctl requests that push or steal input on a terminal the sandbox shares with its parent.
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
DENIED_IOCTLS = (TIOCSTI, TIOCLINUX)

# clone flags that create namespaces (a new user namespace gives back every capability).
CLONE_NAMESPACE_FLAGS = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET


class SeccompUnavailable(RuntimeError):
    """libseccomp could not be loaded or does not know this architecture."""


@functools.cache
def bpf_program() -> bytes:
    """The deny-list as a classic BPF program, the format `bwrap --seccomp FD` reads."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as e:  # the binding loads libseccomp.so.2 on import
        raise SeccompUnavailable(f"libseccomp is not usable: {e}") from e
    f = seccomp.SyscallFilter(seccomp.ALLOW)
    eperm = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        f.add_rule(eperm, name)
    for request in DENIED_IOCTLS:
        f.add_rule(eperm, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    for flag in _namespace_flag_bits():  # rules on one call are OR-ed: any flag set denies
        f.add_rule(eperm, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def docker_profile() -> dict:
    """The same deny-list as a Docker seccomp profile (`--security-opt seccomp=<json>`)."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules = [{"names": list(DENIED_SYSCALLS), **eperm}]
    rules += [{"names": ["ioctl"], **eperm, "args": [{"index": 1, "value": request, "op": "SCMP_CMP_EQ"}]}
              for request in DENIED_IOCTLS]
    rules += [{"names": ["clone"], **eperm,
               "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
              for flag in _namespace_flag_bits()]
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "syscalls": rules}


def _namespace_flag_bits() -> list[int]:
    return [1 << bit for bit in range(32) if CLONE_NAMESPACE_FLAGS & (1 << bit)]


def bpf_fd() -> int:
    """A fresh memfd holding the BPF program, positioned at its start, for one bwrap run."""
    fd = os.memfd_create("crucible-seccomp", os.MFD_CLOEXEC)
    os.write(fd, bpf_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
