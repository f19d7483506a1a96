"""Atomic, hive-partitioned Parquet datasets on any fsspec filesystem (local directory or S3).

Layout under the storage root:

    <root>/<dataset>/experiment=<name>/iteration=<n>/<part>.manifest.json
    <root>/<dataset>/experiment=<name>/iteration=<n>/<part>-<uuid>.parquet

A data file is never overwritten: each write makes a new, uniquely named file, and then
publishes the part's manifest, which names it. The manifest is the commit: one small object
written in one PUT on S3, or renamed into place on a local disk, so a reader that follows
manifests sees the previous version or the new one, whole, and never a file that changes under
it mid-read. Re-writing an iteration replaces its manifest, so nothing is counted twice.

A file no manifest names is invisible. A replaced version is listed in the new manifest as
`superseded`, with the time it was replaced, and deleted by a later write of that part once
`retention_s` has passed since then: time enough for any reader still on it to finish. A
writer can keep a replaced version for good (`keep`: the trajectories a checkpoint trained on). Debris
of a write killed half-way, which no manifest ever named, is deleted once it is that old.

Most datasets have a single part, `data`; `stages` has one part per stage, written by the asset
that ran it. Read through `crucible sql`, `read_partition` or `dataset_files`, never a glob.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from datastore.schema import DATASETS, SCHEMA_VERSION, unknown_value
from datastore.space import free_bytes, out_of_space, size_text

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "crucible-manifest/1"
MANIFEST_PATH = re.compile(rf"experiment=(?P<experiment>[^/]+)/iteration=(?P<iteration>[^/]+)/"
                           rf"(?P<part>[^/]+){re.escape(MANIFEST_SUFFIX)}$")
RETENTION_S = 3600.0
ROW_GROUP_ROWS = 64_000


class SchemaError(ValueError):
    """Rows do not fit a dataset's schema; the message names the dataset and column."""


class StorageUnavailable(RuntimeError):
    """The storage root cannot be reached or used; the message names it and says why."""


class StorageFull(StorageUnavailable):
    """The storage root's device has no room for a write: a retry fails the same way."""


class StorageUnreachable(StorageUnavailable):
    """The storage root's server did not answer (refused, reset or timed out), or answered that it
    cannot serve now (HTTP 5xx): once it is back, the same call succeeds, and nothing was
    half-published (a manifest is one PUT)."""


# What a client that lost its server raises at the bottom of its chain (builtin ConnectionError and
# TimeoutError), or by botocore's names when it raises with no cause.
LOST_CONNECTION = (ConnectionError, TimeoutError)
LOST_CONNECTION_NAMES = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                                   "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError"})
# The server's own passing trouble (InternalError, Bad Gateway, ServiceUnavailable and SlowDown,
# Gateway Timeout); not 501 or 505, which say what it will never do.
SERVER_TROUBLE = frozenset({500, 502, 503, 504})


class CorruptManifest(StorageUnavailable):
    """A partition's manifest cannot be read; the message names it."""


def _answered(method):
    """A call to a remote storage root whose server does not answer raises StorageUnreachable,
    naming the root, instead of the client library's error."""

    @functools.wraps(method)
    def calling(self: DatasetStore, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except StorageUnavailable:
            raise
        except Exception as error:
            if self.is_local or not _lost_connection(error):
                raise
            raise self._unusable(error) from None

    return calling


def rows_to_table(dataset: str, rows: Iterable[dict]) -> pa.Table:
    schema = DATASETS[dataset]
    rows = list(rows)
    for index, row in enumerate(rows):
        missing = set(schema.names) - row.keys()
        extra = row.keys() - set(schema.names)
        if missing or extra:
            raise SchemaError(
                f"{dataset} row {index}: missing columns {sorted(missing)}, unknown {sorted(extra)}"
            )
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise SchemaError(f"{dataset}: {error}") from None


@dataclass(frozen=True)
class Published:
    """One part as its manifest names it."""

    files: list[str]  # URIs
    schema_version: int
    rows: int
    manifest: str = ""  # its URI
    damage: str | None = None  # why it cannot be read: an unreadable manifest, or a file missing or cut short

    @property
    def partition(self) -> tuple[str, int, str]:
        """(experiment, iteration, part), from the manifest's path."""
        found = MANIFEST_PATH.search(self.manifest)
        return found["experiment"], int(found["iteration"]), found["part"]


class DatasetStore:
    """Datasets under one storage root. S3 settings (endpoint, credentials, region) come from the
    standard AWS environment variables or fsspec's own configuration (FSSPEC_S3_ENDPOINT_URL, …)."""

    def __init__(self, root_uri: str, retention_s: float = RETENTION_S):
        self.uri = root_uri.rstrip("/")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.uri)
        except (ValueError, ImportError) as error:  # an unknown protocol, or its package not installed
            raise StorageUnavailable(f"storage {self.uri}: {error}") from None
        self.retention_s = retention_s

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def check(self) -> None:
        """Fail early, in one line, when the root cannot be used (no endpoint, bad credentials,
        no bucket), rather than deep inside a run."""
        if self.is_local:
            existing = next(p for p in (Path(self.root), *Path(self.root).parents) if p.exists())
            if not existing.is_dir():
                raise StorageUnavailable(f"storage {self.uri}: {existing} is not a directory")
            return
        try:
            self.fs.ls(self.root, refresh=True)
        except FileNotFoundError:  # a prefix not written yet, fine if its bucket exists
            self._check_bucket()
        except Exception as error:  # noqa: BLE001  botocore, aiohttp and OS errors alike; all mean "unusable"
            raise self._unusable(error) from None

    def _check_bucket(self) -> None:
        bucket = self.root.split("/", 1)[0]
        try:
            self.fs.ls(bucket, refresh=True)
        except Exception as error:  # noqa: BLE001  as in check()
            raise self._unusable(error) from None

    def unreachable(self) -> StorageUnreachable | None:
        """The outage, when the storage root's server does not answer now (a local root always does):
        what a failure whose own error does not say so (DuckDB's, a library's) is checked against."""
        if self.is_local:
            return None
        try:
            self.check()
        except StorageUnreachable as outage:
            return outage
        except StorageUnavailable:
            return None  # it answers, if only to refuse
        return None

    def _unusable(self, error: Exception) -> StorageUnavailable:
        if _lost_connection(error):
            reply = _replied(error)
            how = "answered with a server error" if _is_reply(reply) else "did not answer"
            return StorageUnreachable(f"storage {self.uri} {how}: {_reason(reply)}")
        return StorageUnavailable(f"storage {self.uri}: {_reason(error)}")

    def partition_dir(self, dataset: str, experiment: str, iteration: int) -> str:
        return f"{self.root}/{dataset}/experiment={experiment}/iteration={iteration}"

    def manifest_path(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> str:
        return f"{self.partition_dir(dataset, experiment, iteration)}/{part}{MANIFEST_SUFFIX}"

    def uri_of(self, path: str) -> str:
        """Full URI of a path inside this store (what DuckDB and people are given)."""
        return self.fs.unstrip_protocol(path)

    @_answered
    def write_partition(
        self, dataset: str, experiment: str, iteration: int, table: pa.Table, part: str = "data",
        keep: Iterable[str] = (),
    ) -> str:
        """Replace one partition (or one part of it) atomically; returns the new data file's URI.
        The files in `keep` (URIs another record names, such as the trajectories a checkpoint
        trained on) stay listed as superseded and are never swept."""
        expected = DATASETS[dataset]
        if not table.schema.equals(expected):
            raise SchemaError(f"{dataset}: table schema differs from schema v{SCHEMA_VERSION}")
        if problem := unknown_value(dataset, table):
            raise SchemaError(problem)
        directory = self.partition_dir(dataset, experiment, iteration)
        name = f"{part}-{uuid.uuid4().hex}.parquet"
        self.fs.makedirs(directory, exist_ok=True)
        try:
            manifest, expired = self._write_part(dataset, directory, name, table, keep,
                                                 self.manifest_path(dataset, experiment, iteration, part))
        except OSError as error:
            if not out_of_space(error):
                raise  # the manifest may have landed (an S3 reply lost): its file stays
            with suppress(OSError):
                self.fs.rm(f"{directory}/{name}")  # a local manifest is replaced whole or not at all
            free = free_bytes(directory) if self.is_local else None
            raise StorageFull(f"{dataset}, experiment {experiment!r} iteration {iteration}: no space left on the device "
                              f"of {self.uri_of(directory)} for its {table.num_rows} rows ({size_text(table.nbytes)} "
                              f"before compression{f', {size_text(free)} free' if free is not None else ''}): free "
                              "space there or move the storage root") from None
        self._sweep(directory, part, manifest, expired)
        return self.uri_of(f"{directory}/{name}")

    def _write_part(self, dataset: str, directory: str, name: str, table: pa.Table, keep: Iterable[str],
                    path: str) -> tuple[dict, set[str]]:
        """Write the data file, then publish the manifest naming it; (manifest, expired files)."""
        try:
            pq.write_table(
                table.replace_schema_metadata({"crucible_schema_version": str(SCHEMA_VERSION)}),
                f"{directory}/{name}",
                filesystem=self.fs,
                compression="zstd",
                row_group_size=ROW_GROUP_ROWS,
            )
        except Exception:
            with suppress(OSError):
                self.fs.rm(f"{directory}/{name}")  # no half-written file left behind
            raise
        now = time.time()
        superseded = self._superseded(path, now)
        kept = {uri.rsplit("/", 1)[-1] for uri in keep}
        expired = {entry["file"] for entry in superseded
                   if now - entry["at"] >= self.retention_s and entry["file"] not in kept}
        manifest = {"format": MANIFEST_FORMAT, "dataset": dataset, "schema_version": SCHEMA_VERSION,
                    "files": [name], "sizes": {name: self.fs.size(f"{directory}/{name}")}, "rows": table.num_rows,
                    "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "superseded": [entry for entry in superseded if entry["file"] not in expired]}
        self._publish(path, manifest)
        return manifest, expired

    @_answered
    def partition_files(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> list[str]:
        """URIs of the files a part's manifest names; FileNotFoundError when it was never written."""
        path = self.manifest_path(dataset, experiment, iteration, part)
        self._forget_listings(self.partition_dir(dataset, experiment, iteration))
        return self._published(path, self.fs.cat_file(path)).files

    def read_partition(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> pa.Table:
        return self.read_files(dataset, self.partition_files(dataset, experiment, iteration, part))

    @_answered
    def read_files(self, dataset: str, uris: list[str], columns: list[str] | None = None) -> pa.Table:
        paths = [self.fs._strip_protocol(uri) for uri in uris]
        try:
            return pq.read_table(paths, filesystem=self.fs, schema=DATASETS[dataset], columns=columns)
        except FileNotFoundError:
            # pyarrow's bridge to fsspec says "not found" for any file it failed to open (a lost
            # connection too): asked again, the filesystem raises the real reason, or finds them
            # all (a server back from an outage), and they are read again.
            for path in paths:
                self._forget_listings(path)  # else a cached listing would say it is there
                self.fs.info(path)
            return pq.read_table(paths, filesystem=self.fs, schema=DATASETS[dataset], columns=columns)

    @_answered
    def has_partition(self, dataset: str, experiment: str, iteration: int, part: str = "data") -> bool:
        self._forget_listings(self.partition_dir(dataset, experiment, iteration))
        return self.fs.exists(self.manifest_path(dataset, experiment, iteration, part))

    @_answered
    def iterations(self, dataset: str, experiment: str, part: str = "data") -> list[int]:
        """The experiment's iterations that have `part` of `dataset` published, in order."""
        pattern = self.manifest_path(dataset, experiment, 0, part).replace("/iteration=0/", "/iteration=*/")
        self._forget_listings(f"{self.root}/{dataset}/experiment={experiment}")
        return sorted(int(path.rsplit("/iteration=", 1)[1].split("/", 1)[0]) for path in self.fs.glob(pattern))

    def dataset_files(self, dataset: str) -> list[str]:
        """URIs of every published file of a dataset, across experiments and iterations: what a
        reader (DuckDB, polars, pyarrow) should scan."""
        return [uri for published in self.published(dataset) for uri in published.files]

    @_answered
    def published(self, dataset: str) -> list[Published]:
        """Every published part of a dataset, from its manifests (fetched concurrently on S3)."""
        prefix = f"{self.root}/{dataset}"
        self._forget_listings(prefix)
        # One fresh listing of the whole dataset, which then stays cached: DuckDB's per-file
        # lookups while it reads are answered from it, not by a request each (3x faster on S3).
        listing = self.fs.find(prefix, detail=True)
        manifests = sorted(path for path in listing if MANIFEST_PATH.fullmatch(path[len(prefix) + 1:]))
        if not manifests:
            return []
        contents = self.fs.cat(manifests, on_error="raise")
        return [self._checked(path, contents[path], listing) for path in manifests]

    def _checked(self, manifest_path: str, content: bytes, listing: dict[str, dict]) -> Published:
        """The part, with what damages it: an unreadable manifest, a file it names that is missing,
        or one whose size is not the one written (a truncated copy)."""
        try:
            manifest = self._manifest(manifest_path, content)
        except CorruptManifest as error:
            return Published([], 0, 0, self.uri_of(manifest_path), damage=str(error))
        published, sizes = self._named(manifest_path, manifest), manifest.get("sizes", {})  # sizes: since 2026-12-07
        for uri in published.files:
            name, found = uri.rsplit("/", 1)[-1], listing.get(self.fs._strip_protocol(uri))
            if found is None:
                return replace(published, damage=f"{uri} is missing")
            if name in sizes and found["size"] != sizes[name]:
                return replace(published, damage=f"{uri} has {found['size']} bytes of the {sizes[name]} written")
        return published

    def _published(self, manifest_path: str, content: bytes) -> Published:
        return self._named(manifest_path, self._manifest(manifest_path, content))

    def _named(self, manifest_path: str, manifest: dict) -> Published:
        directory = manifest_path.rsplit("/", 1)[0]
        return Published([self.uri_of(f"{directory}/{name}") for name in manifest["files"]],
                         manifest["schema_version"], manifest["rows"], self.uri_of(manifest_path))

    def _manifest(self, path: str, content: bytes) -> dict:
        try:
            manifest = json.loads(content)
            if manifest["format"] != MANIFEST_FORMAT:
                raise ValueError(f"format {manifest['format']!r}, expected {MANIFEST_FORMAT!r}")
            missing = {"files", "schema_version", "rows"} - manifest.keys()
            if missing:
                raise ValueError(f"no {', '.join(sorted(missing))}")
        except (ValueError, AttributeError, TypeError) as error:
            raise CorruptManifest(f"{self.uri_of(path)}: not a readable manifest ({type(error).__name__}: {error})"
                                  ) from None
        return manifest

    def _forget_listings(self, prefix: str) -> None:
        """Drop what this process cached of the listings under `prefix`: other processes write too."""
        self.fs.invalidate_cache(prefix)  # the prefix and its parents
        for cached in [key for key in self.fs.dircache if key.startswith(f"{prefix}/")]:
            self.fs.dircache.pop(cached, None)

    def _publish(self, path: str, manifest: dict) -> None:
        content = json.dumps(manifest, indent=1).encode()
        if not self.is_local:
            self.fs.pipe_file(path, content)  # one PUT: the object appears whole or not at all
            return
        scratch = f"{path}.{uuid.uuid4().hex}.partial"
        try:
            self.fs.pipe_file(scratch, content)
            self.fs.mv(scratch, path)  # a rename: atomic on a local filesystem
        except OSError:
            with suppress(OSError):
                self.fs.rm(scratch)
            raise

    def _superseded(self, path: str, now: float) -> list[dict]:
        """What the next manifest of a part lists as replaced: the current version, as of now,
        and whatever the current manifest still lists."""
        try:
            current = self._manifest(path, self.fs.cat_file(path))
        except (FileNotFoundError, CorruptManifest):  # an unreadable manifest's files are debris: swept when old
            return []
        return [*current.get("superseded", []), *({"file": name, "at": now} for name in current["files"])]

    def _sweep(self, directory: str, part: str, manifest: dict, expired: set[str]) -> None:
        """Best effort, after the commit: delete this part's expired versions, and debris no
        manifest names that is older than the retention time (a concurrent write may be making it)."""
        ours = re.compile(rf"{re.escape(part)}(-[0-9a-f]{{32}}\.parquet|{re.escape(MANIFEST_SUFFIX)}\.[0-9a-f]{{32}}\.partial)")
        named = {*manifest["files"], *(entry["file"] for entry in manifest["superseded"])}
        now = time.time()
        for info in self.fs.ls(directory, detail=True, refresh=True):
            name = info["name"].rsplit("/", 1)[1]
            debris = ours.fullmatch(name) and name not in named and now - _modified(info) >= self.retention_s
            if name in expired or debris:
                with suppress(FileNotFoundError):  # another writer of this part swept it first
                    self.fs.rm_file(info["name"])


def _modified(info: dict) -> float:
    stamp = info.get("mtime") or info.get("LastModified")
    return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp)


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """The error and its causes, as Python prints them."""
    while error is not None:
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _lost_connection(error: BaseException) -> bool:
    """Whether a lost connection, or a server error reply, is in the error's chain."""
    return any(isinstance(link, LOST_CONNECTION) or type(link).__name__ in LOST_CONNECTION_NAMES
               or _is_reply(link) and link.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in SERVER_TROUBLE
               for link in _chain(error))


def _replied(error: BaseException) -> BaseException:
    """The server's error reply in the chain (s3fs turns botocore's ClientError into an OSError
    with only its message), else the error itself."""
    return next((link for link in _chain(error) if _is_reply(link)), error)


def _is_reply(error: BaseException) -> bool:
    return isinstance(getattr(error, "response", None), dict)  # botocore's ClientError: the reply it got


def _reason(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, FileNotFoundError):
        return f"no such bucket or directory ({text})"
    return f"{type(error).__name__}: {text}"
