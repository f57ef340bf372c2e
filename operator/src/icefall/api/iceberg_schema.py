"""The inline schema (`spec.format.schema`) as an Iceberg schema: `to_iceberg_schema`, `iceberg_type`; and
back: `fields_from_iceberg` (a table's columns as schema fields, for the decoder of an evolved table).

Field ids are assigned in Iceberg's fresh-id order (a struct's fields first, then their nested parts), so
a table created from the same schema gets the same ids pyiceberg would give it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyiceberg.schema import Schema
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
    TimeType,
    UUIDType,
)

from icefall.api.schema import ParsedType, SchemaField, TypeNode, TypeSpec


class _Ids:
    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def to_iceberg_schema(fields: Sequence[SchemaField], *, schema_id: int = 0) -> Schema:
    """Convert the inline schema to a `pyiceberg.schema.Schema` with Iceberg's fresh-id order."""
    ids = _Ids()
    return Schema(*_iceberg_struct(fields, ids).fields, schema_id=schema_id)


def iceberg_type(parsed: ParsedType) -> IcebergType:
    """The pyiceberg type of a primitive `ParsedType`."""
    simple: dict[str, IcebergType] = {
        "boolean": BooleanType(),
        "int": IntegerType(),
        "long": LongType(),
        "float": FloatType(),
        "double": DoubleType(),
        "date": DateType(),
        "time": TimeType(),
        "timestamp": TimestampType(),
        "timestamptz": TimestamptzType(),
        "string": StringType(),
        "uuid": UUIDType(),
        "binary": BinaryType(),
    }
    if parsed.name in simple:
        return simple[parsed.name]
    if parsed.name == "decimal":
        assert parsed.precision is not None and parsed.scale is not None
        return DecimalType(parsed.precision, parsed.scale)
    if parsed.name == "fixed":
        assert parsed.length is not None
        return FixedType(parsed.length)
    raise ValueError(f"{parsed} is not a primitive type")


def _iceberg_struct(fields: Sequence[SchemaField], ids: _Ids) -> StructType:
    # Iceberg numbers all fields of a struct first, then descends into each one in order.
    field_ids = [ids.next() for _ in fields]
    return StructType(
        *(
            NestedField(
                field_id=field_id,
                name=field.name,
                field_type=_iceberg_nested(field, ids),
                required=field.required,
                doc=field.doc,
            )
            for field_id, field in zip(field_ids, fields, strict=True)
        )
    )


def _iceberg_nested(node: TypeNode, ids: _Ids) -> IcebergType:
    parsed = node.parsed
    if parsed.name == "struct":
        assert node.fields is not None
        return _iceberg_struct(node.fields, ids)
    if parsed.name == "list":
        assert node.element is not None
        element_id = ids.next()
        return ListType(
            element_id=element_id,
            element_type=_iceberg_nested(node.element, ids),
            element_required=node.element_required,
        )
    if parsed.name == "map":
        assert node.key is not None and node.value is not None
        key_id = ids.next()
        value_id = ids.next()
        key_type = _iceberg_nested(node.key, ids)
        value_type = _iceberg_nested(node.value, ids)
        return MapType(
            key_id=key_id,
            key_type=key_type,
            value_id=value_id,
            value_type=value_type,
            value_required=node.value_required,
        )
    return iceberg_type(parsed)


def fields_from_iceberg(struct: StructType) -> list[SchemaField]:
    """The schema fields of an Iceberg struct (a table's columns), the inverse of `to_iceberg_schema` but
    for field ids."""
    return [SchemaField.model_validate(_field_data(f)) for f in struct.fields]


def _field_data(field: NestedField) -> dict[str, Any]:
    data: dict[str, Any] = {"name": field.name, "required": field.required, **_type_data(field.field_type)}
    if field.doc:
        data["doc"] = field.doc[:1024]
    return data


def _type_data(t: IcebergType) -> dict[str, Any]:
    if isinstance(t, StructType):
        return {"type": "struct", "fields": [_field_data(f) for f in t.fields]}
    if isinstance(t, ListType):
        element = TypeSpec.model_validate(_type_data(t.element_type))
        return {"type": "list", "element": element, "elementRequired": t.element_required}
    if isinstance(t, MapType):
        key, value = (TypeSpec.model_validate(_type_data(x)) for x in (t.key_type, t.value_type))
        return {"type": "map", "key": key, "value": value, "valueRequired": t.value_required}
    if isinstance(t, DecimalType):
        return {"type": f"decimal({t.precision},{t.scale})"}
    if isinstance(t, FixedType):
        return {"type": f"fixed[{len(t)}]"}
    return {"type": str(t)}
