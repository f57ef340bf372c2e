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
upsert or cdc) MERGEs each batch's last change per key with deletion vectors, in the same commit as its
offsets (`icefall.ingest.delta_keyed`).

Schema evolution: the table's schema follows the spec's (`icefall.catalog.delta_schema`, the rules of
`icefall.catalog.evolution`): a new optional field is added by the next batch's commit, in its log entry
(`commit_batch(schema_string=...)`), so the new column, the rows that first fill it and their offsets land
together; rows already in the table read it as null; a narrower type is written as the table's. What the
table cannot follow (a type changed or widened, a new required field) raises DeltaSchemaRefusedError at
start and before any batch is written.

Not done yet for Delta (refused by the spec's validation where it is a setting): registry formats,
partition transforms (identity partitions are Spark's `partitionBy` folders, their values in the commit's
`add` actions: `icefall.commit.delta.moved_into`), pipelining, object stores. The upkeep (OPTIMIZE,
checkpoints, VACUUM) is `icefall.compact.delta`'s.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefall.api import StreamingTable, to_spark_schema_json
from icefall.catalog.delta_schema import (
    DeltaSchemaPlan,
    DeltaSchemaRefusedError,
    plan_delta_schema,
    wanted_schema,
    written_schema,
)
from icefall.commit import FencedError, StaleHeadError
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
from icefall.ingest.columns import DELETE_COLUMN
from icefall.ingest.commits import LeaseKeeper
from icefall.ingest.delta_dead_letters import DeltaDeadLetters, dead_letter_location
from icefall.ingest.outages import Outages, sleep_unless
from icefall.ingest.planning import PlannedBatch, Planner, Progress, ReadStats
from icefall.ingest.report import BatchReport
from icefall.ingest.writer import BatchWriter
from icefall.kafka.admin import TopicView
from icefall.kafka.security import librdkafka_config, spark_kafka_options
from icefall.plan.batching import next_batch_delay
from icefall.plan.outages import Service
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

    from icefall.commit.lease import Lease
    from icefall.ingest.delta_keyed import Merged

log = logging.getLogger(__name__)

STAGING_DIR = "_icefall_staging"  # under the table's folder; names starting with _ are not table data


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
    ) -> None:
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
        self.wanted: dict[str, Any] | None = None  # the batch's schema as the spec wants it (`start`)
        self.rows_schema: str | None = None  # the batch's rows' Spark schema (`start`)
        self._schema_plans: dict[str, DeltaSchemaPlan] = {}
        self.keeper: LeaseKeeper | None = None
        self.outages = Outages(
            self.label,
            {
                Service.KAFKA: f"{source.bootstrap_servers} for topic '{', '.join(source.topic_names)}'",
                Service.OBJECT_STORE: location,
            },
        )
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
            rows = self._good_rows(self.writer.empty_source())
            keyed = bool(self.spec.key)
            schema = (rows.drop(DELETE_COLUMN) if keyed else rows).schema.json()
            fmt, select = self.spec.format, self.spec.transforms.select
            declared = to_spark_schema_json(fmt.schema_fields) if fmt.schema_known and not select else None
            self.wanted = wanted_schema(schema, declared)
            self.rows_schema = schema
            partitioned = [p.field for p in self.spec.table.partitioning]
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
        schema = self.schema_after(planned_on)
        planned = self.planner.batch(proposal)
        wrote = time.monotonic()
        stats, files, merged = self._write(planned, planned_on, schema)
        failpoint("main.after-stage")
        self.planner.check_topics_unchanged(planned)
        if self.keeper is not None:
            self.keeper.check(self.label)
        batch = planned.batch(stats)
        if stats.bad and self.dead_letters is not None:  # before the table's commit (delta_dead_letters)
            self.dead_letters.commit(batch, planned, stats.bad, self.epoch)
        committing = time.monotonic()
        actions = merged.actions if merged is not None else None
        version = commit_batch(
            self.log, planned_on, batch, self.epoch, files, merged=actions, schema_string=schema
        )
        failpoint("main.after-commit")
        if schema is not None and planned_on.schema_string in self._schema_plans:
            changes = self._schema_plans[planned_on.schema_string].describe()
            log.info("%s: schema changed with version %d: %s", self.label, version, changes)
        done = time.monotonic()
        written = merged.written if merged is not None else sum(f.records for f in files)
        return self._report(planned, stats, written, version, started, phases=(wrote, committing, done))

    def schema_after(self, snapshot: DeltaSnapshot) -> str | None:
        """The table's schema once this writer's batch lands on `snapshot` (`icefall.catalog.delta_schema`;
        None: unchanged); DeltaSchemaRefusedError for what it cannot follow, before anything is written."""
        table = snapshot.schema_string
        if table is None or self.wanted is None:
            return None
        if table not in self._schema_plans:
            source = "spec.transforms.select" if self.spec.transforms.select else "spec.format.schema"
            plan = plan_delta_schema(table, self.wanted, source=source)
            self._schema_plans = {table: plan}  # the table's schema changes rarely: the last one is kept
            if plan.changes:
                log.info("%s: the next batch changes the table's schema: %s", self.label, plan.describe())
        plan = self._schema_plans[table]
        if plan.refused:
            raise DeltaSchemaRefusedError(self.log.location, plan.refused)
        return plan.schema_string if plan.changes else None

    def _good_rows(self, source: DataFrame) -> DataFrame:
        return self.writer.decoders.good.good_rows(self.writer.decoders.good.decode(source, None))

    def _write(
        self, planned: PlannedBatch, planned_on: DeltaSnapshot, schema: str | None
    ) -> tuple[ReadStats, list[AddFile], Merged | None]:
        """Read and decode the batch and write its good rows as Parquet files in the table's folder (no log
        entry names them yet): appended, or for a keyed table MERGEd on `planned_on` with its schema
        changed to `schema` (`icefall.ingest.delta_keyed`); the read's counts, the appended files, the
        MERGE's actions."""
        from icefall.ingest.planning import NOTHING_READ

        if not planned.ranges:
            return NOTHING_READ, [], None
        from pyspark.sql import Observation

        decoders = self.writer.decoders
        observation = Observation()
        source = self.writer.read(planned.ranges, headers=False)
        observed = decoders.good.decode(source, None).observe(observation, *decoders.observed)
        if self.spec.key:
            return self._merge(planned, planned_on, schema, decoders.good.good_rows(observed), observation)
        staging = self.log.staging_root(STAGING_DIR) / uuid.uuid4().hex
        rows = self._as_table(decoders.good.good_rows(observed), schema or planned_on.schema_string)
        write = rows.write
        if planned_on.partition_columns:  # folders column=value; the values go into the commit's adds
            write = write.partitionBy(*planned_on.partition_columns)
        write.parquet(str(staging))
        try:
            stats = self._read_stats(planned, observation)
            return stats, moved_into(staging, self.log), None
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

        staging = self.log.root / STAGING_DIR
        with ShadowMerge(self.log, staging, planned_on, schema_string=schema) as shadow:
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

    def _read_stats(self, planned: PlannedBatch, observation: Observation) -> ReadStats:
        """The read's counts, once its write ran; BadRecordsHaltedError if bad records have nowhere to go."""
        seen = observation.get
        stats = ReadStats.of(seen["records"], seen["bytes"], seen["newest"], seen["bad"], None)
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
    ) -> BatchReport:
        wrote, committing, done = phases
        seconds = done - started
        newest = stats.max_produce_ms
        lag = max(planned.backlog - planned.records, 0)
        self.progress = Progress(
            throughput_rps=stats.records / seconds if seconds > 0 else None,
            last_batch_seconds=seconds,
            last_batch_records=stats.records,
            last_batch_started=started,
            backlog_after_last_batch=lag,
            batches_measured=self.progress.batches_measured + 1,
        )
        return BatchReport(
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
        )

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


def committed_snapshot(location: str) -> DeltaSnapshot:
    """The latest version of the Delta table at `location` (what resume reads)."""
    return DeltaLog(location).snapshot()
