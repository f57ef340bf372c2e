"""Create, or check, the Iceberg tables a StreamingTable writes: the table and its dead-letter table.

`ensure_tables(catalog, st)` creates what is missing (namespace, table, dead-letter table) and checks what
exists. The table's columns are `spec.format.schema` (or, with `transforms.select`, the transformed schema
the caller passes as `schema_override`, e.g. from `spark_struct_to_iceberg(good.schema.json())`), then
`_kafka` struct<partition int, offset long, timestamp timestamptz> (and for cdc with `spec.sequenceBy`,
`_sequence` list<string>: each row's position in the source). Partitioning and sort order come from
`spec.table`, properties `TABLE_DEFAULTS`, then `spec.table.properties` (which may override them), then
`format-version=2`. The defaults make every commit delete metadata files beyond the newest 100: a table
committing every few seconds would otherwise leave tens of thousands of metadata files a day for orphan
removal, which waits days.

The dead-letter table has `DEAD_LETTER_SCHEMA` (the columns of `icefall.decode.decode`'s bad rows) and is
partitioned by day(ingested_at): dead letters are read and expired by time ("what failed since
yesterday", "drop what is older than 30 days"), which a day partition turns into whole-file operations,
and a batch writes one file per day either way, so it costs no extra files.

The expected layout is built by `icefall.catalog.layout`, compared by `icefall.catalog.compare`.

Guarantees:
- Idempotent, and safe when several processes race to create the same namespace or table.
- An existing table whose columns differ from the expected ones in a way Iceberg cannot follow (a type
  changed or narrowed, a new required field; `icefall.catalog.evolution`) raises `TableMismatchError`
  listing every such field with its fix. Nothing is altered here: what Iceberg can follow (new optional
  fields, wider types, required to optional) is changed by the writer before its first batch
  (`icefall.decode.schemas`), under its lease.
- A different partition spec or sort order is not an error (data is still correct): each difference is
  logged and returned in `EnsuredTables.warnings`.

With `transforms.select`, the columns' requiredness is Spark's nullability of the select output (for
columns read from JSON: optional), and uuid columns become strings (Spark has no uuid type).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder

from icefall.api import StreamingTable
from icefall.api.routes import DYNAMIC_OWNER_PROPERTY, RouteTable, TableTemplate
from icefall.catalog.compare import ExpectedAt, layout_warnings, schema_differences
from icefall.catalog.evolution import plan_evolution
from icefall.catalog.layout import (
    dead_letter_partition_spec,
    dead_letter_schema,
    expected_schema,
    partition_spec,
    sort_order,
)
from icefall.plan.routing import dynamic_candidate
from icefall.runtime.failpoints import TableRole, failpoint

#: Table properties Icefall sets at creation unless `spec.table.properties` says otherwise (module doc).
TABLE_DEFAULTS: dict[str, str] = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}

log = logging.getLogger(__name__)

#: Keyed tables (spec.mode upsert or cdc): Spark's MERGE writes the batch's changes as new rows plus
#: position deletes of the rows they replace (merge-on-read), not by rewriting whole data files.
KEYED_TABLE_DEFAULTS: dict[str, str] = {
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
TABLE_FIX = "a table's key does not change — change spec.key back or use a new table"
DEAD_LETTER_FIX = (
    "a dead-letter table must have Icefall's layout — drop or rename that table, "
    "or set spec.deadLetter.table.name to a new table"
)


class TableMismatchError(ValueError):
    """An existing table whose columns differ from the spec; `differences` has one line (with fix) each."""

    def __init__(self, identifier: str, differences: Sequence[str]) -> None:
        self.identifier = identifier
        self.differences = tuple(differences)
        lines = "\n".join(f"  - {d}" for d in self.differences)
        super().__init__(f"the table {identifier} does not match the StreamingTable:\n{lines}")


class EnsuredTables(tuple[Table, Table | None]):
    """`(table, dead_letter_table)`, unpackable as a pair, with `warnings` about layout differences."""

    warnings: tuple[str, ...]

    def __new__(cls, table: Table, dead_letter: Table | None, warnings: Iterable[str] = ()) -> EnsuredTables:
        self = super().__new__(cls, (table, dead_letter))
        self.warnings = tuple(warnings)
        return self

    @property
    def table(self) -> Table:
        return self[0]

    @property
    def dead_letter(self) -> Table | None:
        return self[1]


def _key_differences(identifier: str, actual: Schema, expected: Schema) -> list[str]:
    """The table's identifier fields (its key) against spec.key."""
    have = sorted(actual.identifier_field_names())
    want = sorted(expected.identifier_field_names())
    if have == want:
        return []
    return [
        f"the table {identifier} has key (identifier fields) [{', '.join(have)}], spec.key says "
        f"[{', '.join(want)}]; {TABLE_FIX}"
    ]


def _load_or_create(
    catalog: Catalog,
    identifier: tuple[str, ...],
    *,
    schema: Schema,
    spec: PartitionSpec,
    order: SortOrder,
    properties: Mapping[str, str],
) -> tuple[Table, bool]:
    """The table and whether this call created it."""
    try:
        return catalog.load_table(identifier), False
    except NoSuchTableError:
        pass
    try:
        catalog.create_namespace_if_not_exists(identifier[:-1])
    except Exception:
        # The SQL catalog reports a lost creation race as an integrity error, not NamespaceAlreadyExists.
        if not catalog.namespace_exists(identifier[:-1]):
            raise
    try:
        table = catalog.create_table(
            identifier, schema, partition_spec=spec, sort_order=order, properties=dict(properties)
        )
    except TableAlreadyExistsError:  # another process won the race
        return catalog.load_table(identifier), False
    log.info("created Iceberg table %s", ".".join(identifier))
    return table, True


def ensure_tables(
    catalog: Catalog, st: StreamingTable, *, schema_override: Schema | None = None
) -> EnsuredTables:
    """Create the table and the dead-letter table when missing; check them when they exist.

    Raises `TableMismatchError` (columns differ) or `TableLayoutError` (partitioning or sort order names
    a column the table does not have). Returns `(table, dead_letter_table_or_None)` with `.warnings`.
    """
    table, warnings = _ensure_main_table(catalog, st, schema_override)
    dead_letter: Table | None = None
    if st.dead_letter_identifier is not None:
        dead_letter, dlq_warnings = _ensure_dead_letter_table(
            catalog, st.dead_letter_identifier, by_topic=st.spec.source.by_topic
        )
        warnings += dlq_warnings
    for warning in warnings:
        log.warning("%s", warning)
    return EnsuredTables(table, dead_letter, warnings)


def ensure_route_tables(
    catalog: Catalog, st: StreamingTable, *, schema_override: Schema | None = None
) -> list[Table]:
    """Each route's table (`spec.routes`, in order), created with the table's columns (a route's own:
    `StreamingTableSpec.route_spec`) and the route's own layout and properties, or checked like the table
    (`TableMismatchError`, layout warnings logged)."""
    return [
        _ensure_route_table(catalog, *route_table(st, i, schema_override), identifier, route.table)
        for i, (route, identifier) in enumerate(zip(st.spec.routes, st.route_identifiers, strict=True))
    ]


def route_table(
    st: StreamingTable, index: int, schema_override: Schema | None = None
) -> tuple[StreamingTable, Schema | None]:
    """`st` as route `index`'s table is laid out (its own spec, `StreamingTableSpec.route_spec`, else `st`),
    with the schema override that applies to it (none for an own route: its columns are its schema's)."""
    own = st.spec.route_spec(index)
    if own is None:
        return st, schema_override
    return st.model_copy(update={"spec": own}), None


def _ensure_route_table(
    catalog: Catalog,
    st: StreamingTable,
    schema_override: Schema | None,
    identifier: tuple[str, ...],
    layout: RouteTable | TableTemplate,
    *,
    properties: Mapping[str, str] | None = None,
) -> Table:
    table_spec = st.spec.table.model_copy(
        update={
            "namespace": ".".join(identifier[:-1]),
            "name": identifier[-1],
            "partitioning": layout.partitioning,
            "sort_order": layout.sort_order,
            "properties": {**layout.properties, **(properties or {})},
        }
    )
    as_table = st.model_copy(update={"spec": st.spec.model_copy(update={"table": table_spec})})
    table, warnings = _ensure_main_table(catalog, as_table, schema_override, role="route")
    for warning in warnings:
        log.warning("%s", warning)
    return table


def dynamic_owner(st: StreamingTable) -> str:
    """The `DYNAMIC_OWNER_PROPERTY` value of the tables `st`'s dynamic route creates: its table's name."""
    return ".".join(st.table_identifier)


def ensure_dynamic_table(
    catalog: Catalog, st: StreamingTable, name: str, *, schema_override: Schema | None = None
) -> Table | None:
    """Dynamic route table `name` (`spec.dynamicRoute`): created with spec.table's columns, the route's
    template layout and `DYNAMIC_OWNER_PROPERTY`, or loaded and checked like a route table; None when it
    exists without that property naming this StreamingTable's table (a table the route did not create: it
    is never written)."""
    route = st.spec.dynamic_route
    assert route is not None
    identifier = (*st.dynamic_namespace, name)
    owner = {DYNAMIC_OWNER_PROPERTY: dynamic_owner(st)}
    try:
        existing = catalog.load_table(identifier)
    except NoSuchTableError:
        existing = None
    if (
        existing is not None
        and existing.properties.get(DYNAMIC_OWNER_PROPERTY) != owner[DYNAMIC_OWNER_PROPERTY]
    ):
        return None
    return _ensure_route_table(catalog, st, schema_override, identifier, route.table, properties=owner)


def dynamic_route_tables(
    catalog: Catalog, st: StreamingTable, *, schema_override: Schema | None = None
) -> list[tuple[str, Table]]:
    """The dynamic route's tables that exist (`spec.dynamicRoute`), by name (`dynamic_route_identifiers`),
    each checked like a route table."""
    route = st.spec.dynamic_route
    if route is None:
        return []
    return [
        (identifier[-1], _ensure_route_table(catalog, st, schema_override, identifier, route.table))
        for identifier in dynamic_route_identifiers(catalog, st)
    ]


def dynamic_route_identifiers(catalog: Catalog, st: StreamingTable) -> list[tuple[str, ...]]:
    """The identifiers of the dynamic route's tables that exist, sorted (`owned_dynamic_tables`)."""
    return [identifier for identifier, _ in owned_dynamic_tables(catalog, st)]


def owned_dynamic_tables(catalog: Catalog, st: StreamingTable) -> list[tuple[tuple[str, ...], Table]]:
    """The dynamic route's tables that exist, sorted by identifier, as loaded: the tables of its namespace
    whose name fits its template and whose `DYNAMIC_OWNER_PROPERTY` names this StreamingTable's table. One
    list of the namespace and one load per candidate; a candidate dropped meanwhile is left out."""
    if st.spec.dynamic_route is None:
        return []
    namespace = st.dynamic_namespace
    try:
        listed = catalog.list_tables(namespace)
    except NoSuchNamespaceError:
        return []
    names = sorted(ident[-1] for ident in listed if dynamic_candidate(st, (*namespace, ident[-1])))
    owner = dynamic_owner(st)
    found = []
    for name in names:
        try:
            table = catalog.load_table((*namespace, name))
        except NoSuchTableError:
            continue
        if table.properties.get(DYNAMIC_OWNER_PROPERTY) == owner:
            found.append(((*namespace, name), table))
    return found


def _ensure_main_table(
    catalog: Catalog, st: StreamingTable, schema_override: Schema | None, role: TableRole = "main"
) -> tuple[Table, list[str]]:
    """The table, created with the spec's layout, or checked against it; the layout warnings."""
    identifier = st.table_identifier
    name = ".".join(identifier)
    schema = expected_schema(st, schema_override)
    spec = partition_spec(st, schema)
    order = sort_order(st, schema)
    keyed = KEYED_TABLE_DEFAULTS if st.spec.key else {}
    properties = {**TABLE_DEFAULTS, **keyed, **st.spec.table.properties, "format-version": "2"}
    table, created = _load_or_create(
        catalog, identifier, schema=schema, spec=spec, order=order, properties=properties
    )
    if created:
        failpoint(f"{role}.after-create")
        return table, []
    source = "spec.format.schema" if schema_override is None else "spec.transforms.select"
    evolution = plan_evolution(
        table.schema(), schema, source=source, relax_required=st.spec.format.type.uses_registry
    )
    differences = [f"the table {name}: {refused}" for refused in evolution.refused]
    differences += _key_differences(name, table.schema(), schema)
    if differences:
        raise TableMismatchError(name, differences)
    if evolution.changes:
        log.info("%s: the first batch changes the table's schema: %s", name, evolution.describe())
    return table, layout_warnings(
        name, table=table, spec=spec, order=order, schema=schema, source="spec.table"
    )


def _ensure_dead_letter_table(
    catalog: Catalog, identifier: tuple[str, ...], *, by_topic: bool
) -> tuple[Table, list[str]]:
    """The dead-letter table, created with Icefall's layout, or checked against it; the layout warnings."""
    name = ".".join(identifier)
    schema = assign_fresh_schema_ids(dead_letter_schema(by_topic=by_topic))
    spec = dead_letter_partition_spec(schema)
    table, created = _load_or_create(
        catalog,
        identifier,
        schema=schema,
        spec=spec,
        order=UNSORTED_SORT_ORDER,
        properties={**TABLE_DEFAULTS, "format-version": "2"},
    )
    if created:
        failpoint("dlq.after-create")
        return table, []
    where = ExpectedAt(None, "Icefall's dead-letter layout")
    differences = schema_differences(name, table.schema(), schema, where, DEAD_LETTER_FIX)
    if differences:
        raise TableMismatchError(name, differences)
    return table, layout_warnings(
        name,
        table=table,
        spec=spec,
        order=UNSORTED_SORT_ORDER,
        schema=schema,
        source="Icefall's dead-letter layout",
    )
