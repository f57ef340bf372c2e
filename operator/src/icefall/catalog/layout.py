"""The layout Icefall expects of its tables, as pyiceberg objects: the table's schema (`expected_schema`:
the spec's columns, then `_kafka`, and `_sequence` for cdc with `spec.sequenceBy`), the dead-letter table's
(`DEAD_LETTER_SCHEMA`), partition specs and sort orders from `spec.table`, and a Spark struct (the
`transforms.select` output) as an Iceberg schema (`spark_struct_to_iceberg`).

Pure: builds objects, reads no catalog. `TableLayoutError`: a layout that cannot be built on the columns
(known only at run time, with `transforms.select`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
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

from icefall.api import NullOrder as SpecNullOrder
from icefall.api import ParsedTransform, StreamingTable, TransformName, to_iceberg_schema
from icefall.api import SortDirection as SpecSortDirection

KAFKA_COLUMN = "_kafka"
#: cdc with `spec.sequenceBy`: each row's position in the source (`icefall.decode.decode.SEQUENCE_COLUMN`).
SEQUENCE_COLUMN = "_sequence"
SEQUENCE_DOC = (
    "The change's position in the source (spec.sequenceBy); integers zero-padded to compare as text"
)
PARTITION_FIELD_ID_START = 1000


class TableLayoutError(ValueError):
    """Partitioning or sort order that cannot be built on the table's columns (known only at run time)."""


def kafka_struct(*, by_topic: bool = False) -> StructType:
    """`_kafka`: where the record came from (ids are placeholders; tables get fresh ones); `topic` too in
    a table of several topics (`spec.source.topics`)."""
    fields = [
        NestedField(1, "partition", IntegerType(), required=True),
        NestedField(2, "offset", LongType(), required=True),
        NestedField(3, "timestamp", TimestamptzType(), required=False),
    ]
    if by_topic:
        fields.append(NestedField(4, "topic", StringType(), required=True))
    return StructType(*fields)


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


#: The dead-letter table of a table of several topics: the record's topic too.
TOPIC_FIELD = NestedField(12, "topic", StringType(), required=True)


def dead_letter_schema(*, by_topic: bool = False) -> Schema:
    """`DEAD_LETTER_SCHEMA`, and its `topic` column in a table of several topics (`spec.source.topics`)."""
    if not by_topic:
        return DEAD_LETTER_SCHEMA
    return Schema(*DEAD_LETTER_SCHEMA.fields, TOPIC_FIELD)


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
            for i, f in enumerate(kafka_struct(by_topic=st.spec.source.by_topic).fields)
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
