"""The table auditor: does the table hold every committed Kafka record once, as it should? (`icefall verify`)

For each partition the audited range is `[start, committed end)`: the end is the table's committed next
offset (`icefall.offsets`, read with `read_committed`), the start is where ingestion began (the
`icefall.start-offsets` property ingestion sets on its first commit and every offset reset; 0 for
partitions absent from it). The records Kafka still holds in that range are compared with the main table's
rows (`_kafka.partition`, `_kafka.offset`) and the dead-letter table's rows (`partition`, `offset`):

- duplicate: an offset that one table holds more than once (the table, or the DLQ); reported as offsets,
  and as `duplicate_rows` (rows beyond the first per offset). Each destination holds a record at most
  once (commit/DESIGN.md, "Several destinations of one batch"), but a record may be in both tables: the
  DLQ's row under the spec that found it bad, the table's under a spec changed (fixed) between a crash
  and the batch read again (`in_table_and_dlq`; the reverse change leaves a record in neither: missing).
  By content, the row that is not what the audited spec makes of its record is `wrong`; by offsets only,
  which one is cannot be told, and an offset in both counts as a duplicate;
- wrong (by content, below): a row whose content is not what its record decodes to; named by offset;
- missing: in Kafka, in neither table, and not dropped by the spec's filter;
- unexpected: in a table but below the range start, at or beyond the committed end, or inside the range
  where Kafka holds no such record (e.g. rows of a batch that was never committed);
- lost to retention: the range start lies below Kafka's low watermark, so `[start, low)` can no longer be
  compared with Kafka; rows there are counted as `unverified`, and only checked for duplicates. The
  table's own count, `icefall.lost-records`, is cross-checked: it cannot exceed the offsets below the low
  watermark that are in neither table (`lost_records_problem` otherwise).

By content (`content=`, a `ContentSource`; `icefall.audit.content.SparkContent` is what `icefall verify`
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
itself (and keeps them if the main commit fails: the batch read again skips them), so every dead letter of
the main table's batches is there, and DLQ rows at or past the committed end (`dlq_ahead`) belong to a
batch not committed yet: unexpected in a stopped table, reported without failing with `ingesting=True`.
Offset comparisons are vectorised pyarrow kernels; digests are computed by Spark.

A table of several topics (`spec.source.topics`): each topic is audited as a table of its own, on the rows
that name it (`_kafka.topic`, the dead-letter table's `topic`) and the offsets the table holds of it; the
report lists every partition with its topic. `icefall.lost-records` counts the whole table and is checked
against all the topics together.

Not guaranteed:
- on compacted topics, records Kafka no longer shows (compacted away after ingestion) count as unexpected
  when the table holds them;
- records deleted by retention before they were audited are only counted, never compared;
- a spec changed since the rows were written (schema, select, filter) makes those rows wrong: audit with the
  spec the table was filled with; a 64-bit digest can collide (a changed row then passes, with negligible
  probability).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from icefall.audit.kafka import KafkaTopic
from icefall.audit.report import AuditReport, PartitionAudit
from icefall.audit.rows import (
    DEAD_LETTER,
    ELSEWHERE,
    FILTERED,
    GOOD,
    OFFSETS,
    AuditError,
    ContentSource,
    RecordedTopic,
    Reset,
    TopicOffsets,
    after_last_reset,
    as_offsets,
    count_true,
    empty_rows,
    first_offsets,
    offsets_between,
    offsets_of,
    partitions_of,
    read_rows,
    split_before,
)
from icefall.commit import read_committed
from icefall.commit.protocol import table_name
from icefall.commit.state import CommittedState

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

DLQ_SUFFIX = "_dlq"
MAX_EXAMPLES = 10


@dataclass(frozen=True)
class _Options:
    """How `audit_table` judges what it finds (its keyword arguments)."""

    has_dlq_table: bool
    filter_configured: bool
    ingesting: bool
    max_examples: int


@dataclass(frozen=True)
class _Side:
    """The rows of the main or the dead-letter table: those after the last offset reset, and how many rows
    lacked a partition or offset."""

    rows: pa.Table
    nulls: int = 0
    reset: Reset = field(default_factory=Reset)


@dataclass(frozen=True)
class _Range:
    """A partition's audited range `[start, committed)` and Kafka's watermarks (None: no such partition)."""

    partition: int
    start: int
    committed: int
    marks: tuple[int, int] | None

    @property
    def held(self) -> tuple[int, int] | None:
        """The part of the range Kafka still holds, if any."""
        if self.marks is None:
            return None
        begin, end = max(self.start, self.marks[0]), min(self.committed, self.marks[1])
        return (begin, end) if begin < end else None


def audit_table(
    main_table: Table,
    dlq_table: Table | None,
    topic: TopicOffsets | Mapping[int, Iterable[int]],
    *,
    content: ContentSource | None = None,
    filter_configured: bool = False,
    ingesting: bool = False,
    max_examples: int = MAX_EXAMPLES,
    of_topic: str | None = None,
) -> AuditReport:
    """Audit `main_table` (and its dead-letter table) against the records `topic` holds (in a table of
    several topics, `of_topic` names it: the rows and offsets of that topic only).

    `topic` is a `TopicOffsets` (`KafkaTopic` for a live topic), or a mapping of partition to the offsets
    Kafka holds (low watermarks 0). `content` compares every row with its record (`SparkContent`); without
    it only offsets are compared, and `filter_configured` says whether absent records count as filtered
    (the spec has a filter) instead of missing. `ingesting`: ingestion may be running, so dead letters past
    the committed end are pending, not unexpected. AuditError: the table was filled from another topic.
    """
    source: TopicOffsets = RecordedTopic(topic) if isinstance(topic, Mapping) else topic
    state = read_committed(main_table)  # refreshes: properties and head come from one metadata version
    if of_topic is not None:
        state = topic_slice(state, of_topic)
    if source.topic is not None and state.topic is not None and source.topic != state.topic:
        raise AuditError(
            f"table {table_name(main_table)} is filled from topic {state.topic!r}, not {source.topic!r}"
        )
    report = AuditReport(
        table=table_name(main_table),
        dlq_table=table_name(dlq_table) if dlq_table is not None else None,
        topic=state.topic,
        snapshot_id=state.snapshot_id,
        filter_configured=filter_configured,
        ingesting=ingesting,
        partitions=(),
        content_checked=content is not None,
        lost_records=state.lost_records,
    )
    if None not in (state.topic_id, source.topic_id) and state.topic_id != source.topic_id:
        return replace(report, source_changed=_recreated(state, source))
    main = _read_side(main_table, state.snapshot_id, content, dead_letters=False, topic=of_topic)
    dlq = _Side(empty_rows())
    if dlq_table is not None:
        # Read after the main table: the dead letters of every batch main holds are committed by then
        # (they land first). Rows past main's committed offsets are cut off below (`dlq_ahead`).
        dead = read_committed(dlq_table).snapshot_id
        dlq = _read_side(dlq_table, dead, content, dead_letters=True, topic=of_topic)
    ranges = _ranges(state, main, dlq, source)
    held = {r.partition: r.held for r in ranges if r.held is not None}
    expected = content.expected(state.topic, held) if content is not None and state.topic and held else None
    wrong = _wrong_rows(main.rows, dlq.rows, expected) if expected is not None else {}
    options = _Options(dlq_table is not None, filter_configured, ingesting, max_examples)
    audits = [
        _audit_range(r, source, main=main, dlq=dlq, expected=expected, wrong=wrong, options=options)
        for r in ranges
    ]
    notes = [n for n in (main.reset.note, dlq.reset.note) if n]
    return replace(
        report,
        partitions=tuple(audits),
        rows_without_offset=main.nulls + dlq.nulls,
        lost_records_problem=_check_lost_records(state, audits, reset=main.reset.happened),
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
) -> AuditReport:
    """Load `identifier` and its dead-letter table and audit them against the live topic.

    `dead_letter` names the dead-letter table (`spec.deadLetter.table`); by default `<identifier>_dlq`,
    audited if it exists.
    """
    table = catalog.load_table(identifier)
    state = read_committed(table)
    topic = state.topic
    if topic is None and state.topics is None:
        raise AuditError(f"table {identifier} has no icefall.topic: nothing was ever ingested into it")
    dlq: Table | None
    if dead_letter is not None:
        dlq = catalog.load_table(dead_letter)
    else:
        default = dlq_identifier(identifier)
        dlq = catalog.load_table(default) if catalog.table_exists(default) else None
    if state.topics is not None:
        reports = {}
        for name in state.topics:
            with KafkaTopic(bootstrap, name, config=kafka_config) as source:
                reports[name] = audit_table(
                    table, dlq, source, content=content, filter_configured=filter_configured,
                    ingesting=ingesting, of_topic=name,
                )  # fmt: skip
        return of_topics(reports, read_committed(table).lost_records)
    assert topic is not None
    with KafkaTopic(bootstrap, topic, config=kafka_config) as source:
        return audit_table(
            table, dlq, source, content=content, filter_configured=filter_configured, ingesting=ingesting
        )


def topic_slice(state: CommittedState, topic: str) -> CommittedState:
    """What a table of several topics holds of `topic`, as the state of a table of that topic alone (its
    lost records are the whole table's: checked over all the topics, `_of_topics`)."""
    held = state.of_topic(topic)
    return CommittedState(
        snapshot_id=state.snapshot_id,
        topic=topic,
        topic_id=held.topic_id,
        offsets=held.offsets,
        start_offsets=held.start_offsets,
        epoch=state.epoch,
        max_produce_time_ms=state.max_produce_time_ms,
    )


def of_topics(reports: Mapping[str, AuditReport], lost_records: int) -> AuditReport:
    """The report of a table of several topics: each topic's partitions, named by topic."""
    first = next(iter(reports.values()))
    audits = [replace(p, topic=name) for name, report in reports.items() for p in report.partitions]
    absent = sum(a.absent_below_low for a in audits)
    reset = any(r.reset_note for r in reports.values())
    problem = None
    if lost_records > absent and not reset:
        problem = (
            f"icefall.lost-records says {lost_records} records were lost to retention, but only {absent} "
            "offsets below Kafka's low watermarks are in neither table: rows exist for records the table "
            "counts as lost"
        )
    return replace(
        first,
        topic=", ".join(reports),
        partitions=tuple(audits),
        rows_without_offset=sum(r.rows_without_offset for r in reports.values()),
        source_changed="; ".join(r.source_changed for r in reports.values() if r.source_changed) or None,
        lost_records=lost_records,
        lost_records_problem=problem,
        reset_note="; ".join(r.reset_note for r in reports.values() if r.reset_note) or None,
    )


# --- the comparison ----------------------------------------------------------------------------------------


def _recreated(state: CommittedState, source: TopicOffsets) -> str:
    return (
        f"topic {state.topic!r} was deleted and created again (the table's offsets belong to topic "
        f"id {state.topic_id}, Kafka's topic is {source.topic_id}): its records cannot be compared; "
        "`icefall reset-offsets` goes on with the new topic"
    )


def _read_side(
    table: Table,
    snapshot_id: int | None,
    content: ContentSource | None,
    *,
    dead_letters: bool,
    topic: str | None = None,
) -> _Side:
    rows, nulls = read_rows(table, snapshot_id, content, dead_letters=dead_letters, topic=topic)
    rows, reset = after_last_reset(
        table, table.metadata, rows, content, dead_letters=dead_letters, topic=topic
    )
    return _Side(rows, nulls, reset)


def _ranges(state: CommittedState, main: _Side, dlq: _Side, source: TopicOffsets) -> list[_Range]:
    """The audited range of every partition the table knows or holds rows of (Kafka's watermarks read)."""
    starts = {p: max(o, main.reset.audit_from.get(p, 0)) for p, o in state.start_offsets.items()}
    for p, o in main.reset.audit_from.items():
        starts.setdefault(p, o)
    partitions = sorted(set(state.offsets) | set(partitions_of(main.rows)) | set(partitions_of(dlq.rows)))
    ranges = []
    for partition in partitions:
        committed = state.offsets.get(partition, 0)
        start = min(starts.get(partition, 0), committed)
        ranges.append(_Range(partition, start, committed, source.watermarks(partition)))
    return ranges


def _audit_range(
    r: _Range,
    source: TopicOffsets,
    *,
    main: _Side,
    dlq: _Side,
    expected: pa.Table | None,
    wrong: Mapping[int, Any],
    options: _Options,
) -> PartitionAudit:
    """The audit of one partition: its offsets from Kafka and both tables, compared."""
    empty = pa.array([], OFFSETS)
    main_p, main_before = split_before(offsets_of(main.rows, r.partition), main.reset, r.partition)
    dlq_p, dlq_before = split_before(offsets_of(dlq.rows, r.partition), dlq.reset, r.partition)
    found = _Found(
        kafka=as_offsets(source.offsets(r.partition, r.start, r.committed)) if r.marks is not None else empty,
        table=main_p,
        dlq=dlq_p,
        expected=_expected_of(expected, r.partition),
        wrong=wrong.get(r.partition, empty),
        before_reset=main_before + dlq_before,
    )
    return _audit_partition(r, found, options)


@dataclass(frozen=True)
class _Found:
    """One partition's sorted int64 offsets: Kafka's in the range, the main and the dead-letter table's
    rows (all of them), the rows whose content is wrong; `expected` its re-decoded records (`offset`,
    `kind`; by content audits); `before_reset` rows set aside as the old topic's."""

    kafka: Any
    table: Any
    dlq: Any
    expected: pa.Table | None
    wrong: Any
    before_reset: int


def _audit_partition(r: _Range, found: _Found, options: _Options) -> PartitionAudit:
    """Compare the partition's offsets: Kafka's in the range, the table's and the DLQ's (all rows)."""
    start, committed, table = r.start, r.committed, found.table
    low, high = r.marks if r.marks is not None else (None, None)
    verify_from = max(start, low) if low is not None else start
    kafka = pc.unique(offsets_between(found.kafka, verify_from, committed))
    dlq = found.dlq
    dlq_ahead = count_true(pc.greater_equal(dlq, committed))
    if options.ingesting:  # a batch's dead letters, committed before the batch: not in the committed state
        dlq = dlq.filter(pc.less(dlq, committed))

    rows = pa.concat_arrays([table, dlq]).sort()
    if found.expected is None:  # by offsets only: a row in both tables cannot be judged, a duplicate
        duplicate_rows, duplicated = _duplicates(rows)
    else:  # by content: each table on its own; a row in both is judged by its record (`wrong`)
        duplicate_rows, duplicated = _duplicates_per_table(table, dlq)
    present = pc.unique(rows)
    both = count_true(pc.is_in(pc.unique(dlq), value_set=table)) if len(dlq) and len(table) else 0

    absent = kafka.filter(pc.invert(pc.is_in(kafka, value_set=present)))
    outside = pc.or_(pc.less(present, start), pc.greater_equal(present, committed))
    not_in_kafka = pc.and_(
        pc.greater_equal(present, verify_from), pc.invert(pc.is_in(present, value_set=kafka))
    )
    unexpected = present.filter(pc.or_(outside, not_in_kafka))
    unverified = count_true(pc.and_(pc.greater_equal(present, start), pc.less(present, verify_from)))
    missing, filtered, examples, elsewhere = _absent(absent, found.expected, options)
    wrong, wrong_table = _wrong_table(found.wrong, found.expected)
    below_low = max(0, min(verify_from, committed) - start)
    limit = options.max_examples
    return PartitionAudit(
        partition=r.partition,
        start=start,
        committed=committed,
        low_watermark=low,
        high_watermark=high,
        expected=len(kafka),
        in_table=len(table),
        in_dlq=len(found.dlq),
        in_table_and_dlq=both,
        duplicates=len(duplicated),
        duplicate_rows=duplicate_rows,
        missing=missing,
        filtered=filtered,
        unexpected=len(unexpected),
        lost_to_retention=max(0, verify_from - start),
        unverified=unverified,
        dlq_ahead=dlq_ahead,
        duplicate_examples=first_offsets(duplicated, limit),
        missing_examples=first_offsets(examples, limit),
        unexpected_examples=first_offsets(unexpected, limit),
        wrong=len(wrong),
        wrong_examples=first_offsets(wrong, limit),
        wrong_table=len(wrong_table),
        wrong_table_examples=first_offsets(wrong_table, limit),
        routed_elsewhere=_of_kind(kafka, found.expected, ELSEWHERE),
        dead_letters_elsewhere=elsewhere,
        before_reset=found.before_reset,
        absent_below_low=max(0, below_low - unverified),
    )


def _duplicates(rows: Any) -> tuple[int, Any]:
    """(rows beyond the first per offset, the offsets held more than once) of sorted offsets."""
    if len(rows) <= 1:
        return 0, pa.array([], OFFSETS)
    repeated = pc.equal(rows.slice(1), rows.slice(0, len(rows) - 1))
    return int(pc.sum(repeated).as_py() or 0), pc.unique(rows.slice(1).filter(repeated))


def _duplicates_per_table(table: Any, dlq: Any) -> tuple[int, Any]:
    """`_duplicates` of each table's sorted offsets, added up: (rows, the offsets one table holds twice)."""
    in_table, in_dlq = _duplicates(table), _duplicates(dlq)
    offsets = pc.unique(pa.concat_arrays([in_table[1], in_dlq[1]])).sort()
    return in_table[0] + in_dlq[0], offsets


def _absent(absent: Any, expected: pa.Table | None, options: _Options) -> tuple[int, int, Any, int]:
    """Kafka's records in neither table, judged: (missing, filtered, examples, dead letters elsewhere)."""
    if expected is None:
        if options.filter_configured:
            return 0, len(absent), absent, 0
        return len(absent), 0, absent, 0

    # The filter re-evaluated: only records it drops may be absent.
    def of_kind(kind: int) -> Any:
        offsets = expected.filter(pc.equal(expected.column("kind"), kind)).column("offset")
        return absent.filter(pc.is_in(absent, value_set=offsets.combine_chunks()))

    filtered = of_kind(FILTERED)
    dropped, elsewhere = pa.concat_arrays([filtered, of_kind(ELSEWHERE)]), 0
    if not options.has_dlq_table:  # dead letters went to the topic (or nowhere): not in a table to compare
        sent = of_kind(DEAD_LETTER)
        elsewhere = len(sent)
        dropped = pa.concat_arrays([dropped, sent])
    missing = absent.filter(pc.invert(pc.is_in(absent, value_set=dropped)))
    return len(missing), len(filtered), missing if len(missing) else filtered, elsewhere


def _offsets_of_kind(expected: pa.Table, kind: int) -> Any:
    return expected.filter(pc.equal(expected.column("kind"), kind)).column("offset").combine_chunks()


def _wrong_table(wrong: Any, expected: pa.Table | None) -> tuple[Any, Any]:
    """`wrong` offsets split: (rows not what their record decodes to, rows of a record another destination
    of a routed table takes)."""
    if expected is None or not len(wrong):
        return wrong, wrong[:0]
    elsewhere = pc.is_in(wrong, value_set=_offsets_of_kind(expected, ELSEWHERE))
    return wrong.filter(pc.invert(elsewhere)), wrong.filter(elsewhere)


def _of_kind(kafka: Any, expected: pa.Table | None, kind: int) -> int:
    """How many of the range's records (`kafka`) re-decoding says are of `kind`."""
    if expected is None:
        return 0
    return count_true(pc.is_in(kafka, value_set=_offsets_of_kind(expected, kind)))


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
    return {p: pc.unique(offsets_of(wrong, p)) for p in partitions_of(wrong)}
