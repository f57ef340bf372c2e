"""The commit protocol for Delta Lake tables (`spec.table.format: delta`; commit/DESIGN.md, "Delta Lake").

A Delta table is a folder: Parquet data files plus `_delta_log/<version>.json`, one file of actions per
commit. Version N exists once: whoever creates `N.json` first made commit N (Delta's mutual exclusion),
so a commit planned on version V is a compare-and-swap: it creates `V+1.json`, or learns someone else did.

Each ingestion commit holds, in ONE log file: the batch's `add` actions (files Spark wrote, invisible to
readers until then), a `metaData` action whose `configuration` carries the `icefall.*` properties (the
Kafka offsets and topic id per partition, the epoch, the newest times; the same encoding as an Iceberg
table's properties, `CommittedState.to_properties`), and a `commitInfo` for people. The Metadata action is
part of the table's state: every checkpoint keeps it and every later commit carries it forward, so log
cleanup and VACUUM cannot remove what resume needs (a `commitInfo` would be gone with its log file).

Guarantees: a commit lands only if the table's epoch is not above the writer's (FencedError), the table's
`icefall.*` state is still the one the batch was planned from (StaleHeadError otherwise: another ingestion
commit landed), and the batch starts at the committed offsets of the same topic id (`check_source`, as
for Iceberg). Commits by others that leave `icefall.*` alone (OPTIMIZE, a user's DELETE) do not cost the
batch: it is committed on top of them, as its files are its own and its offsets still come next.
Checkpoints and log cleanup: Delta Spark's locally, Icefall's own on an object store (`delta_checkpoint`);
a snapshot reads the newest checkpoint and the commits after it (`DeltaLog.tail`). Table properties outside
`icefall.*` (the retention the spec sets) change in a metadata-only commit, `set_properties`.
The folder is local or in an object store (`icefall.commit.delta_storage`: put-if-absent is `link`
locally, a conditional PUT on S3, a create-only upload on GCS and Azure, `icefall.commit.delta_cloud`).
Schema evolution (`icefall.catalog.delta_schema`): a batch whose schema adds columns commits the table's
new `schemaString` in the `metaData` action of its own log entry
(`commit_batch(schema_string=...)`, and a `protocol` action if a new column needs a feature), not in a
metadata-only commit before it: the batch's commit writes a `metaData` action anyway, so the new column,
its first rows and their offsets land together or not at all, behind the same epoch, offset and
put-if-absent checks; a batch planned on another schema than the table's is StaleHeadError.
Not guaranteed / not done yet: type widening (Delta's `typeWidening` feature), partition
transforms (identity partitions only: `partitionColumns`, each `add` with its `partitionValues`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from icefall.api.delta_partitions import GENERATION_EXPRESSION
from icefall.commit.batch import SourceBatch, check_source, state_after
from icefall.commit.delta_history import DeltaHistory
from icefall.commit.delta_storage import is_object_store, local_path, storage_for
from icefall.commit.delta_tail import (
    CHECKPOINT_FILE,
    COMMIT_FILE,
    LAST_CHECKPOINT,
    LogTail,
    complete_checkpoints,
    last_checkpoint_version,
    tail_of,
)
from icefall.commit.errors import CorruptStateError, FencedError, MaintenanceConflictError, StaleHeadError
from icefall.commit.state import (
    OFFSET_RESETS,
    CommittedState,
    OffsetReset,
    planned_reset,
    state_from_properties,
)
from icefall.runtime.failpoints import failpoint

LOG_DIR = "_delta_log"
PREFIX = "icefall."
ENGINE_INFO = "icefall"
MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class DeltaSnapshot:
    """A version of the table: its number (-1: no table yet) and the Metadata and Protocol in force."""

    version: int
    metadata: Mapping[str, Any] | None = None
    protocol: Mapping[str, Any] | None = None

    @property
    def exists(self) -> bool:
        return self.version >= 0

    @property
    def configuration(self) -> Mapping[str, str]:
        return (self.metadata or {}).get("configuration") or {}

    @property
    def schema_string(self) -> str | None:
        return (self.metadata or {}).get("schemaString")

    @property
    def partition_columns(self) -> list[str]:
        return list((self.metadata or {}).get("partitionColumns") or [])

    @property
    def committed(self) -> CommittedState:
        """The `icefall.*` state of this version; `snapshot_id` is the version (None: no table yet)."""
        ours = {k: v for k, v in self.configuration.items() if k.startswith(PREFIX)}
        return state_from_properties(ours, self.version if self.exists else None)


@dataclass(frozen=True)
class AddFile:
    """A data file a batch adds, relative to the table's folder (a partitioned table's: in its partition's
    folder, `partition_values` its values as Delta writes them, None for null; no `stats`: numRecords)."""

    path: str
    size: int
    records: int
    modification_time_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    stats: str | None = None

    def action(self) -> dict[str, Any]:
        return {
            "add": {
                "path": quote(self.path, safe="/="),  # a URI, as Delta writes it: folders column=value
                "partitionValues": dict(self.partition_values),
                "size": self.size,
                "modificationTime": self.modification_time_ms,
                "dataChange": True,
                "stats": self.stats or json.dumps({"numRecords": self.records}),
            }
        }


class DeltaLog:
    """The `_delta_log` of one table (local or on S3, `storage`): read versions, create the next one.
    `root` is the local folder (on S3: meaningless, use `storage`)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.storage = storage_for(location)
        self.root = local_path(location)
        self.log_dir = self.root / LOG_DIR
        # The newest snapshot read: a version never changes, so a later read walks back only to it (without
        # it each read walked to version 0 for the Protocol where there is no checkpoint).
        self._known: DeltaSnapshot | None = None
        self._floor: int | None = None  # the newest checkpoint listed: the next listing starts there
        self._listed = False  # listed once: a log without checkpoints needs no `_last_checkpoint` read

    def staging_root(self, name: str) -> Path:
        """A local folder for files on their way into the table: `name` in the table's folder, or for a
        table in an object store in this machine's temporary directory (one per table)."""
        if is_object_store(self.location):
            digest = hashlib.sha256(self.location.encode()).hexdigest()[:16]
            return Path(tempfile.gettempdir()) / "icefall-delta" / digest / name
        return self.root / name

    def latest_version(self) -> int:
        """The newest version in the log, a commit's or a checkpoint's (Delta's log cleanup may have
        removed the commit of a checkpointed version); -1: none."""
        return self.tail().latest

    def tail(self) -> LogTail:
        """The newest checkpoint and the commits after it, from ONE listing starting at the newest checkpoint
        this object knows, else (first read, or it is gone) at `_last_checkpoint`'s, else at the start
        (`icefall.commit.delta_tail`): a snapshot costs as much as the tail, not the whole log."""
        known = self._floor
        if known is not None and (found := self._tail_from(known)) is not None:
            return found
        if known is not None or not self._listed:
            hint = self._last_checkpoint()
            if hint is not None and hint != known and (found := self._tail_from(hint)) is not None:
                return found
        whole = self._tail_from(None)
        assert whole is not None  # a listing from the start always stands
        return whole

    def _tail_from(self, start: int | None) -> LogTail | None:
        after = "" if start is None else f"{start:020d}."
        found = tail_of(self.storage.list_after(LOG_DIR, after), start)
        if found is not None:
            self._floor, self._listed = found.checkpoint, True
        return found

    def _last_checkpoint(self) -> int | None:  # None: no such file, or unreadable (it is only a hint)
        try:
            return last_checkpoint_version(self.storage.read(f"{LOG_DIR}/{LAST_CHECKPOINT}"))
        except OSError:
            return None

    def actions(self, version: int) -> list[dict[str, Any]]:
        text = self.storage.read(f"{LOG_DIR}/{version:020d}.json").decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def history(self) -> DeltaHistory:
        """The log's commit files with their modification times, and its checkpoints (time travel:
        `icefall.commit.delta_history`)."""
        commits: dict[int, int] = {}
        checkpoints: set[int] = set()
        for name, modified_ms in self.storage.list_times(LOG_DIR).items():
            if match := COMMIT_FILE.match(name):
                commits[int(match.group(1))] = modified_ms
            elif match := CHECKPOINT_FILE.match(name):
                checkpoints.add(int(match.group(1)))
        return DeltaHistory(commits, frozenset(checkpoints))

    def snapshot(self, version: int | None = None) -> DeltaSnapshot:
        """The latest version (or `version`, which must exist: `DeltaHistory.check`) with the Metadata and
        Protocol in force there, from the commits after the newest checkpoint at or below it, else from
        that checkpoint (log cleanup may have removed older commits)."""
        latest, checkpoint, checkpoint_files = self._bounds(version)
        if latest < 0:
            return DeltaSnapshot(-1)
        known = self._known
        if known is None or not _walk_floor(checkpoint) <= known.version <= latest:
            known = None  # none, before a checkpoint (log cleanup may have removed what follows), or newer
        elif known.version == latest:
            return known
        stop = known.version if known is not None else _walk_floor(checkpoint)
        metadata = protocol = None
        for each in range(latest, stop, -1):
            for action in self.actions(each):
                metadata = metadata or action.get("metaData")
                protocol = protocol or action.get("protocol")
            if metadata is not None and protocol is not None:
                break
        if known is not None:
            if metadata is not None and metadata.get("id") != (known.metadata or {}).get("id"):
                self._known = None  # another table at the location (deleted and created again): read it whole
                return self.snapshot(latest)
            metadata, protocol = metadata or known.metadata, protocol or known.protocol
        elif (metadata is None or protocol is None) and checkpoint is not None:
            found = self._from_checkpoint(checkpoint, checkpoint_files)
            metadata, protocol = metadata or found[0], protocol or found[1]
        if metadata is None or protocol is None:
            raise CorruptStateError(
                f"{self.location}: version {latest} has no metaData or protocol in its log"
            )
        read = DeltaSnapshot(latest, metadata, protocol)
        if self._known is None or latest > self._known.version:
            self._known = read
        return read

    def _bounds(self, version: int | None) -> tuple[int, int | None, tuple[str, ...]]:
        """The version to read (the latest for None), the newest checkpoint at or below it, its files."""
        if version is None:
            tail = self.tail()
            return tail.latest, tail.checkpoint, tail.checkpoint_files
        checkpoint = self._latest_checkpoint(version)  # time travel: from the whole listing
        return version, checkpoint, self.checkpoint_files(checkpoint) if checkpoint is not None else ()

    def latest_checkpoint(self) -> int | None:
        """The version of the newest checkpoint (None: none)."""
        return self.tail().checkpoint

    def _latest_checkpoint(self, latest: int) -> int | None:
        found = [v for v in complete_checkpoints(self.storage.list(LOG_DIR)) if v <= latest]
        return max(found, default=None)

    def checkpoint_files(self, version: int) -> tuple[str, ...]:
        """The file names of the complete checkpoint at `version` (a whole listing; () if none)."""
        return complete_checkpoints(self.storage.list(LOG_DIR)).get(version, ())

    def _from_checkpoint(
        self, version: int, names: Sequence[str] | None = None
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The Metadata and Protocol of the checkpoint at `version` (its files `names`, else listed)."""
        import pyarrow.parquet as pq

        metadata = protocol = None
        filesystem, root = self.storage.arrow()
        for name in names if names is not None else self.checkpoint_files(version):
            path = f"{root}/{LOG_DIR}/{name}"
            rows = pq.read_table(path, columns=["metaData", "protocol"], filesystem=filesystem).to_pylist()
            for row in rows:
                metadata = metadata or row.get("metaData")
                protocol = protocol or row.get("protocol")
        if metadata is not None:  # maps read as lists of pairs, absent fields as nulls: back as in a commit
            metadata = {k: v for k, v in metadata.items() if v is not None}
            if isinstance(metadata.get("configuration"), list):
                metadata["configuration"] = dict(metadata["configuration"])
            found_format = metadata.get("format") or {}
            if isinstance(found_format.get("options"), list):
                metadata["format"] = {**found_format, "options": dict(found_format["options"])}
        return metadata, {k: v for k, v in protocol.items() if v is not None} if protocol else None

    def try_commit(self, version: int, actions: Iterable[Mapping[str, Any]]) -> bool:
        """Create `version` with `actions`; False if it exists (someone else committed it). The file is
        complete before it appears under its name, and never replaces one (`DeltaStorage.put_if_absent`)."""
        text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
        return self.storage.put_if_absent(f"{LOG_DIR}/{version:020d}.json", text.encode("utf-8"))


def _walk_floor(checkpoint: int | None) -> int:  # where a walk back through the commits stops (exclusive)
    return checkpoint if checkpoint is not None else -1


def protocol_for(schema_string: str, *, deletion_vectors: bool = False) -> dict[str, Any]:
    """The oldest Delta protocol that can hold `schema_string`: timestamps without a time zone need the
    `timestampNtz` table feature (reader 3, writer 7), a keyed table's MERGE `deletionVectors`; the
    generated partition columns of `icefall.api.delta_partitions` the writer feature `generatedColumns`
    (writer 4)."""
    features = ["timestampNtz"] if '"timestamp_ntz"' in schema_string else []
    features += ["deletionVectors"] if deletion_vectors else []
    generated = f'"{GENERATION_EXPRESSION}"' in schema_string
    if features:
        return {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": features,
            # Writer version 7 names every feature: those of writer version 2 too (NOT NULL columns need
            # `invariants`; Delta refuses a table whose metadata uses a feature its protocol lacks).
            "writerFeatures": [
                "appendOnly",
                "invariants",
                *(["generatedColumns"] if generated else []),
                *features,
            ],
        }
    return {"minReaderVersion": 1, "minWriterVersion": 4 if generated else 2}


#: The table features each legacy writer version implies (Delta's PROTOCOL.md, "Table Features").
_LEGACY_WRITER_FEATURES = (
    (2, ("appendOnly", "invariants")),
    (3, ("checkConstraints",)),
    (4, ("changeDataFeed", "generatedColumns")),
    (5, ("columnMapping",)),
    (6, ("identityColumns",)),
)


def protocol_after(protocol: Mapping[str, Any] | None, schema_string: str) -> dict[str, Any] | None:
    """The protocol a table with `protocol` needs once its schema is `schema_string` (a new column may need
    a feature, `timestampNtz`); None: `protocol` holds it. Features are only ever added: a table's
    protocol never goes down."""
    needed = protocol_for(schema_string).get("readerFeatures", [])
    current = dict(protocol or {})
    reader = list(current.get("readerFeatures") or [])
    if all(f in reader for f in needed):
        return None
    writer = list(current.get("writerFeatures") or [])
    if int(current.get("minWriterVersion", 2)) < 7:  # legacy: name what its version implied
        version = int(current.get("minWriterVersion", 2))
        writer = [f for v, features in _LEGACY_WRITER_FEATURES if v <= version for f in features]
    if int(current.get("minReaderVersion", 1)) == 2:
        reader = ["columnMapping"]
    return {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": [*reader, *(f for f in needed if f not in reader)],
        "writerFeatures": [*writer, *(f for f in needed if f not in writer)],
    }


#: A keyed table's configuration: Delta's MERGE marks replaced rows in deletion vectors, no file rewrites.
DELETION_VECTORS = {"delta.enableDeletionVectors": "true"}


def _commit_info(operation: str, **extra: Any) -> dict[str, Any]:
    return {
        "commitInfo": {
            "timestamp": int(time.time() * 1000),
            "operation": operation,
            "engineInfo": ENGINE_INFO,
            "txnId": str(uuid.uuid4()),
            **extra,
        }
    }


def _with_state(
    metadata: Mapping[str, Any], state: CommittedState, history: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`metadata` with its `icefall.*` configuration replaced by `state`'s; other keys are kept, and so is
    the record of offset resets (`OFFSET_RESETS`: a history every commit carries forward) unless `history`
    gives a new one."""
    configuration = metadata.get("configuration") or {}
    kept = {k: v for k, v in configuration.items() if not k.startswith(PREFIX) or k == OFFSET_RESETS}
    return {"metaData": {**metadata, "configuration": {**kept, **state.to_properties(), **(history or {})}}}


def create_table(
    log: DeltaLog,
    schema_string: str,
    epoch: int,
    *,
    role: str = "main",
    deletion_vectors: bool = False,
    partition_columns: Sequence[str] = (),
) -> DeltaSnapshot:
    """Version 0 of a new table (no rows; the epoch claimed), unless the table exists: then its snapshot.
    Two writers creating it at once: one creates version 0, the other reads it. `deletion_vectors`: a
    keyed table's (`DELETION_VECTORS`); `partition_columns`: Delta's partitionColumns (identity)."""
    existing = log.snapshot()
    if existing.exists:
        return existing
    metadata = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_string,
        "partitionColumns": list(partition_columns),
        "configuration": dict(DELETION_VECTORS) if deletion_vectors else {},
        "createdTime": int(time.time() * 1000),
    }
    actions = [
        _commit_info(
            "CREATE TABLE",
            operationParameters={"partitionBy": json.dumps(list(partition_columns))},
            isBlindAppend=True,
        ),
        {"protocol": protocol_for(schema_string, deletion_vectors=deletion_vectors)},
        _with_state(metadata, CommittedState(snapshot_id=None, epoch=epoch)),
    ]
    log.try_commit(0, actions)
    failpoint(f"{role}.after-create")
    return log.snapshot()


def claim_epoch(log: DeltaLog, epoch: int, *, role: str = "main") -> DeltaSnapshot:
    """Raise the table's `icefall.epoch` to `epoch` (a commit with no rows), so an older writer cannot
    commit from now on; FencedError if the table's epoch is above it already."""
    for _ in range(MAX_ATTEMPTS):
        current = log.snapshot()
        committed = current.committed
        if epoch < committed.epoch:
            raise FencedError(
                f"epoch {epoch} is below the table's epoch {committed.epoch}: a newer writer took over"
            )
        if epoch == committed.epoch:
            return current
        assert current.metadata is not None
        actions = [
            _commit_info(
                "SET TBLPROPERTIES", operationParameters={"properties": f'{{"icefall.epoch":"{epoch}"}}'}
            ),
            _with_state(current.metadata, replace(committed, epoch=epoch)),
        ]
        if log.try_commit(current.version + 1, actions):
            failpoint(f"{role}.after-claim")
            return log.snapshot()
    raise MaintenanceConflictError(f"{log.location}: the epoch claim lost {MAX_ATTEMPTS} races in a row")


def reset_offsets(log: DeltaLog, asked: OffsetReset) -> CommittedState:
    """Point the committed offsets at `asked`'s (`icefall reset-offsets`; `commit.direct.reset_offsets` is the
    Iceberg table's): ONE metadata-only version carries the new `icefall.*` state and the reset appended to
    `icefall.offset-resets` (`commit.state.planned_reset`). A batch planned before it is StaleHeadError at its
    commit (the offsets changed) and is planned again from here; the epoch is kept; rows stay. A request
    recorded already commits nothing. Returns the state after it."""
    for _ in range(MAX_ATTEMPTS):
        current = log.snapshot()
        if current.metadata is None:
            raise CorruptStateError(f"{log.location}: no Delta table to reset")
        planned = planned_reset(current.committed, current.configuration, asked, log.location)
        if planned is None:
            return current.committed
        reset, properties = planned
        actions = [
            _commit_info(
                "SET TBLPROPERTIES",
                operationParameters={"properties": json.dumps(properties)},
                userMetadata=json.dumps({"icefall.offset-reset": asked.reason}),
            ),
            _with_state(current.metadata, reset, {OFFSET_RESETS: properties[OFFSET_RESETS]}),
        ]
        if log.try_commit(current.version + 1, actions):
            return replace(reset, snapshot_id=current.version + 1)
    raise MaintenanceConflictError(f"{log.location}: the offset reset lost {MAX_ATTEMPTS} races in a row")


def set_properties(log: DeltaLog, properties: Mapping[str, str]) -> int | None:
    """Set Delta table properties (not `icefall.*`) in a metadata-only commit; the version made, None if
    the table has them already. A concurrent ingestion commit is not lost: the commit is planned again on
    it (its Metadata carries the new offsets), and an ingestion commit planned before this one is committed
    over it (`commit_batch`: the `icefall.*` state is unchanged)."""
    if any(k.startswith(PREFIX) for k in properties):
        raise ValueError("icefall.* properties are written by ingestion commits only")
    for _ in range(MAX_ATTEMPTS):
        current = log.snapshot()
        if current.metadata is None:
            raise CorruptStateError(f"{log.location}: no Delta table to set properties on")
        configuration = {**current.configuration, **properties}
        if configuration == dict(current.configuration):
            return None
        actions = [
            _commit_info(
                "SET TBLPROPERTIES", operationParameters={"properties": json.dumps(dict(properties))}
            ),
            {"metaData": {**current.metadata, "configuration": configuration}},
        ]
        if log.try_commit(current.version + 1, actions):
            return current.version + 1
    raise MaintenanceConflictError(f"{log.location}: setting properties lost {MAX_ATTEMPTS} races in a row")


def commit_batch(
    log: DeltaLog,
    planned: DeltaSnapshot,
    batch: SourceBatch,
    epoch: int,
    files: Iterable[AddFile],
    *,
    schema_string: str | None = None,
    role: str = "main",
    merged: Iterable[Mapping[str, Any]] | None = None,
) -> int:
    """Commit `files` (already in the table's folder) with `batch`'s offsets, planned on `planned`; the
    version made. Refuses, in this order: FencedError (the table's epoch is above `epoch`), StaleHeadError
    (an ingestion commit, reset or epoch claim landed since `planned`, or the schema changed),
    TopicMismatchError / OffsetGapError (`check_source`). A commit by someone else that leaves `icefall.*`
    alone is committed over, as often as MAX_ATTEMPTS.

    `schema_string`: the table's schema with this batch (`icefall.catalog.delta_schema.plan_delta_schema`
    on `planned`'s); when it differs from `planned`'s, the commit's Metadata carries it (and a Protocol
    action the features a new column needs, `protocol_after`): the schema change lands with the batch's
    rows and offsets in one log entry, or not at all. None: the schema stays.

    `merged`: a keyed batch's MERGE (`icefall.ingest.delta_keyed`), its `add` and `remove` actions (rows
    marked deleted in deletion vectors, new files) computed on `planned` exactly: committed on `planned`
    only, any other commit since is a StaleHeadError (an OPTIMIZE may have replaced the files it marks)."""
    adds = [f.action() for f in files]
    extra = list(merged) if merged is not None else []
    for _ in range(MAX_ATTEMPTS):
        current = log.snapshot()
        committed = current.committed
        if epoch < committed.epoch:
            raise FencedError(
                f"epoch {epoch} is below the table's epoch {committed.epoch}: a newer writer took over"
            )
        if merged is not None and current.version != planned.version:
            raise StaleHeadError(
                f"version {current.version} landed since version {planned.version} the batch's MERGE was "
                "computed on"
            )
        if current.version != planned.version:
            if committed.to_properties() != planned.committed.to_properties():
                raise StaleHeadError(
                    f"version {current.version} holds other offsets than version {planned.version} the batch "
                    "was planned on: another commit of Icefall landed since"
                )
            if current.schema_string != planned.schema_string:
                # The batch's files and its schema change were planned on the schema it replaced.
                raise StaleHeadError(f"the table's schema changed since version {planned.version}")
        check_source(committed, batch)
        new = state_after(committed, batch, epoch, snapshot_id=current.version + 1)
        assert current.metadata is not None
        metadata, evolved = current.metadata, []
        if schema_string is not None and schema_string != current.schema_string:
            metadata = {**metadata, "schemaString": schema_string}
            upgraded = protocol_after(current.protocol, schema_string)
            evolved = [{"protocol": upgraded}] if upgraded is not None else []
        actions = [
            _commit_info(
                "STREAMING UPDATE" if merged is None else "MERGE",
                operationParameters={
                    "outputMode": "Append" if merged is None else "Update",
                    "epochId": str(epoch),
                },
                isBlindAppend=False,
                userMetadata=json.dumps(new.to_properties(), sort_keys=True),
            ),
            *evolved,
            _with_state(metadata, new),
            *adds,
            *extra,
        ]
        failpoint(f"{role}.before-commit")
        if log.try_commit(current.version + 1, actions):
            return current.version + 1
    raise MaintenanceConflictError(f"{log.location}: the commit lost {MAX_ATTEMPTS} races in a row")


def moved_into(staging: Path, log: DeltaLog, metadata: Mapping[str, Any] | None = None) -> list[AddFile]:
    """The Parquet files Spark wrote in `staging` moved into the table's folder (files without rows dropped;
    Spark's `partitionBy` folders `column=value` kept, their values the adds' `partition_values`), with
    each footer's statistics (read before the move) of the columns `metadata` indexes (`delta_stats`)."""
    import pyarrow.parquet as pq

    from icefall.commit.delta_stats import StatsColumns, delta_stats

    columns, files = StatsColumns.of(metadata), []
    for written in sorted(staging.rglob("part-*.parquet")):
        if (footer := pq.read_metadata(written)).num_rows == 0:
            continue
        stats, relative = delta_stats(footer, columns), written.relative_to(staging).as_posix()
        size, values = log.storage.move_in(written, relative), partition_values(relative)
        files.append(AddFile(relative, size, footer.num_rows, partition_values=values, stats=stats))
    return files


#: Spark's folder for a null partition value (Hive's); Delta's partitionValues hold null instead.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_values(relative: str) -> dict[str, str | None]:
    """The partition values of a file at `relative` in Spark's `column=value` folders (Hive-escaped:
    %XX), as Delta's partitionValues hold them (strings; None for null)."""
    values: dict[str, str | None] = {}
    for folder in relative.split("/")[:-1]:
        name, _, value = folder.partition("=")
        text = unquote(value)
        values[unquote(name)] = None if text == NULL_PARTITION else text
    return values
