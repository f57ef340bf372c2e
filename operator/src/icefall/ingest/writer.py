"""The Spark side of a batch: read its offsets with Spark's Kafka source, decode them, and write the good
rows to a staging branch (append, or MERGE for a keyed table); read the bad rows again for the dead letters.

Guarantees: every read is read_committed whatever `spec.source.properties` say; a write whose observed
counts show its input was computed twice raises instead of reporting wrong numbers. Not done here: any
catalog commit of `main`, the lease, or deciding what to read (`icefall.ingest.planning`); the staging
branch is made and committed by `icefall.ingest.commits`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from icefall.api import StreamingTable, StreamingTableSpec
from icefall.decode.known_writers import KnownWriters
from icefall.ingest.planning import NOTHING_READ, PlannedBatch, ReadStats
from icefall.ingest.routes import Destination, Routing
from icefall.kafka.admin import ISOLATION
from icefall.plan.offsets import OffsetRange, spark_offset_options

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

    from icefall.commit import WrittenFiles
    from icefall.decode.avro import BatchWriters, SchemaLookup
    from icefall.decode.decode import Decoder
    from icefall.decode.schemas import Writers
    from icefall.ingest.routes import RouteStage

log = logging.getLogger(__name__)

#: Before a batch is written: given its writer schemas (None for json), make the table hold them and
#: return the table's schema (`icefall.ingest.batches`).
Evolve = Callable[["Writers | None"], "Schema"]

#: Consumer settings for Spark's Kafka reader, unless `spec.source.properties` set them. After each poll
#: the reader asks the broker for the partition's earliest and latest offsets; a consumer that has read to
#: the end of a partition has a fetch waiting at the broker for up to `fetch.max.wait.ms` (500 ms by
#: default), and a broker answers one request per connection at a time, so every task of a caught-up batch
#: waited half a second. Larger polls mean fewer round trips per batch.
SPARK_CONSUMER_DEFAULTS = {"fetch.max.wait.ms": "10", "max.poll.records": "5000"}
#: The writer schemas of the latest versions of a spec's subjects, values' and keys' by id
#: (`icefall.kafka.registry.registered_writers`): what a writer's first batch decodes with.
Registered = Callable[[], tuple[Mapping[int, str], Mapping[int, str]]]


def read_kafka(
    spark: SparkSession,
    spec: StreamingTableSpec,
    ranges: tuple[OffsetRange, ...],
    security_options: Mapping[str, str],
    *,
    group_id: str | None = None,
    headers: bool = True,
    records_per_task: int | None = None,
) -> DataFrame:
    """Spark's Kafka batch source over `ranges` (`OffsetRange`s of the topic each names, else of the spec's
    first topic), as ingestion reads it: assigned partitions, explicit offsets, headers, read_committed
    whatever `spec.source.properties` say; `security_options` from `spark_kafka_options` (secrets: never
    logged).

    `group_id`: the consumers' group id, unless `spec.source.properties` sets `group.id` (Kafka ACLs may
    require a given one). Spark pools its consumers per group id and partition, so a fixed id lets every
    batch reuse them; without one, Spark makes a new id (and new consumers) per read. The group is never
    joined (partitions are assigned) and nothing commits offsets to it: Spark's Kafka source turns
    `enable.auto.commit` off and never commits; Icefall's offsets live in the table. Without `headers`,
    the records' headers are not read (the `headers` column is absent). `records_per_task`: split each
    partition's range into Spark tasks of at most that many offsets (Spark's `maxRecordsPerPartition`;
    default: one task per partition), so a read of a whole topic that is cached does not hold a partition's
    records in one block.
    """
    topic = spec.source.first_topic  # of the ranges that name none
    assigned: dict[str, list[int]] = {}
    for r in ranges:
        assigned.setdefault(r.topic or topic, []).append(r.partition)
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", spec.source.bootstrap_servers)
        .option("assign", json.dumps({t: sorted(partitions) for t, partitions in assigned.items()}))
        .option("includeHeaders", str(headers).lower())
    )
    group = {"group.id": group_id} if group_id is not None else {}
    for key, value in {**SPARK_CONSUMER_DEFAULTS, **group, **spec.source.properties, **ISOLATION}.items():
        reader = reader.option(f"kafka.{key}", value)
    for key, value in {**security_options, **spark_offset_options(topic, ranges)}.items():
        reader = reader.option(key, value)
    if records_per_task is not None:
        reader = reader.option("maxRecordsPerPartition", str(records_per_task))
    return reader.load()


class Decoders:
    """The spec's `Decoder`s and the batch's observed aggregates, built once per writer: building them
    costs more than reading and writing a small batch (`icefall.decode.decode.Decoder`)."""

    def __init__(self, spec: StreamingTableSpec, schemas: SchemaLookup | None = None) -> None:
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.decode.decode import BAD_COLUMN, BYTES_COLUMN, Decoder

        self.spec = spec
        self.schemas = schemas
        self.good = Decoder(spec, errors=False, schemas=schemas)  # no error text: the table's rows
        self.observed = [
            F.count(F.lit(1)).alias("records"),
            F.sum(BYTES_COLUMN).alias("bytes"),
            F.max("timestamp").alias("newest"),
            F.count_if(F.col(BAD_COLUMN)).alias("bad"),
            *self.good.observed_ids(),  # a registry format: the batch's schema ids
        ]

    @functools.cached_property
    def with_errors(self) -> Decoder:
        """The dead-letter path's decoder (with error text), built when a batch first has bad records."""
        from icefall.decode.decode import Decoder

        return Decoder(self.spec, schemas=self.schemas)


class BatchWriter:
    """One writer's Spark work: reads, decodes, appends or merges into staging branches. No commits."""

    def __init__(
        self,
        st: StreamingTable,
        spark: SparkSession,
        *,
        catalog_name: str,
        kafka_options: Mapping[str, str],
        writer_id: str,
        schemas: SchemaLookup | None = None,
        registered: Registered | None = None,
    ) -> None:
        """`kafka_options`: Spark's Kafka security options (secrets: never logged). `schemas`: writer
        schemas by id; `registered`: the latest of the spec's subjects, learnt before the first batch."""
        self.st = st
        self.spec = st.spec
        self.spark = spark
        self.catalog_name = catalog_name
        self.writer_id = writer_id
        self.label = ".".join(st.table_identifier)
        # One Kafka consumer group per writer, the same for every batch (`read_kafka`).
        self.consumer_group = f"icefall-{self.label}-{writer_id}"
        self._kafka_options = kafka_options
        self._schemas = schemas
        self._registered = registered
        # The table's schema the decoders were built for (`icefall.decode.schemas.decoding_spec`).
        self._table_schema: Schema | None = None
        # cdc with sequenceBy: the deleted keys file this writer wrote last to each table (by its name; a
        # routed table's destinations each have theirs) and its content, so that the next batch does not
        # read back what it has (`_merge_changes`).
        self._deleted_keys: dict[tuple[str, ...], tuple[str, pa.Table]] = {}
        # A registry format: every writer schema this writer has met; each batch decodes with them.
        self.known = KnownWriters()
        # spec.routes, spec.dynamicRoute: the routes and their Spark side (`icefall.ingest.routes`).
        self.routing = Routing(st, self.spark_name) if st.spec.routed else None

    @functools.cached_property
    def decoders(self) -> Decoders:
        """Built on first use (its columns need the running Spark session), again after the table's schema
        changed (`use_table_schema`)."""
        from icefall.decode.schemas import decoding_spec

        schema = self._table_schema
        return Decoders(decoding_spec(self.spec, schema) if schema is not None else self.spec, self._schemas)

    def use_table_schema(self, schema: Schema) -> None:
        """Write into the columns of `schema` (the table's current schema) from now on."""
        same = self._table_schema is not None and self._table_schema.schema_id == schema.schema_id
        if same and self._table_schema == schema:  # (a Delta table's schemas all have id 0: the columns)
            return
        from icefall.decode.schemas import follows_table

        changed = self._table_schema is not None or follows_table(self.spec)
        self._table_schema = schema
        if changed:
            self.__dict__.pop("decoders", None)  # built again, into the new columns

    def read(self, ranges: tuple[OffsetRange, ...], *, headers: bool = True) -> DataFrame:
        return read_kafka(
            self.spark,
            self.spec,
            ranges,
            self._kafka_options,
            group_id=self.consumer_group,
            headers=headers,
        )

    def empty_source(self) -> DataFrame:
        """No records, in the columns of Spark's Kafka source (for the analyser to type the transforms)."""
        from icefall.decode.decode import HEADERS_TYPE

        schema = (
            "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
            f"timestampType int, headers {HEADERS_TYPE.simpleString()}"
        )
        return self.spark.createDataFrame([], schema)

    def spark_name(self, identifier: tuple[str, ...], branch: str) -> str:
        return ".".join([self.catalog_name, *identifier, f"branch_{branch}"])

    def write_good_rows(
        self,
        planned: PlannedBatch,
        branch: str,
        table: Table,
        evolve: Evolve | None = None,
        routes: Sequence[RouteStage] = (),
    ) -> ReadStats:
        """Read the planned offsets, decode them (no error text) and append the good rows to `branch` of
        `table`, in one Spark job that also counts, through an observation, every record read, their value
        bytes, the newest produce time and the bad rows. A batch with nothing to read writes nothing here
        (its commit stages its empty snapshot). `evolve` first makes the table hold the writer schemas.

        A registry format decodes with the writer schemas this writer has met (`known`; before its first
        batch, the latest of its subjects': `writers_for`). The observation
        also names the batch's schema ids: ids not met before are looked up, and when one has a writer
        schema the stats say `unseen_writers` (the batch must be written again, `plan.pipelining`
        REWRITE).

        With `routing` (`spec.routes`), the same one read and decode is cached and written to `table`'s
        branch (the unrouted records) and to each route's (`routes`: those that take part of the batch)."""
        if not planned.ranges:
            return NOTHING_READ
        from pyspark.sql import Observation

        from icefall.decode.decode import with_every_column

        # The table's rows carry no headers: only dead letters keep them (`bad_rows`).
        routing = self.routing
        source = self.read(planned.ranges, headers=routing is not None and routing.headers)
        writers = self.writers_for()
        self.use_table_schema(evolve(writers) if evolve is not None else table.schema())
        decoders = self.decoders
        observation = Observation()
        decoded = decoders.good.decode(source, writers)
        if routing is not None:
            decoded = routing.routed(decoded)
        observed = decoded.observe(observation, *decoders.observed, *(routing.observed() if routing else ()))
        target = self.spark_name(self.st.table_identifier, branch)
        sorted_table = bool(self.spec.table.sort_order)
        deleted_keys = None
        routes_deleted_keys: dict[str, str] = {}
        routes_files: dict[str, WrittenFiles] = {}
        route_bad = 0
        if routing is not None:

            def rows_of(frame: DataFrame, carry: Sequence[str] = ()) -> DataFrame:
                return with_every_column(decoders.good.good_rows(frame, carry), self._table_schema)

            def write_to(rows: DataFrame, to: Destination) -> str | None:
                if self.spec.key:  # each destination is keyed: its changes MERGEd as the table's are
                    return self._merge_changes(rows, to.deleted_keys, to.target, to.table, to.spec)
                append(rows, to.target, sorted_table=to.sorted_table)
                return None

            def read() -> tuple[int, int]:
                seen = observation.get
                return int(seen["records"] or 0), int(seen["bytes"] or 0)

            main = Destination(target, sorted_table, table, planned.committed.deleted_keys)
            written = routing.write(observed, list(routes), rows_of, write_to, main, read=read)
            routes_deleted_keys, route_bad, routes_files = (
                dict(written.deleted_keys),
                written.bad,
                written.files,
            )
            deleted_keys = routes_deleted_keys.pop(target, None)
        elif self.spec.key:
            rows = with_every_column(decoders.good.good_rows(observed), self._table_schema)
            deleted_keys = self._merge_changes(rows, planned.committed.deleted_keys, target, table)
        else:
            rows = with_every_column(decoders.good.good_rows(observed), self._table_schema)
            append(rows, target, sorted_table=sorted_table)
        seen = observation.get
        stats = ReadStats.of(seen["records"], seen["bytes"], seen["newest"], seen["bad"], deleted_keys)
        if routing is not None:  # unrouted, refused dynamic names, not fitting an own route: dead letters too
            unrouted = routing.letters(int(seen["unrouted"] or 0))
            stats = dataclasses.replace(
                stats,
                bad=stats.bad + route_bad,
                unrouted=unrouted,
                routes_deleted_keys=routes_deleted_keys,
                routes_files=routes_files,
            )
        planned_offsets = sum(r.records for r in planned.ranges)
        if stats.records > planned_offsets:
            # Each offset holds at most one record: the write ran its input twice, and every count is off.
            raise RuntimeError(
                f"{self.label}: the batch's write counted {stats.records} records in {planned_offsets} "
                "offsets (its input was computed twice); the batch is not committed"
            )
        if writers is None:
            return stats
        from icefall.decode.framing import KEY_SCHEMA_IDS, SCHEMA_IDS

        return self.learned(stats, seen.get(SCHEMA_IDS) or [], seen.get(KEY_SCHEMA_IDS) or [])

    def writers_for(self) -> BatchWriters | None:
        """The writer schemas a batch decodes with: those met so far (None: not a registry format). Before
        the first batch they are the latest of the spec's subjects (`registered`: asked of the registry,
        no Spark job reads the batch for its ids); an id the batch holds beyond them is met by
        the write's observation like any new one (the batch is written again with it)."""
        good = self.decoders.good
        if not good.uses_registry:
            return None
        if self.known.empty:
            values, keys = self._registered() if self._registered is not None else ({}, {})
            self.known.learn(values, keys)
            log.info(
                "%s: decoding with the subjects' latest writer schemas: ids %s (keys %s)",
                self.label,
                sorted(values),
                sorted(keys),
            )
        from icefall.decode.avro import BatchWriters

        return BatchWriters(self.known.values, self.known.keys)

    def learned(self, stats: ReadStats, values: Sequence[int], keys: Sequence[int]) -> ReadStats:
        """`stats` with the batch's writer schemas, after the registry's answer for the ids of the batch
        not met before (`values`, `keys`: the ids the write observed)."""
        unseen_values, unseen_keys = self.known.unseen(values, keys)
        unseen = False
        if unseen_values or unseen_keys:
            assert self._schemas is not None  # a registry format's decoder has a lookup
            found = self._schemas(sorted({*unseen_values, *unseen_keys}))
            unseen = self.known.learn(
                {i: found.get(i) for i in unseen_values}, {i: found.get(i) for i in unseen_keys}
            )
            log.log(
                logging.INFO if unseen else logging.DEBUG,
                "%s: the batch holds schema ids it was not decoded with (values %s, keys %s)%s",
                self.label,
                unseen_values,
                unseen_keys,
                ": writing it again with their writer schemas" if unseen else "; the registry has none",
            )
        return dataclasses.replace(stats, writers=self.known.of_values(values), unseen_writers=unseen)

    def _merge_changes(
        self,
        rows: DataFrame,
        committed: str | None,
        target: str,
        table: Table,
        spec: StreamingTableSpec | None = None,
    ) -> str | None:
        """MERGE the last change per key of a keyed batch's `rows` into `target` (a staging branch of
        `table`), keyed by `spec` (an own route's; default the table's). With `spec.sequenceBy` first drop
        the changes older than a delete remembered in `committed` (the deleted keys file `table`'s committed
        state names) and store the deleted keys to remember (`icefall.ingest.deleted_keys`); returns that
        file, for the commit to name, or None."""
        from icefall.decode.decode import last_changes
        from icefall.ingest import deleted_keys

        spec = spec if spec is not None else self.spec
        key = spec.key or []
        view = f"icefall_changes_{self.writer_id}"
        if not spec.sequence_by:
            merge(last_changes(rows, key), target, key, view=view)
            return None
        last = self._deleted_keys.get(table.name())
        if last is not None and last[0] == committed:
            remembered: pa.Table | None = last[1]
        else:
            remembered = deleted_keys.load(table, committed)
        remembering = deleted_keys.Remembering(
            remembered, now_ms=int(time.time() * 1000), keep_ms=1000 * spec.deletes_remembered_seconds
        )
        merge(remembering.filter(self.spark, last_changes(rows, key), key), target, key, view=view)
        keys = remembering.kept()
        if keys is None:
            return None  # the commit keeps the set named now
        path = deleted_keys.store(table, keys)
        self._deleted_keys[table.name()] = (path, keys)
        return path

    def bad_rows(self, ranges: tuple[OffsetRange, ...]) -> DataFrame:
        """The bad records of `ranges`, read again and decoded with their error text and headers."""
        from icefall.decode.decode import bad_rows

        with_errors = self.decoders.with_errors
        writers = None
        if with_errors.uses_registry and not self.known.empty:
            from icefall.decode.avro import BatchWriters

            # As the good rows were decoded: every id of the batch is met by now, each keeps its answer.
            writers = BatchWriters(self.known.values, self.known.keys)
        decoded = with_errors.decode(self.read(ranges), writers)
        by_topic = self.spec.source.by_topic
        if self.routing is None:
            return bad_rows(decoded, by_topic=by_topic)
        rows = bad_rows(self.routing.dead_letters(decoded), by_topic=by_topic)
        if self.routing.own:  # (the dead-letter path reads the batch again for them)
            rows = rows.unionByName(self.routing.own_dead_letters(decoded, by_topic=by_topic))
        return rows


def append(rows: DataFrame, name: str, *, sorted_table: bool) -> None:
    """Append `rows` to the Spark table `name` (a staging branch).

    A table with a sort order gets hash distribution: clustered by partition, each file sorted (not range
    distribution, Iceberg's default for a sorted table: it samples its input in a job of its own, which
    would compute the batch twice and make the batch's observed counts count every record twice). An
    unsorted table is written without a shuffle: the read tasks, coalesced to Spark's parallelism, each
    sort their rows by partition and write them (at most that many files per partition and batch;
    compaction merges them). bench/write_path.py: the shuffle cost 6 to 20 % of the write's CPU. Not the
    fanout writer (no sort): as cheap here, but it keeps a file open per partition value in each task,
    which a backfill over many hours or an identity partition on a wide column would make thousands.
    """
    if sorted_table:
        rows.writeTo(name).option("distribution-mode", "hash").append()
        return
    tasks = rows.sparkSession.sparkContext.defaultParallelism
    writer = rows.coalesce(tasks).writeTo(name).option("distribution-mode", "none")
    writer.option("fanout-enabled", "false").append()


def merge(changes: DataFrame, name: str, key: Sequence[str], *, view: str) -> None:
    """Apply a keyed batch's `changes` (good rows with `DELETE_COLUMN`) to the Spark table `name` (a
    staging branch) in ONE Spark MERGE: one snapshot, new rows plus position deletes of the rows they
    replace (the table is merge-on-read, `icefall.catalog.tables.KEYED_TABLE_DEFAULTS`).

    `changes` are the batch's last change per key (`icefall.decode.decode.last_changes`), and that one
    decides alone: insert-then-delete leaves no row, delete-then-insert leaves the insert, and the
    batch never deletes a row it writes itself (position deletes name rows of files already there). With
    `SEQUENCE_COLUMN` (cdc with `spec.sequenceBy`) a change older than the row's stored position, or
    without one (a tombstone), leaves the row as it is.
    """
    from icefall.decode.decode import DELETE_COLUMN, SEQUENCE_COLUMN

    changes.createOrReplaceTempView(view)
    columns = [_quoted(c) for c in changes.columns if c != DELETE_COLUMN]
    on = " AND ".join(f"t.{_quoted(k)} = s.{_quoted(k)}" for k in key)
    delete = f"s.{_quoted(DELETE_COLUMN)}"
    current = "true"
    if SEQUENCE_COLUMN in changes.columns:
        s_seq, t_seq = f"s.{_quoted(SEQUENCE_COLUMN)}", f"t.{_quoted(SEQUENCE_COLUMN)}"
        current = f"({s_seq} IS NOT NULL AND NOT coalesce({s_seq} < {t_seq}, false))"
    changes.sparkSession.sql(
        f"MERGE INTO {name} t USING {view} s ON {on} "
        f"WHEN MATCHED AND {current} AND {delete} THEN DELETE "
        f"WHEN MATCHED AND {current} THEN UPDATE SET {', '.join(f't.{c} = s.{c}' for c in columns)} "
        f"WHEN NOT MATCHED AND NOT {delete} THEN INSERT ({', '.join(columns)}) "
        f"VALUES ({', '.join(f's.{c}' for c in columns)})"
    )


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"
