"""Files in and out of a workspace, safely.

Two halves: path rules every backend applies to put/get paths, and host-side file access for
backends whose workspace is a host directory (local). The host side runs as root over a
directory the sandboxed command could write, so it never follows a symlink: each path is
walked one component at a time with O_NOFOLLOW, and only regular files are read or replaced.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from sandbox.base import WorkspacePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO the command planted must not hang us.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def safe_relative(rel: str) -> PurePosixPath:
    """`rel` as a path that stays inside the workspace, or WorkspacePathError."""
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts or path == PurePosixPath(".") or "\0" in rel:
        raise WorkspacePathError(f"workspace path must be relative and stay inside: {rel!r}")
    return path


def as_bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else content


def files_to_tar(files: Mapping[str, str | bytes], uid: int, gid: int) -> bytes:
    """A tar archive of `files` (paths checked), owned by uid:gid, for backends that unpack
    inside the sandbox."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for rel, content in files.items():
            data = as_bytes(content)
            info = tarfile.TarInfo(str(safe_relative(rel)))
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, uid, gid
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def regular_files_in_tar(archive: bytes) -> dict[str, bytes]:
    """Every regular file of a tar archive by its relative path (checked); links, devices and
    directories are left out."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {str(safe_relative(member.name)): tar.extractfile(member).read()
                for member in tar.getmembers() if member.isreg()}


def regular_files_from_tar(archive: bytes, wanted: Sequence[str]) -> dict[str, bytes]:
    """The members `wanted` of a tar archive, each of which must be a regular file."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            name = str(PurePosixPath(member.name))
            if name in wanted and member.isreg():
                found[name] = tar.extractfile(member).read()
    missing = [p for p in wanted if p not in found]
    if missing:
        raise WorkspacePathError(f"not a regular file in the workspace: {missing[0]!r}")
    return found


class HostWorkspace:
    """A workspace directory on this host, written as root, owned by the sandbox user."""

    def __init__(self, root: Path, uid: int, gid: int, max_file_bytes: int):
        self.root, self.uid, self.gid, self.max_file_bytes = root, uid, gid, max_file_bytes

    def put(self, files: Mapping[str, str | bytes]) -> None:
        for rel, content in files.items():
            path = safe_relative(rel)
            dir_fd = self._open_parent(path, create=True)
            try:
                self._write(dir_fd, path, as_bytes(content))
            finally:
                os.close(dir_fd)

    def get(self, paths: Sequence[str]) -> dict[str, bytes]:
        return {rel: self._read(safe_relative(rel)) for rel in paths}

    def protect(self, paths: Sequence[str]) -> None:
        """See Session.protect: each file root-owned and read-only, every directory on the way
        to it (the workspace included) root-owned and sticky."""
        for rel in paths:
            fd = self._open_regular(safe_relative(rel), "protect", seal=True)
            try:
                os.fchown(fd, 0, 0)
                os.fchmod(fd, 0o444)
            finally:
                os.close(fd)

    def snapshot(self) -> bytes:
        """The workspace as a tar archive; symlinks are stored as links, never followed.
        Refused beyond `max_file_bytes` of apparent size: sparse files the command made could
        otherwise make us read far more than the workspace holds."""
        size = sum(os.lstat(os.path.join(d, f)).st_size for d, _, names in os.walk(self.root) for f in names)
        if size > self.max_file_bytes:
            raise WorkspacePathError(f"the workspace holds {size} bytes (apparent size); a snapshot takes "
                                     f"at most {self.max_file_bytes}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for child in sorted(self.root.iterdir()):
                tar.add(child, arcname=child.name)
        return buffer.getvalue()

    def restore(self, archive: bytes) -> None:
        """Replace the workspace with `archive`'s contents, member by member through the same
        no-symlink walk as `put` (tarfile's own extraction resolves links as root): files,
        directories and symlinks (stored, never followed) only; modes lose setuid bits."""
        self.clear()
        try:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                for member in tar:
                    self._restore_member(tar, member)
        except tarfile.TarError as e:
            raise WorkspacePathError(f"cannot restore snapshot: {e}") from e

    def _restore_member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = [part for part in PurePosixPath(member.name).parts if part != "."]
        if not parts:
            return  # the workspace itself
        path = safe_relative("/".join(parts))
        dir_fd = self._open_parent(path, create=True)
        try:
            if member.isdir():
                with contextlib.suppress(FileExistsError):  # made earlier as a parent
                    os.mkdir(path.name, 0o755, dir_fd=dir_fd)
            elif member.isreg():
                self._write(dir_fd, path, tar.extractfile(member).read(), member.mode & 0o777)
            elif member.issym():
                os.symlink(member.linkname, path.name, dir_fd=dir_fd)
            else:
                raise WorkspacePathError(f"snapshot member {member.name!r}: only files, directories and symlinks")
            os.chown(path.name, self.uid, self.gid, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            raise WorkspacePathError(f"cannot restore {member.name!r}: {e.strerror}") from e
        finally:
            os.close(dir_fd)

    def clear(self) -> None:
        clear_directory(self.root)
        os.chown(self.root, self.uid, self.gid)  # the sandbox user's again, if `protect` sealed it
        os.chmod(self.root, 0o755)

    def _open_parent(self, path: PurePosixPath, create: bool, seal: bool = False) -> int:
        """An fd of `path`'s directory, reached without following any symlink; with `seal`,
        every directory on the way (the workspace included) is sealed as it is passed."""
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            if seal:
                _seal_directory(fd)
            for part in path.parts[:-1]:
                if create:
                    with contextlib.suppress(FileExistsError):  # then the walk checks what it is
                        os.mkdir(part, 0o755, dir_fd=fd)
                        os.chown(part, self.uid, self.gid, dir_fd=fd, follow_symlinks=False)
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
                if seal:
                    _seal_directory(fd)
            return fd
        except OSError as e:
            os.close(fd)
            raise WorkspacePathError(f"{str(path)!r}: a parent is not a plain directory ({e.strerror})") from e

    def _write(self, dir_fd: int, path: PurePosixPath, data: bytes, mode: int = 0o644) -> None:
        try:
            fd = os.open(path.name, _WRITE_FLAGS, 0o644, dir_fd=dir_fd)
        except OSError as e:
            raise WorkspacePathError(f"cannot write {str(path)!r}: {e.strerror}") from e
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WorkspacePathError(f"cannot write {str(path)!r}: not a regular file")
            os.ftruncate(fd, 0)
            write_all(fd, data)
            os.fchown(fd, self.uid, self.gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def _open_regular(self, path: PurePosixPath, verb: str, seal: bool = False) -> int:
        """An fd of the regular file at `path`, reached without following any symlink."""
        dir_fd = self._open_parent(path, create=False, seal=seal)
        try:
            fd = os.open(path.name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            raise WorkspacePathError(f"cannot {verb} {str(path)!r}: {e.strerror}") from e
        finally:
            os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise WorkspacePathError(f"cannot {verb} {str(path)!r}: not a regular file")
        return fd

    def _read(self, path: PurePosixPath) -> bytes:
        fd = self._open_regular(path, "read")
        try:
            info = os.fstat(fd)
            if info.st_size > self.max_file_bytes:
                raise WorkspacePathError(f"cannot read {str(path)!r}: {info.st_size} bytes is over the cap")
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read(self.max_file_bytes)
        finally:
            os.close(fd)


def _seal_directory(fd: int) -> None:
    # Sticky and root-owned: the sandbox user may add files of its own, never remove or rename
    # root's (a directory's owner could, hence root).
    os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o1777)


def clear_directory(directory: Path) -> None:
    """Delete everything inside `directory`, following no symlink."""
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
