"""The audit of keyed routes (`spec.routes` with `spec.mode` upsert or cdc): each destination audited as a
keyed table (`icefall.audit.keyed`) over exactly the records its writer sends it.

The records of every destination's committed ranges are read once (read_committed), decoded with the spec
as ingestion decodes them and routed by the writer's own code (`icefall.ingest.routes.Routing`:
`dead_letters`, then `routed`). Each destination's model is the records of ITS OWN committed ranges (per
topic and partition) that go to it, as its MERGE gets them: `spec.table` the unrouted ones
(`unrouted: Table`; none with `DeadLetter`), a route those its condition takes, and both a delete no
condition takes (`EVERY`); a route with its own schema, key or sequenceBy decodes its records with its own
spec (`OwnDecoders.rows`) and is keyed by its own key. The model is collapsed to the last change per key,
deletes removed, and compared with the destination's rows at its committed snapshot by key and content
(`icefall.audit.keyed.compare`: every column and the Kafka position, topic included). The records of
`spec.table`'s committed ranges that must be dead letters (malformed, unrouted with `unrouted:
DeadLetter`, not fitting their own route's schema) are checked against the dead-letter table by
(topic,) partition and offset, in `spec.table`'s report.

Not guaranteed: dead letters are checked by position, not by their reason; a route added, removed or
changed since its rows were written makes them unexpected or missing (audit with the spec the tables were
filled with); tables with offset resets are refused, as by the keyed audit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icefall.audit.keyed import (
    KeyedAuditError,
    KeyedAuditReport,
    KeyedComparison,
    committed_ranges,
    compare,
    counted,
    dead_letter_positions,
    inside,
    positions,
)
from icefall.audit.routed import DestinationAudit, RoutedAuditReport, writer_routing
from icefall.commit.state import OFFSET_RESETS, CommittedState, read_committed

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame, SparkSession

    from icefall.api import StreamingTable, StreamingTableSpec
    from icefall.ingest.routes import Routing
    from icefall.plan.offsets import OffsetRange


@dataclass(frozen=True)
class _Destination:
    """`spec.table` (`index` None) or `spec.routes[index]`'s table, at its committed state."""

    name: str  # as the report names it: spec.table, routes[i]
    index: int | None
    identifier: tuple[str, ...]
    table: Table
    committed: CommittedState

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
        return committed_ranges(self.committed)


def audit_keyed_routes(
    spark: SparkSession,
    st: StreamingTable,
    catalog: Catalog,
    catalog_name: str,
    *,
    security_options: Mapping[str, str] | None = None,
) -> RoutedAuditReport[KeyedAuditReport]:
    """Audit every destination of the keyed, routed `st` (module doc), `spec.table` first. `spark` has
    `catalog_name` configured."""
    from icefall.audit.content import RECORDS_PER_TASK, cached
    from icefall.decode.decode import decode
    from icefall.decode.schemas import decoding_spec, schema_at
    from icefall.ingest.engine import read_kafka
    from icefall.kafka.registry import spec_with_registry_schema

    destinations = _destinations(st, catalog)
    main = destinations[0]
    if main.committed.snapshot_id is None:
        raise KeyedAuditError(f"{'.'.join(main.identifier)}: the table has no snapshot yet; nothing to audit")
    # Decoded as the writer decodes the batch: spec.table's columns at its snapshot (a registry format's
    # grow with its writer schemas), the registry's latest schema standing in for an inline one.
    spec = spec_with_registry_schema(st.spec)
    spec = decoding_spec(spec, schema_at(main.table, main.committed.snapshot_id))
    read = _spanning([r for d in destinations for r in d.ranges])
    kafka = read_kafka(spark, st.spec, read, security_options or {}, records_per_task=RECORDS_PER_TASK)
    routing = writer_routing(st)
    # Computed once for every destination (as the writer caches its batch): an own route's decode stacked
    # on the spec's decode and the conditions, uncached, runs Spark's optimizer out of memory.
    routed = cached(routing.routed(routing.dead_letters(decode(kafka, spec))))
    try:
        audit = _Routed(spark, st, spec, routing, routed, catalog_name).audit
        audits = [DestinationAudit(d.name, audit(d)) for d in destinations]
    finally:
        routed.unpersist()
    return RoutedAuditReport(tuple(audits))


def _destinations(st: StreamingTable, catalog: Catalog) -> list[_Destination]:
    """`spec.table`, then each route's table, at their committed states; refused after an offset reset."""
    found = []
    for index, identifier in [(None, st.table_identifier), *enumerate(st.route_identifiers)]:
        table = catalog.load_table(identifier)
        if table.properties.get(OFFSET_RESETS):
            label = ".".join(identifier)
            raise KeyedAuditError(f"{label}: its offsets were reset; a keyed audit cannot model that yet")
        name = "spec.table" if index is None else f"routes[{index}]"
        found.append(_Destination(name, index, identifier, table, read_committed(table)))
    return found


def _spanning(ranges: list[OffsetRange]) -> tuple[OffsetRange, ...]:
    """One range per (topic, partition) covering every range of it in `ranges`: what to read once."""
    from icefall.plan.offsets import OffsetRange

    spans: dict[tuple[str, int], OffsetRange] = {}
    for r in ranges:
        held = spans.get((r.topic or "", r.partition), r)
        spans[(r.topic or "", r.partition)] = OffsetRange(
            r.partition, min(held.start, r.start), max(held.end, r.end), r.topic
        )
    return tuple(span for _, span in sorted(spans.items()))


@dataclass(frozen=True)
class _Routed:
    """The records read for every destination, routed (`routed`, persisted) by the writer's `routing`."""

    spark: SparkSession
    st: StreamingTable
    spec: StreamingTableSpec  # the spec they decoded with
    routing: Routing
    routed: DataFrame
    catalog_name: str

    def audit(self, destination: _Destination) -> KeyedAuditReport:
        """One destination's keyed audit: its records against its rows; `spec.table`'s with the dead
        letters."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.decode.decode import good_rows, with_every_column
        from icefall.decode.schemas import schema_at
        from icefall.ingest.routes import ROUTE_COLUMN

        index, own = destination.index, self.routing.own
        mine = self.routed.where(inside(destination.ranges))
        taken = mine.where(F.coalesce(_takes(self.routing, index, F.col(ROUTE_COLUMN)), F.lit(False)))
        schema = schema_at(destination.table, destination.committed.snapshot_id)  # its columns then
        if index is not None and index in own:
            changes, key = own.rows(index, taken, schema), own.specs[index].key
        else:
            changes, key = with_every_column(good_rows(taken, self.spec), schema), self.st.spec.key
        rows = _rows(self.spark, destination, self.catalog_name)
        comparison: KeyedComparison | None = None
        try:
            comparison = compare(changes, rows, list(key or []))
            checked = destination.index is None and self.st.dead_letter_identifier is not None
            return counted(
                ".".join(destination.identifier), destination.committed, records=mine.count(), rows=rows,
                comparison=comparison, bad=self._bad(mine) if checked else None,
                dead=self._dead(destination.ranges) if checked else None,
            )  # fmt: skip
        finally:
            if comparison is not None:
                comparison.compared.unpersist()

    def _bad(self, records: DataFrame) -> DataFrame:
        """The `positions` of `records` (routed) that must be dead letters: malformed, unrouted with
        `unrouted: DeadLetter` (both `BAD_COLUMN` after `Routing.dead_letters`), or not fitting the schema
        of the own route that takes them."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.decode.decode import BAD_COLUMN
        from icefall.ingest.routes import ROUTE_COLUMN

        by_topic = self.st.spec.source.by_topic
        bad = positions(records.where(F.col(BAD_COLUMN)), by_topic=by_topic)
        if not self.routing.own:
            return bad
        misfits = self.routing.own.misfits(records, F.col(ROUTE_COLUMN))
        return bad.unionByName(positions(misfits, by_topic=by_topic))

    def _dead(self, ranges: tuple[OffsetRange, ...]) -> DataFrame | None:
        return dead_letter_positions(self.spark, self.st, self.catalog_name, ranges)


def _takes(routing: Routing, index: int | None, route: Column) -> Column:
    """Whether a record with route index `route` is one destination's change (`index`: a route's, None:
    `spec.table`'s), as `Routing.write` gives it: its route's (or, unrouted, spec.table's unless
    `unrouted: DeadLetter`), and a delete no condition takes (`EVERY`) everyone's."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.api import Unrouted
    from icefall.ingest.routes import EVERY

    if index is not None:
        return (route == index) | (route == EVERY)
    if routing.unrouted is Unrouted.TABLE:
        return route.isNull() | (route == EVERY)
    return F.lit(False)


def _rows(spark: SparkSession, destination: _Destination, catalog_name: str) -> DataFrame:
    """The destination's rows at its committed snapshot (none before its first commit)."""
    name = ".".join(f"`{part}`" for part in (catalog_name, *destination.identifier))
    snapshot = destination.committed.snapshot_id
    if snapshot is None:
        return spark.table(name)
    return spark.sql(f"SELECT * FROM {name} VERSION AS OF {int(snapshot)}")
