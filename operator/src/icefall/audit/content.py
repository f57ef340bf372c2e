"""The auditor's content side (`icefall.audit.rows.ContentSource` on Spark): rows and records as digests.

`SparkContent` reads the table's rows through Spark's Iceberg catalog at the snapshot the audit names, and
the topic's records through Spark's Kafka source (read_committed, the offsets the audit names), decodes the
records with `icefall.decode.decode` and the StreamingTable's spec (format, schema, transforms: `select`
and `filter`), and turns both sides into one int64 digest per row. Avro records decode as ingestion decodes
them: each with its own writer schema from `spec.format.registry` (`icefall.kafka.registry.WriterSchemas`),
onto the inline schema's fields or, without one, the subject's latest schema's, as ingestion derives them
when it starts (`spec_with_registry_schema`).


- a main-table row: xxhash64 of the JSON of every column but `_kafka`, plus `_kafka.timestamp`
  (columns by name, nulls written out, timestamps to the microsecond, binary as base64);
- a dead-letter row: xxhash64 of the JSON of the record's key, value, timestamp and headers;
- a record: the digest of the row it must have become (GOOD), of the dead letter it must have become
  (DEAD_LETTER), or FILTERED when the spec's filter drops it.

A table whose schema ingestion changed (`icefall.decode.schemas`) is audited as it was written: records decode
into the table's columns (a registry format follows its writer schemas into them), a column the spec no
longer has is null, and a field is compared only for the rows written after the change that added it
(`icefall.schema-changes` records the offsets committed then; older rows hold null in it). Fields added
inside lists or maps are compared on every row.

Equal digests mean equal content with overwhelming probability (a 64-bit hash); a differing row is found
unless it collides. Not guaranteed: a spec changed since the rows were written (another schema, select or
filter) makes rows differ that were right when written — audit with the spec they were written with; for
Avro without an inline schema, the subject's latest schema is part of that spec.
The Spark session must have the table's catalog configured (`CatalogConfig.spark_conf`) under
`catalog_name`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyiceberg.types import StructType

from icefall.audit.rows import DEAD_LETTER, EXPECTED_SCHEMA, FILTERED, GOOD, KAFKA_COLUMN, ROW_SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame, SparkSession

    from icefall.api import StreamingTableSpec

#: `to_json` options: every field written (a null differs from an absent one), timestamps to the microsecond.
JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}
DEAD_LETTER_CONTENT = ("key", "value", "timestamp", "headers")
#: Offsets per Spark task when an audit reads (and caches) a whole topic: one task per partition cached the
#: records of a partition as one block, and a 1,000,000-key topic ran a 1 GB driver out of heap.
RECORDS_PER_TASK = 100_000
_TIMESTAMP = "__icefall_kafka_timestamp"


def cached(frame: DataFrame) -> DataFrame:
    """`frame` cached on local disk only, for the audits that read a whole topic: far more than the heap
    holds. Cached in memory and on disk, a block read back from disk is unrolled into the memory store
    again (Spark's `BlockManager.maybeCacheDiskValuesInMemory`), and the audit of a keyed table of
    5,000,000 keys and 10,000,000 records ran a 1 GB driver out of heap doing it, 100,000 records a task."""
    from pyspark import StorageLevel

    return frame.persist(StorageLevel.DISK_ONLY)


class SparkContent:
    """`ContentSource` on a Spark session: see the module docstring."""

    def __init__(
        self,
        spark: SparkSession,
        spec: StreamingTableSpec,
        catalog_name: str,
        *,
        security_options: Mapping[str, str] | None = None,
        reason: str | None = None,
        reason_prefix: str | None = None,
    ) -> None:
        """`reason`: a dead letter's digest also covers whether its error is exactly this text (a routed
        table's `UNROUTED_REASON`: an unrouted record must say so, a malformed one must not);
        `reason_prefix`: and its error's whole text when it starts so (a dynamic route's refusals)."""
        self.spark = spark
        self.reason = reason
        self.reason_prefix = reason_prefix
        self.spec = spec
        self.catalog_name = catalog_name
        self.security_options = dict(security_options or {})
        self._decoding: StreamingTableSpec | None = None
        self._written: _Written | None = None

    @property
    def decoding_spec(self) -> StreamingTableSpec:
        """The spec the records decode with: `spec`, its registry format's fields filled as ingestion fills
        them (the registry is asked once, on first use)."""
        if self._decoding is None:
            from icefall.kafka.registry import spec_with_registry_schema

            self._decoding = spec_with_registry_schema(self.spec)
        return self._decoding

    def written_as(self, schema: Schema) -> None:
        """Decode records into the columns of `schema` (a table whose schema changes carry no offsets: a
        Delta table's), as ingestion does; `main_rows` sets them from an Iceberg table's snapshot."""
        self._written = _Written(schema, [])

    def main_rows(self, table: Table, snapshot_id: int, *, topic: str | None = None) -> pa.Table:
        """(Also remembers the table's columns and schema changes at `snapshot_id`, for `expected`.)"""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        self._written = _Written.of(table, snapshot_id, topic)
        rows = self._read(table, snapshot_id)
        if topic is not None:
            rows = rows.where(F.col(f"{KAFKA_COLUMN}.topic") == F.lit(topic))
        return _arrow(
            rows.select(
                F.col(f"{KAFKA_COLUMN}.partition").cast("long").alias("partition"),
                F.col(f"{KAFKA_COLUMN}.offset").cast("long").alias("offset"),
                main_digest(rows).alias("digest"),
            ),
            ROW_SCHEMA,
        )

    def dead_letter_rows(self, table: Table, snapshot_id: int, *, topic: str | None = None) -> pa.Table:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        rows = self._read(table, snapshot_id)
        if topic is not None:
            rows = rows.where(F.col("topic") == F.lit(topic))
        return _arrow(
            rows.select(
                F.col("partition").cast("long").alias("partition"),
                F.col("offset").cast("long").alias("offset"),
                self.dead_letter_digest(rows).alias("digest"),
            ),
            ROW_SCHEMA,
        )

    def expected(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        from icefall.decode.decode import split

        decoded, spec = self.decoded(topic, ranges)
        try:
            prepared = split(decoded, spec)
            good = self.good_digests(prepared.good).select(
                "partition", "offset", F.lit(GOOD).cast("byte").alias("kind"), "digest"
            )
            bad = prepared.bad.select(
                F.col("partition").cast("long").alias("partition"),
                F.col("offset").cast("long").alias("offset"),
                F.lit(DEAD_LETTER).cast("byte").alias("kind"),
                self.dead_letter_digest(prepared.bad).alias("digest"),
            )
            kept = good.unionByName(bad)
            filtered = (
                decoded.select(
                    F.col("partition").cast("long").alias("partition"),
                    F.col("offset").cast("long").alias("offset"),
                )
                .join(kept.select("partition", "offset"), ["partition", "offset"], "left_anti")
                .select(
                    "partition",
                    "offset",
                    F.lit(FILTERED).cast("byte").alias("kind"),
                    F.lit(None).cast("long").alias("digest"),
                )
            )
            return _arrow(kept.unionByName(filtered), EXPECTED_SCHEMA)
        finally:
            decoded.unpersist()

    def decoded(
        self, topic: str, ranges: Mapping[int, tuple[int, int]]
    ) -> tuple[DataFrame, StreamingTableSpec]:
        """The records of `topic` in `ranges` decoded as ingestion decodes them (persisted: the caller
        unpersists), and the spec they decoded with."""
        from icefall.decode.decode import decode
        from icefall.ingest.engine import read_kafka
        from icefall.plan.offsets import OffsetRange

        if not self.spec.source.reads(topic):
            raise ValueError(f"the spec reads topic {self.spec.source.topics_text}, not {topic!r}")
        offset_ranges = tuple(OffsetRange(p, start, end, topic) for p, (start, end) in sorted(ranges.items()))
        kafka = read_kafka(
            self.spark, self.spec, offset_ranges, self.security_options, records_per_task=RECORDS_PER_TASK
        )
        spec = self.decoding_spec
        if self._written is not None:
            spec = self._written.decoding(spec)
        return cached(decode(kafka, spec)), spec

    def good_digests(self, good: DataFrame) -> DataFrame:
        """(`partition`, `offset`, `digest`) of decoded good rows, as the table holds them."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        rows = self._written.as_written(good) if self._written is not None else good
        return rows.select(
            F.col(f"{KAFKA_COLUMN}.partition").cast("long").alias("partition"),
            F.col(f"{KAFKA_COLUMN}.offset").cast("long").alias("offset"),
            main_digest(rows).alias("digest"),
        )

    def dead_letter_digest(self, rows: DataFrame) -> Column:
        """`dead_letter_digest` of dead-letter rows (with `error`), with `reason` and `reason_prefix`."""
        return dead_letter_digest(rows, self.reason, self.reason_prefix)

    def _read(self, table: Table, snapshot_id: int) -> DataFrame:
        name = ".".join(f"`{part}`" for part in (self.catalog_name, *table.name()))
        return self.spark.sql(f"SELECT * FROM {name} VERSION AS OF {int(snapshot_id)}")


class _Written:
    """The table's columns at the audited snapshot, and the fields each ingestion schema change added."""

    def __init__(self, schema: Schema, added: list[tuple[tuple[str, ...], Mapping[int, int]]]) -> None:
        self.schema = schema
        self.added = added  # (path of an added field in `schema`, the offsets committed before it)

    @classmethod
    def of(cls, table: Table, snapshot_id: int, topic: str | None = None) -> _Written:
        from icefall.commit.state import schema_changes
        from icefall.decode.schemas import schema_at

        meta = table.metadata
        schemas = {s.schema_id: s for s in meta.schemas}
        schema = schema_at(table, snapshot_id)
        paths = _struct_paths(schema.as_struct(), ())
        added = []
        for change in schema_changes(meta.properties):
            before = [s for i, s in schemas.items() if i < change.schema_id]
            after = schemas.get(change.schema_id)
            if after is None or not before:
                continue
            older = set(_struct_paths(max(before, key=lambda s: s.schema_id).as_struct(), ()).values())
            new_ids = set(_struct_paths(after.as_struct(), ()).values()) - older
            offsets = change.offsets_of(topic)
            added += [(path, offsets) for path, field_id in paths.items() if field_id in new_ids]
        return cls(schema, added)

    def decoding(self, spec: StreamingTableSpec) -> StreamingTableSpec:
        """`spec` as ingestion decodes with it (`icefall.decode.schemas.decoding_spec`)."""
        from icefall.decode.schemas import decoding_spec

        return decoding_spec(spec, self.schema)

    def as_written(self, good: DataFrame) -> DataFrame:
        """Decoded good rows as the table holds them: every column, the added fields null before they
        existed."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        from icefall.decode.decode import with_every_column

        rows = with_every_column(good, self.schema)
        partition, offset = F.col(f"{KAFKA_COLUMN}.partition"), F.col(f"{KAFKA_COLUMN}.offset")
        for path, offsets in self.added:
            before = F.lit(False)
            for p, o in offsets.items():
                before = before | ((partition == F.lit(p)) & (offset < F.lit(o)))
            top = path[0]
            if len(path) == 1:
                rows = rows.withColumn(top, F.when(~before, F.col(f"`{top}`")))
            else:
                nested = ".".join(path[1:])
                value = F.col(f"`{top}`").withField(nested, F.when(~before, F.col(f"`{top}`.{nested}")))
                rows = rows.withColumn(top, F.when(F.col(f"`{top}`").isNotNull(), value))
        return rows


def _struct_paths(struct: StructType, at: tuple[str, ...]) -> dict[tuple[str, ...], int]:
    """Field id of every field reached through structs only (not inside lists or maps), by path."""
    paths: dict[tuple[str, ...], int] = {}
    for field in struct.fields:
        path = (*at, field.name)
        paths[path] = field.field_id
        if isinstance(field.field_type, StructType):
            paths.update(_struct_paths(field.field_type, path))
    return paths


def main_digest(rows: DataFrame) -> Column:
    """The digest of a main-table row (or of a decoded good row: the same columns)."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    columns = sorted(c for c in rows.columns if c != KAFKA_COLUMN)
    content = F.struct(
        *[F.col(f"`{c}`") for c in columns], F.col(f"{KAFKA_COLUMN}.timestamp").alias(_TIMESTAMP)
    )
    return F.xxhash64(F.to_json(content, JSON_OPTIONS))


def dead_letter_digest(
    rows: DataFrame, reason: str | None = None, reason_prefix: str | None = None
) -> Column:
    """The digest of a dead-letter row (or of a bad record): its key, value, timestamp and headers (with
    `reason`, and whether its `error` is that text; with `reason_prefix`, its `error` if it starts so)."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    content = [F.col(c) for c in DEAD_LETTER_CONTENT]
    if reason is not None:
        content.append(F.coalesce(F.col("error") == F.lit(reason), F.lit(False)).alias("__icefall_reason"))
    if reason_prefix is not None:
        routing = F.when(F.col("error").startswith(reason_prefix), F.col("error"))
        content.append(routing.alias("__icefall_routing_reason"))
    return F.xxhash64(F.to_json(F.struct(*content), JSON_OPTIONS))


def _arrow(frame: DataFrame, schema: pa.Schema) -> pa.Table:
    return frame.toArrow().cast(schema)
