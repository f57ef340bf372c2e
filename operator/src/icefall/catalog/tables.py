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

The dead-letter table has `DEAD_LETTER_SCHEMA` (the columns of `icefall.ingest.decode`'s bad rows) and is
partitioned by day(ingested_at): dead letters are read and expired by time ("what failed since
yesterday", "drop what is older than 30 days"), which a day partition turns into whole-file operations,
and a batch writes one file per day either way, so it costs no extra files.

Guarantees:
- Idempotent, and safe when several processes race to create the same namespace or table.
- An existing table whose columns differ from the expected ones (names, types, requiredness; field ids
  and docs are ignored) raises `TableMismatchError` listing every difference with its fix. Nothing is
  ever altered: schema evolution is not supported yet.
- A different partition spec or sort order is not an error (data is still correct): each difference is
  logged and returned in `EnsuredTables.warnings`.

With `transforms.select`, the columns' requiredness is Spark's nullability of the select output (for
columns read from JSON: optional), and uuid columns become strings (Spark has no uuid type).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from icefall.api import (
    NullOrder as SpecNullOrder,
)
from icefall.api import (
    ParsedTransform,
    StreamingTable,
    TransformName,
    to_iceberg_schema,
)
from icefall.api import (
    SortDirection as SpecSortDirection,
)
from icefall.runtime.failpoints import failpoint

#: Table properties Icefall sets at creation unless `spec.table.properties` says otherwise (module doc).
TABLE_DEFAULTS: dict[str, str] = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}

log = logging.getLogger(__name__)

KAFKA_COLUMN = "_kafka"
#: cdc with `spec.sequenceBy`: each row's position in the source (`icefall.ingest.decode.SEQUENCE_COLUMN`).
SEQUENCE_COLUMN = "_sequence"
SEQUENCE_DOC = (
    "The change's position in the source (spec.sequenceBy); integers zero-padded to compare as text"
)
PARTITION_FIELD_ID_START = 1000
#: Keyed tables (spec.mode upsert or cdc): Spark's MERGE writes the batch's changes as new rows plus
#: position deletes of the rows they replace (merge-on-read), not by rewriting whole data files.
KEYED_TABLE_DEFAULTS: dict[str, str] = {
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
TABLE_FIX = "schema evolution is not supported yet — change the spec back or use a new table"
DEAD_LETTER_FIX = (
    "a dead-letter table must have Icefall's layout — drop or rename that table, "
    "or set spec.deadLetter.table.name to a new table"
)
LAYOUT_FIX = (
    "Icefall does not change the layout of an existing table — change the spec, or evolve the table "
    "yourself (e.g. Spark's ALTER TABLE ... ADD/DROP PARTITION FIELD, WRITE ORDERED BY)"
)


class TableMismatchError(ValueError):
    """An existing table whose columns differ from the spec; `differences` has one line (with fix) each."""

    def __init__(self, identifier: str, differences: Sequence[str]) -> None:
        self.identifier = identifier
        self.differences = tuple(differences)
        lines = "\n".join(f"  - {d}" for d in self.differences)
        super().__init__(f"the table {identifier} does not match the StreamingTable:\n{lines}")


class TableLayoutError(ValueError):
    """Partitioning or sort order that cannot be built on the table's columns (known only at run time)."""


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


# --- expected layouts ----------------------------------------------------------------------------------


def kafka_struct() -> StructType:
    """`_kafka`: where the record came from (ids are placeholders; tables get fresh ones)."""
    return StructType(
        NestedField(1, "partition", IntegerType(), required=True),
        NestedField(2, "offset", LongType(), required=True),
        NestedField(3, "timestamp", TimestamptzType(), required=False),
    )


DEAD_LETTER_SCHEMA = Schema(
    NestedField(1, "partition", IntegerType(), required=True),
    NestedField(2, "offset", LongType(), required=True),
    NestedField(3, "timestamp", TimestamptzType(), required=False),
    NestedField(4, "key", BinaryType(), required=False),
    NestedField(5, "value", BinaryType(), required=False),
    NestedField(
        6,
        "headers",
        ListType(
            9,
            StructType(
                NestedField(10, "key", StringType(), required=False),
                NestedField(11, "value", BinaryType(), required=False),
            ),
            element_required=False,
        ),
        required=False,
    ),
    NestedField(7, "error", StringType(), required=True),
    NestedField(8, "ingested_at", TimestamptzType(), required=True),
)


def expected_schema(st: StreamingTable, schema_override: Schema | None = None) -> Schema:
    """The table's schema: the spec's (or `schema_override`'s) columns, then `_kafka` (and `_sequence` for
    cdc with `spec.sequenceBy`), with fresh ids.

    A `_kafka` or `_sequence` column in `schema_override` is replaced by Icefall's.
    """
    if schema_override is None:
        base = to_iceberg_schema(st.spec.format.schema_fields)
    else:
        system = (KAFKA_COLUMN, SEQUENCE_COLUMN)
        base = Schema(*(f for f in schema_override.fields if f.name not in system))
    top = base.highest_field_id
    kafka = StructType(
        *(
            NestedField(top + 2 + i, f.name, f.field_type, required=f.required, doc=f.doc)
            for i, f in enumerate(kafka_struct().fields)
        )
    )
    system_fields = [NestedField(top + 1, KAFKA_COLUMN, kafka, required=True)]
    if st.spec.sequence_by:
        top += 1 + len(kafka.fields)
        sequence = ListType(top + 2, StringType(), element_required=False)
        system_fields.append(
            NestedField(top + 1, SEQUENCE_COLUMN, sequence, required=False, doc=SEQUENCE_DOC)
        )
    combined = assign_fresh_schema_ids(Schema(*base.fields, *system_fields))
    key = st.spec.key or []
    missing = [name for name in key if name not in {f.name for f in base.fields}]
    if missing:
        raise TableLayoutError(
            f"spec.key names {', '.join(map(repr, missing))}, which spec.transforms.select does not "
            "produce; select the key columns as they are (e.g. add them to select)"
        )
    if not key:
        return combined
    # Identifier fields must be required: a key column is, whatever Spark's nullability of a select says
    # (the decoder dead-letters records without their key).
    fields = [replace_required(f) if f.name in key else f for f in combined.fields]
    ids = [f.field_id for name in key for f in fields if f.name == name]
    return Schema(*fields, identifier_field_ids=ids)


def replace_required(field: NestedField) -> NestedField:
    return NestedField(field.field_id, field.name, field.field_type, required=True, doc=field.doc)


def _transform(parsed: ParsedTransform) -> Transform[Any, Any]:
    simple: dict[TransformName, Callable[[], Transform[Any, Any]]] = {
        TransformName.IDENTITY: IdentityTransform,
        TransformName.YEAR: YearTransform,
        TransformName.MONTH: MonthTransform,
        TransformName.DAY: DayTransform,
        TransformName.HOUR: HourTransform,
    }
    if parsed.name in simple:
        return simple[parsed.name]()
    assert parsed.param is not None
    if parsed.name is TransformName.BUCKET:
        return BucketTransform(num_buckets=parsed.param)
    return TruncateTransform(width=parsed.param)


def _partition_name(path: str, parsed: ParsedTransform) -> str:
    # Iceberg Java's (and so Spark's) default partition field names.
    if parsed.name is TransformName.IDENTITY:
        return path
    if parsed.name is TransformName.BUCKET:
        return f"{path}_bucket"
    if parsed.name is TransformName.TRUNCATE:
        return f"{path}_trunc"
    return f"{path}_{parsed.name.value}"


def _find(schema: Schema, path: str, where: str) -> NestedField:
    try:
        return schema.find_field(path)
    except ValueError:
        columns = ", ".join(f.name for f in schema.fields)
        raise TableLayoutError(f"{where}: no column {path!r} in the table's columns ({columns})") from None


def partition_spec(st: StreamingTable, schema: Schema) -> PartitionSpec:
    """`spec.table.partitioning` on `schema` (whose ids it uses)."""
    fields = []
    for i, part in enumerate(st.spec.table.partitioning):
        source = _find(schema, part.field, f"spec.table.partitioning[{i}].field")
        parsed = part.parsed_transform
        transform = _transform(parsed)
        if not transform.can_transform(source.field_type):
            raise TableLayoutError(
                f"spec.table.partitioning[{i}].transform: {parsed} cannot partition {part.field!r} "
                f"of type {describe_type(source.field_type)}"
            )
        fields.append(
            PartitionField(
                source_id=source.field_id,
                field_id=PARTITION_FIELD_ID_START + i,
                transform=transform,
                name=_partition_name(part.field, parsed),
            )
        )
    return PartitionSpec(*fields) if fields else UNPARTITIONED_PARTITION_SPEC


def sort_order(st: StreamingTable, schema: Schema) -> SortOrder:
    """`spec.table.sortOrder` on `schema` (whose ids it uses)."""
    fields = []
    for i, key in enumerate(st.spec.table.sort_order):
        source = _find(schema, key.field, f"spec.table.sortOrder[{i}].field")
        if not source.field_type.is_primitive:
            raise TableLayoutError(
                f"spec.table.sortOrder[{i}].field: {key.field!r} is not a primitive column"
            )
        fields.append(
            SortField(
                source_id=source.field_id,
                transform=IdentityTransform(),
                direction=SortDirection.ASC if key.direction is SpecSortDirection.ASC else SortDirection.DESC,
                null_order=NullOrder.NULLS_FIRST
                if key.null_order is SpecNullOrder.FIRST
                else NullOrder.NULLS_LAST,
            )
        )
    return SortOrder(*fields, order_id=1) if fields else UNSORTED_SORT_ORDER


def dead_letter_partition_spec(schema: Schema) -> PartitionSpec:
    source = schema.find_field("ingested_at")
    return PartitionSpec(
        PartitionField(
            source_id=source.field_id,
            field_id=PARTITION_FIELD_ID_START,
            transform=DayTransform(),
            name="ingested_at_day",
        )
    )


# --- Spark schemas -------------------------------------------------------------------------------------

_SPARK_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "byte": IntegerType(),
    "short": IntegerType(),
    "integer": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "timestamp": TimestamptzType(),
    "timestamp_ntz": TimestampType(),
}
_SPARK_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_SPARK_CHAR = re.compile(r"^(var)?char\(\d+\)$")


def spark_struct_to_iceberg(struct_json: str | Mapping[str, Any]) -> Schema:
    """A Spark schema (`df.schema.json()` or `.jsonValue()`) as an Iceberg schema with fresh ids.

    Nullability becomes requiredness, column comments become docs. `TableLayoutError` names a column
    whose Spark type Iceberg cannot store (void, interval, variant, ...).
    """
    data = json.loads(struct_json) if isinstance(struct_json, str) else struct_json
    counter = iter(range(1, 1 << 30))
    struct = _spark_struct(data, "", counter)
    return assign_fresh_schema_ids(Schema(*struct.fields))


def _spark_struct(data: Mapping[str, Any], prefix: str, ids: Iterable[int]) -> StructType:
    it = iter(ids)
    fields = []
    for f in data["fields"]:
        path = f"{prefix}{f['name']}"
        doc = (f.get("metadata") or {}).get("comment")
        fields.append(
            NestedField(
                next(it), f["name"], _spark_type(f["type"], path, it), required=not f["nullable"], doc=doc
            )
        )
    return StructType(*fields)


def _spark_type(data: Any, path: str, ids: Iterable[int]) -> IcebergType:
    it = iter(ids)
    if isinstance(data, str):
        if data in _SPARK_PRIMITIVES:
            return _SPARK_PRIMITIVES[data]
        if m := _SPARK_DECIMAL.match(data):
            return DecimalType(int(m.group(1)), int(m.group(2)))
        if _SPARK_CHAR.match(data):
            return StringType()
        raise TableLayoutError(
            f"column {path!r} has Spark type {data}, which an Iceberg table cannot store; "
            "cast it in spec.transforms.select"
        )
    kind = data.get("type")
    if kind == "struct":
        return _spark_struct(data, f"{path}.", it)
    if kind == "array":
        return ListType(
            next(it), _spark_type(data["elementType"], f"{path}.element", it), not data["containsNull"]
        )
    if kind == "map":
        key_id, value_id = next(it), next(it)
        return MapType(
            key_id,
            _spark_type(data["keyType"], f"{path}.key", it),
            value_id,
            _spark_type(data["valueType"], f"{path}.value", it),
            not data["valueContainsNull"],
        )
    raise TableLayoutError(f"column {path!r} has Spark type {kind}, which an Iceberg table cannot store")


# --- comparing -----------------------------------------------------------------------------------------


def describe_type(t: IcebergType) -> str:
    """A type as a spec spells it: `decimal(10,2)`, `fixed[16]`, `list<struct<a: int>>`."""
    if isinstance(t, DecimalType):
        return f"decimal({t.precision},{t.scale})"
    if isinstance(t, FixedType):
        return f"fixed[{len(t)}]"
    if isinstance(t, StructType):
        return "struct<" + ", ".join(f"{f.name}: {describe_type(f.field_type)}" for f in t.fields) + ">"
    if isinstance(t, ListType):
        return f"list<{describe_type(t.element_type)}>"
    if isinstance(t, MapType):
        return f"map<{describe_type(t.key_type)}, {describe_type(t.value_type)}>"
    return str(t)


def _required(flag: bool) -> str:
    return "required" if flag else "optional"


class _Where:
    """Names the place that defines an expected column, for messages."""

    def __init__(self, indexed: str | None, label: str, kafka_label: str | None = None) -> None:
        self.indexed = indexed  # e.g. "spec.format.schema": top-level columns by index
        self.label = label  # e.g. "spec.transforms.select": columns by path
        self.kafka_label = kafka_label

    def top(self, index: int, name: str) -> str:
        if name == KAFKA_COLUMN and self.kafka_label is not None:
            return f"{self.kafka_label} ({name})"
        if self.indexed is not None:
            return f"{self.indexed}[{index}]"
        return f"{self.label} ({name})"


def schema_differences(
    identifier: str, actual: Schema, expected: Schema, where: _Where, fix: str
) -> list[str]:
    """Every difference of `actual` from `expected` (names, types, requiredness; not ids), one line each."""
    comparer = _Comparer(identifier, where, fix)
    comparer.structs(actual.as_struct(), expected.as_struct(), "", None)
    return comparer.out


class _Comparer:
    def __init__(self, table: str, where: _Where, fix: str) -> None:
        self.table = table
        self.where = where
        self.fix = fix
        self.out: list[str] = []

    def nested_where(self, parent: str, suffix: str, path: str) -> str:
        indexed = self.where.indexed
        if indexed is not None and parent.startswith(indexed):
            return parent + suffix
        head = parent.split(" (", 1)[0]
        return f"{head} ({path})"

    def requiredness(self, path: str, actual: bool, expected: bool, here: str) -> None:
        if actual != expected:
            self.out.append(
                f"the table {self.table} has column {path} as {_required(actual)} but {here} says "
                f"{_required(expected)}; {self.fix}"
            )

    def structs(
        self, actual: StructType, expected: StructType, prefix: str, parent_where: str | None
    ) -> None:
        actual_by_name = {f.name: f for f in actual.fields}
        for i, field in enumerate(expected.fields):
            path = f"{prefix}{field.name}"
            if parent_where is None:
                here = self.where.top(i, field.name)
            else:
                here = self.nested_where(parent_where, f".fields[{i}]", path)
            found = actual_by_name.get(field.name)
            if found is None:
                self.out.append(
                    f"the table {self.table} has no column {path} but {here} defines it as "
                    f"{describe_type(field.field_type)}; {self.fix}"
                )
                continue
            self.requiredness(path, found.required, field.required, here)
            self.types(found.field_type, field.field_type, path, here)
        source = (self.where.indexed or self.where.label) if parent_where is None else parent_where
        expected_names = {f.name for f in expected.fields}
        for field in actual.fields:
            if field.name not in expected_names:
                self.out.append(
                    f"the table {self.table} has column {prefix}{field.name} "
                    f"({describe_type(field.field_type)}) that {source} does not define; {self.fix}"
                )

    def types(self, actual: IcebergType, expected: IcebergType, path: str, here: str) -> None:
        if isinstance(actual, StructType) and isinstance(expected, StructType):
            self.structs(actual, expected, f"{path}.", here)
        elif isinstance(actual, ListType) and isinstance(expected, ListType):
            element = f"{path}.element"
            element_where = self.nested_where(here, ".element", element)
            self.requiredness(element, actual.element_required, expected.element_required, element_where)
            self.types(actual.element_type, expected.element_type, element, element_where)
        elif isinstance(actual, MapType) and isinstance(expected, MapType):
            key, value = f"{path}.key", f"{path}.value"
            value_where = self.nested_where(here, ".value", value)
            self.types(actual.key_type, expected.key_type, key, self.nested_where(here, ".key", key))
            self.requiredness(value, actual.value_required, expected.value_required, value_where)
            self.types(actual.value_type, expected.value_type, value, value_where)
        elif actual != expected:
            self.out.append(
                f"the table {self.table} has column {path} as {describe_type(actual)} but {here} says "
                f"{describe_type(expected)}; {self.fix}"
            )


def _describe_partitioning(spec: PartitionSpec, schema: Schema) -> list[str]:
    return [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in spec.fields]


def _describe_sort(order: SortOrder, schema: Schema) -> list[str]:
    out = []
    for f in order.fields:
        name = schema.find_column_name(f.source_id)
        column = name if isinstance(f.transform, IdentityTransform) else f"{f.transform}({name})"
        direction = "asc" if f.direction == SortDirection.ASC else "desc"
        nulls = "first" if f.null_order == NullOrder.NULLS_FIRST else "last"
        out.append(f"{column} {direction} nulls {nulls}")
    return out


def _layout_warnings(
    identifier: str,
    *,
    table: Table,
    spec: PartitionSpec,
    order: SortOrder,
    schema: Schema,
    source: str,
) -> list[str]:
    warnings = []
    current = table.schema()
    actual = _describe_partitioning(table.spec(), current)
    wanted = _describe_partitioning(spec, schema)
    if actual != wanted:
        warnings.append(
            f"the table {identifier} is partitioned by [{', '.join(actual) or 'nothing'}] but "
            f"{source}.partitioning says [{', '.join(wanted) or 'nothing'}]; {LAYOUT_FIX}"
        )
    actual_sort = _describe_sort(table.sort_order(), current)
    wanted_sort = _describe_sort(order, schema)
    if actual_sort != wanted_sort:
        warnings.append(
            f"the table {identifier} is sorted by [{', '.join(actual_sort) or 'nothing'}] but "
            f"{source}.sortOrder says [{', '.join(wanted_sort) or 'nothing'}]; {LAYOUT_FIX}"
        )
    return warnings


# --- ensuring ------------------------------------------------------------------------------------------


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
    warnings: list[str] = []
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
        failpoint("main.after-create")
    else:
        where = (
            _Where("spec.format.schema", "spec.format.schema", kafka_label="Icefall's _kafka column")
            if schema_override is None
            else _Where(None, "spec.transforms.select", kafka_label="Icefall's _kafka column")
        )
        differences = schema_differences(name, table.schema(), schema, where, TABLE_FIX)
        differences += _key_differences(name, table.schema(), schema)
        if differences:
            raise TableMismatchError(name, differences)
        warnings += _layout_warnings(
            name, table=table, spec=spec, order=order, schema=schema, source="spec.table"
        )

    dead_letter: Table | None = None
    dlq_identifier = st.dead_letter_identifier
    if dlq_identifier is not None:
        dlq_name = ".".join(dlq_identifier)
        dlq_schema = assign_fresh_schema_ids(DEAD_LETTER_SCHEMA)
        dlq_spec = dead_letter_partition_spec(dlq_schema)
        dead_letter, created = _load_or_create(
            catalog,
            dlq_identifier,
            schema=dlq_schema,
            spec=dlq_spec,
            order=UNSORTED_SORT_ORDER,
            properties={**TABLE_DEFAULTS, "format-version": "2"},
        )
        if created:
            failpoint("dlq.after-create")
        else:
            where = _Where(None, "Icefall's dead-letter layout")
            differences = schema_differences(
                dlq_name, dead_letter.schema(), dlq_schema, where, DEAD_LETTER_FIX
            )
            if differences:
                raise TableMismatchError(dlq_name, differences)
            warnings += _layout_warnings(
                dlq_name,
                table=dead_letter,
                spec=dlq_spec,
                order=UNSORTED_SORT_ORDER,
                schema=dlq_schema,
                source="Icefall's dead-letter layout",
            )
    for warning in warnings:
        log.warning("%s", warning)
    return EnsuredTables(table, dead_letter, warnings)
