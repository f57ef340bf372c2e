"""The ingestion loop: Kafka offset ranges in, one exactly-once Iceberg commit per batch out.

Each batch: read the committed state from the table (never from Kafka groups), plan offset ranges from it
and the watermarks, read them with Spark's Kafka source, decode and validate, append the good rows to a
staging branch (a keyed table, `spec.mode` upsert or cdc: MERGE them, the last change per key, `_merge`),
then let `icefall.commit` fast-forward `main` with a compare-and-swap that also stores the
offsets and the lease epoch. Bad records go to the dead-letter table first, through the same protocol.

Guarantees: a batch is in the table once or not at all; a writer whose lease was taken over cannot commit
(epoch fencing; `run_batch` raises FencedError once it notices); every Kafka read is read_committed, so
records of aborted transactions never land and a batch never reads past an open transaction; a topic
deleted and created again (another topic id) or truncated below the committed offsets stops ingestion with
SourceChangedError instead of skipping or re-reading records; records lost to topic retention are
never skipped silently: logged at ERROR, counted in `icefall_data_loss_records_total`, and added to the
table's `icefall.lost-records` by the commit that skips them. Maintenance committing to the table
between staging and commit (compaction, retention, manifest rewrites) does not cost a batch: the commit
re-stages it on top (`icefall_ingest_commits_restaged_total`); the rare case where it cannot is counted in
`icefall_ingest_commits_failed_by_maintenance_total`, and the batch is planned again.
Pipelining (`run`, `spec.batch.pipelined`): while behind, a clean batch's commit runs on a commit thread
while the next batch is planned from the state that commit gives the table, read, and appended to the
branch on top of it (`commit.next_stage`); that batch is committed only after the one below it landed as
itself, and is otherwise dropped and planned again (`icefall_ingest_batches_discarded_total`).
Outages: `run` waits out an unreachable Kafka, catalog or object store (`icefall.outages`): one log line
per failed attempt, capped exponential backoff, the outage metrics, and on the next attempt the batch is
planned again from the table, so a batch whose commit outcome the outage left unknown is either found
committed (its offsets are the table's) or read again, never committed twice; staging branches the
outage left behind are swept and the dead-letter table reconciled before that batch.
Not guaranteed: the dead-letter table may briefly hold rows of a batch whose main commit then failed;
`reconcile_dead_letters` removes them before the next batch (and at start).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icefall import metrics
from icefall.api import StreamingTable, StreamingTableSpec
from icefall.catalog import CatalogConfig
from icefall.commit import (
    Batch,
    CommitOutcome,
    CommittedState,
    FencedError,
    MaintenanceConflictError,
    Stage,
    StaleHeadError,
    abandon_stage,
    claim_epoch,
    commit_staged_outcome,
    next_stage,
    prepare_stage,
    read_committed,
    rewind_dead_letters,
    stage_branch_name,
    staged_on,
    sweep_stages,
)
from icefall.commit.lease import Lease, LeaseLostError
from icefall.failpoints import failpoint
from icefall.kafka.admin import ISOLATION, TopicView
from icefall.kafka.dead_letters import Source as DeadLetterSource
from icefall.kafka.dead_letters import produce_dead_letters
from icefall.kafka.security import librdkafka_config, spark_kafka_options
from icefall.outages import Outages, classify, service_addresses, sleep_unless
from icefall.plan.batching import BatchLimits, choose_batch_size, next_batch_delay, update_throughput
from icefall.plan.lag import freshness_seconds, partition_lag, total_lag
from icefall.plan.leases import YIELD_MAX_WAIT_SECONDS, yield_pending
from icefall.plan.offsets import OffsetRange, plan_offsets, source_change, spark_offset_options

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

    from icefall.failpoints import TableRole
    from icefall.ingest.avro import SchemaLookup
    from icefall.ingest.decode import Decoder
    from icefall.kafka.registry import Registry

log = logging.getLogger(__name__)


#: Consumer settings for Spark's Kafka reader, unless `spec.source.properties` set them. After each poll
#: the reader asks the broker for the partition's earliest and latest offsets; a consumer that has read to
#: the end of a partition has a fetch waiting at the broker for up to `fetch.max.wait.ms` (500 ms by
#: default), and a broker answers one request per connection at a time, so every task of a caught-up batch
#: waited half a second. Larger polls mean fewer round trips per batch.
SPARK_CONSUMER_DEFAULTS = {"fetch.max.wait.ms": "10", "max.poll.records": "5000"}


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
    """Spark's Kafka batch source over `ranges` (`OffsetRange`s of `spec.source.topic`), as ingestion reads
    it: assigned partitions, explicit offsets, headers, read_committed whatever `spec.source.properties`
    say; `security_options` from `spark_kafka_options` (secrets: never logged).

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
    topic = spec.source.topic
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", spec.source.bootstrap_servers)
        .option("assign", json.dumps({topic: sorted(r.partition for r in ranges)}))
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


class SourceChangedError(RuntimeError):
    """The topic was recreated or its log truncated: the committed offsets no longer point into it.

    Nothing was skipped or committed. Ingestion stops until a user resets the offsets
    (`icefall reset-offsets`), which records the reset in the table.
    """


@dataclass(frozen=True)
class BatchReport:
    records_read: int
    records_written: int
    records_dead_lettered: int
    seconds: float
    commit_seconds: float
    snapshot_id: int
    offsets: dict[int, int]
    lag: int
    freshness_seconds: float = 0.0  # now - produce time of the newest committed record; 0 when caught up
    bytes_read: int = 0
    data_loss: int = 0
    # Seconds per phase of the batch (plan, stage, write, dead_letters, commit, report): where a batch's
    # fixed cost goes. "write" is the one Spark job that reads, decodes and writes the good rows; "stage"
    # puts the writer's staging branch at main's head (no catalog commit when the last commit left it
    # there) and, for a batch that wrote nothing, stages its empty snapshot.
    phases: Mapping[str, float] = field(default_factory=dict)
    # The dead letters by kind of reason (`icefall.ingest.decode.REASON_KINDS`), summing to the above.
    dead_letter_reasons: Mapping[str, int] = field(default_factory=dict)


class LeaseKeeper:
    """Renews the commit lease in the background, so a long batch or a quiet topic never lets it lapse.

    A lost lease is remembered, and `check()` turns it into FencedError before anything is committed.
    Losing the lease is only about liveness: the epoch in the table refuses a stale writer regardless.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lost: LeaseLostError | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="icefall-lease", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval()):
            try:
                self.renew()
            except LeaseLostError:
                return
            except Exception:  # a flaky API server: try again at the next tick, the lease has slack
                log.warning("renewing the commit lease failed; retrying", exc_info=True)

    def _interval(self) -> float:
        expires = self.lease.expires_at
        return 0.5 if expires is None else max((expires - time.time()) / 3, 0.5)

    def renew(self) -> None:
        with self._lock:
            if self._lost is not None:
                raise self._lost
            failpoint("lease.renew")
            try:
                self.lease.renew()
            except LeaseLostError as lost:
                self._lost = lost
                raise

    def check(self, label: str) -> None:
        """Raise FencedError if the lease was lost (renewing it now, so the answer is current)."""
        try:
            self.renew()
        except LeaseLostError as lost:
            raise FencedError(f"{label}: this writer lost the commit lease") from lost

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


@dataclass
class _Progress:
    throughput_rps: float | None = None
    last_batch_seconds: float | None = None
    last_batch_records: int | None = None
    last_batch_started: float | None = None  # time.monotonic()
    backlog_after_last_batch: int = 0
    data_loss_seen: set[tuple[int, int]] = field(default_factory=set)


class _PhaseClock:
    """Seconds per phase of one batch (`BatchReport.phases`), on the monotonic clock."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.ended: float | None = None
        self.phases: dict[str, float] = {}
        self._mark = self.started

    def mark(self, name: str) -> None:
        """The time since the previous mark belongs to phase `name`."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._mark
        self._mark = now

    def mark_stage_and_commit(self, commit_seconds: float) -> None:
        """The time since the previous mark was staging, but its last `commit_seconds` were the commit."""
        now = time.monotonic()
        self.phases["stage"] = self.phases.get("stage", 0.0) + now - self._mark - commit_seconds
        self.phases["commit"] = self.phases.get("commit", 0.0) + commit_seconds
        self._mark = now

    def landed(self, commit_seconds: float, at: float) -> None:
        """A pipelined batch's commit, run on the commit thread, took `commit_seconds` and ended `at`."""
        self.phases["commit"] = self.phases.get("commit", 0.0) + commit_seconds
        self.ended = at
        self._mark = time.monotonic()  # what follows is the report

    def elapsed(self) -> float:
        """From the start to the commit that landed the batch (or now, if that is not known yet)."""
        return (self.ended or time.monotonic()) - self.started


@dataclass(frozen=True)
class _PlannedBatch:
    """A batch planned from the table's committed state and the watermarks, before anything is read."""

    committed: CommittedState
    topic_id: str | None
    watermarks: Mapping[int, tuple[int, int]]
    ranges: tuple[OffsetRange, ...]  # what to read (may be empty: a batch that only pins or skips)
    start: dict[int, int]  # the commit's offset range per partition (ranges, plus pinned and skipped ones)
    end: dict[int, int]
    gaps: dict[int, int]  # retention gaps the commit acknowledges
    lost: int  # records lost to retention first reported by this batch
    backlog: int  # records waiting in Kafka when it was planned (this batch's among them)

    @property
    def records(self) -> int:
        return sum(r.records for r in self.ranges)

    @property
    def whole_backlog(self) -> bool:
        """The batch takes everything Kafka held when it was planned."""
        return self.records >= self.backlog

    def batch(self, topic: str, stats: _ReadStats) -> Batch:
        return Batch(
            topic=topic,
            start=self.start,
            end=self.end,
            max_produce_time_ms=stats.max_produce_ms,
            retention_gaps=self.gaps,
            topic_id=self.topic_id,
            deleted_keys=stats.deleted_keys,
        )


@dataclass(frozen=True)
class _ReadStats:
    """What the read of a batch saw: records, bytes of their values, newest produce time, bad records."""

    records: int
    bytes: int
    max_produce_ms: int | None
    bad: int
    deleted_keys: str | None = None  # cdc with sequenceBy: the deleted keys file the commit names

    @classmethod
    def of(
        cls, records: Any, value_bytes: Any, newest: Any, bad: Any, deleted_keys: str | None = None
    ) -> _ReadStats:
        """From Spark's aggregates: counts, a sum (None over no rows), a max timestamp (None or datetime)."""
        return cls(
            records=int(records or 0),
            bytes=int(value_bytes or 0),
            max_produce_ms=int(newest.timestamp() * 1000) if newest is not None else None,
            bad=int(bad or 0),
            deleted_keys=deleted_keys,
        )


def _newest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class _InFlight:
    """A written batch whose commit runs on the commit thread while the next batch is read and written on
    top of it (`Ingestor._step`). `after` is that next batch's stage."""

    planned: _PlannedBatch
    stats: _ReadStats
    clock: _PhaseClock
    table: Table  # the commit thread's own pyiceberg table object
    commit: Future[tuple[CommitOutcome, float, float]]  # outcome, seconds of the commit, when it ended
    after: Stage
    settled: bool = False
    restaged: bool = False


class _Decoders:
    """The spec's `Decoder`s and the batch's observed aggregates, built once per writer: building them
    costs more than reading and writing a small batch (`icefall.ingest.decode.Decoder`)."""

    def __init__(self, spec: StreamingTableSpec, schemas: SchemaLookup | None = None) -> None:
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.ingest.decode import BAD_COLUMN, Decoder

        self.spec = spec
        self.schemas = schemas
        self.good = Decoder(spec, errors=False, schemas=schemas)  # no error text: the table's rows
        self.observed = [
            F.count(F.lit(1)).alias("records"),
            F.sum(F.length("value")).alias("bytes"),
            F.max("timestamp").alias("newest"),
            F.count_if(F.col(BAD_COLUMN)).alias("bad"),
        ]

    @functools.cached_property
    def with_errors(self) -> Decoder:
        """The dead-letter path's decoder (with error text), built when a batch first has bad records."""
        from icefall.ingest.decode import Decoder

        return Decoder(self.spec, schemas=self.schemas)


class Ingestor:
    """One table's writer. Call `start()` once (takes the lease), then `run_batch()` in a loop."""

    def __init__(
        self,
        st: StreamingTable,
        catalog: CatalogConfig,
        spark: SparkSession,
        lease: Lease,
        *,
        writer_id: str | None = None,
        yield_to: Lease | None = None,
        registry: Registry | None = None,
    ) -> None:
        """`yield_to`: the table's yield Lease (`rewrite_yield_name`), only read: a keyed table's batches wait
        while a rewrite holds it (`icefall.compact.runner`), so compaction cannot starve. `registry`: writer
        schemas by id and the latest schema (default: the spec's `format.registry`, if any)."""
        from icefall.kafka.registry import WriterSchemas, with_registry_schema

        if registry is None and st.spec.format.registry is not None:
            registry = WriterSchemas(st.spec.format.registry)
        # A registry format without an inline schema: the table's columns are the registry's latest schema.
        st = with_registry_schema(st, registry.latest_schema if registry is not None else None)
        self._writer_schemas = registry.lookup if registry is not None else None
        self.st = st
        self.spec = st.spec
        self.catalog_config = catalog
        self._catalog: Catalog | None = None
        self.spark = spark
        self.lease = lease
        self.yield_to = yield_to if st.spec.key else None  # appends never conflict with a rewrite
        self.writer_id = writer_id or uuid.uuid4().hex[:12]
        self.label = ".".join(st.table_identifier)
        # One Kafka consumer group per writer, the same for every batch (`read_kafka`).
        self.consumer_group = f"icefall-{self.label}-{self.writer_id}"
        # Secret values: handed to the clients only, never logged.
        self._kafka_config = librdkafka_config(self.spec.source.security)
        self._spark_kafka_options = spark_kafka_options(self.spec.source.security)
        self.topic = TopicView(self.spec.source.bootstrap_servers, self.spec.source.topic, self._kafka_config)
        self.epoch = 0
        self._progress = _Progress()
        self._dead_letters_dirty = True
        self._keeper: LeaseKeeper | None = None
        self._sweep_pending = False
        # cdc with sequenceBy: the deleted keys file this writer wrote last and its content, so that the
        # next batch does not read back what it has (`_merge_changes`).
        self._deleted_keys: tuple[str, pa.Table] | None = None
        # Pipelining (`_step`): the batch whose commit runs on the commit thread, and that thread.
        self._in_flight: _InFlight | None = None
        self._committer: ThreadPoolExecutor | None = None
        self.outages = Outages(
            self.label,
            service_addresses(self.spec.source.bootstrap_servers, self.spec.source.topic, catalog),
        )

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg client, made on first use (a catalog unreachable at start is an outage, retried)."""
        if self._catalog is None:
            self._catalog = self.catalog_config.pyiceberg()
        return self._catalog

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, lease_timeout: float | None = None) -> None:
        """Create the tables if needed, take the commit lease, claim its epoch, sweep what crashed writers
        left. If anything fails, the lease is given back, so calling `start` again (after an outage) is safe.
        """
        try:
            self._start(lease_timeout)
        except BaseException:
            self._abort_start()
            raise

    def _abort_start(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        if self.epoch:
            try:
                self.lease.release()
            except Exception:
                log.warning("%s: giving back the commit lease after a failed start failed", self.label)
            self.epoch = 0

    def _start(self, lease_timeout: float | None) -> None:
        from icefall.catalog.tables import ensure_tables, spark_struct_to_iceberg
        from icefall.ingest.decode import prepare

        override = None
        if self.spec.transforms.select:
            # The table's columns are what the select expressions produce: ask Spark's analyser.
            override = spark_struct_to_iceberg(prepare(self._empty_source(), self.spec).good.schema.json())
        self.table, self.dead_letter_table = ensure_tables(self.catalog, self.st, schema_override=override)
        self.epoch = self._acquire_and_claim(lease_timeout)
        self._sweep_pending = False
        self._keeper = LeaseKeeper(self.lease)
        self._keeper.start()
        log.info("%s: writer %s holds the commit lease at epoch %d", self.label, self.writer_id, self.epoch)
        # Branches of writers that died mid-batch: their data was never on main.
        sweep_stages(self.table, role="main")
        if self.dead_letter_table is not None:
            sweep_stages(self.dead_letter_table, role="dlq")
        self.reconcile_dead_letters()

    def _acquire_and_claim(self, lease_timeout: float | None, attempts: int = 5) -> int:
        """Take the commit lease at an epoch above the tables' and claim it in both tables.

        The floor makes a deleted or reset Lease harmless (its epoch would start again at 1); the claim
        makes the epoch this writer's alone, whatever lease store another writer used, and fences an older
        writer's late dead-letter commit as well as its main one.
        """
        tables: list[tuple[Table, TableRole]] = [(self.table, "main")]
        if self.dead_letter_table is not None:
            tables.insert(0, (self.dead_letter_table, "dlq"))
        for _ in range(attempts):
            floor = max(read_committed(t).epoch for t, _ in tables)
            epoch = self.lease.acquire(lease_timeout, floor=floor)
            try:
                for table, role in tables:
                    claim_epoch(table, epoch, role=role)
                return epoch
            except FencedError as taken:
                log.warning("%s: %s; taking a newer epoch", self.label, taken)
                self.lease.release()
        raise FencedError(f"{self.label}: could not claim an epoch: other writers kept claiming newer ones")

    def close(self) -> None:
        if self._committer is not None:
            self._committer.shutdown(wait=True)
        if self._keeper is not None:
            self._keeper.stop()
        self.topic.close()
        self.lease.release()

    # -- one batch ------------------------------------------------------------------------------------

    def run_batch(self) -> BatchReport | None:
        """Plan, read, write and commit one batch; None when there was nothing to read.

        The steps, in order: `_plan_batch` (committed state, watermarks, offset ranges), a staging branch
        of `main`, `_write_good_rows` (ONE Spark job: read, decode, write the good rows to the branch, and
        count records, bytes, newest produce time and bad rows on the way), `_dead_letter_step` (only when
        there are bad rows: the same offsets read again, the bad rows committed to the dead-letter table,
        then produced to the dead-letter topic), `_commit_main` (the compare-and-swap of `main`, after the
        dead letters as the protocol requires), `_report_batch` (lag and freshness after the commit, the
        pacing figures, the metrics). `run` pipelines these (`_step`).

        Raises FencedError when this writer lost its lease or a newer writer committed (stop writing),
        StaleHeadError when the table moved under the batch (plan again).
        """
        reports = self._step(pipeline=False)
        return reports[-1] if reports else None

    def _step(self, *, pipeline: bool) -> list[BatchReport]:
        """One batch, as `run_batch` describes; returns the reports of the batches that landed, oldest first.

        With `pipeline` (and `spec.batch.pipelined`), a clean batch after which a next one as large is due
        at once is not committed here: its commit runs on the commit thread (`_in_flight`) while the next
        step plans that next batch from the state the commit gives the table, reads it and appends it to
        the branch on top of it (`commit.next_stage`); then that step waits for the commit and reports it.
        If the commit failed, the next batch is dropped with the branch and the error raised, as it
        would have been without pipelining; if it re-staged the batch over maintenance, the next batch
        sits on a snapshot that never landed and is dropped (planned again from the table).
        """
        flight, self._in_flight = self._in_flight, None
        try:
            return self._step_on(flight, pipeline=pipeline)
        except BaseException:
            if flight is not None and not flight.settled:
                self._settle(flight)
            raise

    def _step_on(self, flight: _InFlight | None, *, pipeline: bool) -> list[BatchReport]:
        clock = _PhaseClock()
        self._progress.last_batch_started = clock.started
        planned = self._plan_batch(flight.after.base if flight is not None else None)
        if planned is None:
            return [self._land(flight)] if flight is not None else []
        clock.mark("plan")
        # `_plan_batch` has just read the table: the branch left by the last commit is normally at main's
        # head already, and staging costs no catalog round trip. In flight: on top of the batch before.
        stage = (
            flight.after
            if flight is not None
            else prepare_stage(self.table, self._stage_branch, role="main", refresh=False)
        )
        reports: list[BatchReport] = []
        with _dropped_unless_committed(self.table, stage.branch, self.label, "main"):
            if stage.base.offsets != planned.committed.offsets:
                raise StaleHeadError("the table moved between planning and staging")
            clock.mark("stage")
            stats = self._write_good_rows(planned, stage.branch)
            clock.mark("write")
            self._check_topic_unchanged(planned.topic_id)
            if flight is not None:
                reports.append(self._land(flight))
                if flight.restaged:
                    log.info("%s: the batch before was re-staged; this one is planned again", self.label)
                    metrics.INGEST_BATCHES_DISCARDED.labels(self.label).inc()
                    abandon_stage(self.table, stage.branch, role="main")
                    return reports
            batch = planned.batch(self.spec.source.topic, stats)
            if pipeline and self.spec.batch.pipelined and not stats.bad and self._next_is_due(planned, clock):
                self._in_flight = self._send_commit(planned, stats, stage, batch, clock)
                return reports
            dead, kinds = self._dead_letter_step(batch, planned, stats.bad) if stats.bad else (0, {})
            clock.mark("dead_letters")
            snapshot_id, commit_seconds = self._commit_main(stage, batch, planned)
            clock.mark_stage_and_commit(commit_seconds)
        self._dead_letters_dirty = False  # main caught up with the dead letters just committed
        reports.append(
            self._report_batch(
                planned,
                stats,
                dead=dead,
                kinds=kinds,
                snapshot_id=snapshot_id,
                commit_seconds=commit_seconds,
                clock=clock,
            )
        )
        return reports

    def _learn_pace(self, planned: _PlannedBatch, stats: _ReadStats, seconds: float) -> None:
        """The pacing figures after a batch of `stats.records` that took `seconds`."""
        progress = self._progress
        progress.throughput_rps = update_throughput(
            progress.throughput_rps, stats.records, seconds, whole_backlog=planned.whole_backlog
        )
        progress.last_batch_seconds = seconds
        progress.last_batch_records = stats.records

    def _next_is_due(self, planned: _PlannedBatch, clock: _PhaseClock) -> bool:
        """Whether a next batch as large as this one is waiting, and the pacing
        (`plan.batching.next_batch_delay`) starts it at once. With less left, waiting for the commit
        lets the next batch take what arrives meanwhile: fewer, larger batches."""
        left = planned.backlog - planned.records
        return left >= max(planned.records, 1) and not next_batch_delay(
            now=time.monotonic(),
            last_batch_started_at=clock.started,
            backlog_records=left,
            throughput_rps=self._progress.throughput_rps,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            min_interval_seconds=float(self.spec.batch.min_interval_seconds),
            last_batch_seconds=clock.elapsed(),
        )

    def _send_commit(
        self, planned: _PlannedBatch, stats: _ReadStats, stage: Stage, batch: Batch, clock: _PhaseClock
    ) -> _InFlight:
        """Start the commit of a written batch on the commit thread; the next batch goes on top of it."""
        self._stage_if_nothing_written(stage, planned)
        stage = staged_on(self.table, stage)
        self._check_lease()
        clock.mark("stage")
        # The next batch is sized before this one's report: learn from it now (its commit is a few ms).
        self._learn_pace(planned, stats, clock.elapsed())
        table = copy.copy(self.table)  # the commit thread's own: refreshing it leaves this one alone
        if self._committer is None:
            self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="icefall-commit")
        commit = self._committer.submit(self._commit_in_background, table, stage, batch)
        return _InFlight(planned, stats, clock, table, commit, after=next_stage(stage, batch, self.epoch))

    def _commit_in_background(
        self, table: Table, stage: Stage, batch: Batch
    ) -> tuple[CommitOutcome, float, float]:
        started = time.monotonic()
        outcome = commit_staged_outcome(table, stage, batch, self.epoch)
        ended = time.monotonic()
        return outcome, ended - started, ended

    def _land(self, flight: _InFlight) -> BatchReport:
        """Wait for the in-flight batch's commit and report it; its error, if it failed, is raised here."""
        flight.settled = True
        outcome, commit_seconds, ended = flight.commit.result()
        flight.restaged = outcome.restaged
        self._count_restage(self.label, outcome)
        flight.clock.landed(commit_seconds, ended)
        return self._report_batch(
            flight.planned,
            flight.stats,
            dead=0,
            kinds={},
            snapshot_id=outcome.snapshot_id,
            commit_seconds=commit_seconds,
            clock=flight.clock,
            table=flight.table,
            paced=True,
        )

    def _settle(self, flight: _InFlight) -> None:
        """The step after an in-flight batch failed: still wait for that batch's commit (it may land)."""
        try:
            self._land(flight)
        except Exception as error:
            log.info("%s: the commit of the batch before did not land either (%s)", self.label, error)

    def _land_at_stop(self, on_batch: Callable[[BatchReport | None], None]) -> None:
        """Stopping: wait for the batch still in flight, if any, and report it."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        try:
            report = self._land(flight)
        except StaleHeadError as refused:
            self._count_refused(refused)
            log.warning("%s: the last batch's commit was refused (%s)", self.label, refused)
            return
        on_batch(report)

    def _plan_batch(self, after: CommittedState | None = None) -> _PlannedBatch | None:
        """Read the committed state and the watermarks, choose the batch size and plan the offset ranges;
        None (lag published) when there is nothing to commit. Reconciles the dead-letter table first when
        a batch may have left it ahead. `after`: the state a batch in flight gives the table, planned on
        instead of the table's."""
        committed = after if after is not None else read_committed(self.table)  # refreshes the table
        if self._sweep_pending:
            self._sweep_after_outage()
        topic_id = self.topic.topic_id()
        watermarks = self.topic.watermarks()
        backlog = total_lag(committed.offsets, watermarks)
        size = choose_batch_size(
            backlog_records=backlog,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            throughput_rps=self._progress.throughput_rps,
            last_batch_seconds=self._progress.last_batch_seconds,
            limits=BatchLimits.from_spec(self.spec.batch),
            last_batch_records=self._progress.last_batch_records,
        )
        timestamp_offsets = None
        position = self.spec.source.starting_position
        if position.timestamp_ms is not None and not committed.offsets:
            timestamp_offsets = dict(self.topic.offsets_for_time(position.timestamp_ms))
        plan = plan_offsets(
            committed.offsets,
            watermarks,
            position.type,
            timestamp_offsets=timestamp_offsets,
            max_records=size.records,
            max_records_per_partition=self.spec.batch.max_records_per_partition,
        )
        problem = source_change(self.spec.source.topic, committed.topic_id, topic_id, plan.offsets_ahead)
        if problem is not None:
            raise SourceChangedError(f"{self.label}: {problem}")
        # A table's first commit pins where it starts (a `latest` start would otherwise drift forward).
        pin_start = not committed.offsets and bool(plan.positions.starts)
        if plan.is_empty and not plan.data_loss and not pin_start:
            self._progress.backlog_after_last_batch = 0
            self._publish_lag(plan.positions.lag)
            if after is None:
                self._drop_stage_if_behind(committed.snapshot_id)
            return None
        self._check_lease()
        if self._dead_letters_dirty:
            self.reconcile_dead_letters()

        lost = self._report_data_loss(plan)
        start = {r.partition: r.start for r in plan.ranges}
        end = {r.partition: r.end for r in plan.ranges}
        # A partition retention emptied past its committed offset is committed at its low watermark even
        # with nothing to read, so the loss lands in the table (icefall.lost-records) with this batch.
        for loss in plan.data_loss:
            start.setdefault(loss.partition, loss.earliest_available)
            end.setdefault(loss.partition, loss.earliest_available)
        if pin_start:
            for partition, offset in plan.positions.starts.items():
                start.setdefault(partition, offset)
                end.setdefault(partition, offset)
        return _PlannedBatch(
            committed=committed,
            topic_id=topic_id,
            watermarks=watermarks,
            ranges=plan.ranges,
            start=start,
            end=end,
            gaps={d.partition: d.committed for d in plan.data_loss},
            lost=lost,
            backlog=backlog,
        )

    def _write_good_rows(self, planned: _PlannedBatch, branch: str) -> _ReadStats:
        """Read the planned offsets, decode them (no error text) and append the good rows to `branch`, in
        one Spark job that also counts, through an observation, every record read, their value bytes, the
        newest produce time and the bad rows. A batch with nothing to read writes nothing here
        (`_commit_main` stages its empty snapshot)."""
        if not planned.ranges:
            return _ReadStats(records=0, bytes=0, max_produce_ms=None, bad=0)
        from pyspark.sql import Observation

        decoders = self._decoders
        observation = Observation()
        # The table's rows carry no headers: only dead letters keep them (`_dead_letter_step`).
        decoded = decoders.good.decode(self._read(planned.ranges, headers=False))
        observed = decoded.observe(observation, *decoders.observed)
        rows = decoders.good.good_rows(observed)
        target = self._spark_name(self.st.table_identifier, branch)
        deleted_keys = None
        if self.spec.key:
            deleted_keys = self._merge_changes(rows, planned, target)
        else:
            _append(rows, target, sorted_table=bool(self.spec.table.sort_order))
        seen = observation.get
        stats = _ReadStats.of(seen["records"], seen["bytes"], seen["newest"], seen["bad"], deleted_keys)
        planned_offsets = sum(r.records for r in planned.ranges)
        if stats.records > planned_offsets:
            # Each offset holds at most one record: the write ran its input twice, and every count is off.
            raise RuntimeError(
                f"{self.label}: the batch's write counted {stats.records} records in {planned_offsets} "
                "offsets (its input was computed twice); the batch is not committed"
            )
        return stats

    def _merge_changes(self, rows: DataFrame, planned: _PlannedBatch, target: str) -> str | None:
        """MERGE the last change per key of a keyed batch's `rows` into `target`. With `spec.sequenceBy`
        first drop the changes older than a remembered delete and store the deleted keys to remember
        (`icefall.ingest.deleted_keys`); returns that file, for the commit to name, or None."""
        from icefall.ingest import deleted_keys
        from icefall.ingest.decode import last_changes

        key = self.spec.key or []
        view = f"icefall_changes_{self.writer_id}"
        if not self.spec.sequence_by:
            _merge(last_changes(rows, key), target, key, view=view)
            return None
        committed = planned.committed.deleted_keys
        if self._deleted_keys is not None and self._deleted_keys[0] == committed:
            remembered: pa.Table | None = self._deleted_keys[1]
        else:
            remembered = deleted_keys.load(self.table, committed)
        remembering = deleted_keys.Remembering(
            remembered, now_ms=int(time.time() * 1000), keep_ms=1000 * self.spec.deletes_remembered_seconds
        )
        _merge(remembering.filter(self.spark, last_changes(rows, key), key), target, key, view=view)
        keys = remembering.kept()
        if keys is None:
            return None  # the commit keeps the set named now
        path = deleted_keys.store(self.table, keys)
        self._deleted_keys = (path, keys)
        return path

    def _check_topic_unchanged(self, planned_topic_id: str | None) -> None:
        """The records are read: were they read from the topic the offsets were planned on?"""
        if self.topic.topic_id() != planned_topic_id:
            raise SourceChangedError(
                f"{self.label}: topic {self.spec.source.topic!r} was recreated "
                "while a batch was read; the batch is not committed"
            )

    def _dead_letter_step(
        self, batch: Batch, planned: _PlannedBatch, expected: int
    ) -> tuple[int, dict[str, int]]:
        """Read the batch's offsets again and commit its `expected` bad rows (with their error text) to the
        dead-letter table, then produce them to the dead-letter topic (if the spec names one); both before
        the main commit. Returns how many there were, and how many of each kind of reason."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.ingest.decode import bad_rows, reason_kind

        bad = bad_rows(self._decoders.with_errors.decode(self._read(planned.ranges))).persist()
        try:
            dead = self._write_dead_letters(bad, batch, planned.committed.offsets, expected)
            # For the metrics by kind of reason (`_publish`): one small job on the cached rows.
            counted = bad.groupBy(reason_kind(F.col("error")).alias("kind")).count().collect()
            kinds = {row["kind"]: int(row["count"]) for row in counted}
            if dead and self.spec.dead_letter.topic is not None:
                # Before the main commit: at-least-once, deduplicated downstream by `icefall.dedupe-key`.
                produce_dead_letters(
                    bad,
                    bootstrap=self.spec.source.bootstrap_servers,
                    topic=self.spec.dead_letter.topic,
                    source=DeadLetterSource(self.spec.source.topic, planned.topic_id, self.epoch),
                    kafka_config=self._kafka_config,
                )
                failpoint("dlq-topic.after-produce")
        finally:
            bad.unpersist()
        return dead, kinds

    def _report_batch(
        self,
        planned: _PlannedBatch,
        stats: _ReadStats,
        *,
        dead: int,
        kinds: Mapping[str, int],
        snapshot_id: int,
        commit_seconds: float,
        clock: _PhaseClock,
        table: Table | None = None,
        paced: bool = False,
    ) -> BatchReport:
        """After the commit: update the pacing figures, measure lag and freshness, publish the metrics.
        `table`: one whose metadata holds the new snapshot (default: the writer's); `paced`: the pacing
        figures were updated when the batch was written (`_send_commit`)."""
        written = _added_records(table or self.table, snapshot_id)
        seconds = clock.elapsed()
        progress = self._progress
        if not paced:
            self._learn_pace(planned, stats, seconds)
        committed = planned.committed
        offsets = {**committed.offsets, **planned.end}
        # The lag when the commit landed, not when the batch was planned: records keep arriving while a
        # batch runs, and a lag of 0 from the old watermarks would call a live table caught up (and let
        # in-process maintenance run) while it is seconds behind. Watermarks are one cheap broker call.
        lag = partition_lag(offsets, self._watermarks_after(planned.watermarks))
        progress.backlog_after_last_batch = sum(lag.values())
        newest = _newest(committed.max_produce_time_ms, stats.max_produce_ms)
        behind = freshness_seconds(sum(lag.values()), newest, time.time())
        report = BatchReport(
            records_read=stats.records,
            records_written=written,
            records_dead_lettered=dead,
            seconds=seconds,
            commit_seconds=commit_seconds,
            snapshot_id=snapshot_id,
            offsets=offsets,
            lag=sum(lag.values()),
            freshness_seconds=behind or 0.0,
            bytes_read=stats.bytes,
            data_loss=planned.lost,
            phases=clock.phases,
            dead_letter_reasons=kinds,
        )
        clock.mark("report")
        log.debug(
            "%s: batch of %d records in %.2fs: %s", self.label, stats.records, seconds,
            ", ".join(f"{name} {secs:.2f}s" for name, secs in clock.phases.items()),
        )  # fmt: skip
        self._publish(report, lag)
        return report

    def run(self, should_stop: Callable[[], bool], on_batch: Callable[[BatchReport | None], None]) -> None:
        """Run batches until `should_stop()`, paced by `plan.batching.next_batch_delay`: back to back while
        behind; caught up or idle, every half freshness target, sooner when batches take longer. An
        unreachable service is waited out (module doc); any other error is raised."""
        try:
            self._run(should_stop, on_batch)
        finally:
            self._land_at_stop(on_batch)

    def _run(self, should_stop: Callable[[], bool], on_batch: Callable[[BatchReport | None], None]) -> None:
        while not should_stop():
            self._wait_for_rewrite(should_stop)
            try:
                reports = self._step(pipeline=True)
            except SourceChangedError:
                raise
            except (StaleHeadError, FencedError) as refused:
                self._count_refused(refused)
                if isinstance(refused, FencedError):
                    raise
                log.warning("%s: commit refused (%s); planning again from the table", self.label, refused)
                continue
            except Exception as error:
                delay = self.outages.failed(error)
                if delay is None:
                    raise
                # The batch may have stopped anywhere: a staging branch or dead letters of an uncommitted
                # batch may be left, and are cleaned before the next batch is planned.
                self._dead_letters_dirty = True
                self._sweep_pending = True
                sleep_unless(delay, should_stop)
                continue
            self.outages.succeeded()
            for report in reports:
                on_batch(report)
            if self._in_flight is not None:
                continue  # the next batch is due now, and is written while this one's commit runs
            if not reports:
                on_batch(None)
            self._sleep_until(self._next_delay(), should_stop)

    def _wait_for_rewrite(self, should_stop: Callable[[], bool]) -> None:
        """Before a batch: wait while a rewrite holds the yield Lease (at most YIELD_MAX_WAIT_SECONDS)."""
        if self.yield_to is None:
            return
        started = time.monotonic()
        waited = False
        try:
            while yield_pending(self.yield_to.current(), time.time()) and not should_stop():
                waited = True
                if time.monotonic() - started >= YIELD_MAX_WAIT_SECONDS:
                    log.warning(
                        "%s: a rewrite held the yield lease for %.0fs; going on",
                        self.label,
                        YIELD_MAX_WAIT_SECONDS,
                    )
                    break
                time.sleep(0.25)
        except Exception:  # the lease store did not answer: ingestion does not depend on it
            log.warning("%s: reading the yield lease failed; going on", self.label, exc_info=True)
        if waited:
            seconds = time.monotonic() - started
            metrics.INGEST_YIELD_SECONDS.labels(self.label).inc(seconds)
            log.info("%s: waited %.1fs for a rewrite holding the yield lease", self.label, seconds)

    def _count_refused(self, refused: StaleHeadError | FencedError) -> None:
        reason = "fenced" if isinstance(refused, FencedError) else "stale_head"
        metrics.COMMITS_REFUSED.labels(self.label, reason).inc()
        if isinstance(refused, MaintenanceConflictError):
            metrics.INGEST_COMMITS_FAILED_BY_MAINTENANCE.labels(self.label).inc()
        self._dead_letters_dirty = True

    def _sweep_after_outage(self) -> None:
        """Drop the staging branches an outage left (this writer holds the lease: no batch of another writer
        is in flight), so they do not pin files until the next start."""
        for table in (self.table, self.dead_letter_table):
            if table is not None:
                dropped = sweep_stages(table)
                if dropped:
                    metrics.STAGES_DROPPED.labels(".".join(table.name())).inc(len(dropped))
                    log.info("%s: dropped staging branches left by the outage: %s", self.label, dropped)
        self._sweep_pending = False

    def _next_delay(self) -> float:
        progress = self._progress
        return next_batch_delay(
            now=time.monotonic(),
            last_batch_started_at=progress.last_batch_started,
            backlog_records=progress.backlog_after_last_batch,
            throughput_rps=progress.throughput_rps,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            min_interval_seconds=float(self.spec.batch.min_interval_seconds),
            last_batch_seconds=progress.last_batch_seconds,
        )

    def _watermarks_after(self, planned: Mapping[int, tuple[int, int]]) -> Mapping[int, tuple[int, int]]:
        """Current watermarks; the planned ones if the broker does not answer (the lag is then a floor)."""
        try:
            return self.topic.watermarks()
        except Exception:
            log.warning("%s: reading watermarks after the commit failed; lag may be low", self.label)
            return planned

    # -- steps ----------------------------------------------------------------------------------------

    @functools.cached_property
    def _decoders(self) -> _Decoders:
        """Built on first use: its columns need the running Spark session."""
        return _Decoders(self.spec, self._writer_schemas)

    def _read(self, ranges: Any, *, headers: bool = True) -> DataFrame:
        return read_kafka(
            self.spark,
            self.spec,
            ranges,
            self._spark_kafka_options,
            group_id=self.consumer_group,
            headers=headers,
        )

    def _empty_source(self) -> DataFrame:
        from icefall.ingest.decode import HEADERS_TYPE

        schema = (
            "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
            f"timestampType int, headers {HEADERS_TYPE.simpleString()}"
        )
        return self.spark.createDataFrame([], schema)

    def _spark_name(self, identifier: tuple[str, ...], branch: str) -> str:
        return ".".join([self.catalog_config.name, *identifier, f"branch_{branch}"])

    @property
    def _stage_branch(self) -> str:
        """This writer's staging branch, in both tables: one per writer and epoch, reused by every batch
        (a commit leaves it at main's new head), so another incarnation never writes to it."""
        return stage_branch_name(f"{self.writer_id}_e{self.epoch}", "stage")

    def _drop_stage_if_behind(self, head: int | None) -> None:
        """Idle, drop the staging branch if maintenance moved main past it: it would pin the snapshot it
        points at (and the files compaction replaced) until the next batch."""
        ref = self.table.metadata.refs.get(self._stage_branch)
        if ref is not None and ref.snapshot_id != head:
            abandon_stage(self.table, self._stage_branch, role="main")

    def _stage_if_nothing_written(self, stage: Stage, planned: _PlannedBatch) -> None:
        """Every commit moves main: stage an empty snapshot for a batch that may have written none."""
        # Spark 4.1 with Iceberg 1.11 commits an empty append's own empty snapshot; a batch that read nothing
        # (it only pins its start or skips a retention gap) wrote nothing, and a keyed batch's MERGE may
        # stage nothing (Spark skips a MERGE without changes): `_stage_empty` checks the branch then.
        if not planned.ranges or self.spec.key:
            _stage_empty(self.table, stage.branch, stage.base.snapshot_id)

    def _commit_main(self, stage: Stage, batch: Batch, planned: _PlannedBatch) -> tuple[int, float]:
        """Commit what is staged on `stage` (an empty snapshot if the batch had nothing to write); returns
        the snapshot id and the seconds of the commit itself."""
        self._stage_if_nothing_written(stage, planned)
        self._check_lease()
        commit_started = time.monotonic()
        outcome = commit_staged_outcome(self.table, stage, batch, self.epoch)
        self._count_restage(self.label, outcome)
        return outcome.snapshot_id, time.monotonic() - commit_started

    @staticmethod
    def _count_restage(label: str, outcome: CommitOutcome) -> None:
        if outcome.restaged:
            metrics.INGEST_COMMITS_RESTAGED.labels(label).inc()
            log.info("%s: maintenance committed meanwhile; batch re-staged on top of it", label)

    def _check_lease(self) -> None:
        if self._keeper is None:
            raise RuntimeError("call start() first: it takes the commit lease")
        self._keeper.check(self.label)

    def _write_dead_letters(
        self, bad: DataFrame, batch: Batch, committed: Mapping[int, int], expected: int
    ) -> int:
        """Commit the `expected` rows of `bad` to the dead-letter table; refused (StaleHeadError, nothing
        committed) if reading the offsets again gave another number of bad rows."""
        if expected == 0 or self.dead_letter_table is None:
            return expected
        dlq = self.dead_letter_table
        stage = prepare_stage(dlq, self._stage_branch, role="dlq")
        known = stage.base.offsets
        ahead = {p: o for p, o in known.items() if o > committed.get(p, 0)}
        if ahead:
            # Dead letters of a batch whose main commit never landed (a writer fenced mid-batch, say):
            # writing on top would put their records in the dead-letter table twice.
            self._dead_letters_dirty = True
            abandon_stage(dlq, stage.branch, role="dlq")
            raise StaleHeadError(f"the dead-letter table is ahead of the table at {ahead}; rewind it first")
        # Batches without bad records leave the dead-letter table alone, so it may start further back.
        dlq_batch = Batch(
            topic=batch.topic,
            start={p: known.get(p, s) for p, s in batch.start.items()},
            end=dict(batch.end),
            max_produce_time_ms=batch.max_produce_time_ms,
            topic_id=batch.topic_id,
        )
        label = ".".join(self.st.dead_letter_identifier or ())
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        observation = Observation()
        observed = bad.observe(observation, F.count(F.lit(1)).alias("rows"))
        with _dropped_unless_committed(dlq, stage.branch, label, "dlq"):
            dead_letter_table = self._spark_name(self.st.dead_letter_identifier or (), stage.branch)
            _append(observed, dead_letter_table, sorted_table=False)
            written = int(observation.get["rows"])
            if written != expected:
                raise StaleHeadError(
                    f"reading the batch again gave {written} bad records, not {expected}; planning again"
                )
            self._dead_letters_dirty = True  # ahead of main until the main commit lands
            # Dead letters come now and then: a branch left behind would pin old snapshots meanwhile.
            outcome = commit_staged_outcome(dlq, stage, dlq_batch, self.epoch, keep_branch=False)
        self._count_restage(label, outcome)
        return expected

    def reconcile_dead_letters(self) -> None:
        """Drop dead-letter rows past the main table's offsets: left by a batch whose main commit failed.

        The delete and the offsets move in one commit of `icefall.commit` (`rewind_dead_letters`), refused
        with FencedError if a newer writer has committed to the dead-letter table.
        """
        if self.dead_letter_table is not None:
            main = read_committed(self.table).offsets
            ahead = read_committed(self.dead_letter_table).offsets
            target = {p: main.get(p, 0) for p, o in ahead.items() if o > main.get(p, 0)}
            if target:
                log.warning("%s: dropping dead letters of uncommitted batches from %s", self.label, target)
                rewind_dead_letters(self.dead_letter_table, target, self.epoch)
        self._dead_letters_dirty = False

    # -- reporting ------------------------------------------------------------------------------------

    def _report_data_loss(self, plan: Any) -> int:
        lost = 0
        for loss in plan.data_loss:
            key = (loss.partition, loss.committed)
            if key in self._progress.data_loss_seen:
                continue
            self._progress.data_loss_seen.add(key)
            lost += loss.lost
            metrics.DATA_LOSS.labels(self.label).inc(loss.lost)
            log.error(
                "%s: DATA LOSS: partition %d: records %d..%d were deleted by topic retention before they "
                "were ingested; continuing from %d",
                self.label, loss.partition, loss.committed, loss.earliest_available - 1,
                loss.earliest_available,
            )  # fmt: skip
        return lost

    def _publish_lag(self, lag: Any) -> None:
        for partition, records in lag.items():
            metrics.LAG.labels(self.label, str(partition)).set(records)

    def _publish(self, report: BatchReport, lag: Mapping[int, int]) -> None:
        # A keyed table writes one row per key and batch, and none for a delete: not "filtered".
        filtered = (
            0
            if self.spec.key
            else report.records_read - report.records_written - report.records_dead_lettered
        )
        metrics.RECORDS_READ.labels(self.label).inc(report.records_read)
        metrics.RECORDS_WRITTEN.labels(self.label).inc(report.records_written)
        for kind, count in report.dead_letter_reasons.items():
            metrics.RECORDS_DEAD_LETTERED.labels(self.label, kind).inc(count)
        metrics.RECORDS_FILTERED.labels(self.label).inc(max(filtered, 0))
        metrics.BYTES_READ.labels(self.label).inc(report.bytes_read)
        metrics.BATCH_DURATION.labels(self.label).observe(report.seconds)
        metrics.COMMIT_DURATION.labels(self.label).observe(report.commit_seconds)
        metrics.FRESHNESS.labels(self.label).set(report.freshness_seconds)
        metrics.FRESHNESS_TARGET.labels(self.label).set(self.spec.freshness.target_seconds)
        metrics.LAST_COMMIT.labels(self.label).set(time.time())
        self._publish_lag(lag)

    @staticmethod
    def _sleep_until(seconds: float, should_stop: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not should_stop():
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))


def _added_records(table: Table, snapshot_id: int) -> int:
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.summary is None:
        return 0
    # pyiceberg's Summary.get ignores its default: an empty snapshot has no "added-records" at all.
    return int(snapshot.summary.get("added-records") or 0)


def _append(rows: DataFrame, name: str, *, sorted_table: bool) -> None:
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


def _merge(changes: DataFrame, name: str, key: Sequence[str], *, view: str) -> None:
    """Apply a keyed batch's `changes` (good rows with `DELETE_COLUMN`) to the Spark table `name` (a
    staging branch) in ONE Spark MERGE: one snapshot, new rows plus position deletes of the rows they
    replace (the table is merge-on-read, `icefall.catalog.tables.KEYED_TABLE_DEFAULTS`).

    `changes` are the batch's last change per key (`icefall.ingest.decode.last_changes`), and that one
    decides alone: insert-then-delete leaves no row, delete-then-insert leaves the insert, and the
    batch never deletes a row it writes itself (position deletes name rows of files already there). With
    `SEQUENCE_COLUMN` (cdc with `spec.sequenceBy`) a change older than the row's stored position, or
    without one (a tombstone), leaves the row as it is.
    """
    from icefall.ingest.decode import DELETE_COLUMN, SEQUENCE_COLUMN

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


@contextlib.contextmanager
def _dropped_unless_committed(table: Table, branch: str, label: str, role: TableRole) -> Iterator[None]:
    """Drop staging branch `branch` if the block raises: its batch did not land (a refused commit, a failed
    write), and a branch left behind would pin its snapshots and files until the next start's sweep.

    A commit that raised but landed has already removed the branch; dropping is then a no-op. A failure to
    drop is logged, never raised over the original error (the next start sweeps what is left).
    """
    try:
        yield
    except BaseException:
        try:
            if abandon_stage(table, branch, role=role):
                metrics.STAGES_DROPPED.labels(label).inc()
        except Exception as error:
            # In an outage the failure is the outage's, logged once by the retry loop, which sweeps later.
            level = logging.INFO if classify(error) is not None else logging.WARNING
            log.log(level, "%s: dropping staging branch %s failed; it is swept later", label, branch)
        raise


def _stage_empty(table: Table, branch: str, base: int | None, attempts: int = 5) -> None:
    """Stage an empty snapshot on `branch` (at `base`) for a batch that wrote nothing: every batch moves
    main, so its offsets are committed even with no rows. A branch already one snapshot past `base` (a
    keyed batch's MERGE that did change rows) is left as it is.

    pyiceberg numbers the snapshot from the metadata it just read; a commit landing elsewhere in the table
    meanwhile (maintenance on main) makes the catalog refuse it (CommitFailedException, or ValueError for
    the sequence number) before anything changes, so it is simply tried again from fresh metadata.
    """
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(attempts):
        table.refresh()
        ref = table.metadata.refs.get(branch)
        staged = table.metadata.snapshot_by_id(ref.snapshot_id) if ref is not None else None
        if staged is not None and staged.parent_snapshot_id == base and base is not None:
            return
        if ref is None or ref.snapshot_id != base:
            # Nothing else writes this branch while the batch runs: the stage is gone or not this batch's.
            raise StaleHeadError(f"staging branch {branch} is no longer at {base}; planning again")
        try:
            with table.transaction() as tx, tx.update_snapshot(branch=branch).fast_append():
                pass
        except (CommitFailedException, ValueError) as e:
            log.info("staging an empty batch on %s was refused (%s); trying again", branch, e)
            continue
        failpoint("main.after-ensure-staged")
        return
    raise StaleHeadError(f"could not stage an empty batch on {branch}: the table kept changing")
