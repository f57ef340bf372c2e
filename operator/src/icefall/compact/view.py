"""Read a pyiceberg table's metadata into the planner's `TableView` (plan/maintenance.py).

`read_table_view(table, list_storage=True)` reads, from the metadata the `Table` object was loaded with:

- `files`: the live data and delete files of `main`'s head (from its manifests), with partition values as
  tuples in the spec's field order, sizes, record counts, the snapshot that added them, the spec id and the
  data sequence number; for a position delete file also the one data file all its rows name, when its
  `file_path` bounds are equal (how Iceberg itself tells a file-scoped delete file: pyiceberg does not read
  the v2 manifests' `referenced_data_file` field);
- `snapshots`: every snapshot, with the names of the branches and tags whose head it is and whether it is
  an ancestor of `main`'s head (staging branches `icefall_stage_*` are refs like any other);
- `manifests`: the manifests of `main`'s head;
- `referenced_paths`: every path the metadata still reaches: each snapshot's manifest list, its manifests
  and the files their live entries name, the current metadata file and those of the metadata log,
  statistics files, and the deleted keys file the committed state names (`icefall.ingest.deleted_keys`);
- `storage` (only with `list_storage`): every object under the table's location, with size and mtime,
  listed through pyarrow's file systems (local `file:` warehouses; S3/GCS when pyarrow can reach them).

Hadoop's local file system (Spark's writes to `file:` warehouses) leaves a checksum sidecar `.<name>.crc`
beside each file it writes: a sidecar counts as referenced when its file is, so it goes with its file.

Paths are canonical: `file:/x`, `file:///x` and a bare `/x` all become `file:///x` (Spark's Hadoop paths
and pyiceberg's URIs spell local files differently; the planner compares exact strings), and `s3a://` and
`s3n://` become `s3://` (one bucket, three Hadoop spellings). Other schemes are kept as written: Azure's
`abfss://<container>@<account host>/<path>` is listed through pyarrow's `AzureFileSystem` (inside it,
`<container>/<path>`) and spelled back with its own container and host, exactly as the metadata names it.
`to_local_path` turns a canonical `file:` path back into a filesystem path. Object stores are listed and
deleted from with the table's own FileIO settings (endpoint, region, credentials), through
`filesystem_for`. If a referenced path and a listed object name the same key under a different scheme or
bucket, the listing cannot tell orphans from live files: it is dropped (nothing is planned as an orphan)
and a warning says why, as Iceberg's own orphan removal refuses such a mismatch.

Manifest lists and manifests never change once written, so a `ManifestCache` passed in (a maintenance
runner keeps one for its life) makes a round read only the files that are new since the last round; it keeps
only what the table's metadata still references.

Not guaranteed: a consistent cut. Reading many manifests takes time; the planner is told so (its items may
be stale when run, and Iceberg's commit validation catches that). Without a cache every snapshot's
manifests are read once per call (deduplicated by path), so the cost grows with the number of distinct
manifests: snapshot expiry and manifest rewrites keep that bounded. Objects under the location that belong
to no Iceberg metadata (a stray file someone copied in) are listed too: with the orphan safety window they
are removed like any orphan, which is what Iceberg's `remove_orphan_files` does as well.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFileContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from icefall.catalog.azure import is_azure_location, split_location
from icefall.commit.protocol import table_name
from icefall.commit.state import DELETED_KEYS
from icefall.plan.table_view import (
    MAIN,
    DataFileInfo,
    FileContent,
    ManifestInfo,
    PartitionValue,
    SnapshotInfo,
    StorageObject,
    TableView,
)

log = logging.getLogger(__name__)

_CONTENT = {
    DataFileContent.DATA: FileContent.DATA,
    DataFileContent.POSITION_DELETES: FileContent.POSITION_DELETES,
    DataFileContent.EQUALITY_DELETES: FileContent.EQUALITY_DELETES,
}


_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


def canonical_path(path: str) -> str:
    """One spelling per file: `file:///abs/path` for local files, `s3://` for s3a/s3n; others unchanged."""
    scheme, sep, rest = path.partition("://")
    if sep and scheme.lower() in _SCHEME_ALIASES:
        return f"{_SCHEME_ALIASES[scheme.lower()]}://{rest}"
    if path.startswith("file:"):
        rest = path[len("file:") :]
        if rest.startswith("//") and not rest.startswith("///"):
            return path  # file://host/... : leave as written
        return "file:///" + rest.lstrip("/")
    if path.startswith("/"):
        return "file:///" + path.lstrip("/")
    return path


def to_local_path(path: str) -> str | None:
    """The filesystem path of a canonical `file:` path, or None for other schemes."""
    canonical = canonical_path(path)
    if canonical.startswith("file:///"):
        return "/" + canonical[len("file:///") :]
    return None


class ManifestCache:
    """Manifest lists and live manifest entries already read, by path (both are immutable once written)."""

    def __init__(self) -> None:
        self._lists: dict[str, list[ManifestFile]] = {}
        self._entries: dict[str, list[ManifestEntry]] = {}
        self.files_read = 0  # manifest lists and manifests read from storage (not served from the cache)

    def manifests(self, snapshot: Snapshot, io: FileIO) -> list[ManifestFile]:
        path = snapshot.manifest_list
        if path not in self._lists:
            self._lists[path] = list(snapshot.manifests(io))
            self.files_read += 1
        return self._lists[path]

    def live_entries(self, manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
        path = manifest.manifest_path
        if path not in self._entries:
            self._entries[path] = manifest.fetch_manifest_entry(io, discard_deleted=True)
            self.files_read += 1
        return self._entries[path]

    def keep_only(self, manifest_lists: Iterable[str], manifests: Iterable[str]) -> None:
        """Forget what the metadata no longer references (expired snapshots, rewritten manifests)."""
        lists, paths = set(manifest_lists), set(manifests)
        self._lists = {p: v for p, v in self._lists.items() if p in lists}
        self._entries = {p: v for p, v in self._entries.items() if p in paths}


def read_table_view(
    table: Table, *, list_storage: bool = True, cache: ManifestCache | None = None
) -> TableView:
    """The planner's view of `table` (module doc). Does not refresh `table`: the caller loads it."""
    cache = cache or ManifestCache()
    metadata = table.metadata
    head = _main_head(metadata)
    referenced = _metadata_paths(table) | _manifest_paths(metadata, table.io, cache)
    files, manifests = _head_contents(head, table.io, cache)
    storage = tuple(list_location(metadata.location, table.io)) if list_storage else ()
    referenced |= {o.path for o in storage if checksum_owner(o.path) in referenced}
    name = table_name(table)
    return TableView(
        name=name,
        snapshots=_snapshot_infos(metadata, head),
        files=tuple(sorted(files, key=lambda f: f.path)),
        manifests=tuple(manifests),
        referenced_paths=frozenset(referenced),
        storage=_unless_schemes_differ(name, referenced, storage),
        partition_fields=tuple(f.name for f in table.spec().fields),
        properties=dict(metadata.properties),
    )


def _main_head(metadata: TableMetadata) -> Snapshot | None:
    main_ref = metadata.refs.get(MAIN)
    return metadata.snapshot_by_id(main_ref.snapshot_id) if main_ref is not None else None


def _snapshot_infos(metadata: TableMetadata, head: Snapshot | None) -> tuple[SnapshotInfo, ...]:
    """Every snapshot, with the refs whose head it is and whether `main`'s head descends from it."""
    refs_by_snapshot: dict[int, list[str]] = {}
    for ref_name, ref in metadata.refs.items():
        refs_by_snapshot.setdefault(ref.snapshot_id, []).append(ref_name)
    on_main = {s.snapshot_id for s in ancestors_of(head, metadata)} if head is not None else set()
    return tuple(
        SnapshotInfo(
            snapshot_id=s.snapshot_id,
            parent_id=s.parent_snapshot_id,
            timestamp_ms=s.timestamp_ms,
            is_on_main=s.snapshot_id in on_main,
            refs=tuple(sorted(refs_by_snapshot.get(s.snapshot_id, ()))),
        )
        for s in metadata.snapshots
    )


def _metadata_paths(table: Table) -> set[str]:
    """The metadata files (current and logged), statistics files and the committed deleted keys file."""
    metadata = table.metadata
    referenced: set[str] = {canonical_path(table.metadata_location)}
    referenced |= {canonical_path(entry.metadata_file) for entry in metadata.metadata_log}
    referenced |= {canonical_path(s.statistics_path) for s in metadata.statistics}
    referenced |= {canonical_path(s.statistics_path) for s in metadata.partition_statistics}
    deleted_keys = metadata.properties.get(DELETED_KEYS)  # cdc with sequenceBy: the committed state's
    if deleted_keys:
        referenced.add(canonical_path(deleted_keys))
    return referenced


def _manifest_paths(metadata: TableMetadata, io: FileIO, cache: ManifestCache) -> set[str]:
    """Every snapshot's manifest list, its manifests and the files their live entries name; the cache
    forgets what none of them references any more."""
    referenced: set[str] = set()
    manifests_by_path: dict[str, ManifestFile] = {}
    for snapshot in metadata.snapshots:
        referenced.add(canonical_path(snapshot.manifest_list))
        for manifest in cache.manifests(snapshot, io):
            manifests_by_path.setdefault(canonical_path(manifest.manifest_path), manifest)
    for path, manifest in manifests_by_path.items():
        referenced.add(path)
        referenced |= {canonical_path(e.data_file.file_path) for e in cache.live_entries(manifest, io)}
    cache.keep_only(
        (s.manifest_list for s in metadata.snapshots), (m.manifest_path for m in manifests_by_path.values())
    )
    return referenced


def _head_contents(
    head: Snapshot | None, io: FileIO, cache: ManifestCache
) -> tuple[list[DataFileInfo], list[ManifestInfo]]:
    """The live files and the manifests of `main`'s head (none without a head)."""
    files: list[DataFileInfo] = []
    manifests: list[ManifestInfo] = []
    if head is None:
        return files, manifests
    for manifest in cache.manifests(head, io):
        manifests.append(_manifest_info(manifest))
        files.extend(_file_info(entry, manifest) for entry in cache.live_entries(manifest, io))
    return files, manifests


def _manifest_info(manifest: ManifestFile) -> ManifestInfo:
    return ManifestInfo(
        path=canonical_path(manifest.manifest_path),
        size_bytes=manifest.manifest_length,
        added_files_count=manifest.added_files_count or 0,
        existing_files_count=manifest.existing_files_count or 0,
        deleted_files_count=manifest.deleted_files_count or 0,
    )


def _file_info(entry: ManifestEntry, manifest: ManifestFile) -> DataFileInfo:
    data_file = entry.data_file
    return DataFileInfo(
        path=canonical_path(data_file.file_path),
        partition=_partition_tuple(data_file.partition),
        size_bytes=data_file.file_size_in_bytes,
        record_count=data_file.record_count,
        added_snapshot_id=entry.snapshot_id or 0,
        content=_CONTENT.get(data_file.content, FileContent.DATA),
        spec_id=manifest.partition_spec_id,
        referenced_data_file=referenced_data_file(data_file),
        sequence_number=entry.sequence_number or 0,
    )


def _unless_schemes_differ(
    identifier: str, referenced: set[str], storage: tuple[StorageObject, ...]
) -> tuple[StorageObject, ...]:
    """`storage`, or nothing (with a warning) when it names a referenced file under another scheme or bucket:
    then the listing cannot tell orphans from live files."""
    mismatch = _scheme_mismatch(referenced, storage)
    if mismatch is None:
        return storage
    log.warning(
        "%s: %s is referenced, but storage lists %s: the same file under another scheme or bucket; "
        "no orphan removal until the table's paths and its location agree", identifier, *mismatch,
    )  # fmt: skip
    return ()


DELETE_FILE_PATH_FIELD_ID = 2147483546  # the `file_path` column of position delete files (Iceberg spec)


def referenced_data_file(data_file: Any) -> str | None:
    """The one data file (canonical path) all rows of a position delete file name, else None: from its
    `file_path` column's lower and upper bounds when they are equal."""
    if data_file.content != DataFileContent.POSITION_DELETES:
        return None
    lower = (data_file.lower_bounds or {}).get(DELETE_FILE_PATH_FIELD_ID)
    upper = (data_file.upper_bounds or {}).get(DELETE_FILE_PATH_FIELD_ID)
    if not lower or lower != upper:
        return None
    try:
        return canonical_path(bytes(lower).decode("utf-8"))
    except UnicodeDecodeError:
        return None


def checksum_owner(path: str) -> str | None:
    """The file a Hadoop checksum sidecar `<dir>/.<name>.crc` belongs to (`<dir>/<name>`), else None."""
    directory, _, name = path.rpartition("/")
    if name.startswith(".") and name.endswith(".crc") and len(name) > len("..crc"):
        return f"{directory}/{name[1 : -len('.crc')]}"
    return None


def _scheme_mismatch(referenced: set[str], storage: Iterable[StorageObject]) -> tuple[str, str] | None:
    """A (referenced, listed) pair naming one key under different schemes or authorities, if any."""
    by_key = {_key(path): path for path in referenced}
    for listed in storage:
        known = by_key.get(_key(listed.path))
        if known is not None and known != listed.path:
            return known, listed.path
    return None


def _key(path: str) -> str:
    """The part of a path after its scheme and authority."""
    rest = path.partition("://")[2] or path
    return rest.partition("/")[2]


def _partition_tuple(partition: Any) -> PartitionValue:
    if partition is None:
        return ()
    return tuple(partition[i] for i in range(len(partition)))


def filesystem_for(path: str, io: Any = None) -> tuple[Any, str]:
    """A pyarrow file system for `path` and the path inside it. Object stores are reached with `io`'s
    settings (a pyiceberg `PyArrowFileIO`: the table's endpoint, region and credentials) when given."""
    from pyarrow import fs

    local = to_local_path(path)
    if local is not None:
        return fs.LocalFileSystem(), local
    canonical = canonical_path(path)
    scheme, _, rest = canonical.partition("://")
    if io is not None and hasattr(io, "fs_by_scheme"):
        netloc = rest.split("/", 1)[0]
        if is_azure_location(canonical):
            return io.fs_by_scheme(scheme, netloc), split_location(canonical)[1]
        return io.fs_by_scheme(scheme, netloc), rest
    filesystem, inner = fs.FileSystem.from_uri(canonical)
    return filesystem, str(inner)


def _list_local(root: str) -> Iterable[StorageObject]:
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # deleted while listing, as pyarrow would not have listed it
                continue
            yield StorageObject(
                path=canonical_path("file://" + path),
                size_bytes=stat.st_size,
                modified_ms=stat.st_mtime_ns // 1_000_000,
            )


def list_location(location: str, io: Any = None) -> Iterable[StorageObject]:
    """Every object under `location` (recursively), with canonical paths. Empty if it does not exist."""
    local = to_local_path(location)
    if local is not None:  # the standard library's walk: no pyarrow in a process that needs none else
        yield from _list_local(local)
        return
    from pyarrow import fs

    filesystem, root = filesystem_for(location, io)
    scheme_prefix = "file://" if local is not None else canonical_path(location).split("://", 1)[0] + "://"
    container = ""
    if is_azure_location(
        location
    ):  # inside: <container>/<path>; the location: <scheme>://<container>@<host>/
        scheme_prefix, inner = split_location(canonical_path(location))
        container = inner.split("/", 1)[0] + "/"
    root_info = filesystem.get_file_info(root)
    if root_info.type == fs.FileType.NotFound:
        return
    for info in filesystem.get_file_info(fs.FileSelector(root, recursive=True)):
        if info.type != fs.FileType.File:
            continue
        modified_ns = info.mtime_ns or 0
        yield StorageObject(
            path=canonical_path(scheme_prefix + info.path.removeprefix(container)),
            size_bytes=info.size or 0,
            modified_ms=modified_ns // 1_000_000,
        )
