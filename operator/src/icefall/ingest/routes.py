"""Static routes (`spec.routes`): one read of a batch into several tables, each exactly once.

Each batch is read and decoded once; a column names the first route whose condition holds for each good
record (`Routing.routed`), the decoded batch is cached, and each destination's rows are written
(`Routing.write`): by Spark to its staging branch, or (most route tables) as data files by the driver
from one Spark job for all (`_write_collected`). The route tables commit first, one after the other, each
through the commit protocol (`commit_files` for the driver's files) with the offsets of the part of the
batch it takes (`icefall.plan.routing.destination_take`, whether or not its condition kept any record);
then the dead letters; `spec.table` commits LAST. The batch is planned from `spec.table`'s offsets, so
after a crash between two commits every route table stands at or past them: the range is read again, a
route table that is behind takes its records, one that is ahead takes only what is past its own offsets
(nothing at all once it holds the range), and no table gets a record twice.

Guarantees: a route table's commit records exactly the range its rows came from; its staging branch is
dropped unless the commit landed; a route table behind `spec.table` stops the writer
(`DestinationBehindError`) rather than losing records. Not guaranteed: that the tables land together (a
reader may see a route table ahead of another for the time between their commits); pipelining (a routed
table commits each batch before the next is read).

Keyed tables (`spec.mode` upsert, cdc): every destination is keyed (spec.key) and MERGEs what it takes as
the single table does (`writer.merge`; with `sequenceBy` its own deleted keys file, named by its own
commit); nothing is collected to the driver. A condition sees the row image: upsert's value, cdc's `after`
(op c, r, u) or `before` (op d), key fields the image lacks from the Kafka key (all a tombstone has). A
delete goes where its condition sends it; one NO condition takes goes to every destination (`EVERY`) and
deletes its key wherever it is, never a dead letter. Not guaranteed: a key whose changes route to
different tables stays in each with its last change there (ingest/DESIGN.md says how to route deletes).

Several topics (`spec.source.topics`, `topicPattern`): each destination takes its part per topic
(`icefall.plan.routing.destination_takes`) and commits it as a `TopicsBatch`. Conditions see the decoded
value's fields as the batch decodes them (a registry format's: the table's columns now).

Own schemas (`spec.routes[i].schema`, `key`, `sequenceBy`; `icefall.decode.route_decoding`): a record such
a route takes is judged by its route's schema, not spec's (`routed`); `write` decodes its records again
from the cached batch into its table's columns, keyed by its key (`Destination.spec`), and counts those
that do not fit (dead letters, `own_dead_letters`).

Dynamic routes (`spec.dynamicRoute`): `routed` also adds the name each good record no static route takes
computes (`NAME_COLUMN`). `write` counts the batch's names first (one job over the cached batch, its
observation with it), sorts them (`icefall.plan.routing.dynamic_names`), creates the new tables (`create`:
spec.table's columns, the template's layout, the owner property; this writer's epoch claimed in each)
and stages them like the others: a table created by a batch takes that batch's whole range (it has no
offsets), so it never gets a record older than its creation (those had no table then: they went to the
dead letters past the cap, or there were none). Every dynamic table that exists is a destination of every
batch from then on, found again at start from the catalog (`dynamic_route_tables`). A refused name's
records are dead letters (`dead_letters`) with the reason naming the name.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from icefall.api import UNROUTED_REASON, NameFrom, StreamingTable, StreamingTableSpec, Unrouted
from icefall.commit import (
    Batch,
    SourceBatch,
    Stage,
    TopicsBatch,
    WrittenFiles,
    commit_files,
    commit_staged_outcome,
    prepare_stage,
    sweep_stages,
)
from icefall.commit.batch import held_of
from icefall.decode.columns import (
    BAD_COLUMN,
    DELETE_COLUMN,
    ERROR_COLUMN,
    INTERNAL_PREFIX,
)
from icefall.decode.route_decoding import ROUTE, OwnDecoders
from icefall.ingest.arrow_append import arrow_writable, write_rows
from icefall.ingest.commits import count_restage, dropped_unless_committed, stage_empty
from icefall.ingest.report import added_records
from icefall.ingest.route_context import (
    RECORD,
    dynamic_name,
    judged,
    kafka_context,
    value_field,
    value_fields,
)
from icefall.plan.routing import (
    Take,
    TopicRange,
    destination_takes,
    driver_collects,
    dynamic_names,
    not_created_reason,
    reads_headers,
    same_takes,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame

    from icefall.ingest.planning import PlannedBatch

log = logging.getLogger(__name__)

#: The decoded batch's column naming the route that takes each good record (null: none).
ROUTE_COLUMN = f"{INTERNAL_PREFIX}route"
#: The decoded batch's column with the table name a good record no static route takes computes
#: (`spec.dynamicRoute`; null: none).
NAME_COLUMN = f"{INTERNAL_PREFIX}table_name"
#: `ROUTE_COLUMN` of a keyed table's delete that no route's condition takes (a tombstone has no row image to
#: test): it goes to every destination, and deletes its key wherever it is.
EVERY = -1
#: The collected rows' column naming the route table each row goes to (`_write_collected`).
_DESTINATION = f"{INTERNAL_PREFIX}destination"


@dataclass(frozen=True)
class Destination:
    """Where `Routing.write` puts one destination's rows of a batch: its staging branch (`target`, the Spark
    name) of `table`, whether it is sorted, (keyed, cdc with sequenceBy) the deleted keys file its
    committed state names, and an own route's spec (`StreamingTableSpec.route_spec`; None: spec's)."""

    target: str
    sorted_table: bool
    table: Table
    deleted_keys: str | None = None
    spec: StreamingTableSpec | None = None


class RowsOf(Protocol):
    """The table's rows of (part of) the decoded batch (`Decoder.good_rows`, every table column); `carry`:
    columns of the batch kept beside them."""

    def __call__(self, frame: DataFrame, carry: Sequence[str] = ()) -> DataFrame: ...


#: Writes one destination's rows (append, or a keyed table's MERGE); the deleted keys file it stored for
#: the commit to name (cdc with sequenceBy), or None (`icefall.ingest.writer.BatchWriter.write_good_rows`).
WriteTo = Callable[["DataFrame", Destination], "str | None"]


@dataclass(frozen=True)
class RoutesWritten:
    """What `Routing.write` wrote: the deleted keys file each destination stored (cdc with sequenceBy), by
    its target; the records that do not fit their own route's schema (dead letters); the data files the
    driver wrote for each route table whose rows it collected (none: it kept no row), by its target."""

    deleted_keys: dict[str, str]
    bad: int
    files: dict[str, WrittenFiles] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteStage:
    """A route table's part of one batch: its staging branch and what it takes."""

    index: int
    label: str
    table: Table
    stage: Stage
    takes: Mapping[str, Take]  # by topic: the topics it takes part of (one in the one-topic form)
    target: str  # the Spark name of its staging branch
    sorted_table: bool
    loaded: bool = False  # staged on the metadata this writer's last commit to it left (`commit_files`)

    @property
    def destination(self) -> Destination:
        return Destination(self.target, self.sorted_table, self.table, self.stage.base.deleted_keys)


class Routing:
    """One writer's route tables (made ready by `Ingestor.start`), staged, written and committed per batch."""

    def __init__(self, st: StreamingTable, spark_name: Callable[[tuple[str, ...], str], str]) -> None:
        """`spark_name`: the Spark name of a table's staging branch (`BatchWriter.spark_name`)."""
        self.spec = st.spec
        self.tables: list[Table] = []  # in the order of spec.routes, set by `Ingestor.start`
        self.labels = [".".join(identifier) for identifier in st.route_identifiers]
        self.identifiers = list(st.route_identifiers)
        self.sorted = [bool(route.table.sort_order) for route in st.spec.routes]
        self.conditions = [route.when for route in st.spec.routes]
        self.dynamic = st.spec.dynamic_route
        from_header = self.dynamic is not None and self.dynamic.from_ is NameFrom.HEADER
        dynamic_when = [self.dynamic.when] if self.dynamic is not None and self.dynamic.when else []
        self.headers = reads_headers([*self.conditions, *dynamic_when], dynamic_from_header=from_header)
        self.unrouted = st.spec.unrouted_to
        self.keyed = st.spec.key is not None  # every destination MERGEs its changes (`write_to`)
        self.key = list(st.spec.key or [])
        self.max_collect_bytes = st.spec.batch.max_collect_bytes
        self.own = OwnDecoders(st)  # the routes with their own schema, key or sequenceBy
        self.spark_name = spark_name
        self.dynamic_namespace = st.dynamic_namespace
        self.reserved = st.dynamic_reserved
        # name -> index in `tables` of each dynamic table (`found`, `_create_new`).
        self.dynamic_index: dict[str, int] = {}
        # Makes a dynamic table ready (created or loaded, this writer's epoch claimed); None: the name is a
        # table the route did not create. Set by `Ingestor.start`.
        self.create: Callable[[str], Table | None] | None = None
        # The batch being written (`stage`): its branch and planned part, the stages of the tables its
        # write created, its refused names with their reasons and how many records they hold.
        self._batch: tuple[str, PlannedBatch] | None = None
        self.created: list[RouteStage] = []
        self.staged: list[RouteStage] = []  # the route tables `stage` staged for the batch being written
        # The tables (indexes) whose loaded metadata is what this writer's last commit to them left
        # (`commit`): staged without loading it again (`_stage_one`).
        self.current: set[int] = set()
        self.refused: dict[str, str] = {}
        self.refused_records = 0

    def found(self, tables: list[tuple[str, Table]]) -> None:
        """Add the dynamic tables that exist (`icefall.catalog.tables.dynamic_route_tables`)."""
        for name, table in tables:
            self._add(name, table)

    def _add(self, name: str, table: Table) -> int:
        assert self.dynamic is not None
        identifier = (*self.dynamic_namespace, name)
        self.dynamic_index[name] = len(self.tables)
        self.tables.append(table)
        self.identifiers.append(identifier)
        self.labels.append(".".join(identifier))
        self.sorted.append(bool(self.dynamic.table.sort_order))
        return self.dynamic_index[name]

    # -- Spark -----------------------------------------------------------------------------------------

    def routed(self, decoded: DataFrame, conditions: list[str] | None = None) -> DataFrame:
        """`decoded` (a `decode` result) with `ROUTE_COLUMN`: the index of the first route whose condition
        (of `conditions`, default the spec's) holds for a good record; null for a record no route takes and
        for a bad record. A record a route with its own schema takes is that route's, not bad here, whatever
        spec's decode made of it (`OwnDecoders` judges it)."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        context = decoded.select(
            F.struct(*(F.col(c) for c in decoded.columns)).alias(RECORD),
            *(value_field(name, self.key).alias(name) for name in value_fields(decoded)),
            kafka_context(decoded, self.spec.source.first_topic).alias("_kafka"),
        )
        conditions = self.conditions if conditions is None else conditions
        route = F.lit(None).cast("int")
        if conditions:
            first, *rest = conditions
            route = F.when(F.expr(first), F.lit(0))
            for i, condition in enumerate(rest, start=1):
                route = route.when(F.expr(condition), F.lit(i))
        if self.keyed:  # a delete no condition takes deletes its key wherever it is
            route = F.when(F.col(RECORD)[DELETE_COLUMN] & route.isNull(), F.lit(EVERY)).otherwise(route)
        good = ~F.col(RECORD)[BAD_COLUMN]
        columns: list[Column | str] = [f"{RECORD}.*", F.when(good, route).alias(ROUTE_COLUMN)]
        if self.own:  # a record an own route takes is judged by its route's schema, not by spec's
            own = F.coalesce(route.isin(list(self.own.specs)), F.lit(False))
            columns = [*judged(decoded.columns, own), F.when(good | own, route).alias(ROUTE_COLUMN)]
        if self.dynamic is not None:
            name = F.when(good & route.isNull(), dynamic_name(self.dynamic))
            columns.append(name.alias(NAME_COLUMN))
        return context.select(*columns)

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
        if self.dynamic is not None:
            try:
                _ = self.routed(decoded, []).schema
            except Exception as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ValueError(f"spec.dynamicRoute: Spark cannot compute the table name: {first}") from None

    def observed(self) -> list[Column]:
        """The observed aggregate of the records no route takes (good records only)."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        return [F.count_if(~F.col(BAD_COLUMN) & self._unrouted(F.col(ROUTE_COLUMN))).alias("unrouted")]

    def _unrouted(self, route: Column) -> Column:
        """Whether a good record with route index `route` goes where spec.unrouted says: no static route and
        no computed name."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        return route.isNull() & (F.col(NAME_COLUMN).isNull() if self.dynamic is not None else F.lit(True))

    def letters(self, unrouted: int) -> int:
        """The batch's good records that are dead letters: the unrouted ones (`unrouted: DeadLetter`; their
        observed count) and those of refused dynamic names."""
        return (unrouted if self.unrouted is Unrouted.DEAD_LETTER else 0) + self.refused_records

    def write(
        self,
        routed: DataFrame,
        stages: list[RouteStage],
        rows_of: RowsOf,
        write_to: WriteTo,
        main: Destination,
        *,
        read: Callable[[], tuple[int, int]],
    ) -> RoutesWritten:
        """Write each destination's rows of the batch (`routed`, computed once and cached) to its staging
        branch (`write_to`: an append, or a keyed table's MERGE): `spec.table`'s (`main`) gets the unrouted
        records (with `unrouted: DeadLetter` nothing is written to it), each route the records it takes
        past its own offsets; a keyed table's delete no condition takes goes to each (`EVERY`). `read`: the
        batch's records and value bytes (its observation, known once a job over `routed` ran), which decide
        whether the driver collects the route rows (`driver_collects`). An own route's rows are decoded with
        its schema (`OwnDecoders`). Returns the deleted keys file each destination stored (cdc with
        sequenceBy), by its target, and how many records do not fit their own route's schema."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        cached = routed.persist(StorageLevel.MEMORY_AND_DISK)
        route = F.col(ROUTE_COLUMN)
        stored: dict[str, str] = {}

        def write(rows: DataFrame, to: Destination) -> None:
            path = write_to(rows, to)
            if path is not None:
                stored[to.target] = path

        try:
            if self.dynamic is not None:
                # The batch and its observation computed once, by a count: the names' groupBy as the first
                # job loses an observation that holds arrays (a registry format's schema ids).
                cached.count()
                route = self._resolve(cached)
                stages = [*stages, *self.created]
            if self.unrouted is Unrouted.TABLE:
                write(rows_of(cached.where(self._unrouted(route) | self._every(route))), main)
            elif self.dynamic is None:
                # No rows for the table: its commit stages an empty snapshot (`Batches._commit_here`). Not an
                # append of `where(false)`: Spark prunes that query, and the batch's observation breaks.
                cached.count()  # computes the batch once, its observation with it, for the routes to share
            by_topic = "topic" in cached.columns
            driver = self._collected(stages, read)
            for rs in stages:
                if rs not in driver:
                    keep = ((route == rs.index) | self._every(route)) & taken_filter(
                        rs.takes, by_topic=by_topic
                    )
                    if rs.index in self.own:
                        rows = self.own.rows(rs.index, cached.where(keep), rs.table.schema())
                        write(rows, replace(rs.destination, spec=self.own.specs[rs.index]))
                    else:
                        write(rows_of(cached.where(keep)), rs.destination)
            files = self._write_collected(cached, route, driver, rows_of) if driver else {}
            bad = self.own.bad(cached, route) if self.own else 0  # every record it takes, as dead letters
        finally:
            cached.unpersist()
        return RoutesWritten(stored, bad, files)

    def _every(self, route: Column) -> Column:
        """Whether a record goes to every destination: a keyed table's delete no condition takes."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        return F.coalesce(route == EVERY, F.lit(False)) if self.keyed else F.lit(False)

    def _collected(self, stages: list[RouteStage], read: Callable[[], tuple[int, int]]) -> list[RouteStage]:
        """The stages whose rows the driver collects and writes (`_write_collected`): those pyiceberg
        writes as Spark would, when the batch is small enough to hold in the driver (`driver_collects`);
        none otherwise (each is then appended by Spark)."""
        # A keyed table's changes are MERGEd by Spark: pyiceberg writes no position deletes. An own route's
        # rows have columns of their own: appended by Spark.
        driver = [rs for rs in stages if rs.index not in self.own and arrow_writable(rs.table)]
        driver = [] if self.keyed else driver
        if not driver:
            return []
        records, value_bytes = read()
        if driver_collects(records, value_bytes, self.max_collect_bytes):
            return driver
        log.info(
            "batch of %d records (%d value bytes) past spec.batch.maxCollectBytes (%d): %d route tables "
            "appended by Spark",
            records,
            value_bytes,
            self.max_collect_bytes,
            len(driver),
        )
        return []

    def _write_collected(
        self, cached: DataFrame, route: Column, stages: list[RouteStage], rows_of: RowsOf
    ) -> dict[str, WrittenFiles]:
        """Collect the rows of every stage of `stages` in ONE Spark job (one projection of the cached batch,
        each row tagged with the index of the stage it goes to) and write each table's as data files from
        the driver (`arrow_append`): no Spark job, no plan and no catalog commit per route table here. The
        files by each stage's target (none for a table that keeps no row); `commit` lands them."""
        import pyarrow.compute as pc

        by_topic = "topic" in cached.columns
        groups = same_takes((rs.index, rs.takes) for rs in stages)  # one condition per distinct take
        taken = [route.isin(indexes) & taken_filter(takes, by_topic=by_topic) for takes, indexes in groups]
        tagged = cached.where(functools.reduce(lambda a, b: a | b, taken)).withColumn(_DESTINATION, route)
        collected = rows_of(tagged, carry=[_DESTINATION]).toArrow()
        tags, rows = collected[_DESTINATION], collected.drop_columns([_DESTINATION])
        return {rs.target: write_rows(rs.table, rows.filter(pc.equal(tags, rs.index))) for rs in stages}

    def _resolve(self, cached: DataFrame) -> Column:
        """Count the batch's computed names, create and stage the new tables, remember the refused names;
        the route index of each record with the dynamic tables' indexes filled in."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        assert self.dynamic is not None
        name = F.col(NAME_COLUMN)
        counts = {
            row[0]: int(row[1]) for row in cached.where(name.isNotNull()).groupBy(name).count().collect()
        }
        names = dynamic_names(counts, self.dynamic_index, self.reserved, max_tables=self.dynamic.max_tables)
        refused = dict(names.refused)
        for new in names.new:
            if not self._create_new(new):
                refused[new] = not_created_reason(new)
        self.refused = refused
        self.refused_records = sum(counts[n] for n in refused)
        for n, why in refused.items():
            log.warning("%d records are dead letters: %s", counts[n], why)
        route = F.col(ROUTE_COLUMN)
        index = F.lit(None).cast("int")
        for n, i in self.dynamic_index.items():
            index = F.when(name == F.lit(n), F.lit(i)).otherwise(index)
        return F.coalesce(route, index)

    def _create_new(self, name: str) -> bool:
        """Create (or load) dynamic table `name` and stage it for the batch being written; False when it is
        a table the route did not create."""
        assert self.create is not None and self._batch is not None, "Ingestor.start sets create; stage"
        table = self.create(name)
        if table is None:
            return False
        index = self._add(name, table)
        branch, planned = self._batch
        staged = self._stage_one(index, branch, planned)
        if staged is not None:
            self.created.append(staged)
        return True

    def dead_letters(self, decoded: DataFrame) -> DataFrame:
        """`decoded` (with error text) with the records no route takes marked bad, for `unrouted:
        DeadLetter`: their reason is `UNROUTED_REASON`; those an own route takes not bad (`own_dead_letters`
        judges them)."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        if self.unrouted is not Unrouted.DEAD_LETTER and not self.refused and not self.own:
            return decoded
        unrouted = self._unrouted(F.col(ROUTE_COLUMN))
        if self.unrouted is not Unrouted.DEAD_LETTER:
            unrouted = F.lit(False)
        reason = F.when(unrouted, F.lit(UNROUTED_REASON))
        if self.refused:
            pairs = [F.lit(x) for name, why in sorted(self.refused.items()) for x in (name, why)]
            refused = F.element_at(F.create_map(*pairs), F.col(NAME_COLUMN))
            reason = F.coalesce(reason, F.when(F.col(ROUTE_COLUMN).isNull(), refused))
        return self.routed(decoded).select(
            *(c for c in decoded.columns if c not in (BAD_COLUMN, ERROR_COLUMN)),
            (F.col(BAD_COLUMN) | reason.isNotNull()).alias(BAD_COLUMN),
            F.coalesce(F.col(ERROR_COLUMN), reason).alias(ERROR_COLUMN),
        )

    def own_dead_letters(self, decoded: DataFrame, *, by_topic: bool) -> DataFrame:
        """The dead-letter rows of the records of `decoded` that do not fit the schema of the own route
        that takes them (`OwnDecoders.bad_rows`): routed, checkpointed (a job: the dead-letter path is
        rare, its plan must stay small), then decoded again by their routes."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        taken = self.own.taken(self.routed(decoded), F.col(ROUTE_COLUMN)).localCheckpoint()
        return self.own.bad_rows(taken, F.col(ROUTE), by_topic=by_topic)

    # -- commits ---------------------------------------------------------------------------------------

    def stage(self, branch: str, planned: PlannedBatch) -> list[RouteStage]:
        """Each route table's stage of `planned` (planned from `spec.table`): its branch at its head and
        what it takes; route tables that hold the whole batch already are left out."""
        self._batch, self.created, self.refused, self.refused_records = (branch, planned), [], {}, 0
        stages = []
        for i in range(len(self.tables)):
            staged = self._stage_one(i, branch, planned)
            if staged is not None:
                stages.append(staged)
        self.staged = stages
        return stages

    def _stage_one(self, i: int, branch: str, planned: PlannedBatch) -> RouteStage | None:
        table = self.tables[i]
        ranges = [TopicRange(part.topic, part.start, part.end, part.gaps) for part in planned.parts]
        # A table this writer committed to last is staged on the metadata that commit left, no load, when
        # it takes the whole batch as planned: a change since (maintenance, another writer, a reset) moved
        # `main`, and its commit is then refused by the catalog and checked on fresh metadata
        # (`commit_files(loaded=True)`). Any other take (ahead, behind, nothing) is decided on fresh metadata.
        loaded, self.current = i in self.current, self.current - {i}
        stage = prepare_stage(table, branch, role="route", refresh=not loaded)
        held = {part.topic: held_of(stage.base, part.topic).offsets for part in planned.parts}
        if loaded and not whole_batch(ranges, held):
            loaded = False
            stage = prepare_stage(table, branch, role="route")
            held = {part.topic: held_of(stage.base, part.topic).offsets for part in planned.parts}
        takes = destination_takes(ranges, held, name=self.labels[i], by_topic=planned.by_topic)
        if not takes:
            log.warning(
                "%s: holds the whole batch already (a crash between commits); skipped", self.labels[i]
            )
            return None
        ahead = {topic: take.start for topic, take in takes.items() if take.skip_below}
        if ahead:
            log.warning(
                "%s: ahead of the table (a crash between commits); takes from %s", self.labels[i], ahead
            )
        target = self.spark_name(self.identifiers[i], branch)
        return RouteStage(i, self.labels[i], table, stage, takes, target, self.sorted[i], loaded=loaded)

    @contextlib.contextmanager
    def dropped_unless_committed(self, stages: list[RouteStage]) -> Iterator[None]:
        """Drop the route tables' staging branches if the block raises (a landed commit left its branch at
        its table's head: dropping that one costs nothing)."""
        with contextlib.ExitStack() as stack:
            for rs in stages:
                stack.enter_context(dropped_unless_committed(rs.table, rs.stage.branch, rs.label, "route"))
            try:
                yield
            except BaseException as error:
                entered = {rs.label for rs in stages}
                # Staged by this batch's write (created), or by its write again (a REWRITE stages every
                # route table again): dropped the same way.
                later = [rs for rs in [*self.staged, *self.created] if rs.label not in entered]
                for rs in later:
                    try:
                        with dropped_unless_committed(rs.table, rs.stage.branch, rs.label, "route"):
                            raise error
                    except BaseException as again:
                        if again is not error:
                            raise
                raise

    def commit(
        self,
        stages: list[RouteStage],
        batch: SourceBatch,
        epoch: int,
        check_lease: Callable[[], None],
        *,
        deleted_keys: Mapping[str, str] | None = None,
        files: Mapping[str, WrittenFiles] | None = None,
    ) -> int:
        """Commit each route table's part of `batch`, in order, before the dead letters and the table; the
        rows they added. `deleted_keys`: the deleted keys file each route table's MERGE stored (cdc with
        sequenceBy; `write`'s result), named by its commit. `files`: the data files the driver wrote for a
        route table (`write`'s result), landed with its offsets in one catalog commit (`commit_files`);
        the others land what Spark appended to their branch (`commit_staged_outcome`)."""
        added = 0
        for rs in [*stages, *self.created]:
            part = destination_batch(batch, rs.takes, (deleted_keys or {}).get(rs.target))
            written = (files or {}).get(rs.target)
            if written is None:
                stage_empty(rs.table, rs.stage.branch, rs.stage.base.snapshot_id)  # a batch that read nothing
            check_lease()
            if written is None:
                outcome = commit_staged_outcome(rs.table, rs.stage, part, epoch)
            else:
                outcome = commit_files(rs.table, rs.stage, part, epoch, written, loaded=rs.loaded)
            count_restage(rs.label, outcome)
            self.current.add(rs.index)  # the table holds the metadata of this commit
            added += added_records(rs.table, outcome.snapshot_id)
        return added

    def sweep(self) -> None:
        """Drop the staging branches crashed writers (or an outage) left in the route tables."""
        for table in self.tables:
            sweep_stages(table, role="route")


def whole_batch(ranges: Sequence[TopicRange], held: Mapping[str, Mapping[int, int]]) -> bool:
    """Whether a destination holding `held` (offsets by topic) takes every range of the batch as planned:
    each partition it committed stands exactly where the batch was planned from (its retention gap, else
    its start). Anything else (ahead, behind, past the end) is what a stale view could get wrong."""
    for r in ranges:
        own = held.get(r.topic, {})
        if any(p in own and own[p] != r.gaps.get(p, start) for p, start in r.start.items()):
            return False
    return True


def destination_batch(
    batch: SourceBatch, takes: Mapping[str, Take], deleted_keys: str | None = None
) -> SourceBatch:
    """What one destination commits of `batch` (the table's): the part of each topic it takes (`takes`),
    in the batch's form (a `TopicsBatch` in the topics form, whatever the number of topics it takes);
    `deleted_keys`: the deleted keys file it names (None: its own, kept)."""
    parts = tuple(
        Batch(
            topic=part.topic,
            start=take.start,
            end=take.end,
            max_produce_time_ms=part.max_produce_time_ms,
            retention_gaps=take.gaps,
            topic_id=part.topic_id,
        )
        for part in batch.parts
        if (take := takes.get(part.topic)) is not None
    )
    if isinstance(batch, TopicsBatch):
        return TopicsBatch(parts, deleted_keys=deleted_keys)
    (one,) = parts
    return replace(one, deleted_keys=deleted_keys)


def taken_filter(takes: Mapping[str, Take], *, by_topic: bool) -> Column:
    """Whether a record (columns `partition`, `offset`, and `topic` in the topics form: a batch's rows or
    its dead letters) is in the part of the batch a destination takes (`takes`, by topic): its topic and
    partition taken, its offset past what the destination holds."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    kept = F.lit(False)
    for topic, take in takes.items():
        keep = F.col("partition").isin(list(take.start))
        for p, below in take.skip_below.items():
            keep = keep & ((F.col("partition") != p) | (F.col("offset") >= below))
        kept = kept | ((F.col("topic") == F.lit(topic)) & keep if by_topic else keep)
    return kept
