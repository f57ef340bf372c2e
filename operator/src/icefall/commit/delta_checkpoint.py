"""Checkpoints and log cleanup of a Delta table without Spark (commit/DESIGN.md, "Checkpoints and log
cleanup"): what the compaction pods (and `icefall run`) do for a table on an object store, where Delta
Spark's own cannot run.

`write_checkpoint(log, files, now_ms)` writes the classic single-file checkpoint `N.checkpoint.parquet` of
the replay `files` at version N (`icefall.commit.delta_files.LogFiles`), as Delta's PROTOCOL.md
("Checkpoints", V1 spec) asks: the protocol, the Metadata (its configuration holds the `icefall.*` offsets:
resume reads them from here once log cleanup removed the commits), every live `add` (path, partition
values, size, modification time, stats, tags, deletion vector, row ids; dataChange false), the `txn`
actions, and the `remove` tombstones not older than `delta.deletedFileRetentionDuration` (VACUUM and
readers need them); then `_last_checkpoint` pointing at it, with the checkpoint's schema (Delta Spark 4.1
reads a checkpoint by the schema named there) and the JSON checksum. The Parquet file is built in memory
and written in ONE put-if-absent (no torn file is ever visible; a checkpoint at N is a function of the log
up to N, so of two writers the first one's stands and the second's is dropped). `_last_checkpoint` is only
a hint: it is replaced only by a newer version's, and a stale one costs readers a longer listing.

`log_cleanup_deletions(listed, cutoff_ms)` (pure) is Delta's metadata cleanup: the newest commit at or
before the cut-off (commit times made increasing, as time travel counts them), the newest complete
checkpoint at or below it, and everything of the log below that checkpoint — commits, checkpoints, `.crc`
files, log compactions starting at or below it. Every version from that checkpoint on can still be
rebuilt; the newest checkpoint and everything after it are never deleted. `clean_up_log` runs it with the
table's `delta.logRetentionDuration`.

Not done: V2 checkpoints and sidecars (a table with the `v2Checkpoint` feature is refused, as is one whose
writer features keep state outside protocol, metaData, add, remove and txn: domain metadata, row
tracking, ...: `checkpoint_refusal`), `stats_parsed` and `partitionValues_parsed` (optional columns).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from icefall.commit.delta_files import MERGE_SAFE_WRITER_FEATURES
from icefall.commit.delta_tail import COMMIT_FILE, LAST_CHECKPOINT, complete_checkpoints
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    import pyarrow as pa

    from icefall.commit.delta import DeltaLog
    from icefall.commit.delta_files import LogFiles

LOG_DIR = "_delta_log"
FILE_RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
DAY_MS = 86_400_000
DEFAULT_FILE_RETENTION_MS = 7 * DAY_MS  # Delta's defaults
DEFAULT_LOG_RETENTION_MS = 30 * DAY_MS
#: Readers features a V1 checkpoint of this writer keeps valid (their state is in the actions it writes).
CHECKPOINT_SAFE_READER_FEATURES = frozenset(
    {"columnMapping", "deletionVectors", "timestampNtz", "vacuumProtocolCheck"}
)
_COMPACTED = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")
_VERSIONED = re.compile(r"^(\d{20})\.")
_UNITS_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": DAY_MS,
    "week": 7 * DAY_MS,
}


def interval_ms(text: str | None, default_ms: int) -> int:
    """A Delta interval property (`interval 7 days`, `interval 3600 seconds`, `1 week`) in ms; `default_ms`
    when absent or unreadable (Delta's own default then applies too)."""
    words = (text or "").lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    if not words or len(words) % 2:
        return default_ms
    total = 0
    for amount, unit in zip(words[::2], words[1::2], strict=True):
        factor = _UNITS_MS.get(unit.rstrip("s"))
        if factor is None or not amount.isdigit():
            return default_ms
        total += int(amount) * factor
    return total


def checkpoint_refusal(protocol: Mapping[str, Any] | None) -> str | None:
    """Why this writer may not checkpoint a table with `protocol` (None: it may)."""
    current = dict(protocol or {})
    writer = set(current.get("writerFeatures") or []) - MERGE_SAFE_WRITER_FEATURES
    reader = set(current.get("readerFeatures") or []) - CHECKPOINT_SAFE_READER_FEATURES
    if (int(current.get("minWriterVersion", 2)) >= 7 and writer) or reader:
        unknown = ", ".join(sorted(writer | reader))
        return f"the table uses features Icefall's checkpoint writer does not keep: {unknown}"
    return None


def checkpoint_actions(files: LogFiles, now_ms: int) -> list[dict[str, Any]]:
    """The actions of the checkpoint of `files` at `now_ms` (module doc), in the order Delta writes them
    roughly: protocol, metaData, txns, adds, tombstones. Pure."""
    if files.metadata is None or files.protocol is None:
        raise ValueError(f"version {files.version} has no metaData or protocol to checkpoint")
    retention = interval_ms(files.configuration.get(FILE_RETENTION_PROPERTY), DEFAULT_FILE_RETENTION_MS)
    kept_after = now_ms - retention
    actions: list[dict[str, Any]] = [{"protocol": files.protocol}, {"metaData": files.metadata}]
    actions += [{"txn": txn} for _, txn in sorted(files.txns.items())]
    actions += [{"add": {**add, "dataChange": False}} for _, add in sorted(files.live.items())]
    actions += [
        {"remove": {**gone, "dataChange": False}}
        for path, gone in sorted(files.tombstones.items())
        if int(gone.get("deletionTimestamp") or 0) >= kept_after
    ]
    return actions


def _schema() -> pa.Schema:
    import pyarrow as pa

    text = pa.string()
    strings = pa.map_(pa.string(), pa.string())
    vector = pa.struct(
        [
            ("storageType", text),
            ("pathOrInlineDv", text),
            ("offset", pa.int32()),
            ("sizeInBytes", pa.int32()),
            ("cardinality", pa.int64()),
            ("maxRowIndex", pa.int64()),
        ]
    )
    return pa.schema(
        [
            ("txn", pa.struct([("appId", text), ("version", pa.int64()), ("lastUpdated", pa.int64())])),
            (
                "add",
                pa.struct(
                    [
                        ("path", text),
                        ("partitionValues", strings),
                        ("size", pa.int64()),
                        ("modificationTime", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("stats", text),
                        ("tags", strings),
                        ("deletionVector", vector),
                        ("baseRowId", pa.int64()),
                        ("defaultRowCommitVersion", pa.int64()),
                        ("clusteringProvider", text),
                    ]
                ),
            ),
            (
                "remove",
                pa.struct(
                    [
                        ("path", text),
                        ("deletionTimestamp", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("extendedFileMetadata", pa.bool_()),
                        ("partitionValues", strings),
                        ("size", pa.int64()),
                        ("deletionVector", vector),
                        ("baseRowId", pa.int64()),
                        ("defaultRowCommitVersion", pa.int64()),
                    ]
                ),
            ),
            (
                "metaData",
                pa.struct(
                    [
                        ("id", text),
                        ("name", text),
                        ("description", text),
                        ("format", pa.struct([("provider", text), ("options", strings)])),
                        ("schemaString", text),
                        ("partitionColumns", pa.list_(text)),
                        ("configuration", strings),
                        ("createdTime", pa.int64()),
                    ]
                ),
            ),
            (
                "protocol",
                pa.struct(
                    [
                        ("minReaderVersion", pa.int32()),
                        ("minWriterVersion", pa.int32()),
                        ("readerFeatures", pa.list_(text)),
                        ("writerFeatures", pa.list_(text)),
                    ]
                ),
            ),
        ]
    )


def spark_schema(schema: pa.Schema | pa.DataType) -> dict[str, Any]:
    """`schema` as Spark's JSON (what `_last_checkpoint`'s `checkpointSchema` holds); every field nullable."""
    import pyarrow as pa

    def of(kind: pa.DataType) -> Any:
        if pa.types.is_struct(kind):
            return {"type": "struct", "fields": [field(kind.field(i)) for i in range(kind.num_fields)]}
        if pa.types.is_map(kind):
            return {"type": "map", "keyType": of(kind.key_type), "valueType": of(kind.item_type),
                    "valueContainsNull": True}  # fmt: skip
        if pa.types.is_list(kind):
            return {"type": "array", "elementType": of(kind.value_type), "containsNull": True}
        names = {pa.string(): "string", pa.int64(): "long", pa.int32(): "integer", pa.bool_(): "boolean"}
        return names[kind]

    def field(f: pa.Field) -> dict[str, Any]:
        return {"name": f.name, "type": of(f.type), "nullable": True, "metadata": {}}

    fields = schema if isinstance(schema, pa.Schema) else None
    if fields is not None:
        return {"type": "struct", "fields": [field(f) for f in fields]}
    result: dict[str, Any] = of(schema)
    return result


def _row(action: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """One checkpoint row: the action under its column, fields the column lacks dropped, maps as pairs."""
    import pyarrow as pa

    def shaped(value: Any, kind: pa.DataType) -> Any:
        if value is None:
            return None
        if pa.types.is_map(kind):
            return [(str(k), None if v is None else str(v)) for k, v in dict(value).items()]
        if pa.types.is_struct(kind):
            names = {kind.field(i).name: kind.field(i).type for i in range(kind.num_fields)}
            return {name: shaped(value.get(name), names[name]) for name in names}
        return value

    [(column, value)] = action.items()
    return {column: shaped(value, schema.field(column).type)}


@dataclass(frozen=True)
class CheckpointWritten:
    """A checkpoint at `version`: `created` False when one was there already (written by someone else)."""

    version: int
    actions: int
    add_files: int
    size_bytes: int
    created: bool


def checkpoint_bytes(actions: Iterable[Mapping[str, Any]]) -> tuple[bytes, pa.Schema]:
    """The checkpoint Parquet file of `actions`, in memory (written whole in one PUT)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    table = pa.Table.from_pylist([_row(a, schema) for a in actions], schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue().to_pybytes(), schema


def write_checkpoint(log: DeltaLog, files: LogFiles, now_ms: int) -> CheckpointWritten:
    """Write the checkpoint of the replay `files` (at its version) and point `_last_checkpoint` at it
    (module doc). ValueError: the table uses a feature the writer does not keep (`checkpoint_refusal`)."""
    if (refusal := checkpoint_refusal(files.protocol)) is not None:
        raise ValueError(f"{log.location}: {refusal}")
    actions = checkpoint_actions(files, now_ms)
    data, schema = checkpoint_bytes(actions)
    name = f"{files.version:020d}.checkpoint.parquet"
    created = log.storage.put_if_absent(f"{LOG_DIR}/{name}", data)
    failpoint("main.after-checkpoint")  # the checkpoint written, `_last_checkpoint` not yet
    adds = sum(1 for a in actions if "add" in a)
    written = CheckpointWritten(files.version, len(actions), adds, len(data), created)
    hint = {
        "version": files.version,
        "size": len(actions),
        "sizeInBytes": len(data),
        "numOfAddFiles": adds,
        "checkpointSchema": spark_schema(schema),
    }
    _point_last_checkpoint(log, {**hint, "checksum": json_checksum(hint)})
    return written


def _point_last_checkpoint(log: DeltaLog, hint: Mapping[str, Any]) -> None:
    """Replace `_last_checkpoint` with `hint` unless it names a newer version already. One object written
    whole (S3: one PUT; locally: a rename), so readers see the old or the new one."""
    from icefall.commit.delta_tail import last_checkpoint_version

    try:
        current = last_checkpoint_version(log.storage.read(f"{LOG_DIR}/{LAST_CHECKPOINT}"))
    except OSError:
        current = None
    if current is not None and current >= int(hint["version"]):
        return
    staging = log.staging_root("_icefall_staging")
    staging.mkdir(parents=True, exist_ok=True)
    staged = staging / f"last-checkpoint-{uuid.uuid4().hex}"
    staged.write_text(json.dumps(hint, separators=(",", ":")))
    try:
        log.storage.move_in(staged, f"{LOG_DIR}/{LAST_CHECKPOINT}")
    finally:
        staged.unlink(missing_ok=True)


def json_checksum(document: Mapping[str, Any]) -> str:
    """The MD5 of `document` canonicalized as PROTOCOL.md's "JSON checksum" says (a top-level `checksum`
    key ignored): leaf paths and values URL-encoded, `path=value` pairs sorted and joined by commas."""
    pairs: list[str] = []

    def walk(node: Any, path: list[str]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, [*path, _encoded(str(key))])
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, [*path, str(index)])
        else:
            if node is None:
                text = "null"
            elif isinstance(node, bool):
                text = "true" if node else "false"
            elif isinstance(node, str):
                text = _encoded(node)
            else:
                text = json.dumps(node)
            pairs.append(f"{'+'.join(path)}={text}")

    walk({k: v for k, v in document.items() if k != "checksum"}, [])
    return hashlib.md5(",".join(sorted(pairs)).encode(), usedforsecurity=False).hexdigest()


def _encoded(text: str) -> str:
    return '"' + quote(text, safe="-._~") + '"'


def log_cleanup_deletions(listed: Mapping[str, int], cutoff_ms: int) -> tuple[str, ...]:
    """What Delta's metadata cleanup deletes of a `_delta_log` listing (name → modification time, ms) with
    everything up to `cutoff_ms` expired (module doc); () when no checkpoint can stand for older versions.
    Pure."""
    commits = sorted((int(m.group(1)), ms) for name, ms in listed.items() if (m := COMMIT_FILE.match(name)))
    expired: int | None = None  # the newest commit at or before the cut-off, times made increasing
    previous: int | None = None
    for version, modified_ms in commits:
        stamp = modified_ms if previous is None or modified_ms > previous else previous + 1
        previous = stamp
        if stamp <= cutoff_ms:
            expired = version
    if expired is None:
        return ()
    standing = [v for v in complete_checkpoints(listed) if v <= expired]
    if not standing:
        return ()
    keep_from = max(standing)
    doomed = []
    for name in listed:
        if (compacted := _COMPACTED.match(name)) is not None:
            if int(compacted.group(1)) <= keep_from:
                doomed.append(name)
        elif (versioned := _VERSIONED.match(name)) is not None and int(versioned.group(1)) < keep_from:
            doomed.append(name)  # a commit, a checkpoint (classic, part, UUID-named), a `.crc`
    return tuple(sorted(doomed))


def clean_up_log(log: DeltaLog, configuration: Mapping[str, str], now_ms: int) -> tuple[str, ...]:
    """Delete the log files `log_cleanup_deletions` selects with the table's `delta.logRetentionDuration`
    (Delta's default 30 days); the names deleted."""
    retention = interval_ms(configuration.get(LOG_RETENTION_PROPERTY), DEFAULT_LOG_RETENTION_MS)
    doomed = log_cleanup_deletions(log.storage.list_times(LOG_DIR), now_ms - retention)
    return tuple(name for name in doomed if log.storage.delete(f"{LOG_DIR}/{name}"))
