"""The table auditor: does the table hold every committed Kafka record once, as it should? (`icefall verify`)

For each partition the audited range is `[start, committed end)`: the end is the table's committed next
offset (`icefall.offsets`, read with `read_committed`), the start is where ingestion began (the
`icefall.start-offsets` property ingestion sets on its first commit and every offset reset; 0 for
partitions absent from it). The records Kafka still holds in that range are compared with the main table's
rows (`_kafka.partition`, `_kafka.offset`) and the dead-letter table's rows (`partition`, `offset`):

- duplicate: an offset that appears more than once across the table and the DLQ (twice in the table, or in
  both); reported as offsets, and as `duplicate_rows` (rows beyond the first per offset);
- wrong (by content, below): a row whose content is not what its record decodes to; named by offset;
- missing: in Kafka, in neither table, and not dropped by the spec's filter;
- unexpected: in a table but below the range start, at or beyond the committed end, or inside the range
  where Kafka holds no such record (e.g. rows of a batch that was never committed);
- lost to retention: the range start lies below Kafka's low watermark, so `[start, low)` can no longer be
  compared with Kafka; rows there are counted as `unverified`, and only checked for duplicates. The
  table's own count, `icefall.lost-records`, is cross-checked: it cannot exceed the offsets below the low
  watermark that are in neither table (`lost_records_problem` otherwise).

By content (`content=`, a `ContentSource`; `icefall.audit_content.SparkContent` is what `icefall verify`
uses): the records of the range are decoded again with the StreamingTable's spec, as ingestion decodes them,
and each row's digest is compared with its record's. A main-table row must be the record's good row
(columns and Kafka timestamp), a dead-letter row the record's key, value, timestamp and headers; a row in
the table for a record that decodes as a dead letter or that the filter drops is wrong too. The filter is
evaluated again, so only records it drops count as `filtered`; without a dead-letter table, records that
decode as dead letters count as `dead_letters_elsewhere` (sent to the dead-letter topic, or nowhere).
Without `content` only offsets are compared and, with `filter_configured=True`, every absent record is
taken for a filtered one.

Offset resets (`icefall reset-offsets`, after a topic was deleted and created again): rows of the old and
the new topic can share offsets. Chosen: the audit uses the reset history (`icefall.offset-resets`) rather
than a per-row topic id column. Adding `_kafka.topic_id` would change the schema of every existing table,
which `ensure_tables` refuses (no schema evolution yet), and every writer, reader and test of the `_kafka`
layout. Instead the reset's own snapshot on `main` (an empty append, summary `icefall.offset-reset`) holds
exactly the rows committed before the reset: those are taken away from the audited rows as a multiset of
(partition, offset, digest), which compaction since the reset does not change, and only the rows committed
after the last reset are audited against the current topic (`before_reset` counts the others, and the
report says so). If that snapshot was expired, the rows below the old committed offsets cannot be told
apart and are set aside unaudited, together with the new topic's records at those offsets (`reset_note`).

The main table is read at `main`'s head from the same metadata the committed offsets were read from, so an
ingestion commit racing the audit cannot show up as unexpected rows. The dead-letter table is read after
it and cut at the same committed offsets: ingestion commits a batch's dead letters before the batch
itself (and drops them again if the main commit fails, `reconcile_dead_letters`), so every dead letter of
the main table's batches is there, and DLQ rows at or past the committed end (`dlq_ahead`) belong to a
batch not committed yet: unexpected in a stopped table, reported without failing with `ingesting=True`.
Offset comparisons are vectorised pyarrow kernels; digests are computed by Spark.

Not guaranteed:
- on compacted topics, records Kafka no longer shows (compacted away after ingestion) count as unexpected
  when the table holds them;
- records deleted by retention before they were audited are only counted, never compared;
- a spec changed since the rows were written (schema, select, filter) makes those rows wrong: audit with the
  spec the table was filled with; a 64-bit digest can collide (a changed row then passes, with negligible
  probability).
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyiceberg.table.snapshots import ancestors_of

from icefall.commit import read_committed
from icefall.commit.protocol import RESET_PROPERTY
from icefall.commit.state import MAIN, OFFSET_RESETS, CommittedState
from icefall.kafka.admin import ISOLATION, TopicView

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

KAFKA_COLUMN = "_kafka"
DLQ_SUFFIX = "_dlq"
MAX_EXAMPLES = 10

_OFFSETS = pa.int64()
#: What re-decoding says a record should have become (`ContentSource.expected`'s `kind` column); a record
#: in the range but absent from `expected` was dropped by `spec.transforms.filter`.
FILTERED, GOOD, DEAD_LETTER = 0, 1, 2
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
    """Rows and records by content (`icefall.audit_content.SparkContent`): one int64 digest per row.

    A main-table row's digest covers every column but `_kafka.partition`/`_kafka.offset` (so the Kafka
    timestamp too); a dead-letter row's covers the record's key, value, timestamp and headers. `expected`
    decodes the topic's records with the table's spec exactly as ingestion does and digests what each one
    must have become, the same way: `kind` GOOD (a main-table row), DEAD_LETTER, or FILTERED (dropped by
    `spec.transforms.filter`; digest null).
    """

    def main_rows(self, table: Table, snapshot_id: int) -> pa.Table:
        """`ROW_SCHEMA` for every row of the main table at `snapshot_id`."""
        ...

    def dead_letter_rows(self, table: Table, snapshot_id: int) -> pa.Table:
        """`ROW_SCHEMA` for every row of the dead-letter table at `snapshot_id`."""
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
        self._offsets: dict[int, Any] = {int(p): _as_offsets(o) for p, o in records.items()}
        self._low = dict(low_watermarks or {})

    def watermarks(self, partition: int) -> tuple[int, int] | None:
        offsets = self._offsets.get(partition)
        if offsets is None:
            return None
        high = int(pc.max(offsets).as_py()) + 1 if len(offsets) else 0
        return self._low.get(partition, 0), high

    def offsets(self, partition: int, start: int, end: int) -> Iterable[int]:
        offsets = self._offsets.get(partition, pa.array([], _OFFSETS))
        return _between(offsets, start, end)  # type: ignore[no-any-return]


class KafkaTopic:
    """A live topic, read with a consumer assigned to explicit offsets (never a group, never a commit).

    `config` is added to the consumer's configuration (security settings, ...); reads are always
    `read_committed`, as ingestion's. Reading
    stops at the range's end, at the high watermark, or at the end of the partition, so gaps in the offsets
    (transaction markers, aborted or compacted records) are fine. `timeout` bounds a wait without progress.
    """

    def __init__(
        self, bootstrap: str, topic: str, *, config: Mapping[str, Any] | None = None, timeout: float = 30
    ) -> None:
        self.topic = topic
        self._timeout = timeout
        settings = {
            "bootstrap.servers": bootstrap,
            "group.id": "icefall-audit",  # required by the client; never joined, never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # records deleted while we read: fail, do not skip silently
            # A fetch left waiting on a partition we moved off would hold up the next one (500 ms default).
            "fetch.wait.max.ms": 50,
            "log_level": 0,  # a broker down is an exception to the caller, not a log line every backoff
            **(config or {}),
            **ISOLATION,  # what ingestion reads: aborted transactions are not records of the topic
        }
        self._view = TopicView(bootstrap, topic, config)
        self._consumer = Consumer(settings)
        self._marks: dict[int, tuple[int, int]] | None = None
        self._topic_id: str | None = None

    @property
    def topic_id(self) -> str:
        if self._topic_id is None:
            self._topic_id = self._view.topic_id(timeout=self._timeout)
        return self._topic_id

    def watermarks(self, partition: int) -> tuple[int, int] | None:
        if self._marks is None:
            self._marks = self._view.watermarks(timeout=self._timeout)
        return self._marks.get(partition)

    def offsets(self, partition: int, start: int, end: int) -> Iterable[int]:
        marks = self.watermarks(partition)
        if marks is None:
            return []
        low, high = marks
        begin, stop = max(start, low), min(end, high)
        if begin >= stop:
            return []
        found = array("q")  # 8 bytes an offset; handed to Arrow without a copy
        self._consumer.assign([TopicPartition(self.topic, partition, begin)])
        try:
            deadline = time.monotonic() + self._timeout
            while True:
                # consume() waits until the batch is full or the wait ends: keep the wait short.
                messages = self._consumer.consume(num_messages=10_000, timeout=0.05)
                if not messages and time.monotonic() > deadline:
                    position = found[-1] + 1 if found else begin
                    raise AuditError(
                        f"no progress reading {self.topic} partition {partition} at offset {position} "
                        f"for {self._timeout}s (reading up to {stop})"
                    )
                if messages:
                    deadline = time.monotonic() + self._timeout
                if self._take(messages, partition, found, stop):
                    break
        finally:
            self._consumer.unassign()
        return pa.Array.from_buffers(_OFFSETS, len(found), [None, pa.py_buffer(found)])  # type: ignore[no-any-return]

    def _take(self, messages: list[Any], partition: int, found: array[int], stop: int) -> bool:
        """Append the offsets below `stop`; True once the range is done."""
        for message in messages:
            if message.partition() != partition:
                continue  # left over from an earlier assignment
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return True
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise AuditError(
                        f"Kafka deleted records of {self.topic} partition {partition} while they were "
                        f"being audited (retention); audit again ({error.str()})"
                    )
                raise KafkaException(error)
            offset = int(message.offset())
            if offset >= stop:
                return True
            found.append(offset)
        return bool(found) and found[-1] >= stop - 1

    def close(self) -> None:
        self._consumer.close()
        self._view.close()

    def __enter__(self) -> KafkaTopic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class PartitionAudit:
    """The audit of one partition. Counts are offsets, except `in_table`, `in_dlq`, `duplicate_rows`
    and `before_reset`, which count rows."""

    partition: int
    start: int  # first offset of the audited range (where ingestion started, or the last offset reset)
    committed: int  # the committed next offset: the range's end
    low_watermark: int | None  # Kafka's earliest offset held; None if Kafka has no such partition
    high_watermark: int | None
    expected: int  # records Kafka holds in [max(start, low), committed)
    in_table: int  # rows of this partition in the main table (all of them)
    in_dlq: int  # rows of this partition in the dead-letter table
    in_table_and_dlq: int  # offsets in both (each also counts as a duplicate)
    duplicates: int  # offsets present more than once across table and DLQ
    duplicate_rows: int  # rows beyond the first for each such offset
    missing: int  # in Kafka, in neither table, and not dropped by the spec's filter
    filtered: int  # in Kafka, in neither table, and dropped by the spec's filter (re-evaluated)
    unexpected: int  # offsets in a table outside the range, or inside it but not in Kafka
    lost_to_retention: int  # offsets in [start, low): deleted by Kafka, cannot be compared
    unverified: int  # offsets in a table inside [start, low): counted, not compared
    dlq_ahead: int = 0  # DLQ rows at or past the committed end (unexpected unless `ingesting`)
    duplicate_examples: tuple[int, ...] = ()
    missing_examples: tuple[int, ...] = ()  # missing, or with a filter configured, filtered offsets
    unexpected_examples: tuple[int, ...] = ()
    # Offsets whose rows are not what their Kafka record decodes to (by content audits only): a changed
    # value, a row in the table for a record that is a dead letter or filtered out, or the reverse.
    wrong: int = 0
    wrong_examples: tuple[int, ...] = ()
    dead_letters_elsewhere: int = 0  # dead letters with no dead-letter table (sent to the topic, or none)
    before_reset: int = 0  # rows committed before the last offset reset: of the old topic, not audited
    absent_below_low: int = 0  # offsets in [start, low) in neither table (lost-records cross-check)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.unexpected == 0 and self.missing == 0 and self.wrong == 0

    @property
    def result(self) -> str:
        """A few words for the report's last column."""
        problems = [
            f"{n} {what}"
            for n, what in (
                (self.duplicates, "duplicated"),
                (self.missing, "missing"),
                (self.unexpected, "unexpected"),
                (self.wrong, "wrong"),
            )
            if n
        ]
        notes = [
            f"{n} {what}"
            for n, what in (
                (self.filtered, "filtered"),
                (self.lost_to_retention, "lost to retention"),
                (self.before_reset, "rows before the offset reset"),
                (self.dead_letters_elsewhere, "dead letters not in a table"),
            )
            if n
        ]
        if problems:
            return "FAIL: " + ", ".join(problems + notes)
        return "ok" + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class AuditReport:
    table: str
    dlq_table: str | None
    topic: str | None  # the table's icefall.topic
    snapshot_id: int | None  # main's head the audit read
    filter_configured: bool
    ingesting: bool
    partitions: tuple[PartitionAudit, ...]
    rows_without_offset: int = 0  # rows whose partition or offset is null (in either table)
    # Why the table cannot be compared with the topic at all (it was recreated): a failed audit.
    source_changed: str | None = None
    content_checked: bool = False  # rows compared with their records by content, not only by offset
    lost_records: int = 0  # the table's `icefall.lost-records`
    lost_records_problem: str | None = None  # the cross-check of `lost_records` failed: why
    reset_note: str | None = None  # how rows from before the last offset reset were told apart

    @property
    def ok(self) -> bool:
        return (
            self.source_changed is None
            and self.lost_records_problem is None
            and self.rows_without_offset == 0
            and all(p.ok for p in self.partitions)
        )

    @property
    def wrong(self) -> int:
        return sum(p.wrong for p in self.partitions)

    @property
    def duplicates(self) -> int:
        return sum(p.duplicates for p in self.partitions)

    @property
    def missing(self) -> int:
        return sum(p.missing for p in self.partitions)

    @property
    def filtered(self) -> int:
        return sum(p.filtered for p in self.partitions)

    @property
    def unexpected(self) -> int:
        return sum(p.unexpected for p in self.partitions)

    def partition(self, partition: int) -> PartitionAudit:
        for audit in self.partitions:
            if audit.partition == partition:
                return audit
        raise KeyError(partition)

    def render(self) -> str:
        """A short human-readable report: one line per partition, then examples of what went wrong."""
        dlq = f" + {self.dlq_table}" if self.dlq_table else " (no DLQ table)"
        how = "by content" if self.content_checked else "by offset only"
        lines = [
            f"{self.table}{dlq} vs topic {self.topic or '?'} at snapshot {self.snapshot_id}, {how}: "
            + ("OK" if self.ok else "FAILED")
        ]
        header = ("partition", "committed", "kafka", "table", "dlq", "dup", "missing", "result")
        rows = [
            (
                str(p.partition),
                str(p.committed),
                str(p.expected),
                str(p.in_table),
                str(p.in_dlq),
                str(p.duplicates),
                str(p.missing),
                p.result,
            )
            for p in self.partitions
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        for row in [header, *rows]:
            cells = [cell.rjust(width) for cell, width in zip(row[:-1], widths, strict=True)]
            lines.append("  ".join([*cells, row[-1]]))
        for p in self.partitions:
            for what, examples in (
                ("duplicated offsets", p.duplicate_examples),
                (
                    "filtered offsets"
                    if self.filter_configured and not self.content_checked
                    else "missing offsets",
                    p.missing_examples,
                ),
                ("unexpected offsets", p.unexpected_examples),
                ("wrong rows (content differs from the Kafka record) at offsets", p.wrong_examples),
            ):
                if examples:
                    lines.append(f"partition {p.partition}: {what} {', '.join(map(str, examples))}")
            if self.ingesting and p.dlq_ahead:
                lines.append(
                    f"partition {p.partition}: {p.dlq_ahead} dead-letter rows past the committed end "
                    "(a batch whose main commit has not landed)"
                )
        if self.rows_without_offset:
            lines.append(f"{self.rows_without_offset} rows have no Kafka partition or offset")
        if self.lost_records:
            lines.append(
                f"icefall.lost-records: {self.lost_records} records deleted by retention before ingestion"
            )
        if self.lost_records_problem:
            lines.append(self.lost_records_problem)
        if self.reset_note:
            lines.append(self.reset_note)
        if self.source_changed:
            lines.append(self.source_changed)
        return "\n".join(lines)


def audit_table(
    main_table: Table,
    dlq_table: Table | None,
    topic: TopicOffsets | Mapping[int, Iterable[int]],
    *,
    content: ContentSource | None = None,
    filter_configured: bool = False,
    ingesting: bool = False,
    max_examples: int = MAX_EXAMPLES,
) -> AuditReport:
    """Audit `main_table` (and its dead-letter table) against the records `topic` holds.

    `topic` is a `TopicOffsets` (`KafkaTopic` for a live topic), or a mapping of partition to the offsets
    Kafka holds (low watermarks 0). `content` compares every row with its record (`SparkContent`); without
    it only offsets are compared, and `filter_configured` says whether absent records count as filtered
    (the spec has a filter) instead of missing. `ingesting`: ingestion may be running, so dead letters past
    the committed end are pending, not unexpected. Raises AuditError if the table was filled from another
    topic.
    """
    source: TopicOffsets = RecordedTopic(topic) if isinstance(topic, Mapping) else topic
    state = read_committed(main_table)  # refreshes: properties and head come from one metadata version
    if source.topic is not None and state.topic is not None and source.topic != state.topic:
        raise AuditError(
            f"table {_name(main_table)} is filled from topic {state.topic!r}, not {source.topic!r}"
        )
    report = AuditReport(
        table=_name(main_table),
        dlq_table=_name(dlq_table) if dlq_table is not None else None,
        topic=state.topic,
        snapshot_id=state.snapshot_id,
        filter_configured=filter_configured,
        ingesting=ingesting,
        partitions=(),
        content_checked=content is not None,
        lost_records=state.lost_records,
    )
    if None not in (state.topic_id, source.topic_id) and state.topic_id != source.topic_id:
        return replace(
            report,
            source_changed=(
                f"topic {state.topic!r} was deleted and created again (the table's offsets belong to topic "
                f"id {state.topic_id}, Kafka's topic is {source.topic_id}): its records cannot be compared; "
                "`icefall reset-offsets` goes on with the new topic"
            ),
        )
    main_meta = main_table.metadata
    main_rows, main_nulls = _rows(main_table, state.snapshot_id, content, dead_letters=False)
    main_rows, main_reset = _after_last_reset(main_table, main_meta, main_rows, content, dead_letters=False)
    dlq_rows, dlq_nulls, dlq_reset = _empty_rows(), 0, _Reset()
    if dlq_table is not None:
        # Read after the main table: the dead letters of every batch main holds are committed by then
        # (they land first). Rows past main's committed offsets are cut off below (`dlq_ahead`).
        dlq_state = read_committed(dlq_table)
        dlq_rows, dlq_nulls = _rows(dlq_table, dlq_state.snapshot_id, content, dead_letters=True)
        dlq_rows, dlq_reset = _after_last_reset(
            dlq_table, dlq_table.metadata, dlq_rows, content, dead_letters=True
        )
    starts = {p: max(o, main_reset.audit_from.get(p, 0)) for p, o in state.start_offsets.items()}
    for p, o in main_reset.audit_from.items():
        starts.setdefault(p, o)

    partitions = sorted(set(state.offsets) | set(_partitions(main_rows)) | set(_partitions(dlq_rows)))
    ranges: dict[int, tuple[int, int]] = {}
    marks_of: dict[int, tuple[int, int] | None] = {}
    for partition in partitions:
        committed = state.offsets.get(partition, 0)
        start = min(starts.get(partition, 0), committed)
        marks = marks_of[partition] = source.watermarks(partition)
        if marks is not None and max(start, marks[0]) < min(committed, marks[1]):
            ranges[partition] = (max(start, marks[0]), min(committed, marks[1]))
    expected = (
        content.expected(state.topic, ranges) if content is not None and state.topic and ranges else None
    )
    wrong = _wrong_rows(main_rows, dlq_rows, expected) if expected is not None else {}

    audits = []
    empty = pa.array([], _OFFSETS)
    for partition in partitions:
        committed = state.offsets.get(partition, 0)
        start = min(starts.get(partition, 0), committed)
        marks = marks_of[partition]
        main_p, main_before = _split_before(_offsets_of(main_rows, partition), main_reset, partition)
        dlq_p, dlq_before = _split_before(_offsets_of(dlq_rows, partition), dlq_reset, partition)
        audits.append(
            _audit_partition(
                partition,
                start,
                committed,
                marks,
                kafka=_as_offsets(source.offsets(partition, start, committed))
                if marks is not None
                else empty,
                table=main_p,
                dlq=dlq_p,
                expected=_expected_of(expected, partition),
                wrong=wrong.get(partition, empty),
                has_dlq_table=dlq_table is not None,
                before_reset=main_before + dlq_before,
                filter_configured=filter_configured,
                ingesting=ingesting,
                max_examples=max_examples,
            )
        )
    notes = [n for n in (main_reset.note, dlq_reset.note) if n]
    return replace(
        report,
        partitions=tuple(audits),
        rows_without_offset=main_nulls + dlq_nulls,
        lost_records_problem=_check_lost_records(state, audits, reset=main_reset.happened),
        reset_note="; ".join(notes) or None,
    )


def dlq_identifier(identifier: str) -> str:
    """The dead-letter table of a table: `<table>_dlq` in the same namespace."""
    return f"{identifier}{DLQ_SUFFIX}"


def audit_from_catalog(
    catalog: Catalog,
    identifier: str,
    bootstrap: str,
    *,
    dead_letter: str | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    content: ContentSource | None = None,
    filter_configured: bool = False,
    ingesting: bool = False,
    timeout: float = 30,
) -> AuditReport:
    """Load `identifier` and its dead-letter table and audit them against the live topic.

    `dead_letter` names the dead-letter table (`spec.deadLetter.table`); by default `<identifier>_dlq`,
    audited if it exists.
    """
    table = catalog.load_table(identifier)
    topic = read_committed(table).topic
    if topic is None:
        raise AuditError(f"table {identifier} has no icefall.topic: nothing was ever ingested into it")
    dlq: Table | None
    if dead_letter is not None:
        dlq = catalog.load_table(dead_letter)
    else:
        default = dlq_identifier(identifier)
        dlq = catalog.load_table(default) if catalog.table_exists(default) else None
    with KafkaTopic(bootstrap, topic, config=kafka_config, timeout=timeout) as source:
        return audit_table(
            table, dlq, source, content=content, filter_configured=filter_configured, ingesting=ingesting
        )


# --- the comparison ----------------------------------------------------------------------------------------


def _audit_partition(
    partition: int,
    start: int,
    committed: int,
    marks: tuple[int, int] | None,
    *,
    kafka: Any,
    table: Any,
    dlq: Any,
    expected: pa.Table | None,
    wrong: Any,
    has_dlq_table: bool,
    before_reset: int,
    filter_configured: bool,
    ingesting: bool,
    max_examples: int,
) -> PartitionAudit:
    """Compare sorted int64 offset arrays: Kafka's in the range, the table's and the DLQ's (all rows).

    `expected` (by content audits): this partition's re-decoded records (`offset`, `kind`); `wrong`: the
    offsets whose rows differ from them.
    """
    low, high = marks if marks is not None else (None, None)
    verify_from = max(start, low) if low is not None else start
    kafka = pc.unique(_between(kafka, verify_from, committed))
    in_dlq = len(dlq)
    dlq_ahead = _count(pc.greater_equal(dlq, committed))
    if ingesting:  # a batch's dead letters, committed before the batch: not part of the committed state
        dlq = dlq.filter(pc.less(dlq, committed))

    rows = pa.concat_arrays([table, dlq]).sort()
    if len(rows) > 1:
        repeated = pc.equal(rows.slice(1), rows.slice(0, len(rows) - 1))
        duplicate_rows = int(pc.sum(repeated).as_py() or 0)
        duplicated = pc.unique(rows.slice(1).filter(repeated))
    else:
        duplicate_rows, duplicated = 0, pa.array([], _OFFSETS)
    present = pc.unique(rows)
    both = _count(pc.is_in(pc.unique(dlq), value_set=table)) if len(dlq) and len(table) else 0

    absent = kafka.filter(pc.invert(pc.is_in(kafka, value_set=present)))
    outside = pc.or_(pc.less(present, start), pc.greater_equal(present, committed))
    not_in_kafka = pc.and_(
        pc.greater_equal(present, verify_from), pc.invert(pc.is_in(present, value_set=kafka))
    )
    unexpected = present.filter(pc.or_(outside, not_in_kafka))
    unverified = _count(pc.and_(pc.greater_equal(present, start), pc.less(present, verify_from)))

    elsewhere = 0
    if expected is not None:  # the filter re-evaluated: only records it drops may be absent

        def of_kind(kind: int) -> Any:
            offsets = expected.filter(pc.equal(expected.column("kind"), kind)).column("offset")
            return absent.filter(pc.is_in(absent, value_set=offsets.combine_chunks()))

        filtered = of_kind(FILTERED)
        dropped = filtered
        if not has_dlq_table:  # dead letters went to the topic (or nowhere): not in a table to compare
            sent = of_kind(DEAD_LETTER)
            elsewhere = len(sent)
            dropped = pa.concat_arrays([filtered, sent])
        missing = absent.filter(pc.invert(pc.is_in(absent, value_set=dropped)))
        n_missing, n_filtered = len(missing), len(filtered)
        examples = missing if len(missing) else filtered
    else:
        n_missing, n_filtered = (0, len(absent)) if filter_configured else (len(absent), 0)
        examples = absent
    below_low = max(0, min(verify_from, committed) - start)

    return PartitionAudit(
        partition=partition,
        start=start,
        committed=committed,
        low_watermark=low,
        high_watermark=high,
        expected=len(kafka),
        in_table=len(table),
        in_dlq=in_dlq,
        in_table_and_dlq=both,
        duplicates=len(duplicated),
        duplicate_rows=duplicate_rows,
        missing=n_missing,
        filtered=n_filtered,
        unexpected=len(unexpected),
        lost_to_retention=max(0, verify_from - start),
        unverified=unverified,
        dlq_ahead=dlq_ahead,
        duplicate_examples=_examples(duplicated, max_examples),
        missing_examples=_examples(examples, max_examples),
        unexpected_examples=_examples(unexpected, max_examples),
        wrong=len(wrong),
        wrong_examples=_examples(wrong, max_examples),
        dead_letters_elsewhere=elsewhere,
        before_reset=before_reset,
        absent_below_low=max(0, below_low - unverified),
    )


def _check_lost_records(
    state: CommittedState, audits: Iterable[PartitionAudit], *, reset: bool
) -> str | None:
    """Why `icefall.lost-records` cannot be right, or None.

    Every record counted there was deleted by retention before it was read, so its offset lies below
    Kafka's low watermark now and is in neither table: the table cannot claim more lost records than such
    offsets. (Fewer is fine: transaction markers, filtered records and compacted keys leave gaps too.) After
    an offset reset the count also covers the old topic, so it is not checked.
    """
    if reset or not state.lost_records:
        return None
    absent = sum(a.absent_below_low for a in audits)
    if state.lost_records <= absent:
        return None
    return (
        f"icefall.lost-records says {state.lost_records} records were lost to retention, but only {absent} "
        "offsets below Kafka's low watermarks are in neither table: rows exist for records the table "
        "counts as lost"
    )


# --- reading rows ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reset:
    """How the audit sets aside a table's rows from before its last offset reset (`icefall reset-offsets`)."""

    happened: bool = False
    snapshot_id: int | None = None  # the reset's empty snapshot: every row there is the old topic's
    before: Mapping[int, int] = field(default_factory=dict)  # rows set aside per partition
    # Reset snapshot expired: rows below these offsets cannot be told apart, so are set aside unaudited.
    audit_from: Mapping[int, int] = field(default_factory=dict)
    note: str | None = None


def _empty_rows() -> pa.Table:
    return ROW_SCHEMA.empty_table()


def _rows(
    table: Table, snapshot_id: int | None, content: ContentSource | None, *, dead_letters: bool
) -> tuple[pa.Table, int]:
    """`ROW_SCHEMA` rows of `table` at `snapshot_id` (digests null without `content`), and the count of
    rows lacking a partition or offset."""
    if snapshot_id is None:
        return _empty_rows(), 0
    if content is not None:
        read = content.dead_letter_rows if dead_letters else content.main_rows
        rows = read(table, snapshot_id).cast(ROW_SCHEMA)
    else:
        partition_field, offset_field = (
            ("partition", "offset")
            if dead_letters
            else (f"{KAFKA_COLUMN}.partition", f"{KAFKA_COLUMN}.offset")
        )
        for name in (partition_field, offset_field):
            if table.schema().find_field(name, case_sensitive=True) is None:
                raise AuditError(f"{_name(table)} has no column {name}: not a table written by icefall")
        columns = (
            table.scan(selected_fields=(partition_field, offset_field), snapshot_id=snapshot_id)
            .to_arrow()
            .flatten()
        )
        rows = pa.table(
            {
                "partition": columns.column(partition_field).cast(pa.int64()),
                "offset": columns.column(offset_field).cast(_OFFSETS),
                "digest": pa.nulls(columns.num_rows, pa.int64()),
            }
        )
    complete = rows.filter(pc.and_(pc.is_valid(rows.column("partition")), pc.is_valid(rows.column("offset"))))
    return complete, rows.num_rows - complete.num_rows


def _after_last_reset(
    table: Table, meta: TableMetadata, rows: pa.Table, content: ContentSource | None, *, dead_letters: bool
) -> tuple[pa.Table, _Reset]:
    """`rows` without those committed before the table's last offset reset, and how they were set aside.

    The reset's snapshot (an empty append, summary `icefall.offset-reset`) holds exactly the rows of the old
    topic(s): they are taken away as a multiset of (partition, offset, digest), so compaction since the
    reset changes nothing. If that snapshot was expired, rows below the highest old committed offset
    cannot be told from the new topic's and are set aside unaudited (`audit_from`).
    """
    history = json.loads(meta.properties.get(OFFSET_RESETS, "[]"))
    if not history:
        return rows, _Reset()
    last = history[-1]
    head = meta.refs.get(MAIN)
    found = None
    if head is not None:
        for snapshot in ancestors_of(meta.snapshot_by_id(head.snapshot_id), meta):
            if snapshot.summary is not None and RESET_PROPERTY in snapshot.summary.additional_properties:
                found = snapshot.snapshot_id
                break
    which = (
        f"{_name(table)}: rows committed before the offset reset ({last.get('reason')}, topic id "
        f"{last.get('from_topic_id')} -> {last.get('to_topic_id')})"
    )
    if found is not None:
        old, _ = _rows(table, found, content, dead_letters=dead_letters)
        kept, removed = _subtract(rows, old)
        before = {
            int(p): len(removed.filter(pc.equal(removed.column("partition"), p)))
            for p in _partitions(removed)
        }
        note = f"{which} are the old topic's: {removed.num_rows} set aside, not audited"
        return kept, _Reset(happened=True, snapshot_id=found, before=before, note=note)
    audit_from: dict[int, int] = {}
    for entry in history:
        for p, o in entry.get("from_offsets", {}).items():
            audit_from[int(p)] = max(audit_from.get(int(p), 0), int(o))
    note = (
        f"{which}: its snapshot was expired, so offsets below {audit_from} (the old committed ones) "
        "cannot be told apart and are not audited"
    )
    return rows, _Reset(happened=True, audit_from=audit_from, note=note)


def _subtract(rows: pa.Table, old: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows minus old, the rows taken away), as multisets of (partition, offset, digest)."""
    keys = ["partition", "offset", "digest"]

    def counted(t: pa.Table) -> pa.Table:
        filled = t.set_column(2, "digest", pc.fill_null(t.column("digest"), 0))
        return filled.group_by(keys).aggregate([([], "count_all")])

    if old.num_rows == 0 or rows.num_rows == 0:
        return rows, _empty_rows()
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


def _split_before(offsets: Any, reset: _Reset, partition: int) -> tuple[Any, int]:
    """(offsets from where the audit starts, how many rows of this partition were set aside by the reset)."""
    before = reset.before.get(partition, 0)
    cut = reset.audit_from.get(partition)
    if cut is None:
        return offsets, before
    below = _count(pc.less(offsets, cut))
    return offsets.filter(pc.greater_equal(offsets, cut)), before + below


def _partitions(rows: pa.Table) -> list[int]:
    return sorted(int(p) for p in pc.unique(rows.column("partition")).to_pylist())


def _offsets_of(rows: pa.Table, partition: int) -> Any:
    mask = pc.equal(rows.column("partition"), partition)
    return rows.filter(mask).column("offset").combine_chunks().cast(_OFFSETS).sort()


def _expected_of(expected: pa.Table | None, partition: int) -> pa.Table | None:
    if expected is None:
        return None
    return expected.filter(pc.equal(expected.column("partition"), partition))


def _wrong_rows(main: pa.Table, dlq: pa.Table, expected: pa.Table) -> dict[int, Any]:
    """Per partition, the offsets (sorted, unique) whose rows are not what their record decodes to."""
    want = expected.rename_columns(["partition", "offset", "kind", "expected_digest"])
    found = []
    for rows, kind in ((main, GOOD), (dlq, DEAD_LETTER)):
        if rows.num_rows == 0:
            continue
        joined = rows.join(want, keys=["partition", "offset"], join_type="inner")
        right = pc.and_(
            pc.equal(joined.column("kind"), kind),
            pc.equal(joined.column("digest"), joined.column("expected_digest")),
        )
        found.append(joined.filter(pc.invert(pc.fill_null(right, False))).select(["partition", "offset"]))
    if not found:
        return {}
    wrong = pa.concat_tables(found)
    return {p: pc.unique(_offsets_of(wrong, p)) for p in _partitions(wrong)}


def _as_offsets(offsets: Iterable[int]) -> Any:
    array = offsets if isinstance(offsets, pa.Array) else pa.array(list(offsets), _OFFSETS)
    return array.cast(_OFFSETS).sort()


def _between(offsets: Any, start: int, end: int) -> Any:
    return offsets.filter(pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))


def _count(mask: Any) -> int:
    return int(pc.sum(mask).as_py() or 0)


def _examples(offsets: Any, limit: int) -> tuple[int, ...]:
    return tuple(int(o) for o in offsets.slice(0, limit).to_pylist())


def _name(table: Table) -> str:
    return ".".join(table.name())
