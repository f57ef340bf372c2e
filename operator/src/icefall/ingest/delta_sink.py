"""The ingestion writer of a Delta Lake table (`spec.table.format: delta`): Kafka offset ranges in, one
exactly-once Delta commit per batch out (`icefall.commit.delta`; commit/DESIGN.md, "Delta Lake").

`DeltaIngestor` has the Ingestor's shape (`start`, `run_batch`, `run`, `close`, `outages`), so `icefall run`
drives either. It shares the planning (`icefall.ingest.planning`: offsets from the table's committed state
and the watermarks, topic id checks, retention gaps) and the Spark read and decoding
(`icefall.ingest.writer`) with the Iceberg path; only the write and the commit are its own: Spark writes the
good rows as Parquet into a staging folder under the table, the files move into the table's folder
(invisible until a log entry names them), and `commit_batch` lands them with the offsets in one log entry.

Guarantees: a batch is in the table once or not at all; a writer whose lease was taken over cannot commit
(epoch in the table); every Kafka read is read_committed; a recreated topic stops ingestion
(SourceChangedError). Bad records go to the dead-letter table beside it and to `spec.deadLetter.topic`
(at least once, as for Iceberg), both before the table's commit (`icefall.ingest.delta_dead_letters`);
with neither (`spec.deadLetter.table.enabled: false`, no topic) a bad record stops ingestion with
BadRecordsHaltedError, nothing of its batch committed. A keyed table (`spec.mode`
upsert or cdc; partitioned or not, local or on S3) MERGEs each batch's last change per key with deletion
vectors, in the same commit as its offsets (`icefall.ingest.delta_keyed`: the MERGE runs on a local shadow
naming the table's files by URI, the writer keeps the log replay it needs, `_files_at`).

Schema evolution: the table's schema follows the spec's (`icefall.catalog.delta_schema`, the rules of
`icefall.catalog.evolution`): a new optional field is added by the next batch's commit, in its log entry
(`commit_batch(schema_string=...)`), so the new column, the rows that first fill it and their offsets land
together; rows already in the table read it as null; a narrower type is written as the table's. What the
table cannot follow (a type changed or widened, a new required field) raises DeltaSchemaRefusedError at
start and before any batch is written.

Registry formats (avro, protobuf, jsonSchema): without an inline schema the table's columns are the
subject's latest schema at start (`with_registry_schema`, as for Iceberg); records decode with every writer
schema this writer has met (`BatchWriter.writers_for`, `icefall.decode.known_writers`) into the table's
columns, and the table follows each of them too (`plan_delta_schemas`: the spec's, then the writer schemas,
oldest id first): a writer schema's new field is added in the log entry of the batch that first holds its
records. A batch that meets a writer schema it was not decoded with is written again with it before
anything is committed (its first files are dropped; a keyed batch's first MERGE leaves unnamed files that
VACUUM removes). A writer schema the table cannot follow raises DeltaSchemaRefusedError, nothing of its
batch committed (an Iceberg table instead dead-letters the values that do not fit). Records whose schema
id the registry does not know, or whose bytes do not decode, are dead letters as for Iceberg; a registry
that cannot be reached is an outage, waited out.

Partitioning: Spark's `partitionBy` folders, their values in the commit's `add` actions
(`icefall.commit.delta.moved_into`); a partition transform (`day(ts)`, ...) is a generated column of the
table (`icefall.api.delta_partitions`), computed into each batch's rows (`with_partition_columns`) and
named in the table's schema with its expression, so Spark's Delta reader prunes by it.

Not done yet for Delta (refused by the spec's validation where it is a setting): pipelining, GCS and
Azure. The upkeep (OPTIMIZE, checkpoints, VACUUM) is `icefall.compact.delta`'s.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from icefall.api import StreamingTable, StreamingTableSpec, TableMode, to_spark_schema_json
from icefall.api.delta_partitions import delta_partitions, without_generated
from icefall.catalog.delta_schema import (
    DeltaSchemaPlan,
    DeltaSchemaRefusedError,
    Wanted,
    plan_delta_schemas,
    wanted_schema,
    written_schema,
)
from icefall.commit import FencedError, StaleHeadError
from icefall.commit.batch import held_of
from icefall.commit.delta import (
    AddFile,
    DeltaLog,
    DeltaSnapshot,
    claim_epoch,
    commit_batch,
    create_table,
    moved_into,
)
from icefall.commit.errors import LayoutChangedError
from icefall.decode.columns import DELETE_COLUMN
from icefall.decode.schemas import follows_table, writer_fields
from icefall.ingest.commits import LeaseKeeper
from icefall.ingest.delta_dead_letters import DeltaDeadLetters, dead_letter_location
from icefall.ingest.delta_read import with_partition_columns
from icefall.ingest.outages import Outages, registry_address, sleep_unless
from icefall.ingest.outcome import NO_DEAD_LETTERS, DeadLettersLanded
from icefall.ingest.planning import PlannedBatch, Planner, Progress, ReadStats
from icefall.ingest.report import BatchReport, publish_batch
from icefall.ingest.writer import BatchWriter
from icefall.kafka.admin import TopicView
from icefall.kafka.security import librdkafka_config, spark_kafka_options
from icefall.plan.batching import next_batch_delay
from icefall.plan.lag import partition_lag
from icefall.plan.outages import Service
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyspark.sql import DataFrame, Observation, SparkSession

    from icefall.commit.delta_files import LogFiles
    from icefall.commit.lease import Lease
    from icefall.decode.schemas import Writers
    from icefall.ingest.delta_keyed import Merged
    from icefall.kafka.registry import Registry

log = logging.getLogger(__name__)

STAGING_DIR = "_icefall_staging"  # under the table's folder; names starting with _ are not table data
#: The last line of a refusal of a registry format's table: what to do about a writer schema.
WRITER_SCHEMA_FIX = (
    "A writer schema the Delta table cannot follow stops its ingestion before the batch that holds its "
    "records commits: produce them with a schema the table can follow (a registry with BACKWARD "
    "compatibility refuses such a change under the subject), or write a new table (a new "
    "spec.table.location)"
)


class BadRecordsHaltedError(RuntimeError):
    """A batch of a Delta table held records that do not decode, and the spec has no dead-letter table."""


def default_location(warehouse: Path, namespace: str, name: str) -> str:
    """Where a Delta table lives without `spec.table.location`: the warehouse plus namespace/table."""
    return str(warehouse.joinpath(*namespace.split("."), name))


class DeltaIngestor:
    """One Delta table's writer. Call `start()` once (takes the lease), then `run_batch()` or `run()`."""

    def __init__(
        self,
        st: StreamingTable,
        spark: SparkSession,
        lease: Lease,
        *,
        location: str,
        writer_id: str | None = None,
        registry: Registry | None = None,
    ) -> None:
        """`registry`: writer schemas by id and the latest schema (default: the spec's `format.registry`,
        if any); without an inline schema the latest one is asked for here."""
        from icefall.kafka.registry import WriterSchemas, registered_writers, with_registry_schema

        if registry is None and st.spec.format.registry is not None:
            registry = WriterSchemas(st.spec.format.registry, format_type=st.spec.format.type)
        self.columns_from = columns_source(st.spec)  # names the spec's schema in refusals
        st = with_registry_schema(st, registry.latest_schema if registry is not None else None)
        self.st, self.spec, self.spark = st, st.spec, spark
        self.lease = lease
        self.writer_id = writer_id or uuid.uuid4().hex[:12]
        self.label = ".".join(st.table_identifier)
        self.log = DeltaLog(location)
        source = self.spec.source
        self._kafka_config = librdkafka_config(source.security)  # secret values: for the clients only
        self.topic = TopicView(source.bootstrap_servers, source.first_topic, self._kafka_config)
        self.topics = {
            t: self.topic if t == source.first_topic else self.topic.sibling(t) for t in source.topic_names
        }
        self.writer = BatchWriter(
            st,
            spark,
            catalog_name="",
            kafka_options=spark_kafka_options(source.security),
            writer_id=self.writer_id,
            schemas=registry.lookup if registry is not None else None,
            registered=functools.partial(registered_writers, registry, st.spec)
            if registry is not None
            else None,
        )
        self.planner = Planner(self.spec, self.label, self.topics)
        dlq_location = dead_letter_location(st, location)
        self.dead_letters = (
            DeltaDeadLetters(self.writer, dlq_location, self._kafka_config)
            if self.spec.dead_letter.enabled  # a dead-letter table, a topic, or both
            else None
        )
        self.progress = Progress()
        self.epoch = 0
        self.wanted: Wanted | None = None  # the batch's schema as the spec wants it (`start`)
        self.rows_schema: str | None = None  # the batch's rows' Spark schema (`start`)
        # The last schema plan: (table's schema, writer schema ids) it was made for.
        self._schema_plan: tuple[tuple[str, frozenset[int]], DeltaSchemaPlan] | None = None
        self.keeper: LeaseKeeper | None = None
        self._files: LogFiles | None = None  # a keyed table's live files, replayed from the log (`_files_at`)
        self.outages = Outages(self.label, delta_services(self.spec, location))
        # Delta's timestamp is microseconds since the epoch in UTC: Spark's Parquet default (INT96) is not it.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, lease_timeout: float | None = None) -> None:
        """Take the commit lease, create the table if needed, claim the epoch in it, drop staging folders a
        crashed writer left. If anything fails the lease is given back, so `start` may be called again."""
        try:
            floor = self.log.snapshot().committed.epoch
            self.epoch = self.lease.acquire(lease_timeout, floor=floor)
            self.keeper = LeaseKeeper(self.lease)
            self.keeper.start()
            rows = with_partition_columns(self._good_rows(self.writer.empty_source()), self.spec)
            keyed = bool(self.spec.key)
            schema = (rows.drop(DELETE_COLUMN) if keyed else rows).schema.json()
            fmt, select = self.spec.format, self.spec.transforms.select
            declared = to_spark_schema_json(fmt.schema_fields) if fmt.schema_known and not select else None
            # A registry format's spec is its producers' schema: a required field is added as optional.
            relax = fmt.type.uses_registry
            self.wanted = Wanted(self.columns_from, wanted_schema(schema, declared), relax_required=relax)
            self.rows_schema = schema
            partitioned = [p.column for p in delta_partitions(self.spec.table.partitioning)]
            made = create_table(
                self.log, schema, self.epoch, deletion_vectors=keyed, partition_columns=partitioned
            )
            _check_partitioning(made, partitioned, rows.columns, self.log.location)
            self.schema_after(made)
            claim_epoch(self.log, self.epoch)
            shutil.rmtree(self.log.staging_root(STAGING_DIR), ignore_errors=True)
            if self.dead_letters is not None:
                self.dead_letters.start(self.epoch)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None
        self.topic.close()
        self.lease.release()

    # -- one batch ------------------------------------------------------------------------------------

    def run_batch(self) -> BatchReport | None:
        """Plan, read, write and commit one batch; None when there was nothing to read. Raises FencedError
        when a newer writer took over, StaleHeadError when the table moved under the batch (plan again)."""
        started = time.monotonic()
        planned_on = self.log.snapshot()
        proposal = self.planner.propose(planned_on.committed, self.progress)
        if proposal.idle:
            return None
        planned = self.planner.batch(proposal)
        wrote = time.monotonic()
        stats, files, merged, schema = self._write(planned, planned_on)
        failpoint("main.after-stage")
        self.planner.check_topics_unchanged(planned)
        if self.keeper is not None:
            self.keeper.check(self.label)
        batch = planned.batch(stats)
        dead = NO_DEAD_LETTERS
        if stats.bad and self.dead_letters is not None:  # before the table's commit (delta_dead_letters)
            dead = self.dead_letters.commit(batch, planned, stats.bad, self.epoch)
        committing = time.monotonic()
        actions = merged.actions if merged is not None else None
        version = commit_batch(
            self.log, planned_on, batch, self.epoch, files, merged=actions, schema_string=schema
        )
        failpoint("main.after-commit")
        if schema is not None and self._schema_plan is not None:
            changes = self._schema_plan[1].describe()
            log.info("%s: schema changed with version %d: %s", self.label, version, changes)
        done = time.monotonic()
        written = merged.written if merged is not None else sum(f.records for f in files)
        return self._report(
            planned, stats, written, version, started, phases=(wrote, committing, done), dead=dead
        )

    def schema_after(self, snapshot: DeltaSnapshot, writers: Writers | None = None) -> str | None:
        """The table's schema once this writer's batch lands on `snapshot` (`icefall.catalog.delta_schema`;
        None: unchanged): the spec's, and a registry format's `writers` (those the batch is decoded with);
        DeltaSchemaRefusedError for what it cannot follow, before anything of the batch is committed."""
        table = snapshot.schema_string
        if table is None or self.wanted is None:
            return None
        following = follows_table(self.spec)
        ids = frozenset(i for i, text in (writers or {}).items() if text is not None) if following else None
        key = (table, ids or frozenset())
        if self._schema_plan is None or self._schema_plan[0] != key:
            plan = self._plan_schema(table, writers if following else None)
            self._schema_plan = (key, plan)  # the table's schema changes rarely: the last one is kept
            if plan.changes:
                log.info("%s: the next batch changes the table's schema: %s", self.label, plan.describe())
        plan = self._schema_plan[1]
        if plan.refused:
            if following:
                raise DeltaSchemaRefusedError(
                    self.log.location, plan.refused, of="its records' schemas", then=WRITER_SCHEMA_FIX
                )
            raise DeltaSchemaRefusedError(self.log.location, plan.refused)
        return plan.schema_string if plan.changes else None

    def _plan_schema(self, table: str, writers: Writers | None) -> DeltaSchemaPlan:
        """What the table must change to hold the spec's schema and each writer schema of `writers`."""
        assert self.wanted is not None
        wanted, unmapped = [self.wanted], []
        for schema_id, text in sorted((writers or {}).items()):
            if text is None:
                continue  # an unknown id: its records are dead letters
            try:
                fields = writer_fields(self.spec.format, text, cdc=self.spec.mode is TableMode.CDC)
            except ValueError as error:  # the mapping's errors (AvroSchemaError, ...) are ValueErrors
                unmapped.append(f"writer schema id {schema_id}: {error}")
                continue
            schema = to_spark_schema_json(fields)
            wanted.append(Wanted(f"writer schema id {schema_id}", schema, relax_required=True))
        plan = plan_delta_schemas(table, wanted)
        return DeltaSchemaPlan(table, refused=(*unmapped, *plan.refused)) if unmapped else plan

    def _good_rows(self, source: DataFrame) -> DataFrame:
        return self.writer.decoders.good.good_rows(self.writer.decoders.good.decode(source, None))

    def _write(
        self, planned: PlannedBatch, planned_on: DeltaSnapshot
    ) -> tuple[ReadStats, list[AddFile], Merged | None, str | None]:
        """Read and decode the batch and write its good rows as Parquet files in the table's folder (no log
        entry names them yet): appended, or for a keyed table MERGEd on `planned_on` with its schema
        changed (`icefall.ingest.delta_keyed`); the read's counts, the appended files, the MERGE's actions,
        and the table's schema with the batch (None: unchanged). A registry format's batch that meets a
        writer schema it was not decoded with is written once more with it (`BatchWriter.learned`)."""
        from icefall.ingest.planning import NOTHING_READ

        if not planned.ranges:
            return NOTHING_READ, [], None, self.schema_after(planned_on)
        writers = self.writer.writers_for()
        while True:  # twice at most: every id of the batch is met by the first write
            schema = self.schema_after(planned_on, writers)
            if writers is not None and follows_table(self.spec):
                self.writer.use_table_schema(_columns(schema or planned_on.schema_string, generated=True))
            stats, files, merged = self._write_once(planned, planned_on, schema, writers)
            if not stats.unseen_writers:
                return stats, files, merged, schema
            log.info("%s: the batch met new writer schemas; it is written again with them", self.label)
            writers = self.writer.writers_for()

    def _write_once(
        self, planned: PlannedBatch, planned_on: DeltaSnapshot, schema: str | None, writers: Writers | None
    ) -> tuple[ReadStats, list[AddFile], Merged | None]:
        """`_write` with the writer schemas `writers` (None: json); nothing moved into the table's folder
        when the batch must be written again (its stats say `unseen_writers`)."""
        from pyspark.sql import Observation

        decoders = self.writer.decoders
        observation = Observation()
        source = self.writer.read(planned.ranges, headers=False)
        observed = decoders.good.decode(source, writers).observe(observation, *decoders.observed)
        rows = with_partition_columns(decoders.good.good_rows(observed), self.spec)
        if self.spec.key:
            return self._merge(planned, planned_on, schema, rows, observation)
        staging = self.log.staging_root(STAGING_DIR) / uuid.uuid4().hex
        if not follows_table(self.spec):  # a registry format's rows are in the table's columns already
            rows = self._as_table(rows, schema or planned_on.schema_string)
        write = rows.write
        if planned_on.partition_columns:  # folders column=value; the values go into the commit's adds
            write = write.partitionBy(*planned_on.partition_columns)
        write.parquet(str(staging))
        try:
            stats = self._read_stats(planned, observation)
            if stats.unseen_writers:
                return stats, [], None
            # The files' statistics follow the schema they are committed with (a new column's too).
            metadata = {**(planned_on.metadata or {}), **({"schemaString": schema} if schema else {})}
            return stats, moved_into(staging, self.log, metadata), None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _as_table(self, rows: DataFrame, table: str | None) -> DataFrame:
        """`rows` with the table's types where the spec's are narrower (`written_schema`), so each file
        holds the table's types; as they are otherwise."""
        if table is None or self.rows_schema is None:
            return rows
        target = written_schema(self.rows_schema, table)
        if target is None:
            return rows
        from pyspark.sql.types import StructType

        return rows.to(StructType.fromJson(target))

    def _merge(
        self,
        planned: PlannedBatch,
        planned_on: DeltaSnapshot,
        schema: str | None,
        rows: DataFrame,
        observation: Observation,
    ) -> tuple[ReadStats, list[AddFile], Merged | None]:
        """A keyed batch: its last change per key MERGEd on a shadow of `planned_on` (module
        `icefall.ingest.delta_keyed`), whose schema is `schema` first when it changes; the MERGE's
        actions for the commit."""
        from icefall.ingest.delta_keyed import ShadowMerge, merge_batch

        staging = self.log.staging_root(STAGING_DIR)
        files = self._files_at(planned_on)
        with ShadowMerge(self.log, staging, planned_on, files, schema_string=schema) as shadow:
            merged, deleted_keys = merge_batch(
                self.spark,
                self.spec,
                shadow,
                rows,
                deleted_keys=planned_on.committed.deleted_keys,
                view=f"icefall_changes_{self.writer_id}",
            )
        stats = replace(self._read_stats(planned, observation), deleted_keys=deleted_keys)
        return stats, [], merged

    def _files_at(self, planned_on: DeltaSnapshot) -> LogFiles:
        """The table's live files at `planned_on` (a keyed batch's MERGE reads them): a replay of the log
        kept across batches and advanced by the commits since; read again for another table at the
        location. A replay past `planned_on` (a commit since) makes the MERGE StaleHeadError."""
        from icefall.commit.delta_files import LogFiles

        files = self._files
        table_id = (planned_on.metadata or {}).get("id")
        if (
            files is None
            or files.version > planned_on.version
            or (files.metadata or {}).get("id") != table_id
        ):
            files = LogFiles.read(self.log)
        elif files.version < planned_on.version:
            files = files.advance(self.log, planned_on.version)
        self._files = files
        return files

    def _read_stats(self, planned: PlannedBatch, observation: Observation) -> ReadStats:
        """The read's counts, once its write ran, with a registry format's writer schemas (the registry
        asked for ids not met before); BadRecordsHaltedError if bad records have nowhere to go."""
        seen = observation.get
        stats = ReadStats.of(seen["records"], seen["bytes"], seen["newest"], seen["bad"], None)
        if self.writer.decoders.good.uses_registry:
            from icefall.decode.framing import KEY_SCHEMA_IDS, SCHEMA_IDS

            stats = self.writer.learned(stats, seen.get(SCHEMA_IDS) or [], seen.get(KEY_SCHEMA_IDS) or [])
            if stats.unseen_writers:
                return stats  # decoded again: its bad records may be good
        if stats.bad and self.dead_letters is None:
            raise BadRecordsHaltedError(
                f"{self.label}: {stats.bad} records of offsets {planned.ranges} do not decode and "
                "spec.deadLetter.table is disabled (and no spec.deadLetter.topic), so ingestion stops "
                "before committing them. Fix or skip them (`icefall reset-offsets`), or enable the "
                "dead-letter table or name a dead-letter topic"
            )
        return stats

    def _report(
        self,
        planned: PlannedBatch,
        stats: ReadStats,
        written: int,
        version: int,
        started: float,
        *,
        phases: tuple[float, float, float],
        dead: DeadLettersLanded,
    ) -> BatchReport:
        """The batch's report, its metrics published (`icefall.ingest.report.publish_batch`)."""
        wrote, committing, done = phases
        seconds = done - started
        newest = stats.max_produce_ms
        by_topic = self._lag_after(planned)
        lag = sum(sum(partitions.values()) for partitions in by_topic.values())
        self.progress = Progress(
            throughput_rps=stats.records / seconds if seconds > 0 else None,
            last_batch_seconds=seconds,
            last_batch_records=stats.records,
            last_batch_started=started,
            backlog_after_last_batch=lag,
            batches_measured=self.progress.batches_measured + 1,
        )
        report = BatchReport(
            records_read=stats.records,
            records_written=written,
            records_dead_lettered=stats.bad,
            seconds=seconds,
            commit_seconds=done - committing,
            snapshot_id=version,
            offsets=dict(planned.parts[0].end),
            lag=lag,
            freshness_seconds=0.0 if newest is None or lag == 0 else max(time.time() - newest / 1000, 0.0),
            bytes_read=stats.bytes,
            data_loss=planned.lost,
            phases={"plan": wrote - started, "write": committing - wrote, "commit": done - committing},
            partition_lag=next(iter(by_topic.values())) if len(by_topic) == 1 else {},
            dead_letter_reasons=dead.kinds,
        )
        publish_batch(self.spec, self.label, report, by_topic)
        return report

    def _lag_after(self, planned: PlannedBatch) -> dict[str, dict[int, int]]:
        """Each topic's lag per partition once the batch landed: against the watermarks now (the planned
        ones, a floor, if the broker does not answer)."""
        lag = {}
        for part in planned.parts:
            marks: Mapping[int, tuple[int, int]]
            try:
                marks = self.topics[part.topic].watermarks()
            except Exception:
                log.warning("%s: reading watermarks after the commit failed; lag may be low", self.label)
                marks = part.watermarks
            after = {**held_of(planned.committed, part.topic).offsets, **part.end}
            lag[part.topic] = partition_lag(after, marks)
        return lag

    # -- the loop -------------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], on_batch: Callable[[BatchReport | None], None]) -> None:
        """Run batches until `should_stop()`: back to back while behind, else paced by the freshness target.
        A refused commit is planned again; an unreachable service is waited out; other errors are raised."""
        while not should_stop():
            try:
                report = self.run_batch()
            except FencedError:
                raise
            except StaleHeadError as refused:
                log.warning("%s: commit refused (%s); planning again from the table", self.label, refused)
                continue
            except (BadRecordsHaltedError, DeltaSchemaRefusedError):
                raise
            except Exception as error:
                delay = self.outages.failed(error)
                if delay is None:
                    raise
                sleep_unless(delay, should_stop)
                continue
            self.outages.succeeded()
            on_batch(report)
            if report is None or report.lag == 0:
                _sleep(self._next_delay(), should_stop)

    def _next_delay(self) -> float:
        progress = self.progress
        return next_batch_delay(
            now=time.monotonic(),
            last_batch_started_at=progress.last_batch_started,
            backlog_records=progress.backlog_after_last_batch,
            throughput_rps=progress.throughput_rps,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            min_interval_seconds=float(self.spec.batch.min_interval_seconds),
            last_batch_seconds=progress.last_batch_seconds,
        )


def _sleep(seconds: float, should_stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not should_stop():
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))


def _check_partitioning(
    table: DeltaSnapshot, partitioned: list[str], columns: list[str], location: str
) -> None:
    """LayoutChangedError unless the table's partition columns are the spec's, and columns of its rows."""
    unknown = [c for c in partitioned if c not in columns]
    if unknown:
        raise LayoutChangedError(
            f"spec.table.partitioning names {unknown}, not columns of the table's rows "
            f"({', '.join(columns)}): partition by a column the spec's schema (after transforms.select) has"
        )
    if table.partition_columns != partitioned:
        raise LayoutChangedError(
            f"the Delta table at {location} is partitioned by {table.partition_columns or 'nothing'}, "
            f"spec.table.partitioning by {partitioned or 'nothing'}: a Delta table's partitioning never "
            "changes; set spec.table.partitioning back, or write a new table (a new spec.table.location)"
        )


def columns_source(spec: StreamingTableSpec) -> str:
    """What a Delta table's columns come from, as refusals name it (before a registry's fills the spec)."""
    if spec.transforms.select:
        return "spec.transforms.select"
    if spec.format.schema_known or spec.format.registry is None:
        return "spec.format.schema"
    subject = spec.format.registry.subject(spec.source.first_topic)
    return f"the latest schema of subject '{subject}'"


def delta_services(spec: StreamingTableSpec, location: str) -> dict[Service, str]:
    """The services a Delta table's writer needs, as outage lines name them."""
    source = spec.source
    where = {
        Service.KAFKA: f"{source.bootstrap_servers} for topic '{', '.join(source.topic_names)}'",
        Service.OBJECT_STORE: location,
    }
    if spec.format.registry is not None:
        where[Service.REGISTRY] = registry_address(spec.format.registry.url)
    return where


def _columns(schema_string: str | None, *, generated: bool = False) -> Schema:
    """A Delta table's schema (Spark JSON) as the Iceberg schema `BatchWriter.use_table_schema` takes;
    `generated`: without its generated columns (`with_partition_columns` adds them; no record holds them)."""
    from icefall.catalog.layout import spark_struct_to_iceberg

    assert schema_string is not None  # the table is made at start
    return spark_struct_to_iceberg(without_generated(schema_string) if generated else schema_string)


def committed_snapshot(location: str) -> DeltaSnapshot:
    """The latest version of the Delta table at `location` (what resume reads)."""
    return DeltaLog(location).snapshot()
