"""Where a dynamic route's records belong (`spec.dynamicRoute`), for the audit of a routed table.

The writer computes a table name from each good record no static route takes (`icefall.ingest.routes.
Routing.routed`, which the audit runs too) and sorts each batch's names against the tables that exist
(`icefall.plan.routing.dynamic_names`). The audit sees the end state instead: the tables whose
`icefall.dynamic-route-of` property names spec.table (`found_tables`), each with the offsets it starts at
(`icefall.start-offsets`: the batch that created it, since a created table takes its creating batch's whole
range), and the tables of the namespace without that property. From them each name's records have one
fate (`name_fates`), with the writer's own reason texts:

- a name that is not an identifier, or names another table of the StreamingTable: a dead letter, always;
- a name of a created table: that table from its start offsets on; before them a dead letter past
  `maxTables` (had the cap allowed, the writer would have created the table then);
- a name that is a table the route did not create: a dead letter saying so while the cap was not full,
  past `maxTables` once it was (`cap_full_from`: from where `maxTables` created tables existed);
- any other name: a dead letter past `maxTables`.

Not guaranteed: a `maxTables` lowered, a `nameTemplate` or namespace changed, or a created table dropped
since the records were written (audit with the spec the tables were filled with); the reason of a table the
route did not create when two such names and the cap's last table met in one batch (the writer counts a
refused creation against the cap of that batch).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from icefall.plan.routing import name_refusal, not_created_reason, past_cap_reason

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

    from icefall.api import StreamingTable

#: The column `resolve` adds: the destination index of a record a created table takes (null: none).
DYNAMIC_DEST_COLUMN = "__icefall_dynamic_dest"


@dataclass(frozen=True)
class DynamicTable:
    """A table the route created: its name, its destination index in the audit, and the offset per
    partition its commits start at (`icefall.start-offsets`; the topics form: per topic)."""

    name: str
    index: int
    since: Mapping[int, int]
    #: The topics form: the offsets per partition its commits start at, by topic (`since` is then one's).
    since_by_topic: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def of_topic(self, topic: str) -> DynamicTable:
        """This table as the audit of one topic of the topics form sees it: `since` of that topic."""
        return replace(self, since=self.since_by_topic.get(topic, {}))


@dataclass(frozen=True)
class NameFate:
    """Where the records that compute `name` belong: table `table` (a destination index; None: none) from
    `since` on; elsewhere dead letters with reason `refused`, or `unowned` (a table the route did not
    create) before the cap was full."""

    name: str
    refused: str
    table: int | None = None
    since: Mapping[int, int] = field(default_factory=dict)
    unowned: str | None = None


def name_fates(
    names: Iterable[str],
    tables: Sequence[DynamicTable],
    unowned: Collection[str],
    reserved: Mapping[str, str],
    *,
    max_tables: int,
) -> list[NameFate]:
    """The fate of each distinct computed name (module docstring), sorted by name."""
    by_name = {t.name: t for t in tables}
    fates = []
    for name in sorted(set(names)):
        always = name_refusal(name, reserved)
        if always is not None:
            fates.append(NameFate(name, always))
            continue
        # Refused past the cap: exactly `max_tables` existed then (the writer creates up to the cap).
        past_cap = past_cap_reason(name, max_tables, max_tables)
        table = by_name.get(name)
        if table is not None:
            fates.append(NameFate(name, past_cap, table=table.index, since=dict(table.since)))
        elif name in unowned:
            fates.append(NameFate(name, past_cap, unowned=not_created_reason(name)))
        else:
            fates.append(NameFate(name, past_cap))
    return fates


def cap_full_from(tables: Sequence[DynamicTable], max_tables: int) -> dict[int, int]:
    """Per partition, the offset from which `max_tables` created tables existed: the `max_tables`-th
    smallest start offset among the tables that started the partition (absent: never full there)."""
    partitions = {p for t in tables for p in t.since}
    full = {}
    for p in sorted(partitions):
        starts = sorted(t.since[p] for t in tables if p in t.since)
        if len(starts) >= max_tables:
            full[p] = starts[max_tables - 1]
    return full


def found_tables(catalog: Catalog, st: StreamingTable) -> tuple[list[tuple[str, Table]], set[str]]:
    """The tables that may be the route's (`icefall.plan.routing.dynamic_candidate`: a computed name always
    fits its template) whose owner property names spec.table, sorted by name, and the names of the other
    candidates: one list of the namespace and one load per candidate."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from icefall.api.routes import DYNAMIC_OWNER_PROPERTY
    from icefall.catalog.tables import dynamic_owner
    from icefall.plan.routing import dynamic_candidate

    namespace = st.dynamic_namespace
    try:
        listed = catalog.list_tables(namespace)
    except NoSuchNamespaceError:
        return [], set()
    owner = dynamic_owner(st)
    owned, others = [], set()
    for identifier in sorted(listed):
        name = identifier[-1]
        if not dynamic_candidate(st, (*namespace, name)):
            continue
        try:
            table = catalog.load_table((*namespace, name))
        except NoSuchTableError:  # dropped meanwhile
            continue
        if table.properties.get(DYNAMIC_OWNER_PROPERTY) == owner:
            owned.append((name, table))
        else:
            others.add(name)
    return owned, others


def resolve(
    spark: SparkSession,
    routed: DataFrame,
    fates: Sequence[NameFate],
    cap_full: Mapping[int, int],
) -> DataFrame:
    """`routed` (`Routing.routed` of the decoded records) with each computed name's fate applied: a record
    a created table takes gets its index in `DYNAMIC_DEST_COLUMN`; one refused is a dead letter (bad) with
    its reason as error text, as the writer's `Routing.dead_letters` makes it."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)
    from pyspark.sql.types import IntegerType, LongType, MapType, StringType, StructField, StructType

    from icefall.decode.columns import BAD_COLUMN, ERROR_COLUMN
    from icefall.ingest.routes import NAME_COLUMN

    schema = StructType(
        [
            StructField("fate_name", StringType(), False),
            StructField("fate_table", IntegerType(), True),
            StructField("fate_since", MapType(IntegerType(), LongType()), False),
            StructField("fate_refused", StringType(), False),
            StructField("fate_unowned", StringType(), True),
        ]
    )
    rows = [(f.name, f.table, dict(f.since), f.refused, f.unowned) for f in fates]
    fate = spark.createDataFrame(rows, schema)
    joined = routed.join(F.broadcast(fate), F.col(NAME_COLUMN) == F.col("fate_name"), "left")
    partition, offset = F.col("partition"), F.col("offset")
    since = F.element_at(F.col("fate_since"), partition.cast("int"))
    taken = F.col("fate_table").isNotNull() & F.coalesce(offset >= since, F.lit(False))
    full = F.lit(False)
    for p, o in sorted(cap_full.items()):
        full = full | ((partition == F.lit(p)) & (offset >= F.lit(o)))
    reason = (
        F.when(F.col("fate_name").isNull() | taken, F.lit(None).cast("string"))
        .when(F.col("fate_unowned").isNotNull() & ~full, F.col("fate_unowned"))
        .otherwise(F.col("fate_refused"))
    )
    columns = [c for c in routed.columns if c not in (BAD_COLUMN, ERROR_COLUMN)]
    return joined.select(
        *(F.col(f"`{c}`") for c in columns),
        (F.col(BAD_COLUMN) | reason.isNotNull()).alias(BAD_COLUMN),
        F.coalesce(F.col(ERROR_COLUMN), reason).alias(ERROR_COLUMN),
        F.when(taken, F.col("fate_table")).cast("int").alias(DYNAMIC_DEST_COLUMN),
    )
