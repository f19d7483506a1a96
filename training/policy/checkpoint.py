"""Atomic, verifiable policy checkpoints.

A checkpoint is a plain Hugging Face directory (config.json, the safetensors weights,
generation_config.json, the tokenizer's files) plus `crucible_manifest.json`: the caller's
manifest, the sha256 of every other file and one content hash over all of them. It is
written into a temporary sibling directory and renamed into place, so a reader sees either
the old checkpoint, the new one, or nothing, never a half-written one.

The tokenizer's files are never re-serialised: a trained checkpoint carries its parent's
byte for byte, so every checkpoint of a lineage tokenizes, and renders chats, exactly as the
model it started from. config.json is written for transformers 4.57 (the range vLLM pins) as
well as 5: see `portable_config`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

from datastore.space import free_bytes, out_of_space, size_text

MANIFEST_FILE = "crucible_manifest.json"
FORMAT = "crucible-checkpoint/1"
REQUIRED_FILES: tuple[str, ...] = ("config.json", "generation_config.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")  # one of them: whole, or sharded
# Every file a Hugging Face tokenizer (and its chat template) may be saved as.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja",
                   "chat_template.json")
_RESERVED_KEYS = ("format", "files", "content_hash")
FULL_BELOW = 1 << 20  # bytes free after a failed write that mean the write failed for want of space


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or corrupt."""


class CheckpointSpaceError(OSError):
    """The checkpoint's filesystem has no room for it: a retry fails the same way."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_hash(files: dict[str, str]) -> str:
    """One hash for the whole directory: sha256 over sorted 'name:sha256' lines."""
    lines = "".join(f"{name}:{digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def write_checkpoint_dir(out_dir: str | Path, write: Callable[[Path], None], manifest: dict[str, Any],
                         needs: int | None = None) -> Path:
    """Atomically create `out_dir` from `write(tmp_dir)` and a manifest; replaces an existing dir.
    `needs`: the bytes it will take, refused up front when its filesystem has less free."""
    clash = [k for k in _RESERVED_KEYS if k in manifest]
    if clash:
        raise ValueError(f"manifest keys {clash} are reserved by the checkpoint format")
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    free = free_bytes(out.parent)
    if needs is not None and free is not None and needs > free:
        raise CheckpointSpaceError(f"checkpoint {out} needs {size_text(needs)} and its filesystem has "
                                   f"{size_text(free)} free: free space there or move the checkpoint root")
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        write(tmp)
        _write_manifest(tmp, manifest)
        _fsync_dir_files(tmp)
        _replace_dir(tmp, out)
    except Exception as error:
        # torch.save reports a full disk without saying so ("unexpected pos …"): what is free tells.
        if not (out_of_space(error) or (free_bytes(out.parent) or 0) < FULL_BELOW):
            raise
        wanted = f"needs {size_text(needs)}" if needs is not None else "did not fit"
        raise CheckpointSpaceError(f"checkpoint {out} {wanted} and its filesystem filled up while it was written "
                                   f"({size_text(free or 0)} was free): free space there or move the checkpoint "
                                   "root") from error
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def save_checkpoint(
    model: Any,
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    manifest: dict[str, Any],
    extra: Callable[[Path], None] | None = None,
    weights: dict[str, Any] | None = None,
    dtype: str | None = None,
    max_shard_size: str = "5GB",
    needs: int | None = None,
) -> Path:
    """Save `model` (HF PreTrainedModel, safetensors, in shards of at most `max_shard_size`)
    with the tokenizer files of `tokenizer_dir` (the checkpoint it was trained from),
    atomically, with a manifest.

    `weights` (a full state dict) replaces the model's own, as gathered from sharded training;
    `dtype` is what config.json then records (theirs); `extra(tmp_dir)` may add more files
    (e.g. optimizer state); they are hashed too. `needs`: write_checkpoint_dir's.
    """

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=weights, max_shard_size=max_shard_size)
        if dtype is not None:
            _record_dtype(tmp / "config.json", dtype)
        portable_config(tmp / "config.json")
        copy_tokenizer_files(tokenizer_dir, tmp)
        if extra is not None:
            extra(tmp)

    return write_checkpoint_dir(out_dir, write, manifest, needs)


def copy_checkpoint(source_dir: str | Path, out_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """`out_dir` as the same files as the checkpoint `source_dir` (so the same content hash),
    atomically, with `manifest`: a training step that took no optimizer step."""
    source = Path(source_dir)
    names = verify_checkpoint(source)["files"]

    def write(tmp: Path) -> None:
        for name in names:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, tmp / name)

    return write_checkpoint_dir(out_dir, write, manifest, needs=sum((source / name).stat().st_size for name in names))


def checkpoint_dtype(checkpoint_dir: str | Path) -> str:
    """The dtype a checkpoint's weights are stored in, as its config.json records it."""
    config = json.loads((Path(checkpoint_dir) / "config.json").read_text(encoding="utf-8"))
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def _record_dtype(path: Path, dtype: str) -> None:
    config = json.loads(path.read_text(encoding="utf-8"))
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def copy_tokenizer_files(source: str | Path, destination: Path) -> list[str]:
    """Copy the tokenizer files `source` has into `destination`, unchanged; their names."""
    names = [name for name in TOKENIZER_FILES if (Path(source) / name).is_file()]
    for name in names:
        shutil.copyfile(Path(source) / name, destination / name)
    return names


def portable_config(path: Path) -> None:
    """Rewrite config.json so that transformers 4.57 reads the model transformers 5 saved.

    transformers 5 keeps the RoPE base only inside `rope_parameters`; 4.57 (and vLLM under
    it) reads `rope_theta` and `rope_scaling`, and silently falls back to 10000 without them,
    which changes every logit of a model trained at another base (Qwen2's is 1e6). The 4.x keys
    are added beside the 5.x ones; transformers 5 reads the file as before.
    """
    config = json.loads(path.read_text(encoding="utf-8"))
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:  # absent, or one per layer type
        return
    legacy = {"rope_theta": rope["rope_theta"], "torch_dtype": config.get("dtype")}
    if rope.get("rope_type", "default") != "default":
        legacy["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config |= {key: value for key, value in legacy.items() if config.get(key) is None}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_manifest(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The manifest as written, unverified ({} for a plain Hugging Face directory without one)."""
    path = Path(checkpoint_dir) / MANIFEST_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def verify_checkpoint(checkpoint_dir: str | Path) -> dict[str, Any]:
    """Check every file against the manifest; return the manifest or raise CheckpointError."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint {root} does not exist or is not a directory")
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {root} has no {MANIFEST_FILE} (partial or foreign directory)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files: dict[str, str] = manifest["files"]
        recorded = manifest["content_hash"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {root}: unreadable {MANIFEST_FILE}: {exc}") from exc
    missing_required = [name for name in REQUIRED_FILES if name not in files]
    if not any(name in files for name in WEIGHT_FILES):
        missing_required.append(" or ".join(WEIGHT_FILES))
    if missing_required:
        raise CheckpointError(f"checkpoint {root}: manifest lists no {missing_required}")
    for name, digest in sorted(files.items()):
        path = root / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {root}: file {name} is missing")
        actual = sha256_file(path)
        if actual != digest:
            raise CheckpointError(
                f"checkpoint {root}: file {name} is corrupt (sha256 {actual[:12]}…, manifest says {digest[:12]}…)"
            )
    if content_hash(files) != recorded:
        raise CheckpointError(f"checkpoint {root}: content hash does not match its file list")
    return manifest


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    files = {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    body = {**manifest, "format": FORMAT, "files": files, "content_hash": content_hash(files)}
    (root / MANIFEST_FILE).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _fsync_dir_files(root: Path) -> None:
    """Flush every file to disk; also make them world-readable (safetensors writes 0600)."""
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename src onto dst; an existing dst is moved aside first and deleted afterwards."""
    old = None
    if dst.exists():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(dst, old)
    os.rename(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
