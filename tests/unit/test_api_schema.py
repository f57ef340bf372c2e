"""The inline schema maps faithfully and deterministically to Iceberg and Spark types.

Proves: every primitive, decimal, fixed, timestamp flavour and nested struct/list/map converts to the
matching pyiceberg type with the right required flags and docs; field ids follow Iceberg's own fresh-id
order (so the schema equals what a catalog stores for a new table) and do not depend on anything but the
input; the Spark DDL and Spark JSON forms use the Iceberg Spark runtime's mapping; type strings are
parsed strictly with helpful suggestions; nesting depth is bounded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
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

from icefall.api import (
    MAX_NESTING_DEPTH,
    Format,
    SchemaField,
    parse_type,
    resolve_column,
    to_iceberg_schema,
    to_spark_ddl,
    to_spark_schema_json,
    to_spark_schema_string,
)
from icefall.api.iceberg_schema import iceberg_type

pytestmark = pytest.mark.unit

NESTED: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True, "doc": "Order id."},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "local_ts", "type": "timestamp"},
    {
        "name": "shipping",
        "type": "struct",
        "required": True,
        "fields": [
            {"name": "city", "type": "string", "required": True},
            {"name": "geo", "type": "struct", "fields": [{"name": "lat", "type": "double"}]},
        ],
    },
    {"name": "tags", "type": "list", "element": {"type": "string"}},
    {
        "name": "lines",
        "type": "list",
        "elementRequired": True,
        "element": {"type": "struct", "fields": [{"name": "sku", "type": "string", "required": True}]},
    },
    {
        "name": "attrs",
        "type": "map",
        "key": {"type": "string"},
        "value": {"type": "list", "element": {"type": "int"}},
        "valueRequired": True,
    },
]


def fields(raw: list[dict[str, Any]]) -> list[SchemaField]:
    return [SchemaField.model_validate(f) for f in raw]


def test_nested_schema_converts_to_pyiceberg_with_iceberg_id_order() -> None:
    schema = to_iceberg_schema(fields(NESTED))
    expected = Schema(
        NestedField(1, "id", LongType(), required=True, doc="Order id."),
        NestedField(2, "amount", DecimalType(10, 2), required=False),
        NestedField(3, "ts", TimestamptzType(), required=True),
        NestedField(4, "local_ts", TimestampType(), required=False),
        NestedField(
            5,
            "shipping",
            StructType(
                NestedField(9, "city", StringType(), required=True),
                NestedField(10, "geo", StructType(NestedField(11, "lat", DoubleType(), required=False))),
            ),
            required=True,
        ),
        NestedField(6, "tags", ListType(12, StringType(), element_required=False)),
        NestedField(
            7,
            "lines",
            ListType(
                13, StructType(NestedField(14, "sku", StringType(), required=True)), element_required=True
            ),
        ),
        NestedField(
            8,
            "attrs",
            MapType(
                15, StringType(), 16, ListType(17, IntegerType(), element_required=False), value_required=True
            ),
        ),
    )
    assert schema == expected
    assert schema.highest_field_id == 17


def test_ids_match_what_a_catalog_assigns_to_a_new_table() -> None:
    schema = to_iceberg_schema(fields(NESTED))
    assert assign_fresh_schema_ids(schema) == schema


def test_conversion_is_deterministic() -> None:
    assert to_iceberg_schema(fields(NESTED)) == to_iceberg_schema(fields(NESTED))
    assert to_spark_ddl(fields(NESTED)) == to_spark_ddl(fields(NESTED))


@pytest.mark.parametrize(
    ("text", "iceberg"),
    [
        ("boolean", BooleanType()),
        ("int", IntegerType()),
        ("long", LongType()),
        ("float", FloatType()),
        ("double", DoubleType()),
        ("date", DateType()),
        ("time", TimeType()),
        ("timestamp", TimestampType()),
        ("timestamptz", TimestamptzType()),
        ("string", StringType()),
        ("uuid", UUIDType()),
        ("binary", BinaryType()),
        ("fixed[16]", FixedType(16)),
        ("decimal(38, 0)", DecimalType(38, 0)),
        ("decimal(1,1)", DecimalType(1, 1)),
    ],
)
def test_every_primitive_maps_to_its_pyiceberg_type(text: str, iceberg: object) -> None:
    assert iceberg_type(parse_type(text)) == iceberg


def test_type_strings_are_normalised() -> None:
    assert SchemaField(name="a", type=" decimal( 10 , 2 ) ").type == "decimal(10,2)"
    assert SchemaField(name="a", type="fixed[ 4 ]").type == "fixed[4]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Long", "type names are lowercase: use 'long'"),
        ("integer", "did you mean 'int'?"),
        ("varchar", "did you mean 'string'?"),
        ("datetime", "did you mean 'timestamptz'?"),
        ("decimal", "did you mean 'decimal(P,S)'?"),
        ("decimal(5,6)", "scale (6) must not exceed its precision (5)"),
        ("decimal(0,0)", "precision must be between 1 and 38"),
        ("fixed[0]", "fixed length must be at least 1"),
        ("strin", "did you mean 'string'?"),
        ("blob", "use one of boolean, int"),
    ],
)
def test_bad_type_strings_explain_the_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_type(text)


def test_spark_ddl_uses_iceberg_spark_mapping() -> None:
    ddl = to_spark_ddl(fields(NESTED))
    assert ddl == (
        "`id` BIGINT NOT NULL COMMENT 'Order id.', `amount` DECIMAL(10,2), `ts` TIMESTAMP NOT NULL, "
        "`local_ts` TIMESTAMP_NTZ, "
        "`shipping` STRUCT<`city`: STRING NOT NULL, `geo`: STRUCT<`lat`: DOUBLE>> NOT NULL, "
        "`tags` ARRAY<STRING>, `lines` ARRAY<STRUCT<`sku`: STRING NOT NULL>>, "
        "`attrs` MAP<STRING, ARRAY<INT>>"
    )


def test_spark_ddl_quotes_names_and_comments() -> None:
    ddl = to_spark_ddl(
        fields(
            [{"name": "user id", "type": "uuid", "doc": "it's \\ here"}, {"name": "f", "type": "fixed[2]"}]
        )
    )
    assert ddl == "`user id` STRING COMMENT 'it\\'s \\\\ here', `f` BINARY"


def test_spark_schema_json_carries_nullability_and_comments() -> None:
    schema = to_spark_schema_json(fields(NESTED))
    by_name = {f["name"]: f for f in schema["fields"]}
    assert by_name["id"] == {
        "name": "id",
        "type": "long",
        "nullable": False,
        "metadata": {"comment": "Order id."},
    }
    assert by_name["ts"]["type"] == "timestamp"
    assert by_name["local_ts"]["type"] == "timestamp_ntz"
    assert by_name["amount"]["type"] == "decimal(10,2)"
    assert by_name["lines"]["type"] == {
        "type": "array",
        "elementType": {
            "type": "struct",
            "fields": [{"name": "sku", "type": "string", "nullable": False, "metadata": {}}],
        },
        "containsNull": False,
    }
    assert by_name["attrs"]["type"] == {
        "type": "map",
        "keyType": "string",
        "valueType": {"type": "array", "elementType": "integer", "containsNull": True},
        "valueContainsNull": False,
    }
    assert json.loads(to_spark_schema_string(fields(NESTED))) == schema


@pytest.mark.parametrize(
    ("raw", "path_word"),
    [
        ({"name": "s", "type": "struct"}, "a struct needs fields"),
        ({"name": "l", "type": "list"}, "a list needs an element type"),
        ({"name": "m", "type": "map", "value": {"type": "int"}}, "a map needs a key type"),
        ({"name": "m", "type": "map", "key": {"type": "string"}}, "a map needs a value type"),
        (
            {
                "name": "m",
                "type": "map",
                "key": {"type": "list", "element": {"type": "int"}},
                "value": {"type": "int"},
            },
            "map keys must be a primitive type",
        ),
        ({"name": "x", "type": "int", "fields": [{"name": "y", "type": "int"}]}, "only a struct has fields"),
        ({"name": "x", "type": "int", "valueRequired": True}, "only a map has valueRequired"),
        ({"name": "a.b", "type": "int"}, "String should match pattern"),
    ],
)
def test_type_parts_must_match_the_type(raw: dict[str, Any], path_word: str) -> None:
    with pytest.raises(ValidationError, match=path_word):
        SchemaField.model_validate(raw)


def test_nesting_depth_is_bounded() -> None:
    node: dict[str, Any] = {"name": "leaf", "type": "int"}
    for depth in range(MAX_NESTING_DEPTH):
        node = {"name": f"s{depth}", "type": "struct", "fields": [node]}
    with pytest.raises(ValidationError, match=f"nesting deeper than {MAX_NESTING_DEPTH} levels"):
        Format.model_validate({"schema": [node]})
    Format.model_validate({"schema": [node["fields"][0]]})  # one level less is fine


def test_resolve_column_walks_structs_only() -> None:
    schema = fields(NESTED)
    resolved = resolve_column(schema, "shipping.geo.lat")
    assert resolved.field is not None and resolved.field.type == "double"
    assert "is a list; use a column outside lists and maps" in (
        resolve_column(schema, "lines.sku").problem or ""
    )
    assert "is a long, not a struct" in (resolve_column(schema, "id.x").problem or "")
    assert "did you mean 'shipping.city'?" in (resolve_column(schema, "shipping.cty").problem or "")
