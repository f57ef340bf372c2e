"""The audit of a routed table (`spec.routes`, `spec.dynamicRoute`): every committed record in exactly one
destination.

A routed StreamingTable writes one topic into several tables: each record goes to the first route whose
condition holds, else to `spec.table` (`unrouted: Table`) or to the dead-letter table with
`UNROUTED_REASON` (`unrouted: DeadLetter`); malformed records go to the dead-letter table. Each destination
commits the offsets of the range it took, so after a crash between their commits they stand at different
offsets: each is audited up to its own committed offsets (`icefall.audit.table.audit_table`), `spec.table`
together with the dead-letter table (cut at `spec.table`'s offsets, as for any table).

By content: the records are decoded once for all destinations (`SparkContent.decoded`) and routed by the
writer's own code (`icefall.ingest.routes.Routing`: `dead_letters`, then `routed`), so a condition is
evaluated exactly as ingestion evaluates it. Each destination then sees its own records as they should
be (GOOD, FILTERED by `spec.transforms.filter`, DEAD_LETTER for `spec.table`'s dead-letter table) and every
other record as ELSEWHERE: a row of such a record is reported as in the wrong table (`wrong_table`), and its
absence is not missing. A dead letter's digest also covers whether its error is `UNROUTED_REASON`, so an
unrouted record must be a dead letter with that reason, and a malformed one without it.

A dynamic route (`spec.dynamicRoute`): its tables are found in the catalog by their owner property, each a
destination after the routes', audited from the offsets it starts at (the batch that created it) up to its
own committed ones. `Routing.routed` computes each record's name, and `icefall.audit.dynamic` gives each
name its fate: a created table from its start offsets on, else a dead letter whose digest covers the
writer's exact reason (`reason_prefix`). A created table none of whose audited records goes to it is
reported (`RoutedAuditReport.problems`); one never committed is noted.

Several topics (`spec.source.topics`, `topicPattern`): each destination is audited per topic, up to its
own offsets of that topic, over the topics `spec.table` or it holds (`icefall.audit.table.of_topics`). A
dynamic route's names get their fates per topic, from each created table's start offsets of that topic
(a table starts each topic at the first batch of it that it took).

Routes with their own schema (`icefall.decode.route_decoding`): their records are decoded again with it, as
their writer does, from a local checkpoint of the routed records; one that does not fit it must be a dead
letter. Its rows are digested as its schema decodes them: a field removed from it since they were written
makes them differ (audit with the spec the tables were filled with).

Keyed routes (`spec.mode` upsert, cdc) are audited by key instead (`icefall.audit.keyed_routes`), with the
same routing (`writer_routing`) and each destination up to its own offsets.

Not guaranteed: the records are decoded with the columns of the first table audited (`spec.table`'s
schema changes); a route added, removed or changed since its rows were written makes them wrong-table or
missing: audit with the spec the tables were filled with.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from icefall.audit.dynamic import (
    DYNAMIC_DEST_COLUMN,
    DynamicTable,
    cap_full_from,
    found_tables,
    name_fates,
    resolve,
)
from icefall.audit.kafka import KafkaTopic
from icefall.audit.keyed import KeyedAuditReport
from icefall.audit.report import AuditReport
from icefall.audit.rows import DEAD_LETTER, ELSEWHERE, EXPECTED_SCHEMA, FILTERED, GOOD
from icefall.audit.table import audit_table, dlq_identifier, of_topics
from icefall.commit import read_committed

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

    from icefall.api import StreamingTable, StreamingTableSpec
    from icefall.audit.content import SparkContent
    from icefall.commit.state import CommittedState
    from icefall.ingest.routes import Routing

#: Where re-decoding sends a record (`RoutedContent.records`' `dest`): a route's index, or one of these.
DEFAULT, DEAD = -1, -2
#: `RoutedContent.records`: each record's destination, kind and digest (null unless GOOD or DEAD_LETTER).
RECORDS_SCHEMA = pa.schema(
    [
        ("partition", pa.int64()),
        ("offset", pa.int64()),
        ("dest", pa.int32()),
        ("kind", pa.int8()),
        ("digest", pa.int64()),
    ]
)


#: A destination's report: by content (`AuditReport`), or by key (`KeyedAuditReport`: keyed routes).
Report = TypeVar("Report", AuditReport, KeyedAuditReport)


@dataclass(frozen=True)
class DestinationAudit(Generic[Report]):
    """One destination's audit: `spec.table` (with the dead-letter table) or `routes[i]`."""

    destination: str
    report: Report


@dataclass(frozen=True)
class RoutedAuditReport(Generic[Report]):
    """The audits of every destination of a routed table, `spec.table` first; `problems`: tables of the
    dynamic route its records do not explain; `notes`: those that could not be told."""

    destinations: tuple[DestinationAudit[Report], ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(d.report.ok for d in self.destinations) and not self.problems

    def destination(self, name: str) -> Report:
        """The report of `spec.table`, `routes[i]` or a table's name (`namespace.name`)."""
        for d in self.destinations:
            if name in (d.destination, d.report.table):
                return d.report
        raise KeyError(name)

    def render(self) -> str:
        """One report per destination, then one line for them all."""
        parts = [f"[{d.destination}] {d.report.render()}" for d in self.destinations]
        parts += [f"[dynamicRoute] {line}" for line in (*self.problems, *self.notes)]
        failed = [d.destination for d in self.destinations if not d.report.ok]
        failed += ["dynamicRoute"] if self.problems else []
        verdict = "FAILED: " + ", ".join(failed) if failed else "OK"
        parts.append(f"routed table, {len(self.destinations)} destinations: {verdict}")
        return "\n\n".join(parts)


def destination_view(records: pa.Table, destination: int) -> pa.Table:
    """`EXPECTED_SCHEMA` of `records` (`RECORDS_SCHEMA`) as `destination` (a route's index, or DEFAULT:
    `spec.table` with the dead-letter table) must hold them: the records of other destinations ELSEWHERE."""
    dest = records.column("dest")
    own = pc.equal(dest, destination)
    if destination == DEFAULT:
        own = pc.or_(own, pc.equal(dest, DEAD))
    kind = pc.if_else(own, records.column("kind"), pa.scalar(ELSEWHERE, pa.int8()))
    digest = pc.if_else(own, records.column("digest"), pa.scalar(None, pa.int64()))
    columns = [records.column("partition"), records.column("offset"), kind, digest]
    return pa.Table.from_arrays(columns, schema=EXPECTED_SCHEMA)


def within(records: pa.Table, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
    """The records of `ranges` (`[start, end)` per partition)."""
    keep = pa.array([False] * records.num_rows, pa.bool_())
    partition, offset = records.column("partition"), records.column("offset")
    for p, (start, end) in ranges.items():
        inside = pc.and_(pc.greater_equal(offset, start), pc.less(offset, end))
        keep = pc.or_(keep, pc.and_(pc.equal(partition, p), inside))
    return records.filter(keep)


def covering(
    held: Mapping[int, tuple[int, int]] | None, wanted: Mapping[int, tuple[int, int]]
) -> dict[int, tuple[int, int]] | None:
    """The ranges to decode for `wanted` when `held` are decoded: None if `held` covers them, else the
    smallest ranges covering both."""
    held = held or {}
    if all(p in held and held[p][0] <= s and e <= held[p][1] for p, (s, e) in wanted.items()):
        return None
    union = dict(held)
    for p, (s, e) in wanted.items():
        union[p] = (min(s, union[p][0]), max(e, union[p][1])) if p in union else (s, e)
    return union


class RoutedContent:
    """The records of a routed table's topic, decoded and routed once for every destination (`view`)."""

    def __init__(
        self,
        content: SparkContent,
        st: StreamingTable,
        dynamic: Sequence[DynamicTable] = (),
        unowned: Collection[str] = (),
    ) -> None:
        """`dynamic`: the tables the dynamic route created (destinations after the routes'); `unowned`: the
        names of the other tables of its namespace (`icefall.audit.dynamic.found_tables`)."""
        self.content = content
        self.routing = writer_routing(st)
        self.st = st
        self.dynamic = tuple(dynamic)
        self.unowned = frozenset(unowned)
        # By topic: the ranges decoded and their records (a table of several topics decodes each apart).
        self._decoded: dict[str, tuple[dict[int, tuple[int, int]], pa.Table]] = {}

    def view(self, destination: int) -> _View:
        """The `ContentSource` of one destination (a route's index, or DEFAULT)."""
        return _View(self, destination)

    def records(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
        """`RECORDS_SCHEMA` of the records of `ranges`, decoded again only when they are not yet."""
        held = self._decoded.get(topic)
        union = covering(held[0] if held else None, ranges)
        if union is not None or held is None:
            union = union if union is not None else dict(ranges)
            held = self._decoded[topic] = (union, self._decode(topic, union))
        return within(held[1], ranges)

    def taken(self, destination: int, ranges: Mapping[int, tuple[int, int]], topic: str | None = None) -> int:
        """How many records of `ranges` (decoded already; of `topic`, or of the one topic) go to
        `destination`."""
        if topic is not None:
            held = self._decoded.get(topic)
        else:
            held = next(iter(self._decoded.values())) if len(self._decoded) == 1 else None
        if held is None or not ranges:
            return 0
        dest = within(held[1], ranges).column("dest")
        return int(pc.sum(pc.equal(dest, destination)).as_py() or 0)

    def _decode(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        from icefall.decode.columns import BAD_COLUMN
        from icefall.decode.decode import bad_rows, good_rows
        from icefall.ingest.routes import ROUTE_COLUMN

        decoded, spec = self.content.decoded(topic, ranges)
        try:
            # As the writer: unrouted records marked dead letters first (`unrouted: DeadLetter`), then routed.
            routed = self.routing.routed(self.routing.dead_letters(decoded))
            chosen = [F.col(ROUTE_COLUMN)]
            if self.routing.dynamic is not None:  # each computed name's fate: a created table, or refused
                routed = self._dynamic(routed, topic)
                chosen.append(F.col(DYNAMIC_DEST_COLUMN))
            dest = F.when(F.col(BAD_COLUMN), F.lit(DEAD)).otherwise(F.coalesce(*chosen, F.lit(DEFAULT)))
            where = routed.select(
                F.col("partition").cast("long").alias("partition"),
                F.col("offset").cast("long").alias("offset"),
                dest.cast("int").alias("dest"),
            )
            bad = bad_rows(routed)
            if self.routing.own:  # each own route's records decoded with its schema
                where, bad, good = self._own(routed, where, bad, spec)
            else:
                good = self.content.good_digests(good_rows(routed, spec))
            digests = good.unionByName(
                bad.select(
                    F.col("partition").cast("long").alias("partition"),
                    F.col("offset").cast("long").alias("offset"),
                    self.content.dead_letter_digest(bad).alias("digest"),
                )
            )
            joined = where.join(digests, ["partition", "offset"], "left")
            kind = (
                F.when(F.col("dest") == F.lit(DEAD), F.lit(DEAD_LETTER))
                .when(F.col("digest").isNull(), F.lit(FILTERED))
                .otherwise(F.lit(GOOD))
            )
            frame = joined.select("partition", "offset", "dest", kind.cast("byte").alias("kind"), "digest")
            return frame.toArrow().cast(RECORDS_SCHEMA)
        finally:
            decoded.unpersist()

    def _own(
        self, routed: DataFrame, where: DataFrame, bad: DataFrame, spec: StreamingTableSpec
    ) -> tuple[DataFrame, DataFrame, DataFrame]:
        """`where`, the dead-letter rows and the good rows' digests with the routes that have their own
        schema (`icefall.decode.route_decoding`): their records decoded with it, as their writer does; those
        that do not fit it dead letters."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        from icefall.audit.content import main_digest
        from icefall.decode.columns import KAFKA_COLUMN
        from icefall.decode.decode import good_rows
        from icefall.decode.route_decoding import ROUTE
        from icefall.ingest.routes import ROUTE_COLUMN

        own, route = self.routing.own, F.col(ROUTE_COLUMN)
        others = routed.where(~F.coalesce(route.isin(list(own.specs)), F.lit(False)))
        frames = [self.content.good_digests(good_rows(others, spec))]
        taken = own.taken(routed, route).localCheckpoint()  # (a decode stacked on it must not be)
        bad = bad.unionByName(own.bad_rows(taken, F.col(ROUTE), by_topic=False))
        for i in own.specs:
            rows = own.rows(i, taken.where(F.col(ROUTE) == i), None)
            frames.append(
                rows.select(
                    F.col(f"{KAFKA_COLUMN}.partition").cast("long").alias("partition"),
                    F.col(f"{KAFKA_COLUMN}.offset").cast("long").alias("offset"),
                    main_digest(rows).alias("digest"),
                )
            )
        return _own_dead(where, bad), bad, functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _dynamic(self, routed: DataFrame, topic: str) -> DataFrame:
        """`routed` (records of `topic`) with the fate of each name its records compute
        (`icefall.audit.dynamic.resolve`)."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        from icefall.ingest.routes import NAME_COLUMN

        route = self.routing.dynamic
        assert route is not None
        computed = routed.where(F.col(NAME_COLUMN).isNotNull()).select(NAME_COLUMN).distinct().collect()
        tables = [t.of_topic(topic) for t in self.dynamic] if self.st.spec.source.by_topic else self.dynamic
        fates = name_fates(
            (row[0] for row in computed),
            tables,
            self.unowned,
            self.st.dynamic_reserved,
            max_tables=route.max_tables,
        )
        spark = self.content.spark
        return resolve(spark, routed, fates, cap_full_from(tables, route.max_tables))


def _own_dead(where: DataFrame, bad: DataFrame) -> DataFrame:
    """`where` (`partition`, `offset`, `dest`) with the records of `bad` (dead-letter rows) sent to DEAD:
    those that do not fit their own route's schema."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    dead = bad.select(
        F.col("partition").cast("long").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.lit(True).alias("__icefall_dead"),
    )
    joined = where.join(dead, ["partition", "offset"], "left")
    dest = F.when(F.col("__icefall_dead").isNotNull(), F.lit(DEAD)).otherwise(F.col("dest"))
    return joined.select("partition", "offset", dest.cast("int").alias("dest"))


class _View:
    """`ContentSource` of one destination of a routed table."""

    def __init__(self, routed: RoutedContent, destination: int) -> None:
        self.routed = routed
        self.destination = destination

    def main_rows(self, table: Table, snapshot_id: int, *, topic: str | None = None) -> pa.Table:
        return self.routed.content.main_rows(table, snapshot_id, topic=topic)

    def dead_letter_rows(self, table: Table, snapshot_id: int, *, topic: str | None = None) -> pa.Table:
        return self.routed.content.dead_letter_rows(table, snapshot_id, topic=topic)

    def expected(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> pa.Table:
        return destination_view(self.routed.records(topic, ranges), self.destination)


def audit_routed(
    catalog: Catalog,
    st: StreamingTable,
    content: SparkContent,
    *,
    kafka_config: Mapping[str, Any] | None = None,
    ingesting: bool = False,
) -> RoutedAuditReport[AuditReport]:
    """Audit every destination of the routed `st` by content (`content`: a `SparkContent` of its spec made
    with `reason=UNROUTED_REASON`, and `reason_prefix=DYNAMIC_REASON_PREFIX` for a dynamic route), each
    against the topic up to its own committed offsets: `spec.table`, each route's table, each table the
    dynamic route created (`icefall.audit.dynamic`)."""
    main = catalog.load_table(st.table_identifier)
    committed = read_committed(main)
    # The topics form: each destination audited per topic, over the topics the table or it holds.
    topics = list(committed.topics or ()) if st.spec.source.by_topic else None
    topic = committed.topic or st.spec.source.first_topic
    dlq = _dead_letter_table(catalog, st)
    owned, unowned = found_tables(catalog, st) if st.spec.dynamic_route is not None else ([], set())
    first = len(st.route_identifiers)
    dynamic = [
        _dynamic_table(name, first + k, read_committed(table)) for k, (name, table) in enumerate(owned)
    ]
    routed = RoutedContent(content, st, dynamic, unowned)
    options: dict[str, Any] = {"filter_configured": bool(st.spec.transforms.filter), "ingesting": ingesting}
    audits: list[DestinationAudit[AuditReport]] = []
    with contextlib.ExitStack() as stack:
        one = None
        if topics is None:  # the one topic, for every destination
            one = stack.enter_context(
                KafkaTopic(st.spec.source.bootstrap_servers, topic, config=kafka_config)
            )

        def audit_one(table: Table, dlq: Table | None, destination: int) -> AuditReport:
            view = routed.view(destination)
            if one is not None:
                return audit_table(table, dlq, one, content=view, **options)
            assert topics is not None
            return _audit_topics(
                table, dlq, view, topics=topics, st=st, kafka_config=kafka_config, options=options
            )

        # spec.table first: its columns are those the records decode into (`SparkContent.main_rows`).
        audits.append(DestinationAudit("spec.table", audit_one(main, dlq, DEFAULT)))
        for i, identifier in enumerate(st.route_identifiers):
            table = catalog.load_table(identifier)  # never committed: no range, any row unexpected
            audits.append(DestinationAudit(f"routes[{i}]", audit_one(table, None, i)))
        for made, (name, table) in zip(dynamic, owned, strict=True):
            audits.append(DestinationAudit(f"dynamicRoute:{name}", audit_one(table, None, made.index)))
    problems, notes = unexplained(routed.taken, audits[first + 1 :], dynamic)
    return RoutedAuditReport(tuple(audits), problems, notes)


def _audit_topics(
    table: Table,
    dlq: Table | None,
    view: _View,
    *,
    topics: list[str],
    st: StreamingTable,
    kafka_config: Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> AuditReport:
    """One destination of a table of several topics: each topic it or the table holds, audited up to its
    own offsets of that topic (one it never committed: any row of it unexpected)."""
    state = read_committed(table)
    reports = {}
    for name in dict.fromkeys([*topics, *(state.topics or ())]):
        with KafkaTopic(st.spec.source.bootstrap_servers, name, config=kafka_config) as source:
            reports[name] = audit_table(table, dlq, source, content=view, of_topic=name, **options)
    if not reports:  # nothing committed anywhere yet: no range, any row unexpected
        return audit_table(table, dlq, {}, content=view, **options)
    return of_topics(reports, state.lost_records)


def _dynamic_table(name: str, index: int, state: CommittedState) -> DynamicTable:
    by_topic = {t: dict(held.start_offsets) for t, held in (state.topics or {}).items()}
    return DynamicTable(name, index, state.start_offsets, by_topic)


def unexplained(
    taken: Callable[[int, Mapping[int, tuple[int, int]], str | None], int],
    audits: Sequence[DestinationAudit[AuditReport]],
    dynamic: Sequence[DynamicTable],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(problems, notes) of the created tables (`dynamic`, audited as `audits`): one none of whose audited
    records goes to it (`taken`: how many records of some ranges go to a destination, `RoutedContent.
    taken`) is not explained by the records; one whose records Kafka no longer holds, or that never
    committed, cannot be told."""
    problems, notes = [], []
    for made, audit in zip(dynamic, audits, strict=True):
        by_topic: dict[str | None, dict[int, tuple[int, int]]] = {}
        for p in audit.report.partitions:
            if p.low_watermark is not None and max(p.start, p.low_watermark) < p.committed:
                by_topic.setdefault(p.topic, {})[p.partition] = (max(p.start, p.low_watermark), p.committed)
        ranges = {f"{t}/{p}" if t else str(p): r for t, held in by_topic.items() for p, r in held.items()}
        table = audit.report.table
        if not ranges:
            notes.append(
                f"{table} (icefall.dynamic-route-of this table): no committed records Kafka still holds, so "
                "nothing says whether the records explain it (a writer stopped between its creation and "
                "its first commit, or retention)"
            )
        elif sum(taken(made.index, held, topic) for topic, held in by_topic.items()) == 0:
            problems.append(
                f"{table} has icefall.dynamic-route-of this table, but none of the records of its "
                f"committed offsets {dict(sorted(ranges.items()))} computes the name {made.name!r}: the "
                "records do not explain it (made by another spec, or by hand)"
            )
    return tuple(problems), tuple(notes)


def verify_routed(
    spark: SparkSession, st: StreamingTable, catalog: Catalog, catalog_name: str, *, ingesting: bool = False
) -> RoutedAuditReport[AuditReport]:
    """`audit_routed` as `icefall verify` runs it: by content on `spark` (`catalog_name`: the table's
    catalog there), with the source's security settings."""
    from icefall.api import UNROUTED_REASON
    from icefall.api.routes import DYNAMIC_REASON_PREFIX
    from icefall.audit.content import SparkContent
    from icefall.kafka.security import librdkafka_config, spark_kafka_options

    security = st.spec.source.security
    content = SparkContent(
        spark,
        st.spec,
        catalog_name,
        security_options=spark_kafka_options(security),
        reason=UNROUTED_REASON,
        reason_prefix=DYNAMIC_REASON_PREFIX if st.spec.dynamic_route is not None else None,
    )
    return audit_routed(catalog, st, content, kafka_config=librdkafka_config(security), ingesting=ingesting)


def _dead_letter_table(catalog: Catalog, st: StreamingTable) -> Table | None:
    """`spec.deadLetter.table`, else `<table>_dlq` if it exists."""
    named = st.dead_letter_identifier
    if named is not None:
        return catalog.load_table(named)
    default = dlq_identifier(".".join(st.table_identifier))
    return catalog.load_table(default) if catalog.table_exists(default) else None


def writer_routing(st: StreamingTable) -> Routing:
    """The writer's routing of `st`, to route records as it does; it stages nothing here, so no staging
    branch is ever named."""
    from icefall.ingest.routes import Routing

    return Routing(st, _no_branch)


def _no_branch(identifier: tuple[str, ...], branch: str) -> str:
    raise AssertionError(f"the audit stages nothing ({'.'.join(identifier)} branch {branch})")
