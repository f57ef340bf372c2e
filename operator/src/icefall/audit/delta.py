"""The audit of a Delta Lake table (`spec.table.format: delta`) against its topic, by offset and by content.

The same comparison as `icefall.audit.table` (its partition audit, judged the same way), on a Delta table:
the committed offsets are the `icefall.*` keys of the Metadata action at the latest log version
(`icefall.commit.delta`), and the rows are read at that same version with delta-rs (`deltalake`), a reader
independent of the writer (Spark writes the Parquet files, Icefall's own code the log entries), so a
commit racing the audit cannot show up as unexpected rows. By content (`DeltaContent`): the records are
decoded again with the spec, as ingestion decodes them (`SparkContent.expected`; a registry format into the
table's columns at that version, which follow its writer schemas), and each row read by delta-rs is handed
to Spark only to take the same digest (`main_digest`).

A keyed table (`spec.mode` upsert or cdc): `audit_delta_keyed`, the model of `icefall.audit.keyed` (the
last change per key, deletes removed) against the rows delta-rs reads at the committed version.

The dead-letter table (a Delta table beside it, `icefall.ingest.delta_dead_letters`) is read at its newest
version after the table's (its rows land first): each bad record must be there once, by content too
(`DeltaContent.dead_letter_rows`); rows past the table's committed offsets belong to a batch not committed
yet (`dlq_ahead`), as for Iceberg.

Not guaranteed (not there yet for Delta, refused by the spec where it is a setting): offset resets, tables
of several topics; the rest as `icefall.audit.table` says (compacted topics, retention, a changed spec,
digest collisions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from icefall.api.delta_partitions import without_generated
from icefall.audit.content import SparkContent, main_digest
from icefall.audit.kafka import KafkaTopic
from icefall.audit.report import AuditReport
from icefall.audit.rows import KAFKA_COLUMN, ROW_SCHEMA, AuditError, TopicOffsets, count_true, empty_rows
from icefall.audit.table import (
    MAX_EXAMPLES,
    _audit_range,
    _check_lost_records,
    _Options,
    _ranges,
    _recreated,
    _Side,
    _wrong_rows,
)
from icefall.catalog.layout import spark_struct_to_iceberg
from icefall.commit.delta import DeltaLog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from icefall.api import StreamingTable, StreamingTableSpec
    from icefall.audit.keyed import KeyedAuditReport


class DeltaContent:
    """The content side of a Delta table's audit: digests of the rows delta-rs read, and of the records
    decoded again (`SparkContent.expected`), both taken by Spark."""

    def __init__(
        self,
        spark: SparkSession,
        spec: StreamingTableSpec,
        *,
        security_options: Mapping[str, str] | None = None,
    ) -> None:
        from icefall.api.delta_partitions import delta_partitions

        self.spark = spark
        self.decoded = SparkContent(spark, spec, "", security_options=security_options)
        self.generated = [p for p in delta_partitions(spec.table.partitioning) if p.generated]

    def main_rows(self, rows: pa.Table) -> pa.Table:
        """`rows` (a Delta table's, as delta-rs reads them) as partition, offset and digest. A generated
        partition column (`icefall.api.delta_partitions`) is no record's content: the digest is of the
        other columns, and made wrong where the row's value is not its expression's."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        frame = self.spark.createDataFrame(rows)
        content = frame.drop(*(p.column for p in self.generated))
        digest = main_digest(content)
        for p in self.generated:
            matches = F.col(p.column).eqNullSafe(F.expr(str(p.expression)))
            digest = F.when(matches, digest).otherwise(digest.bitwiseXOR(F.lit(1)))
        return (
            frame.select(
                F.col(f"{KAFKA_COLUMN}.partition").cast("long").alias("partition"),
                F.col(f"{KAFKA_COLUMN}.offset").cast("long").alias("offset"),
                digest.alias("digest"),
            )
            .toArrow()
            .cast(ROW_SCHEMA)
        )

    def dead_letter_rows(self, rows: pa.Table) -> pa.Table:
        """`rows` (a Delta dead-letter table's) as partition, offset and digest (`dead_letter_digest`)."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        frame = self.spark.createDataFrame(rows)
        return (
            frame.select(
                F.col("partition").cast("long").alias("partition"),
                F.col("offset").cast("long").alias("offset"),
                self.decoded.dead_letter_digest(frame).alias("digest"),
            )
            .toArrow()
            .cast(ROW_SCHEMA)
        )

    def expected(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
        return self.decoded.expected(topic, ranges)


def audit_delta(
    location: str,
    topic: TopicOffsets,
    *,
    dead_letter: str | None = None,
    content: DeltaContent | None = None,
    filter_configured: bool = False,
    ingesting: bool = False,
    max_examples: int = MAX_EXAMPLES,
) -> AuditReport:
    """Audit the Delta table at `location` against the records `topic` holds (see the module docstring;
    `dead_letter`: its dead-letter table's location, None when the spec has none; the others as
    `icefall.audit.table.audit_table`'s). AuditError: no such table, or one filled from another topic."""
    from deltalake import DeltaTable

    from icefall.commit.delta_storage import delta_rs_options

    snapshot = DeltaLog(location).snapshot()
    if not snapshot.exists:
        raise AuditError(f"no Delta table at {location} (no _delta_log)")
    state = snapshot.committed
    if topic.topic is not None and state.topic is not None and topic.topic != state.topic:
        raise AuditError(f"Delta table {location} is filled from topic {state.topic!r}, not {topic.topic!r}")
    report = AuditReport(
        table=location,
        dlq_table=dead_letter,
        topic=state.topic,
        snapshot_id=snapshot.version,
        filter_configured=filter_configured,
        ingesting=ingesting,
        partitions=(),
        content_checked=content is not None,
        lost_records=state.lost_records,
    )
    if None not in (state.topic_id, topic.topic_id) and state.topic_id != topic.topic_id:
        return replace(report, source_changed=_recreated(state, topic))
    storage = delta_rs_options(location)
    read = DeltaTable(location, version=snapshot.version, storage_options=storage).to_pyarrow_table()
    if content is not None and snapshot.schema_string is not None:
        content.decoded.written_as(spark_struct_to_iceberg(without_generated(snapshot.schema_string)))
    main = _side(read, content)
    dlq = _dead_letter_side(dead_letter, content)
    ranges = _ranges(state, main, dlq, topic)
    held = {r.partition: r.held for r in ranges if r.held is not None}
    expected = content.expected(state.topic, held) if content is not None and state.topic and held else None
    wrong = _wrong_rows(main.rows, dlq.rows, expected) if expected is not None else {}
    options = _Options(dead_letter is not None, filter_configured, ingesting, max_examples)
    audits = [
        _audit_range(r, topic, main=main, dlq=dlq, expected=expected, wrong=wrong, options=options)
        for r in ranges
    ]
    return replace(
        report,
        partitions=tuple(audits),
        rows_without_offset=main.nulls + dlq.nulls,
        lost_records_problem=_check_lost_records(state, audits, reset=False),
    )


def _side(read: pa.Table, content: DeltaContent | None) -> _Side:
    """The rows with a partition and an offset (digests by content), and how many lacked one."""
    if content is not None and read.num_rows:  # Spark makes no frame of an empty Arrow table
        rows = content.main_rows(read)
    else:
        kafka = read.column(KAFKA_COLUMN).combine_chunks()
        rows = pa.table(
            {
                "partition": pc.struct_field(kafka, "partition").cast(pa.int64()),
                "offset": pc.struct_field(kafka, "offset").cast(pa.int64()),
                "digest": pa.nulls(read.num_rows, pa.int64()),
            }
        ).cast(ROW_SCHEMA)
    return _known(rows)


def _known(rows: pa.Table) -> _Side:
    """`rows` (ROW_SCHEMA) with a partition and an offset, and how many lacked one."""
    known = pc.and_(pc.is_valid(rows.column("partition")), pc.is_valid(rows.column("offset")))
    return _Side(rows.filter(known), nulls=rows.num_rows - count_true(known))


def _dead_letter_side(location: str | None, content: DeltaContent | None) -> _Side:
    """The dead-letter table's rows at its newest version (none before its first commit, or without one)."""
    if location is None or not DeltaLog(location).snapshot().exists:
        return _Side(empty_rows())
    read = delta_rows(location)
    if read.num_rows == 0:  # Spark makes no frame of an empty Arrow table with timestamps
        return _Side(empty_rows())
    if content is not None:
        rows = content.dead_letter_rows(read)
    else:
        rows = pa.table(
            {"partition": read.column("partition").cast(pa.int64()), "offset": read.column("offset")}
            | {"digest": pa.nulls(read.num_rows, pa.int64())}
        ).cast(ROW_SCHEMA)
    return _known(rows)


def audit_delta_table(
    location: str,
    bootstrap: str,
    *,
    dead_letter: str | None = None,
    kafka_config: Mapping[str, object] | None = None,
    content: DeltaContent | None = None,
    filter_configured: bool = False,
    ingesting: bool = False,
) -> AuditReport:
    """`audit_delta` against the live topic the table names (`icefall verify` of a Delta table)."""
    topic = DeltaLog(location).snapshot().committed.topic
    if topic is None:
        raise AuditError(f"Delta table {location} has no icefall.topic: nothing was ever ingested into it")
    with KafkaTopic(bootstrap, topic, config=kafka_config) as source:
        return audit_delta(
            location,
            source,
            dead_letter=dead_letter,
            content=content,
            filter_configured=filter_configured,
            ingesting=ingesting,
        )


def audit_delta_keyed(
    spark: SparkSession,
    st: StreamingTable,
    location: str,
    *,
    security_options: Mapping[str, str] | None = None,
) -> KeyedAuditReport:
    """`icefall.audit.keyed.audit_keyed` of the keyed Delta table at `location`: the topic's committed
    offset ranges decoded and collapsed to the last change per key, against the rows delta-rs reads at
    the committed version (handed to Spark for the same digests), and the bad records against the Delta
    dead-letter table."""
    from icefall.audit.keyed import KeyedAuditError, compare_with_topic
    from icefall.commit.state import OFFSET_RESETS
    from icefall.ingest.delta_dead_letters import dead_letter_location
    from icefall.ingest.delta_read import with_partition_columns

    snapshot = DeltaLog(location).snapshot()
    if not snapshot.exists:
        raise AuditError(f"no Delta table at {location} (no _delta_log)")
    if snapshot.configuration.get(OFFSET_RESETS):
        raise KeyedAuditError(f"{location}: its offsets were reset; a keyed audit cannot model that yet")
    committed = snapshot.committed
    rows = spark.createDataFrame(delta_rows(location, snapshot.version))
    dlq = dead_letter_location(st, location)
    return compare_with_topic(
        spark, st, st.spec, committed, rows,
        dead_letters=lambda ranges: _dead_letter_rows(spark, dlq, ranges),
        security_options=security_options,
        computed=lambda changes: with_partition_columns(changes, st.spec),  # generated partition columns
    )  # fmt: skip


def delta_rows(location: str, version: int | None = None) -> pa.Table:
    """The rows of the Delta table at `location` (at `version`, else the latest), read by delta-rs through
    its DataFusion scan, which applies deletion vectors (a keyed table's MERGE writes them; delta-rs 1.6's
    `to_pyarrow_table` refuses such tables)."""
    from deltalake import DeltaTable, QueryBuilder

    from icefall.commit.delta_storage import delta_rs_options

    table = DeltaTable(location, version=version, storage_options=delta_rs_options(location))
    read = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    return read.cast(pa.schema([f.with_type(_without_views(f.type)) for f in read.schema]))


def _without_views(kind: pa.DataType) -> pa.DataType:
    """`kind` with DataFusion's view types (string_view, binary_view) as the plain ones Spark reads."""
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_without_views(f.type)) for f in kind])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(_without_views(kind.value_type)))
    if pa.types.is_map(kind):
        return pa.map_(_without_views(kind.key_type), _without_views(kind.item_type))
    return kind


def _dead_letter_rows(spark: SparkSession, location: str | None, ranges: tuple[Any, ...]) -> DataFrame | None:
    """(partition, offset) of the Delta dead-letter table's rows inside `ranges`; None without one."""
    from deltalake import DeltaTable

    from icefall.commit.delta_storage import delta_rs_options

    if location is None:
        return None
    columns = ["partition", "offset"]
    if DeltaLog(location).snapshot().exists:
        read = DeltaTable(location, storage_options=delta_rs_options(location)).to_pyarrow_table(
            columns=columns
        )
    else:
        read = pa.table({"partition": pa.array([], pa.int32()), "offset": pa.array([], pa.int64())})
    found = [
        (p, o)
        for p, o in zip(read.column("partition").to_pylist(), read.column("offset").to_pylist(), strict=True)
        if any(r.partition == p and r.start <= o < r.end for r in ranges)
    ]
    return spark.createDataFrame(found, "partition int, offset long")
