"""The ingestion writer: Kafka offset ranges in, one exactly-once Iceberg commit per batch out.

`Ingestor` drives one table's batches (`ingest/DESIGN.md` tells a batch's life): `planning` says what to
read, `writer` reads, decodes and writes it to a staging branch with Spark, `dead_letters` commits its bad
records first, `commits` commits it (here, or on the commit thread while the next batch is written on top
of it, as `plan.pipelining` decides), and `report` measures it.

Guarantees: a batch is in the table once or not at all; a writer whose lease was taken over cannot commit
(epoch fencing; `run_batch` raises FencedError once it notices); every Kafka read is read_committed; a
topic recreated or truncated below the committed offsets stops ingestion with SourceChangedError; records
lost to retention are never skipped silently, and not at all with `onDataLoss: Halt` (DataLossHaltedError;
`icefall.ingest.planning`). Maintenance committing between
staging and commit does not cost a batch: the commit re-stages it (`icefall_ingest_commits_restaged_total`);
when it cannot, `icefall_ingest_commits_failed_by_maintenance_total` counts it and the batch is planned
again. A pipelined batch whose commit below was re-staged is dropped and planned again
(`icefall_ingest_batches_discarded_total`). `run` waits out an unreachable Kafka, catalog or object store
(`icefall.ingest.outages`) and plans the next batch from the table, so a batch whose commit outcome is unknown
is found committed or read again, never committed twice; staging branches the outage left are cleaned before
it. Not guaranteed: the dead-letter table may hold rows of a batch whose main commit then failed; the batch
read again does not put them there twice (it skips what it holds, `icefall.ingest.dead_letters`).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.commit import FencedError, StaleHeadError, claim_epoch, sweep_stages
from icefall.commit.lease import Lease
from icefall.ingest.batches import Batches
from icefall.ingest.commits import CommitPipeline, LeaseKeeper
from icefall.ingest.dead_letters import DeadLetters
from icefall.ingest.outages import Outages, log_failure, service_addresses, sleep_unless
from icefall.ingest.planning import DataLossHaltedError, Planner, SourceChangedError
from icefall.ingest.report import BatchReport, Reporter
from icefall.ingest.writer import SPARK_CONSUMER_DEFAULTS, BatchWriter, read_kafka
from icefall.kafka.admin import TopicView
from icefall.kafka.security import librdkafka_config, spark_kafka_options
from icefall.kafka.topic_set import TopicSet
from icefall.plan.batching import next_batch_delay
from icefall.plan.leases import YIELD_MAX_WAIT_SECONDS
from icefall.runtime import metrics
from icefall.spark.session import local_dirs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from icefall.kafka.registry import Registry
    from icefall.runtime.failpoints import TableRole

__all__ = [
    "SPARK_CONSUMER_DEFAULTS",
    "BatchReport",
    "DataLossHaltedError",
    "Ingestor",
    "LeaseKeeper",
    "SourceChangedError",
    "read_kafka",
]

log = logging.getLogger(__name__)

OnBatch = Callable[[BatchReport | None], None]


class Ingestor:
    """One table's writer. Call `start()` once (takes the lease), then `run_batch()` or `run()`."""

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
        from icefall.kafka.registry import WriterSchemas, registered_writers, with_registry_schema

        if registry is None and st.spec.format.registry is not None:
            registry = WriterSchemas(st.spec.format.registry, format_type=st.spec.format.type)
        # A registry format without an inline schema: the table's columns are the registry's latest schema.
        st = with_registry_schema(st, registry.latest_schema if registry is not None else None)
        self.st, self.spec, self.spark = st, st.spec, spark
        self.catalog_config = catalog
        self._catalog: Catalog | None = None
        self.yield_to = yield_to if st.spec.key else None  # appends never conflict with a rewrite
        self.writer_id = writer_id or uuid.uuid4().hex[:12]
        self.label = ".".join(st.table_identifier)
        # Secret values: handed to the clients only, never logged.
        self._kafka_config = librdkafka_config(self.spec.source.security)
        source = self.spec.source
        # One view per topic, all through the first one's clients (`TopicView.sibling`).
        self.topic = TopicView(source.bootstrap_servers, source.first_topic, self._kafka_config)
        self.topics = TopicSet(source, self.topic, self.label)  # `topicPattern`: found in Kafka's list
        self.writer = BatchWriter(
            st,
            spark,
            catalog_name=catalog.name,
            kafka_options=spark_kafka_options(self.spec.source.security),
            writer_id=self.writer_id,
            schemas=registry.lookup if registry is not None else None,
            registered=functools.partial(registered_writers, registry, st.spec)
            if registry is not None
            else None,
        )
        self.planner = Planner(self.spec, self.label, self.topics)
        self.reporter = Reporter(self.spec, self.label, self.topics)
        self.commits = CommitPipeline(
            lease, label=self.label, writer_id=self.writer_id, keyed=bool(st.spec.key)
        )
        self.table: Table
        self.dead_letters = DeadLetters(st, self.writer, None, self._kafka_config)
        self._batches: Batches | None = None  # made by `start`, on the tables it made ready
        self.outages = Outages(
            self.label,
            service_addresses(
                source.bootstrap_servers,
                ", ".join(source.topic_names) or source.first_topic,
                catalog,
                registry=self.spec.format.registry.url if self.spec.format.registry else None,
                local_dirs=local_dirs(spark),
            ),
        )

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg client, made on first use (a catalog unreachable at start is an outage, retried)."""
        if self._catalog is None:
            self._catalog = self.catalog_config.pyiceberg()
        return self._catalog

    @property
    def consumer_group(self) -> str:
        """The Kafka consumer group of every read of this writer (`read_kafka`)."""
        return self.writer.consumer_group

    @property
    def dead_letter_table(self) -> Table | None:
        return self.dead_letters.table

    @property
    def batches(self) -> Batches:
        if self._batches is None:
            raise RuntimeError("call start() first: it takes the commit lease")
        return self._batches

    @property
    def epoch(self) -> int:
        """The epoch this writer claimed with its lease (0 before `start`)."""
        return self.commits.epoch

    @property
    def lease(self) -> Lease:
        return self.commits.lease

    @lease.setter
    def lease(self, lease: Lease) -> None:
        self.commits.lease = lease

    @property
    def _keeper(self) -> LeaseKeeper | None:
        """The lease keeper (tests stop or replace it to play a paused writer)."""
        return self.commits.keeper

    @_keeper.setter
    def _keeper(self, keeper: LeaseKeeper | None) -> None:
        self.commits.keeper = keeper

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, lease_timeout: float | None = None) -> None:
        """Create the tables if needed, take the commit lease, claim its epoch, sweep what crashed writers
        left. If anything fails, the lease is given back, so calling `start` again (after an outage) is safe.
        """
        try:
            self._start(lease_timeout)
        except BaseException:
            self.commits.abort_start()
            raise

    def _start(self, lease_timeout: float | None) -> None:
        from icefall.catalog.layout import expected_schema, spark_struct_to_iceberg
        from icefall.catalog.tables import ensure_tables
        from icefall.decode.decode import prepare
        from icefall.decode.schemas import SchemaFollower

        override = None
        if self.spec.transforms.select:
            # The table's columns are what the select expressions produce: ask Spark's analyser.
            good = prepare(self.writer.empty_source(), self.spec).good
            override = spark_struct_to_iceberg(good.schema.json())
        self.table, dlq = ensure_tables(self.catalog, self.st, schema_override=override)
        routes = self._ensure_routes(override)
        follower = SchemaFollower(self.spec, expected_schema(self.st, override), self.label)
        self.reporter.schema_refused = lambda: follower.refused
        self.dead_letters.table = dlq
        # The other tables' epochs first: an older writer's late commit to any of them is fenced too.
        others: list[tuple[Table, TableRole]] = [(t, "route") for t in routes]
        others += [(dlq, "dlq")] if dlq else []
        self.commits.start([*others, (self.table, "main")], lease_timeout)
        self._batches = Batches(
            self.spec,
            self.table,
            writer=self.writer,
            planner=self.planner,
            reporter=self.reporter,
            commits=self.commits,
            dead_letters=self.dead_letters,
            schemas=follower,
        )
        # Branches of writers that died mid-batch: their data was never on main.
        sweep_stages(self.table, role="main")
        if dlq is not None:
            sweep_stages(dlq, role="dlq")
        if self.writer.routing is not None:
            self.writer.routing.sweep()

    def _ensure_routes(self, override: Schema | None) -> list[Table]:
        """The route tables (`spec.routes`), made ready like the table; their conditions analysed by Spark
        first, so that a wrong one fails the start naming its route."""
        routing = self.writer.routing
        if routing is None:
            return []
        from icefall.catalog.tables import ensure_route_tables

        routing.check(self.writer.decoders.good.decode(self.writer.empty_source()))
        routing.tables = ensure_route_tables(self.catalog, self.st, schema_override=override)
        if routing.dynamic is not None:
            from icefall.catalog.tables import dynamic_route_tables

            routing.found(dynamic_route_tables(self.catalog, self.st, schema_override=override))
            routing.create = lambda name: self._create_dynamic(name, override)
        return list(routing.tables)

    def _create_dynamic(self, name: str, override: Schema | None) -> Table | None:
        """Dynamic route table `name`, created on first use, with this writer's epoch claimed in it (a
        late commit of an older writer to it is fenced like one to any other table)."""
        from icefall.catalog.tables import ensure_dynamic_table
        from icefall.decode.schemas import follows_table

        if follows_table(self.spec):
            # A registry format: the table's columns now (every writer schema met), not the latest schema
            # the spec was filled with at start; the batch's rows are written in these columns.
            override = self.table.schema()
        table = ensure_dynamic_table(self.catalog, self.st, name, schema_override=override)
        if table is not None:
            self.commits.check_lease()
            claim_epoch(table, self.commits.epoch, role="route")
        return table

    def close(self) -> None:
        self.commits.stop()
        self.topic.close()
        self.commits.lease.release()

    # -- one batch ------------------------------------------------------------------------------------

    def run_batch(self) -> BatchReport | None:
        """Plan, read, write and commit one batch (`Batches.step`); None when there was nothing to read.

        Raises FencedError when this writer lost its lease or a newer writer committed (stop writing),
        StaleHeadError when the table moved under the batch (plan again).
        """
        reports = self.batches.step(pipeline=False)
        return reports[-1] if reports else None

    # -- the loop -------------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], on_batch: OnBatch) -> None:
        """Run batches until `should_stop()`, paced by `plan.batching.next_batch_delay`: back to back while
        behind (pipelined, if the spec says so); caught up or idle, every half freshness target, sooner when
        batches take longer. An unreachable service is waited out (module doc); any other error is raised.
        """
        try:
            self._run(should_stop, on_batch)
        finally:
            if self._batches is not None and (report := self._batches.land_at_stop()) is not None:
                on_batch(report)

    def _run(self, should_stop: Callable[[], bool], on_batch: OnBatch) -> None:
        while not should_stop():
            if self.yield_to is not None:
                wait_for_rewrite(self.yield_to, self.label, should_stop)
            reports = self._attempt(should_stop)
            if reports is None:
                continue  # refused, or an outage waited out: planned again from the table
            for report in reports:
                on_batch(report)
            if self.commits.in_flight is not None:
                continue  # the next batch is due now, and is written while this one's commit runs
            if not reports:
                on_batch(None)
            sleep_until(self._next_delay(), should_stop)

    def _attempt(self, should_stop: Callable[[], bool]) -> list[BatchReport] | None:
        """One step of the loop; None when its commit was refused or an outage was waited out."""
        batches = self.batches
        try:
            reports = batches.step(pipeline=True)
        except (SourceChangedError, DataLossHaltedError):
            raise
        except (StaleHeadError, FencedError) as refused:
            batches.refused(refused)
            if isinstance(refused, FencedError):
                raise
            log.warning("%s: commit refused (%s); planning again from the table", self.label, refused)
            return None
        except Exception as error:
            delay = self.outages.failed(error)
            if delay is None:
                raise
            batches.outage()
            sleep_unless(delay, should_stop)
            return None
        self.outages.succeeded()
        return reports

    def _next_delay(self) -> float:
        progress = self.reporter.progress
        return next_batch_delay(
            now=time.monotonic(),
            last_batch_started_at=progress.last_batch_started,
            backlog_records=progress.backlog_after_last_batch,
            throughput_rps=progress.throughput_rps,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            min_interval_seconds=float(self.spec.batch.min_interval_seconds),
            last_batch_seconds=progress.last_batch_seconds,
        )


def wait_for_rewrite(yield_to: Lease, label: str, should_stop: Callable[[], bool]) -> None:
    """Before a batch: wait while a rewrite holds the yield Lease (at most YIELD_MAX_WAIT_SECONDS)."""
    started = time.monotonic()
    waited = False
    try:
        while yield_to.observed_holder() is not None and not should_stop():
            waited = True
            if time.monotonic() - started >= YIELD_MAX_WAIT_SECONDS:
                log.warning(
                    "%s: a rewrite held the yield lease for %.0fs; going on", label, YIELD_MAX_WAIT_SECONDS
                )
                break
            time.sleep(0.25)
    except Exception as error:  # the lease store did not answer: the commit's own lease check decides
        log_failure(log, error, "%s: reading the yield lease failed; going on", label)
    if waited:
        seconds = time.monotonic() - started
        metrics.INGEST_YIELD_SECONDS.labels(label).inc(seconds)
        log.info("%s: waited %.1fs for a rewrite holding the yield lease", label, seconds)


def sleep_until(seconds: float, should_stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not should_stop():
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
