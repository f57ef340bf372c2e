"""The table auditor: does the table hold every committed Kafka record exactly once? (`icefall verify`)

For each partition the audited range is `[start, committed end)`: the end is the table's committed next
offset (`icefall.offsets`, read with `read_committed`), the start is where ingestion began (the
`icefall.start-offsets` property ingestion sets on its first commit; 0 for partitions absent from it). The
offsets Kafka still holds in that range are compared with the `_kafka.offset`s of the main table's rows and
the `offset`s of the dead-letter table's rows:

- duplicate: an offset that appears more than once across the table and the DLQ (twice in the table, or in
  both); reported as offsets, and as `duplicate_rows` (rows beyond the first per offset);
- missing: in Kafka, in neither table; with `filter_configured=True` these count as `filtered` instead (a
  spec filter drops records on purpose, so their absence is expected and no error);
- unexpected: in a table but below the range start, at or beyond the committed end, or inside the range
  where Kafka holds no such record (e.g. rows of a batch that was never committed);
- lost to retention: the range start lies below Kafka's low watermark, so `[start, low)` can no longer be
  compared with Kafka; rows there are counted as `unverified`, and only checked for duplicates.

`AuditReport.ok` is True when no partition has duplicates, unexpected rows or missing records, and no row
lacks a partition or offset. Lost-to-retention and filtered records are reported, not errors.

The main table is read at `main`'s head from the same metadata the committed offsets were read from, so an
ingestion commit racing the audit cannot show up as unexpected rows. Only `_kafka.partition` and
`_kafka.offset` are read, into Arrow, and every comparison is a vectorised pyarrow kernel.

Not guaranteed:
- the dead-letter table is separate and read at its current snapshot. Ingestion commits a batch's dead
  letters before the batch itself, and drops them again if the main commit fails (`reconcile_dead_letters`),
  so DLQ rows at or past the committed end (`dlq_ahead`) are unexpected in a stopped table but normal while
  ingestion runs: pass `ingesting=True` to report them without failing;
- on compacted topics, records Kafka no longer shows (compacted away after ingestion) count as unexpected
  when the table holds them;
- records deleted by retention before they were audited are only counted, never compared.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from icefall.commit import read_committed
from icefall.kafka.admin import ISOLATION, TopicView

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

KAFKA_COLUMN = "_kafka"
DLQ_SUFFIX = "_dlq"
MAX_EXAMPLES = 10

_OFFSETS = pa.int64()


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
    """The audit of one partition. Counts are offsets, except `in_table`, `in_dlq` and `duplicate_rows`."""

    partition: int
    start: int  # first offset of the audited range (where ingestion started)
    committed: int  # the committed next offset: the range's end
    low_watermark: int | None  # Kafka's earliest offset held; None if Kafka has no such partition
    high_watermark: int | None
    expected: int  # records Kafka holds in [max(start, low), committed)
    in_table: int  # rows of this partition in the main table (all of them)
    in_dlq: int  # rows of this partition in the dead-letter table
    in_table_and_dlq: int  # offsets in both (each also counts as a duplicate)
    duplicates: int  # offsets present more than once across table and DLQ
    duplicate_rows: int  # rows beyond the first for each such offset
    missing: int  # in Kafka, in neither table (0 when a filter is configured: see `filtered`)
    filtered: int  # in Kafka, in neither table, with a filter configured: dropped on purpose
    unexpected: int  # offsets in a table outside the range, or inside it but not in Kafka
    lost_to_retention: int  # offsets in [start, low): deleted by Kafka, cannot be compared
    unverified: int  # offsets in a table inside [start, low): counted, not compared
    dlq_ahead: int = 0  # DLQ rows at or past the committed end (unexpected unless `ingesting`)
    duplicate_examples: tuple[int, ...] = ()
    missing_examples: tuple[int, ...] = ()  # missing, or with a filter configured, filtered offsets
    unexpected_examples: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.unexpected == 0 and self.missing == 0

    @property
    def result(self) -> str:
        """A few words for the report's last column."""
        problems = [
            f"{n} {what}"
            for n, what in (
                (self.duplicates, "duplicated"),
                (self.missing, "missing"),
                (self.unexpected, "unexpected"),
            )
            if n
        ]
        notes = [
            f"{n} {what}"
            for n, what in ((self.filtered, "filtered"), (self.lost_to_retention, "lost to retention"))
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

    @property
    def ok(self) -> bool:
        return (
            self.source_changed is None
            and self.rows_without_offset == 0
            and all(p.ok for p in self.partitions)
        )

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
        lines = [
            f"{self.table}{dlq} vs topic {self.topic or '?'} at snapshot {self.snapshot_id}: "
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
                ("filtered offsets" if self.filter_configured else "missing offsets", p.missing_examples),
                ("unexpected offsets", p.unexpected_examples),
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
        if self.source_changed:
            lines.append(self.source_changed)
        return "\n".join(lines)


def audit_table(
    main_table: Table,
    dlq_table: Table | None,
    topic: TopicOffsets | Mapping[int, Iterable[int]],
    *,
    filter_configured: bool = False,
    ingesting: bool = False,
    max_examples: int = MAX_EXAMPLES,
) -> AuditReport:
    """Audit `main_table` (and its dead-letter table) against the records `topic` holds.

    `topic` is a `TopicOffsets` (`KafkaTopic` for a live topic), or a mapping of partition to the offsets
    Kafka holds (low watermarks 0). `filter_configured`: the spec drops records on purpose, so absent ones
    are filtered, not missing. `ingesting`: ingestion may be running, so dead letters past the committed end
    are pending, not unexpected. Raises AuditError if the table was filled from another topic.
    """
    source: TopicOffsets = RecordedTopic(topic) if isinstance(topic, Mapping) else topic
    state = read_committed(main_table)  # refreshes: properties and head come from one metadata version
    if source.topic is not None and state.topic is not None and source.topic != state.topic:
        raise AuditError(
            f"table {_name(main_table)} is filled from topic {state.topic!r}, not {source.topic!r}"
        )
    if None not in (state.topic_id, source.topic_id) and state.topic_id != source.topic_id:
        return AuditReport(
            table=_name(main_table),
            dlq_table=_name(dlq_table) if dlq_table is not None else None,
            topic=state.topic,
            snapshot_id=state.snapshot_id,
            filter_configured=filter_configured,
            ingesting=ingesting,
            partitions=(),
            source_changed=(
                f"topic {state.topic!r} was deleted and created again (the table's offsets belong to topic "
                f"id {state.topic_id}, Kafka's topic is {source.topic_id}): its records cannot be compared; "
                "`icefall reset-offsets` goes on with the new topic"
            ),
        )
    starts = state.start_offsets

    main, main_nulls = _offsets_by_partition(
        main_table, state.snapshot_id, f"{KAFKA_COLUMN}.partition", f"{KAFKA_COLUMN}.offset"
    )
    dlq: dict[int, Any] = {}
    dlq_nulls = 0
    if dlq_table is not None:
        dlq_table.refresh()
        dlq, dlq_nulls = _offsets_by_partition(
            dlq_table, dlq_table.metadata.current_snapshot_id, "partition", "offset"
        )

    audits = []
    empty = pa.array([], _OFFSETS)
    for partition in sorted(set(state.offsets) | set(main) | set(dlq)):
        committed = state.offsets.get(partition, 0)
        start = min(starts.get(partition, 0), committed)
        marks = source.watermarks(partition)
        audits.append(
            _audit_partition(
                partition,
                start,
                committed,
                marks,
                kafka=_as_offsets(source.offsets(partition, start, committed))
                if marks is not None
                else empty,
                table=main.get(partition, empty),
                dlq=dlq.get(partition, empty),
                filter_configured=filter_configured,
                ingesting=ingesting,
                max_examples=max_examples,
            )
        )
    return AuditReport(
        table=_name(main_table),
        dlq_table=_name(dlq_table) if dlq_table is not None else None,
        topic=state.topic,
        snapshot_id=state.snapshot_id,
        filter_configured=filter_configured,
        ingesting=ingesting,
        partitions=tuple(audits),
        rows_without_offset=main_nulls + dlq_nulls,
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
        return audit_table(table, dlq, source, filter_configured=filter_configured, ingesting=ingesting)


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
    filter_configured: bool,
    ingesting: bool,
    max_examples: int,
) -> PartitionAudit:
    """Compare sorted int64 offset arrays: Kafka's in the range, the table's and the DLQ's (all rows)."""
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
        missing=0 if filter_configured else len(absent),
        filtered=len(absent) if filter_configured else 0,
        unexpected=len(unexpected),
        lost_to_retention=max(0, verify_from - start),
        unverified=unverified,
        dlq_ahead=dlq_ahead,
        duplicate_examples=_examples(duplicated, max_examples),
        missing_examples=_examples(absent, max_examples),
        unexpected_examples=_examples(unexpected, max_examples),
    )


def _offsets_by_partition(
    table: Table, snapshot_id: int | None, partition_field: str, offset_field: str
) -> tuple[dict[int, Any], int]:
    """The offsets of `table`'s rows per partition (sorted int64 arrays) and the count of rows lacking one.

    Reads only the two columns, at `snapshot_id` (None: a table without snapshots, so no rows).
    """
    if snapshot_id is None:
        return {}, 0
    fields = (partition_field, offset_field)
    for name in fields:
        if table.schema().find_field(name, case_sensitive=True) is None:
            raise AuditError(f"{_name(table)} has no column {name}: not a table written by icefall")
    columns = table.scan(selected_fields=fields, snapshot_id=snapshot_id).to_arrow().flatten()
    partitions = columns.column(partition_field).cast(pa.int64())
    offsets = columns.column(offset_field).cast(_OFFSETS)
    rows = pa.table({"partition": partitions, "offset": offsets})
    complete = rows.drop_null()
    rows_without = rows.num_rows - complete.num_rows
    if complete.num_rows == 0:
        return {}, rows_without
    ordered = complete.sort_by([("partition", "ascending"), ("offset", "ascending")])
    counts = pc.value_counts(ordered.column("partition")).to_pylist()  # one entry per partition
    offsets_sorted = ordered.column("offset").combine_chunks()
    result: dict[int, Any] = {}
    position = 0
    for entry in sorted(counts, key=lambda entry: int(entry["values"])):  # the order of `ordered`
        result[int(entry["values"])] = offsets_sorted.slice(position, entry["counts"])
        position += entry["counts"]
    return result, rows_without


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
