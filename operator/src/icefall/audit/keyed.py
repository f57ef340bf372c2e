"""`icefall verify` for keyed tables (`spec.mode` upsert or cdc): the table against a model of the topic.

The model: every record of the committed offset ranges (per partition from where the table first read it
to the committed offset, read_committed) decoded with the table's spec exactly as ingestion decodes it
(the same `Decoder`; Avro with each record's writer schema, and without an inline schema onto the
registry's latest schema's fields, as ingestion derives them at start: `spec_with_registry_schema`);
the good changes collapsed to the last per key (`icefall.decode.decode.last_changes`, the rule ingestion
applies batch by batch); deletes removed. Compared with the table's rows at the committed snapshot by key
and by content: a digest of every column, `_kafka` (partition, offset, timestamp) included, so a row must
be the very record that last changed its key. The bad records must be in the dead-letter table, by
(partition, offset).

Reports keys missing from the table, rows whose key the model does not hold (never written, or deleted:
a resurrected row), rows with other content, keys held twice, and dead letters missing or unexpected.
Keys changed in several partitions have no order between partitions: they are counted, not judged —
unless `spec.sequenceBy` orders every change by its source position (then the model's last change is
the one with the highest position, and every key is judged).
`compare` and `counted` audit each destination of keyed routes the same way (`icefall.audit.keyed_routes`).
Not covered: tables with offset resets (`icefall reset-offsets`) and records lost to retention before
ingestion (the model lacks them; counted in the report, which then cannot be OK by content alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icefall.commit.state import OFFSET_RESETS, CommittedState, read_committed

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import Column, DataFrame, SparkSession

    from icefall.api import StreamingTable, StreamingTableSpec
    from icefall.plan.offsets import OffsetRange

EXAMPLES = 5


class KeyedAuditError(RuntimeError):
    """The table cannot be audited by key (say why and what to do)."""


@dataclass(frozen=True)
class KeyedAuditReport:
    table: str
    snapshot_id: int | None
    records: int  # records in the committed offset ranges
    keys: int  # keys the model holds (after deletes)
    rows: int  # rows in the table
    missing: int = 0  # keys the model holds and the table does not
    unexpected: int = 0  # rows whose key the model does not hold
    wrong: int = 0  # rows whose content differs from the key's last change
    duplicates: int = 0  # keys with more than one row
    unordered: int = 0  # keys changed in several partitions: not judged
    dead_letters_missing: int = 0
    dead_letters_unexpected: int = 0
    lost_records: int = 0
    examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.unexpected
            or self.wrong
            or self.duplicates
            or self.dead_letters_missing
            or self.dead_letters_unexpected
            or self.lost_records
        )

    def render(self) -> str:
        lines = [
            f"table {self.table} (keyed) at snapshot {self.snapshot_id}: {self.rows} rows; the topic's "
            f"{self.records} committed records leave {self.keys} keys",
        ]
        for label, count, what in (
            ("missing", self.missing, "keys the topic's last change keeps, absent from the table"),
            ("unexpected", self.unexpected, "rows whose key was deleted or never written"),
            ("wrong", self.wrong, "rows that differ from their key's last change"),
            ("duplicates", self.duplicates, "keys with more than one row"),
            ("dead letters missing", self.dead_letters_missing, "bad records not in the dead-letter table"),
            ("dead letters unexpected", self.dead_letters_unexpected, "dead letters of good records"),
        ):
            if count:
                shown = ", ".join(self.examples.get(label, ()))
                lines.append(f"  {label}: {count} ({what}), e.g. {shown}")
        if self.unordered:
            lines.append(
                f"  note: {self.unordered} keys were changed in several partitions; Kafka orders only within "
                "a partition, so they are not judged (produce a key to one partition)"
            )
        if self.lost_records:
            lines.append(
                f"  {self.lost_records} records were lost to topic retention before ingestion: the model "
                "cannot be rebuilt, differences may be theirs"
            )
        lines.append("OK" if self.ok else "NOT OK")
        return "\n".join(lines)


def audit_keyed(
    spark: SparkSession,
    st: StreamingTable,
    catalog: Catalog,
    catalog_name: str,
    *,
    security_options: Mapping[str, str] | None = None,
) -> KeyedAuditReport:
    """Audit the keyed table of `st` (module doc). `spark` has `catalog_name` configured."""
    from icefall.decode.schemas import decoding_spec, schema_at
    from icefall.kafka.registry import spec_with_registry_schema

    if not st.spec.key:
        raise KeyedAuditError(f"{st.metadata.name}: mode {st.spec.mode.value} has no key to audit by")
    label = ".".join(st.table_identifier)
    table = catalog.load_table(st.table_identifier)
    if table.properties.get(OFFSET_RESETS):
        raise KeyedAuditError(f"{label}: its offsets were reset; a keyed audit cannot model that yet")
    committed = read_committed(table)
    name = ".".join(f"`{part}`" for part in (catalog_name, *st.table_identifier))
    if committed.snapshot_id is None:
        raise KeyedAuditError(f"{label}: the table has no snapshot yet; nothing to audit")
    rows = spark.sql(f"SELECT * FROM {name} VERSION AS OF {int(committed.snapshot_id)}")
    # Decoded as ingestion decodes into this table: its columns at the snapshot (a registry format's grow
    # with its writer schemas), the registry's latest schema standing in for an inline one.
    spec = decoding_spec(spec_with_registry_schema(st.spec), schema_at(table, committed.snapshot_id))
    return compare_with_topic(
        spark, st, spec, committed, rows,
        dead_letters=lambda ranges: dead_letter_positions(spark, st, catalog_name, ranges),
        security_options=security_options,
    )  # fmt: skip


def committed_ranges(committed: CommittedState) -> tuple[OffsetRange, ...]:
    """The offset ranges the table holds of its topic (of each topic, in the topics form, each range naming
    it): from where each partition was first read."""
    from icefall.plan.offsets import OffsetRange

    if committed.topics is None:
        return tuple(
            OffsetRange(p, committed.start_offsets.get(p, 0), end)
            for p, end in sorted(committed.offsets.items())
            if end > committed.start_offsets.get(p, 0)
        )
    return tuple(
        OffsetRange(p, held.start_offsets.get(p, 0), end, topic)
        for topic, held in sorted(committed.topics.items())
        for p, end in sorted(held.offsets.items())
        if end > held.start_offsets.get(p, 0)
    )


def inside(ranges: tuple[OffsetRange, ...]) -> Column:
    """Whether a record or dead letter (columns `partition`, `offset`, and `topic` where a range names
    one) is in `ranges`."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    found = F.lit(False)
    for r in ranges:
        here = (F.col("partition") == r.partition) & (F.col("offset") >= r.start) & (F.col("offset") < r.end)
        found = found | (here & (F.col("topic") == F.lit(r.topic)) if r.topic is not None else here)
    return found


def positions(frame: DataFrame, *, by_topic: bool) -> DataFrame:
    """(`partition`, `offset`, and with `by_topic` `topic`) of records or dead letters: how they meet."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    topic = [F.col("topic").cast("string").alias("topic")] if by_topic else []
    return frame.select(F.col("partition").cast("int"), F.col("offset").cast("long"), *topic)


def compare_with_topic(
    spark: SparkSession,
    st: StreamingTable,
    spec: StreamingTableSpec,
    committed: CommittedState,
    rows: DataFrame,
    *,
    dead_letters: Callable[[tuple[OffsetRange, ...]], DataFrame | None],
    security_options: Mapping[str, str] | None,
    computed: Callable[[DataFrame], DataFrame] | None = None,
) -> KeyedAuditReport:
    """The keyed audit of a table's `rows` (any format) holding `committed`: the topic's committed ranges
    decoded with `spec`, collapsed to the last change per key and compared by key; `dead_letters(ranges)`:
    the dead-letter table's (partition, offset) rows inside those ranges (None without one); `computed`:
    the decoded changes with the columns the writer computes from them (a Delta table's generated
    partition columns), so a row's stored value is judged too."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.audit.content import RECORDS_PER_TASK, cached
    from icefall.decode.decode import BAD_COLUMN, decode, good_rows
    from icefall.ingest.engine import read_kafka

    ranges = committed_ranges(committed)
    kafka = read_kafka(spark, st.spec, ranges, security_options or {}, records_per_task=RECORDS_PER_TASK)
    decoded = cached(decode(kafka, spec))
    comparison: KeyedComparison | None = None
    try:
        records = decoded.count() if ranges else 0
        changes = good_rows(decoded, spec)
        comparison = compare(computed(changes) if computed else changes, rows, list(st.spec.key or []))
        bad = positions(decoded.where(F.col(BAD_COLUMN)), by_topic=False)
        return counted(
            ".".join(st.table_identifier), committed, records=records, rows=rows, comparison=comparison,
            bad=bad if st.dead_letter_identifier else None, dead=dead_letters(ranges),
        )  # fmt: skip
    finally:
        decoded.unpersist()
        if comparison is not None:
            comparison.compared.unpersist()


@dataclass(frozen=True)
class KeyedComparison:
    """The model against the table's rows, by key: `compared` (key, expected, actual digests; persisted:
    the caller unpersists), `duplicates` (keys held twice) and `unordered` (keys changed in several
    partitions, not judged)."""

    compared: DataFrame
    duplicates: DataFrame
    unordered: DataFrame


def compare(changes: DataFrame, rows: DataFrame, key: list[str]) -> KeyedComparison:
    """Collapse `changes` (the good rows of a keyed decode, as the table's writer MERGEs them) to the last
    per key, deletes removed, and join them with the table's `rows` by key. A row's digest covers every
    column and its Kafka position (topic too, where `_kafka` has it)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.audit.content import cached, main_digest
    from icefall.decode.decode import DELETE_COLUMN, KAFKA_COLUMN, SEQUENCE_COLUMN, last_changes

    def source(frame: DataFrame) -> list[Column]:
        """Where a row's change came from: (topic,) partition; its order there is the offset."""
        kafka = F.col(KAFKA_COLUMN)
        topics = "topic" in frame.select(f"{KAFKA_COLUMN}.*").columns
        return [kafka["topic"], kafka["partition"]] if topics else [kafka["partition"]]

    unordered = (
        changes.groupBy(*key)
        .agg(F.count_distinct(*source(changes)).alias("partitions"))
        .where("partitions > 1" if SEQUENCE_COLUMN not in changes.columns else "false")
        .select(*key)
    )
    model = last_changes(changes, key).where(~F.col(DELETE_COLUMN)).drop(DELETE_COLUMN)
    model = model.join(unordered, key, "left_anti")
    table_rows = rows.join(unordered, key, "left_anti")

    def digested(frame: DataFrame, side: str) -> DataFrame:
        digest = F.xxhash64(main_digest(frame), *source(frame), F.col(f"{KAFKA_COLUMN}.offset"))
        return frame.select(F.to_json(F.struct(*key)).alias("key"), digest.alias(side))

    expected = digested(model, "expected")
    actual = digested(table_rows, "actual")
    duplicates = actual.groupBy("key").count().where("count > 1")
    # Counted four ways by `counted`: the model's aggregation and the join run once.
    compared = cached(expected.join(actual.dropDuplicates(["key"]), "key", "full_outer"))
    return KeyedComparison(compared=compared, duplicates=duplicates, unordered=unordered)


def counted(
    table: str,
    committed: CommittedState,
    *,
    records: int,
    rows: DataFrame,
    comparison: KeyedComparison,
    bad: DataFrame | None,
    dead: DataFrame | None,
) -> KeyedAuditReport:
    """The report of `table` (`namespace.name`): the comparison counted, and the records that must be dead
    letters (`bad`, `positions`; None: not checked here) against the dead-letter table's (`dead`, the same
    columns; None: it has none)."""
    meet: list[str] = [c for c in ("partition", "offset", "topic") if bad is not None and c in bad.columns]
    compared = comparison.compared
    missing = compared.where("actual IS NULL")
    unexpected = compared.where("expected IS NULL")
    wrong = compared.where("expected IS NOT NULL AND actual IS NOT NULL AND expected != actual")
    dead_missing = dead_unexpected = None
    if bad is not None:
        dead_missing = bad.join(dead, meet, "left_anti") if dead is not None else bad
        dead_unexpected = dead.join(bad, meet, "left_anti") if dead is not None else None

    def keys_of(frame: DataFrame) -> tuple[str, ...]:
        return tuple(r["key"] for r in frame.limit(EXAMPLES).collect())

    def offsets_of(frame: DataFrame | None) -> tuple[str, ...]:
        if frame is None:
            return ()
        rows = frame.limit(EXAMPLES).collect()
        return tuple(f"{r['topic']}/" * ("topic" in meet) + f"{r['partition']}:{r['offset']}" for r in rows)

    return KeyedAuditReport(
        table=table,
        snapshot_id=committed.snapshot_id,
        records=records,
        keys=compared.where("expected IS NOT NULL").count(),
        rows=rows.count(),
        missing=missing.count(),
        unexpected=unexpected.count(),
        wrong=wrong.count(),
        duplicates=comparison.duplicates.count(),
        unordered=comparison.unordered.count(),
        dead_letters_missing=dead_missing.count() if dead_missing is not None else 0,
        dead_letters_unexpected=dead_unexpected.count() if dead_unexpected is not None else 0,
        lost_records=committed.lost_records,
        examples={
            "missing": keys_of(missing),
            "unexpected": keys_of(unexpected),
            "wrong": keys_of(wrong),
            "duplicates": keys_of(comparison.duplicates),
            "dead letters missing": offsets_of(dead_missing),
            "dead letters unexpected": offsets_of(dead_unexpected),
        },
    )


def dead_letter_positions(
    spark: SparkSession, st: StreamingTable, catalog_name: str, ranges: tuple[OffsetRange, ...]
) -> DataFrame | None:
    """`positions` of the dead-letter table's rows inside the audited `ranges` (with their topic when the
    ranges name topics); None without one."""
    identifier = st.dead_letter_identifier
    if identifier is None:
        return None
    name = ".".join(f"`{part}`" for part in (catalog_name, *identifier))
    by_topic = any(r.topic is not None for r in ranges)
    return positions(spark.table(name), by_topic=by_topic).where(inside(ranges))
