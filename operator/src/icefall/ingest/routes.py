"""Static routes (`spec.routes`): one read of a batch into several tables, each exactly once.

Each batch is read and decoded once; a column names the first route whose condition holds for each good
record (`Routing.routed`), the decoded batch is cached, and each destination appends its rows to its own
staging branch (`Routing.write`). The route tables commit first, one after the other, each through the
commit protocol with the offsets of the part of the batch it takes (`icefall.plan.routing.destination_take`,
whether or not its condition kept any record); then the dead letters; `spec.table` commits LAST. The batch
is planned from `spec.table`'s offsets, so after a crash between two commits every route table stands at or
past them: the range is read again, a route table that is behind takes its records, one that is ahead
takes only what is past its own offsets (nothing at all once it holds the range), and no table gets a
record twice.

Guarantees: a route table's commit records exactly the range its rows came from; its staging branch is
dropped unless the commit landed; a route table behind `spec.table` stops the writer
(`DestinationBehindError`) rather than losing records. Not guaranteed: that the tables land together (a
reader may see a route table ahead of another for the time between their commits); pipelining (a routed
table commits each batch before the next is read).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icefall.api import UNROUTED_REASON, StreamingTable, Unrouted
from icefall.commit import Batch, Stage, commit_staged_outcome, prepare_stage, sweep_stages
from icefall.commit.batch import held_of
from icefall.ingest.columns import BAD_COLUMN, ERROR_COLUMN, INTERNAL_PREFIX, TYPED_COLUMN
from icefall.ingest.commits import count_restage, dropped_unless_committed, stage_empty
from icefall.ingest.report import added_records
from icefall.plan.routing import Take, destination_take, reads_headers

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame

    from icefall.ingest.planning import PlannedBatch

log = logging.getLogger(__name__)

#: The decoded batch's column naming the route that takes each good record (null: none).
ROUTE_COLUMN = f"{INTERNAL_PREFIX}route"
_RECORD = f"{INTERNAL_PREFIX}record"
#: `_kafka.headers` of a condition: each header's name to its value as text, the first of a repeated name
#: (a map with a repeated key would fail the batch).
_HEADERS_MAP = (
    "map_from_entries(filter(transform(headers, h -> struct(h.key AS key, CAST(h.value AS STRING) AS value)),"
    " (e, i) -> array_position(transform(headers, x -> x.key), e.key) = i + 1))"
)


@dataclass(frozen=True)
class RouteStage:
    """A route table's part of one batch: its staging branch and what it takes."""

    index: int
    label: str
    table: Table
    stage: Stage
    take: Take
    target: str  # the Spark name of its staging branch
    sorted_table: bool


class Routing:
    """One writer's route tables (made ready by `Ingestor.start`), staged, written and committed per batch."""

    def __init__(self, st: StreamingTable, spark_name: Callable[[tuple[str, ...], str], str]) -> None:
        """`spark_name`: the Spark name of a table's staging branch (`BatchWriter.spark_name`)."""
        self.spec = st.spec
        self.tables: list[Table] = []  # in the order of spec.routes, set by `Ingestor.start`
        self.labels = [".".join(identifier) for identifier in st.route_identifiers]
        self.identifiers = st.route_identifiers
        self.conditions = [route.when for route in st.spec.routes]
        self.headers = reads_headers(self.conditions)
        self.unrouted = st.spec.unrouted_to
        self.spark_name = spark_name

    # -- Spark -----------------------------------------------------------------------------------------

    def routed(self, decoded: DataFrame, conditions: list[str] | None = None) -> DataFrame:
        """`decoded` (a `decode` result) with `ROUTE_COLUMN`: the index of the first route whose condition
        (of `conditions`, default the spec's) holds for a good record; null for a record no route takes and
        for a bad record."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        context = decoded.select(
            F.struct(*(F.col(c) for c in decoded.columns)).alias(_RECORD),
            *(F.col(TYPED_COLUMN)[f.name].alias(f.name) for f in self.spec.format.schema_fields),
            self._kafka(decoded).alias("_kafka"),
        )
        first, *rest = self.conditions if conditions is None else conditions
        route = F.when(F.expr(first), F.lit(0))
        for i, condition in enumerate(rest, start=1):
            route = route.when(F.expr(condition), F.lit(i))
        good = ~F.col(_RECORD)[BAD_COLUMN]
        return context.select(f"{_RECORD}.*", F.when(good, route).alias(ROUTE_COLUMN))

    def _kafka(self, decoded: DataFrame) -> Column:
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        topic = F.col("topic") if "topic" in decoded.columns else F.lit(self.spec.source.first_topic)
        return F.struct(
            topic.cast("string").alias("topic"),
            F.col("partition"),
            F.col("offset"),
            F.col("timestamp"),
            F.col("key").cast("string").alias("key"),
            F.expr(_HEADERS_MAP).alias("headers"),
        )

    def check(self, decoded: DataFrame) -> None:
        """Have Spark analyse each condition over `decoded` (no records): a wrong column or type fails the
        start naming the route, not a batch."""
        for i, condition in enumerate(self.conditions):
            try:
                _ = self.routed(decoded, [condition]).schema
            except Exception as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ValueError(
                    f"spec.routes[{i}].when: Spark cannot evaluate {condition!r}: {first}"
                ) from None

    def observed(self) -> list[Column]:
        """The observed aggregate of the records no route takes (good records only)."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        return [F.count_if(~F.col(BAD_COLUMN) & F.col(ROUTE_COLUMN).isNull()).alias("unrouted")]

    def write(
        self,
        routed: DataFrame,
        stages: list[RouteStage],
        rows_of: Callable[[DataFrame], DataFrame],
        append_to: Callable[[DataFrame, str, bool], None],
        main: tuple[str, bool],
    ) -> None:
        """Append each destination's rows of the batch (`routed`, computed once and cached) to its staging
        branch: `spec.table`'s (`main`: its target and whether it is sorted) gets the unrouted records
        (with `unrouted: DeadLetter` nothing is written to it), each route the records it takes past its
        own offsets."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        route = F.col(ROUTE_COLUMN)
        cached = routed.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            if self.unrouted is Unrouted.TABLE:
                append_to(rows_of(cached.where(route.isNull())), *main)
            else:
                # No rows for the table: its commit stages an empty snapshot (`Batches._commit_here`). Not an
                # append of `where(false)`: Spark prunes that query, and the batch's observation breaks.
                cached.count()  # computes the batch once, its observation with it, for the routes to share
            for rs in stages:
                keep = (route == rs.index) & F.col("partition").isin(list(rs.take.start))
                for p, below in rs.take.skip_below.items():
                    keep = keep & ((F.col("partition") != p) | (F.col("offset") >= below))
                append_to(rows_of(cached.where(keep)), rs.target, rs.sorted_table)
        finally:
            cached.unpersist()

    def dead_letters(self, decoded: DataFrame) -> DataFrame:
        """`decoded` (with error text) with the records no route takes marked bad, for `unrouted:
        DeadLetter`: their reason is `UNROUTED_REASON`."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        if self.unrouted is not Unrouted.DEAD_LETTER:
            return decoded
        unrouted = F.col(ROUTE_COLUMN).isNull()
        return self.routed(decoded).select(
            *(c for c in decoded.columns if c not in (BAD_COLUMN, ERROR_COLUMN)),
            (F.col(BAD_COLUMN) | unrouted).alias(BAD_COLUMN),
            F.coalesce(F.col(ERROR_COLUMN), F.when(unrouted, F.lit(UNROUTED_REASON))).alias(ERROR_COLUMN),
        )

    # -- commits ---------------------------------------------------------------------------------------

    def stage(self, branch: str, planned: PlannedBatch) -> list[RouteStage]:
        """Each route table's stage of `planned` (planned from `spec.table`): its branch at its head and
        what it takes; route tables that hold the whole batch already are left out."""
        (part,) = planned.parts  # routes read one topic
        stages = []
        for i, table in enumerate(self.tables):
            stage = prepare_stage(table, branch, role="route")
            held = held_of(stage.base, part.topic).offsets
            take = destination_take(part.start, part.end, part.gaps, held, name=self.labels[i])
            if take is None:
                log.warning(
                    "%s: holds the whole batch already (a crash between commits); skipped", self.labels[i]
                )
                continue
            if take.skip_below:
                log.warning(
                    "%s: ahead of the table (a crash between commits); takes from %s",
                    self.labels[i],
                    take.start,
                )
            target = self.spark_name(self.identifiers[i], branch)
            sorted_table = bool(self.spec.routes[i].table.sort_order)
            stages.append(RouteStage(i, self.labels[i], table, stage, take, target, sorted_table))
        return stages

    @contextlib.contextmanager
    def dropped_unless_committed(self, stages: list[RouteStage]) -> Iterator[None]:
        """Drop the route tables' staging branches if the block raises (a landed commit left its branch at
        its table's head: dropping that one costs nothing)."""
        with contextlib.ExitStack() as stack:
            for rs in stages:
                stack.enter_context(dropped_unless_committed(rs.table, rs.stage.branch, rs.label, "route"))
            yield

    def commit(
        self, stages: list[RouteStage], batch: Batch, epoch: int, check_lease: Callable[[], None]
    ) -> int:
        """Commit each route table's part of `batch`, in order, before the dead letters and the table; the
        rows they added."""
        added = 0
        for rs in stages:
            take = rs.take
            part = Batch(
                topic=batch.topic,
                start=take.start,
                end=take.end,
                max_produce_time_ms=batch.max_produce_time_ms,
                retention_gaps=take.gaps,
                topic_id=batch.topic_id,
            )
            stage_empty(rs.table, rs.stage.branch, rs.stage.base.snapshot_id)  # a batch that read nothing
            check_lease()
            outcome = commit_staged_outcome(rs.table, rs.stage, part, epoch)
            count_restage(rs.label, outcome)
            added += added_records(rs.table, outcome.snapshot_id)
        return added

    def sweep(self) -> None:
        """Drop the staging branches crashed writers (or an outage) left in the route tables."""
        for table in self.tables:
            sweep_stages(table, role="route")
