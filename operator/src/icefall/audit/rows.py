"""What the audit compares, as pyarrow: the rows of a table and the offsets a topic holds.

`ContentSource` (rows and records by content: `icefall.audit.content.SparkContent`) and `TopicOffsets` (the
offsets a topic holds: `icefall.audit.kafka.KafkaTopic`, or `RecordedTopic` in tests) are the two sides;
`read_rows` reads a table's rows as `ROW_SCHEMA`, and `after_last_reset` sets aside the rows committed
before the table's last offset reset (`icefall.audit.table`'s docstring, "Offset resets"). Offsets are
sorted int64 arrays throughout.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table.snapshots import ancestors_of

from icefall.commit.protocol import RESET_PROPERTY, RESET_TOPIC_PROPERTY, table_name
from icefall.commit.state import MAIN, OFFSET_RESETS

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

KAFKA_COLUMN = "_kafka"
OFFSETS = pa.int64()
#: What re-decoding says a record should have become (`ContentSource.expected`'s `kind` column); a record
#: in the range but absent from `expected` was dropped by `spec.transforms.filter`.
FILTERED, GOOD, DEAD_LETTER = 0, 1, 2
#: A routed table's record that another destination takes (`icefall.audit.routed`): in no row of this one.
ELSEWHERE = 3
#: The columns `ContentSource` returns: rows of a table, and the records of the topic re-decoded.
ROW_SCHEMA = pa.schema([("partition", pa.int64()), ("offset", pa.int64()), ("digest", pa.int64())])
EXPECTED_SCHEMA = pa.schema(
    [("partition", pa.int64()), ("offset", pa.int64()), ("kind", pa.int8()), ("digest", pa.int64())]
)


class AuditError(RuntimeError):
    """The audit could not be carried out (as opposed to a table that fails it)."""


class TopicOffsets(Protocol):
    """The Kafka side of an audit: which offsets a topic's partitions hold."""

    @property
    def topic(self) -> str | None:
        """The topic's name, checked against the table's `icefall.topic` (None: not checked)."""
        ...

    @property
    def topic_id(self) -> str | None:
        """The topic's id, checked against the table's `icefall.topic-id` (None: not checked)."""
        ...

    def watermarks(self, partition: int) -> tuple[int, int] | None:
        """(low, high): the earliest offset held and the next one to be written; None if no such partition."""
        ...

    def offsets(self, partition: int, start: int, end: int) -> Iterable[int]:
        """The offsets of the records present in `[start, end)`, ascending (a pyarrow int64 Array is fine)."""
        ...


class ContentSource(Protocol):
    """Rows and records by content (`icefall.audit.content.SparkContent`): one int64 digest per row.

    A main-table row's digest covers every column but `_kafka.partition`/`_kafka.offset` (so the Kafka
    timestamp too); a dead-letter row's covers the record's key, value, timestamp and headers. `expected`
    decodes the topic's records with the table's spec exactly as ingestion does and digests what each one
    must have become, the same way: `kind` GOOD (a main-table row), DEAD_LETTER, or FILTERED (dropped by
    `spec.transforms.filter`; digest null).
    """

    def main_rows(self, table: Table, snapshot_id: int, *, topic: str | None = None) -> pa.Table:
        """`ROW_SCHEMA` for every row of the main table at `snapshot_id` (of `topic` only, if given: a
        table of several topics)."""
        ...

    def dead_letter_rows(self, table: Table, snapshot_id: int, *, topic: str | None = None) -> pa.Table:
        """`ROW_SCHEMA` for every row of the dead-letter table at `snapshot_id` (of `topic` only, if
        given)."""
        ...

    def expected(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
        """`EXPECTED_SCHEMA` for the records of `topic` in `[start, end)` per partition (read_committed)."""
        ...


class RecordedTopic:
    """A topic described by the offsets it holds, per partition (low watermarks default to 0)."""

    def __init__(
        self,
        records: Mapping[int, Iterable[int]],
        low_watermarks: Mapping[int, int] | None = None,
        topic: str | None = None,
        topic_id: str | None = None,
    ) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self._offsets: dict[int, Any] = {int(p): as_offsets(o) for p, o in records.items()}
        self._low = dict(low_watermarks or {})

    def watermarks(self, partition: int) -> tuple[int, int] | None:
        offsets = self._offsets.get(partition)
        if offsets is None:
            return None
        high = int(pc.max(offsets).as_py()) + 1 if len(offsets) else 0
        return self._low.get(partition, 0), high

    def offsets(self, partition: int, start: int, end: int) -> Iterable[int]:
        offsets = self._offsets.get(partition, pa.array([], OFFSETS))
        return offsets_between(offsets, start, end)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Reset:
    """How the audit sets aside a table's rows from before its last offset reset (`icefall reset-offsets`)."""

    happened: bool = False
    snapshot_id: int | None = None  # the reset's empty snapshot: every row there is the old topic's
    before: Mapping[int, int] = field(default_factory=dict)  # rows set aside per partition
    # Reset snapshot expired: rows below these offsets cannot be told apart, so are set aside unaudited.
    audit_from: Mapping[int, int] = field(default_factory=dict)
    note: str | None = None


def empty_rows() -> pa.Table:
    return ROW_SCHEMA.empty_table()


def read_rows(
    table: Table,
    snapshot_id: int | None,
    content: ContentSource | None,
    *,
    dead_letters: bool,
    topic: str | None = None,
) -> tuple[pa.Table, int]:
    """`ROW_SCHEMA` rows of `table` at `snapshot_id` (digests null without `content`; of `topic` only, if
    given: a table of several topics), and the count of rows lacking a partition or offset."""
    if snapshot_id is None:
        return empty_rows(), 0
    if content is not None:
        read = content.dead_letter_rows if dead_letters else content.main_rows
        rows = read(table, snapshot_id, topic=topic).cast(ROW_SCHEMA)
    else:
        prefix = "" if dead_letters else f"{KAFKA_COLUMN}."
        partition_field, offset_field = f"{prefix}partition", f"{prefix}offset"
        fields = (partition_field, offset_field, *((f"{prefix}topic",) if topic is not None else ()))
        for name in fields:
            if table.schema().find_field(name, case_sensitive=True) is None:
                raise AuditError(f"{table_name(table)} has no column {name}: not a table written by icefall")
        columns = table.scan(selected_fields=fields, snapshot_id=snapshot_id).to_arrow().flatten()
        if topic is not None:
            columns = columns.filter(pc.equal(columns.column(f"{prefix}topic"), topic))
        rows = pa.table(
            {
                "partition": columns.column(partition_field).cast(pa.int64()),
                "offset": columns.column(offset_field).cast(OFFSETS),
                "digest": pa.nulls(columns.num_rows, pa.int64()),
            }
        )
    complete = rows.filter(pc.and_(pc.is_valid(rows.column("partition")), pc.is_valid(rows.column("offset"))))
    return complete, rows.num_rows - complete.num_rows


def after_last_reset(
    table: Table,
    meta: TableMetadata,
    rows: pa.Table,
    content: ContentSource | None,
    *,
    dead_letters: bool,
    topic: str | None = None,
) -> tuple[pa.Table, Reset]:
    """`rows` without those committed before the table's last offset reset, and how they were set aside.

    The reset's snapshot (an empty append, summary `icefall.offset-reset`) holds exactly the rows of the old
    topic(s): they are taken away as a multiset of (partition, offset, digest), so compaction since the
    reset changes nothing. If that snapshot was expired, rows below the highest old committed offset
    cannot be told from the new topic's and are set aside unaudited (`audit_from`). With `topic` (a table of
    several topics): the resets of that topic only, each a snapshot of its own.
    """
    history = [
        entry
        for entry in json.loads(meta.properties.get(OFFSET_RESETS, "[]"))
        if topic is None or entry.get("topic") == topic
    ]
    if not history:
        return rows, Reset()
    last = history[-1]
    head = meta.refs.get(MAIN)
    found = None
    if head is not None:
        # The reset's own snapshot: in a table of several topics, the last one that names the topic.
        for snapshot in ancestors_of(meta.snapshot_by_id(head.snapshot_id), meta):
            summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
            if RESET_PROPERTY in summary and (topic is None or summary.get(RESET_TOPIC_PROPERTY) == topic):
                found = snapshot.snapshot_id
                break
    which = (
        f"{table_name(table)}: rows committed before the offset reset ({last.get('reason')}, topic id "
        f"{last.get('from_topic_id')} -> {last.get('to_topic_id')})"
    )
    if found is not None:
        old, _ = read_rows(table, found, content, dead_letters=dead_letters, topic=topic)
        kept, removed = subtract(rows, old)
        before = {
            int(p): len(removed.filter(pc.equal(removed.column("partition"), p)))
            for p in partitions_of(removed)
        }
        note = f"{which} are the old topic's: {removed.num_rows} set aside, not audited"
        return kept, Reset(happened=True, snapshot_id=found, before=before, note=note)
    audit_from: dict[int, int] = {}
    for entry in history:
        for p, o in entry.get("from_offsets", {}).items():
            audit_from[int(p)] = max(audit_from.get(int(p), 0), int(o))
    note = (
        f"{which}: its snapshot was expired, so offsets below {audit_from} (the old committed ones) "
        "cannot be told apart and are not audited"
    )
    return rows, Reset(happened=True, audit_from=audit_from, note=note)


def subtract(rows: pa.Table, old: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows minus old, the rows taken away), as multisets of (partition, offset, digest)."""
    keys = ["partition", "offset", "digest"]

    def counted(t: pa.Table) -> pa.Table:
        filled = t.set_column(2, "digest", pc.fill_null(t.column("digest"), 0))
        return filled.group_by(keys).aggregate([([], "count_all")])

    if old.num_rows == 0 or rows.num_rows == 0:
        return rows, empty_rows()
    before = counted(old).rename_columns([*keys, "old_count"])
    joined = counted(rows).join(before, keys=keys, join_type="left outer")
    count = joined.column("count_all")
    keep = pc.max_element_wise(pc.subtract(count, pc.fill_null(joined.column("old_count"), 0)), 0)
    removed = pc.subtract(count, keep)
    base = joined.select(keys)

    def repeated(times: Any) -> pa.Table:
        indices = array("q")
        for index, n in enumerate(times.to_pylist()):
            indices.extend([index] * n)
        return base.take(pa.array(indices, pa.int64())).cast(ROW_SCHEMA)

    return repeated(keep), repeated(removed)


def split_before(offsets: Any, reset: Reset, partition: int) -> tuple[Any, int]:
    """(offsets from where the audit starts, how many rows of this partition were set aside by the reset)."""
    before = reset.before.get(partition, 0)
    cut = reset.audit_from.get(partition)
    if cut is None:
        return offsets, before
    below = count_true(pc.less(offsets, cut))
    return offsets.filter(pc.greater_equal(offsets, cut)), before + below


def partitions_of(rows: pa.Table) -> list[int]:
    return sorted(int(p) for p in pc.unique(rows.column("partition")).to_pylist())


def offsets_of(rows: pa.Table, partition: int) -> Any:
    mask = pc.equal(rows.column("partition"), partition)
    return rows.filter(mask).column("offset").combine_chunks().cast(OFFSETS).sort()


def as_offsets(offsets: Iterable[int]) -> Any:
    array = offsets if isinstance(offsets, pa.Array) else pa.array(list(offsets), OFFSETS)
    return array.cast(OFFSETS).sort()


def offsets_between(offsets: Any, start: int, end: int) -> Any:
    return offsets.filter(pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))


def count_true(mask: Any) -> int:
    return int(pc.sum(mask).as_py() or 0)


def first_offsets(offsets: Any, limit: int) -> tuple[int, ...]:
    return tuple(int(o) for o in offsets.slice(0, limit).to_pylist())
