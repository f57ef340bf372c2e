"""A Delta table's files from its log, and the compaction pods' commit that swaps files (commit/DESIGN.md,
"Compaction pods for Delta tables on S3").

`LogFiles.read(log)` replays the log (the newest checkpoint's `add`/`remove` rows, then each commit after
it) into the live files (`add` actions by path) and the tombstones (path → the remove's
`deletionTimestamp`); `advance(log)` brings a replay to the latest version reading only the commits since.

`commit_rewrite(log, files, removed, added)` is the one commit of a merge: `remove` actions (dataChange
false) for `removed` and `add` actions (dataChange false) for `added`, and NO `metaData` action: the
table's Metadata, with the committed offsets in it, stays what it is. It is created with put-if-absent at
the version after the replay's, and only while every removed path is still live at that version: a
version someone else took first (a batch, another pod) is read, the check made again on it, and the commit
tried on top; a removed path no longer live raises `RewriteConflictError` (the round gives up: its merged
file stays unnamed, VACUUM's once older than the retention). So the rows of the removed files leave the
table in the very version their merged copy enters it, or neither happens.

Not guaranteed: that an `add` names a file holding exactly the removed files' rows — the caller writes it
(`icefall.compact.delta_pods`) and checks its row count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from icefall.commit.delta import MAX_ATTEMPTS, DeltaLog, _commit_info
from icefall.commit.delta_vectors import vector_file
from icefall.commit.errors import CorruptStateError, MaintenanceConflictError, StaleHeadError
from icefall.runtime.failpoints import failpoint

#: Writer features a merge keeps valid: it writes a copy of rows already in the table, with the same
#: values, columns (physical names included) and partition, as dataChange=false. A table using any other
#: (row tracking, domain metadata, clustering, ...) is refused: a merge would have to maintain it.
MERGE_SAFE_WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "columnMapping",
        "identityColumns",
        "timestampNtz",
        "deletionVectors",  # files with a deletion vector are never merged (`LogFiles.mergeable`)
        "vacuumProtocolCheck",
    }
)


class RewriteConflictError(StaleHeadError):
    """A file the merge would remove is no longer live (another pod merged it, a user deleted it)."""


@dataclass
class LogFiles:
    """The live files and tombstones of version `version` (-1: no table)."""

    version: int = -1
    live: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> its add action
    removed: dict[str, int] = field(default_factory=dict)  # path -> deletionTimestamp (ms)
    metadata: dict[str, Any] | None = None  # the metaData action in force
    protocol: dict[str, Any] | None = None  # the protocol action in force
    tombstones: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> its remove action
    txns: dict[str, dict[str, Any]] = field(default_factory=dict)  # appId -> its txn action
    newest_checkpoint: int | None = None  # the newest checkpoint at the last listing (None: none)
    # deletion vector file (decoded relative path) -> deletionTimestamp of the last remove naming it
    removed_vectors: dict[str, int] = field(default_factory=dict)

    @property
    def configuration(self) -> dict[str, str]:
        return dict((self.metadata or {}).get("configuration") or {})

    @property
    def partition_columns(self) -> list[str]:
        return list((self.metadata or {}).get("partitionColumns") or [])

    @classmethod
    def read(cls, log: DeltaLog) -> LogFiles:
        """The latest version's files, from the newest checkpoint and the commits after it."""
        tail = log.tail()
        files = cls()
        if tail.latest < 0:
            return files
        if tail.checkpoint is not None:
            files._apply_checkpoint(log, tail.checkpoint, tail.checkpoint_files)
        files.newest_checkpoint = tail.checkpoint
        return files.advance(log, tail.latest)

    @classmethod
    def at_checkpoint(cls, log: DeltaLog, version: int, names: Sequence[str]) -> LogFiles:
        """The files of the checkpoint at `version` (its file names `names`), no commit after it."""
        files = cls()
        files._apply_checkpoint(log, version, names)
        return files

    def advance(self, log: DeltaLog, upto: int | None = None) -> LogFiles:
        """This replay brought to `upto` (default the latest version), in place; a commit log cleanup
        removed meanwhile makes it read again from the newest checkpoint."""
        latest = upto
        if latest is None:
            tail = log.tail()
            latest, self.newest_checkpoint = tail.latest, tail.checkpoint
        for version in range(self.version + 1, latest + 1):
            try:
                actions = log.actions(version)
            except FileNotFoundError as error:
                tail = log.tail()
                if tail.checkpoint is None or tail.checkpoint < version:
                    raise CorruptStateError(
                        f"{log.location}: version {version} is missing from the log and no checkpoint "
                        "stands for it"
                    ) from error
                fresh = LogFiles()
                fresh._apply_checkpoint(log, tail.checkpoint, tail.checkpoint_files)
                self.__dict__.update(fresh.__dict__)
                return self.advance(log, max(latest, tail.latest))
            self.apply(version, actions)
        return self

    def apply(self, version: int, actions: Iterable[Mapping[str, Any]]) -> None:
        for action in actions:
            if (metadata := action.get("metaData")) is not None:
                self.metadata = dict(metadata)
            elif (protocol := action.get("protocol")) is not None:
                self.protocol = dict(protocol)
            elif (added := action.get("add")) is not None:
                self.live[added["path"]] = dict(added)
                self.removed.pop(added["path"], None)
                self.tombstones.pop(added["path"], None)
            elif (gone := action.get("remove")) is not None:
                # A logical file is (path, deletion vector): a MERGE's remove of the old vector and add of
                # the new one share a path, in either order (PROTOCOL.md, "Action Reconciliation").
                if _dv_id(self.live.get(gone["path"])) == _dv_id(gone):
                    self.live.pop(gone["path"], None)
                self.removed[gone["path"]] = int(gone.get("deletionTimestamp") or 0)
                self.tombstones[gone["path"]] = dict(gone)
                self._removed_vector(gone)
            elif (txn := action.get("txn")) is not None:
                self.txns[txn["appId"]] = dict(txn)
        self.version = version

    def _removed_vector(self, remove: Mapping[str, Any]) -> None:
        """Remember the deletion vector file a remove names (a file's older vector: VACUUM keeps it within
        the retention, as the remove itself; `tombstones` keeps only a path's last remove)."""
        if (vector := _vector_file(remove)) is not None:
            self.removed_vectors[vector] = int(remove.get("deletionTimestamp") or 0)

    def vector_files(self) -> set[str]:
        """The deletion vector files (decoded table-relative paths) the live files need."""
        return {f for add in self.live.values() if (f := _vector_file(add)) is not None}

    def mergeable(self) -> dict[str, dict[str, Any]]:
        """The live files a merge may read: paths inside the table's folder (not another location's URI, no
        `..`) without a deletion vector (its Parquet still holds the rows the vector deletes)."""
        return {
            path: add
            for path, add in self.live.items()
            if "://" not in path
            and not path.startswith("/")
            and ".." not in unquote(path).split("/")  # the log is table data: no file outside the folder
            and not add.get("deletionVector")
        }

    def _apply_checkpoint(self, log: DeltaLog, version: int, names: Sequence[str]) -> None:
        import pyarrow.parquet as pq

        self.metadata, self.protocol = (
            dict(found) if found else None for found in log._from_checkpoint(version, names)
        )
        filesystem, root = log.storage.arrow()
        for name in names:
            path = f"{root}/_delta_log/{name}"
            columns = [
                c for c in ("add", "remove", "txn") if c in pq.read_schema(path, filesystem=filesystem).names
            ]
            for row in pq.read_table(path, columns=columns, filesystem=filesystem).to_pylist():
                if (added := row.get("add")) is not None:
                    self.live[added["path"]] = _plain(added)
                elif (gone := row.get("remove")) is not None:
                    self.removed[gone["path"]] = int(gone.get("deletionTimestamp") or 0)
                    self.tombstones[gone["path"]] = _plain(gone)
                    self._removed_vector(gone)
                elif (txn := row.get("txn")) is not None:
                    self.txns[txn["appId"]] = _plain(txn)
        self.version = version


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint row as a log action: no null fields, maps (read as lists of pairs) as dicts."""
    plain = {}
    for key, value in row.items():
        if value is None:
            continue
        plain[key] = dict(value) if key in ("partitionValues", "tags") and isinstance(value, list) else value
    if isinstance(plain.get("deletionVector"), dict):
        plain["deletionVector"] = {k: v for k, v in plain["deletionVector"].items() if v is not None}
    return plain


def _vector_file(action: Mapping[str, Any]) -> str | None:
    """The file of an add's or remove's in-table deletion vector (`vector_file`); None for none, and for a
    descriptor whose name is not Delta's (no reader could open it: the replay goes on without it)."""
    try:
        return vector_file(action.get("deletionVector"))
    except ValueError:
        return None


def _dv_id(action: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """The deletion vector's identity in an add or remove (None: none), as Delta's `dvId`."""
    vector = (action or {}).get("deletionVector")
    if not vector:
        return None
    return (vector.get("storageType"), vector.get("pathOrInlineDv"), vector.get("offset"))


def records_of(add: Mapping[str, Any]) -> int | None:
    """`numRecords` of an add's stats (None: no stats)."""
    try:
        found = json.loads(add.get("stats") or "{}").get("numRecords")
    except (ValueError, AttributeError):
        return None
    return int(found) if found is not None else None


def merge_refusal(protocol: Mapping[str, Any] | None) -> str | None:
    """Why a merge may not commit to a table with `protocol` (None: it may)."""
    current = dict(protocol or {})
    if int(current.get("minWriterVersion", 2)) < 7:
        return None  # legacy versions imply only features of MERGE_SAFE_WRITER_FEATURES (up to 6)
    unknown = sorted(set(current.get("writerFeatures") or []) - MERGE_SAFE_WRITER_FEATURES)
    if unknown:
        return f"the table uses writer features Icefall's merge does not maintain: {', '.join(unknown)}"
    return None


def commit_rewrite(
    log: DeltaLog,
    files: LogFiles,
    removed: Sequence[str],
    added: Sequence[Mapping[str, Any]],
    *,
    zorder_by: Sequence[str] = (),
) -> int:
    """Commit the swap of `removed` (live paths) for `added` (add actions), on the latest version (module
    doc); the version made. `files` is the replay the merge was planned on, advanced in place; `zorder_by`:
    the columns the added files' rows are Z-ordered by, recorded as Delta's OPTIMIZE records them.
    RewriteConflictError: a removed path is no longer live (or has a deletion vector now);
    MaintenanceConflictError: the commit lost MAX_ATTEMPTS races in a row; CorruptStateError: the
    table's protocol refuses a merge."""
    adds = [{"add": {**a, "dataChange": False}} for a in added]
    for _ in range(MAX_ATTEMPTS):
        files.advance(log)
        # Still live AND still without a deletion vector: a keyed batch that marked rows of an input
        # deleted since the plan would otherwise see them back in the merged copy.
        mergeable = files.mergeable()
        gone = [path for path in removed if path not in mergeable]
        if gone:
            raise RewriteConflictError(
                f"{len(gone)} of the {len(removed)} merged files are no longer live at version "
                f"{files.version} (e.g. {gone[0]}): the merge is dropped, its file left for VACUUM"
            )
        if (refusal := merge_refusal(files.protocol)) is not None:
            raise CorruptStateError(f"{log.location}: {refusal}")
        now = int(time.time() * 1000)
        actions = [
            _commit_info(
                "OPTIMIZE",
                operationParameters={
                    "predicate": "[]",
                    "zOrderBy": json.dumps(list(zorder_by), separators=(",", ":")),
                    "auto": "false",
                },
                readVersion=files.version,
                isBlindAppend=False,
            ),
            *(_remove(files.live[path], now) for path in removed),
            *adds,
        ]
        made = files.version + 1
        failpoint("main.before-rewrite-commit")
        if log.try_commit(made, actions):
            failpoint("main.after-rewrite")
            return made
    raise MaintenanceConflictError(f"{log.location}: the merge lost {MAX_ATTEMPTS} races in a row")


def _remove(add: Mapping[str, Any], now_ms: int) -> dict[str, Any]:
    remove = {
        "path": add["path"],
        "deletionTimestamp": now_ms,
        "dataChange": False,
        "extendedFileMetadata": True,
        "partitionValues": dict(add.get("partitionValues") or {}),
        "size": add.get("size"),
    }
    return {"remove": remove}
