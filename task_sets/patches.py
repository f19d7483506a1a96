"""Repositories held as file maps: apply a unified diff (a repository task's submission), make
one, and read the text files of a tar archive.

`git apply` does the work, in a throwaway directory and with no repository configuration of
its own: it refuses paths outside the tree and edits through symlinks, and it applies the
diff whole or not at all. The patched tree is read back with no symlink followed; a diff that
creates a symlink, a binary or a non-UTF-8 file is refused like one that does not apply.
"""

from __future__ import annotations

import difflib
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

MAX_PATCH_BYTES = 4 << 20
APPLY_TIMEOUT_S = 30
# No user or system git configuration: a host's settings must not change what applies.
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": "/nonexistent",
            "PATH": os.defpath, "LC_ALL": "C"}


class PatchError(ValueError):
    """The diff does not apply to the repository (the reason is git's, shortened)."""


def apply_patch(files: Mapping[str, str], diff: str) -> dict[str, str]:
    """The repository after `diff`; an empty or blank diff changes nothing."""
    if not diff.strip():
        return dict(files)
    if len(diff.encode()) > MAX_PATCH_BYTES:
        raise PatchError(f"the diff is larger than {MAX_PATCH_BYTES >> 20} MiB")
    with tempfile.TemporaryDirectory(prefix="crucible-patch-") as tmp:
        root = Path(tmp) / "repo"
        _write_tree(root, files)
        # The ceiling keeps git from finding a repository above the throwaway directory.
        env = {**_GIT_ENV, "GIT_CEILING_DIRECTORIES": tmp}
        try:
            subprocess.run(
                ["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=_with_final_newline(diff),
                env=env, capture_output=True, text=True, timeout=APPLY_TIMEOUT_S, check=True,
            )
        except subprocess.CalledProcessError as e:
            raise PatchError(_first_lines(e.stderr) or "git apply failed") from None
        except subprocess.TimeoutExpired:
            raise PatchError(f"git apply took longer than {APPLY_TIMEOUT_S} s") from None
        return _read_tree(root)


def changed_paths(before: Mapping[str, str], after: Mapping[str, str]) -> set[str]:
    """Paths added, deleted or modified."""
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def make_patch(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """The unified diff that `apply_patch` turns `before` into `after` with."""
    out = []
    for path in sorted(changed_paths(before, after)):
        old, new = before.get(path), after.get(path)
        for line in difflib.unified_diff(
            (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
            f"a/{path}" if old is not None else "/dev/null", f"b/{path}" if new is not None else "/dev/null",
        ):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def text_files_from_tar(archive: bytes) -> dict[str, str]:
    """The regular UTF-8 files of a tar archive (binary files, links and devices left out)."""
    return files_from_tar(archive)[0]


def files_from_tar(archive: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    """The regular files of a tar archive, read member by member (nothing is extracted): the
    UTF-8 ones as text, the others as bytes; links and devices are left out."""
    text, binary = {}, {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            if member.isreg():
                data = tar.extractfile(member).read()
                try:
                    text[str(PurePosixPath(member.name))] = data.decode("utf-8")
                except UnicodeDecodeError:
                    binary[str(PurePosixPath(member.name))] = data
    return text, binary


def _with_final_newline(diff: str) -> str:
    # Models often drop the diff's last newline; git then reports a corrupt patch.
    return diff if diff.endswith("\n") else diff + "\n"


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    root.mkdir()
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="")  # CRLF stays CRLF


def _read_tree(root: Path) -> dict[str, str]:
    tree = {}
    for directory, subdirectories, names in os.walk(root):  # os.walk does not follow symlinks
        for name in names + [d for d in subdirectories if (Path(directory) / d).is_symlink()]:
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink() or not path.is_file():
                raise PatchError(f"the diff creates {relative!r}, which is not a regular file")
            try:
                tree[relative] = path.read_bytes().decode("utf-8")  # no newline translation
            except UnicodeDecodeError:
                raise PatchError(f"the diff leaves {relative!r} as a binary (non-UTF-8) file") from None
    return tree


def _first_lines(text: str, count: int = 3) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines()[:count])
