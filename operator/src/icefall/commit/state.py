"""The committed state: what the table says it already holds, read from its `icefall.*` properties.

The properties are table properties, set by `commit_staged` in the same metadata commit that moves `main`
to the batch's snapshot. They belong to no snapshot, so any later commit that does not touch them
(compaction, file rewrites, snapshot expiry, schema changes, by pyiceberg or Spark) carries them forward
unchanged, and expiring old snapshots cannot remove them. Resume uses `read_committed`, never a Kafka
consumer group or a Spark checkpoint.

Not guaranteed: if someone rolls `main` back by hand, the properties still describe the newer commit, so
the rolled-back records are not ingested again (the rollback wins, no duplicates); edit
`icefall.offsets` as part of such a repair if the records should come back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icefall.commit.errors import CorruptStateError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

TOPIC = "icefall.topic"
# Kafka's id of the topic the offsets belong to: a topic deleted and created again keeps its name, not its id.
TOPIC_ID = "icefall.topic-id"
OFFSETS = "icefall.offsets"  # JSON {"<partition>": <next offset to read>}
EPOCH = "icefall.epoch"
MAX_EVENT_TIME_MS = "icefall.max-event-time-ms"
MAX_PRODUCE_TIME_MS = "icefall.max-produce-time-ms"
START_OFFSETS = "icefall.start-offsets"  # JSON {"<partition>": <first offset ever read>}, for the audit
LOST_RECORDS = "icefall.lost-records"  # records Kafka's retention deleted before they were ingested, in total
# JSON list of the offset resets a user asked for (`icefall reset-offsets`), newest last: the explicit action
# that lets ingestion go on after the topic was recreated or its log truncated.
OFFSET_RESETS = "icefall.offset-resets"
# cdc with spec.sequenceBy: the Parquet file of the keys whose last change was a delete, with its position
# (`icefall.ingest.deleted_keys`); written before the commit that names it, so it lands with the offsets.
DELETED_KEYS = "icefall.deleted-keys"
# JSON list of the schema changes ingestion made (`icefall.commit.evolve_schema`), newest last, each with the
# committed offsets when it landed: `[{"schema-id": 3, "offsets": {"0": 120}}]`. Rows below those offsets
# were written before the change, and read the fields it added as null (the audit needs to know). Not part
# of the committed state: it changes in a commit that does not move `main`, and resume never reads it.
SCHEMA_CHANGES = "icefall.schema-changes"
MAX_SCHEMA_CHANGES_KEPT = 100
PROPERTIES = (
    TOPIC,
    TOPIC_ID,
    OFFSETS,
    EPOCH,
    MAX_EVENT_TIME_MS,
    MAX_PRODUCE_TIME_MS,
    START_OFFSETS,
    LOST_RECORDS,
    OFFSET_RESETS,
    DELETED_KEYS,
    SCHEMA_CHANGES,
)
MAIN = "main"


@dataclass(frozen=True)
class CommittedState:
    """What the table holds: `main`'s head and the Kafka position reached by the last ingestion commit."""

    snapshot_id: int | None  # main's head; None for a table without snapshots
    topic: str | None = None  # None until the first ingestion commit
    topic_id: str | None = None  # None until the first commit that knew it (tables of older versions)
    offsets: Mapping[int, int] = field(default_factory=dict)  # next offset to read, per partition
    epoch: int = 0  # lease epoch of the last ingestion commit; 0 before any
    max_event_time_ms: int | None = None  # newest event time committed so far
    max_produce_time_ms: int | None = None  # newest Kafka (produce) timestamp committed so far
    start_offsets: Mapping[int, int] = field(default_factory=dict)  # where each partition was first read
    # Offsets Kafka's retention deleted past the committed ones before they could be read, over the table's
    # life: each batch that skips such a gap (`Batch.retention_gaps`) adds its width in the same commit.
    lost_records: int = 0
    deleted_keys: str | None = None  # cdc with spec.sequenceBy: the file of deleted keys remembered

    def to_properties(self) -> dict[str, str]:
        """The `icefall.*` table properties describing this state."""
        props = {
            OFFSETS: encode_offsets(self.offsets),
            EPOCH: str(self.epoch),
        }
        if self.topic is not None:
            props[TOPIC] = self.topic
        if self.topic_id is not None:
            props[TOPIC_ID] = self.topic_id
        if self.start_offsets:
            props[START_OFFSETS] = encode_offsets(self.start_offsets)
        if self.max_event_time_ms is not None:
            props[MAX_EVENT_TIME_MS] = str(self.max_event_time_ms)
        if self.max_produce_time_ms is not None:
            props[MAX_PRODUCE_TIME_MS] = str(self.max_produce_time_ms)
        if self.lost_records:
            props[LOST_RECORDS] = str(self.lost_records)
        if self.deleted_keys is not None:
            props[DELETED_KEYS] = self.deleted_keys
        return props


def encode_offsets(offsets: Mapping[int, int]) -> str:
    return json.dumps({str(p): offsets[p] for p in sorted(offsets)}, separators=(",", ":"))


def decode_offsets(text: str, key: str = OFFSETS) -> dict[int, int]:
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        offsets = {int(p): int(o) for p, o in raw.items()}
    except (TypeError, ValueError) as e:
        raise CorruptStateError(f"{key} is not a JSON object of partition → offset: {text!r} ({e})") from e
    if any(p < 0 or o < 0 for p, o in offsets.items()):
        raise CorruptStateError(f"{key} holds a negative partition or offset: {text!r}")
    return offsets


def state_from_properties(properties: Mapping[str, str], snapshot_id: int | None) -> CommittedState:
    """The committed state described by table properties (pure: usable on properties read by Spark too)."""

    def integer(key: str) -> int | None:
        value = properties.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError as e:
            raise CorruptStateError(f"{key} is not an integer: {value!r}") from e

    lost = integer(LOST_RECORDS) or 0
    if lost < 0:
        raise CorruptStateError(f"{LOST_RECORDS} is negative: {lost}")
    return CommittedState(
        snapshot_id=snapshot_id,
        topic=properties.get(TOPIC),
        topic_id=properties.get(TOPIC_ID),
        offsets=decode_offsets(properties[OFFSETS]) if OFFSETS in properties else {},
        epoch=integer(EPOCH) or 0,
        max_event_time_ms=integer(MAX_EVENT_TIME_MS),
        max_produce_time_ms=integer(MAX_PRODUCE_TIME_MS),
        start_offsets=(
            decode_offsets(properties[START_OFFSETS], START_OFFSETS) if START_OFFSETS in properties else {}
        ),
        lost_records=lost,
        deleted_keys=properties.get(DELETED_KEYS),
    )


@dataclass(frozen=True)
class SchemaChange:
    """A schema change ingestion made: the schema it made current, and the offsets committed then."""

    schema_id: int
    offsets: Mapping[int, int]


def schema_changes(properties: Mapping[str, str]) -> list[SchemaChange]:
    """The schema changes `SCHEMA_CHANGES` records, oldest first."""
    try:
        entries = json.loads(properties.get(SCHEMA_CHANGES, "[]"))
        return [
            SchemaChange(int(e["schema-id"]), {int(p): int(o) for p, o in e["offsets"].items()})
            for e in entries
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptStateError(f"{SCHEMA_CHANGES} is not a list of schema changes: {error}") from error


def with_schema_change(properties: Mapping[str, str], change: SchemaChange) -> str:
    """`SCHEMA_CHANGES` with `change` added (the newest `MAX_SCHEMA_CHANGES_KEPT` kept)."""
    entries = [
        {"schema-id": c.schema_id, "offsets": {str(p): o for p, o in sorted(c.offsets.items())}}
        for c in [*schema_changes(properties), change][-MAX_SCHEMA_CHANGES_KEPT:]
    ]
    return json.dumps(entries, separators=(",", ":"))


def reset_recorded(properties: Mapping[str, str], request: str) -> bool:
    """Whether `OFFSET_RESETS` records a reset made for the cluster request `request`
    (`icefall.plan.offset_reset`)."""
    try:
        history = json.loads(properties.get(OFFSET_RESETS, "[]"))
    except ValueError:
        return False
    return isinstance(history, list) and any(
        isinstance(entry, dict) and entry.get("request") == request for entry in history
    )


def state_of(metadata: TableMetadata) -> CommittedState:
    ref = metadata.refs.get(MAIN)
    return state_from_properties(metadata.properties, ref.snapshot_id if ref else None)


def read_committed(table: Table) -> CommittedState:
    """Refresh `table` from its catalog and return its committed state: where ingestion resumes."""
    table.refresh()
    return state_of(table.metadata)


def committed_at(table: Table, snapshot_id: int) -> CommittedState | None:
    """The committed state of the table when `main` was at `snapshot_id` (as loaded: no refresh), or None
    when no metadata file kept by the table shows `main` there.

    The `icefall.*` properties change only in the metadata commit that moves `main` (DESIGN.md), so every
    metadata file whose `main` is at `snapshot_id` holds the same ones: the offsets of exactly the records
    that snapshot holds. They are found in the current metadata or the files of its metadata log, newest
    first; the table keeps `write.metadata.previous-versions-max` of them (about two per batch), so an
    older snapshot's state is gone even while the snapshot itself is still there.
    """
    from pyiceberg.serializers import FromInputFile

    if state_of(table.metadata).snapshot_id == snapshot_id:
        return state_of(table.metadata)
    for entry in reversed(table.metadata.metadata_log):
        try:
            metadata = FromInputFile.table_metadata(table.io.new_input(entry.metadata_file))
        except (FileNotFoundError, OSError):
            continue  # deleted with write.metadata.delete-after-commit.enabled
        state = state_of(metadata)
        if state.snapshot_id == snapshot_id:
            return state
    return None
