"""Partition transforms, sort orders and catalogs are validated before anything runs.

Proves: transform syntax is strict (`bucket[16]`, not `bucket(16)` or `hourly`) with a suggestion; each
transform accepts exactly the source types the Iceberg spec allows; partition/sort columns must exist,
be primitive and sit outside lists and maps (dotted struct paths work); redundant partition fields are
refused; sort nulls default as in Iceberg; catalog configs hold no inline secret; the layout check is
skipped when `transforms.select` makes the columns unknown until run time.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import (
    CatalogSpec,
    NullOrder,
    ParsedTransform,
    PartitionField,
    SchemaField,
    SortField,
    StreamingTableSpec,
    TableSpec,
    TransformName,
    layout_problems,
    parse_transform,
)

pytestmark = pytest.mark.unit

ALL_TYPES = {
    "b": "boolean",
    "i": "int",
    "l": "long",
    "f": "float",
    "d": "double",
    "dec": "decimal(9,2)",
    "dt": "date",
    "ts": "timestamp",
    "tz": "timestamptz",
    "s": "string",
    "u": "uuid",
    "fx": "fixed[8]",
    "bin": "binary",
}
SCHEMA = [SchemaField(name=n, type=t) for n, t in ALL_TYPES.items()] + [
    SchemaField.model_validate(
        {"name": "ship", "type": "struct", "fields": [{"name": "country", "type": "string"}]}
    ),
    SchemaField.model_validate({"name": "tags", "type": "list", "element": {"type": "string"}}),
    SchemaField.model_validate(
        {"name": "kv", "type": "map", "key": {"type": "string"}, "value": {"type": "string"}}
    ),
]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("identity", ParsedTransform(TransformName.IDENTITY)),
        ("hour", ParsedTransform(TransformName.HOUR)),
        ("day", ParsedTransform(TransformName.DAY)),
        ("month", ParsedTransform(TransformName.MONTH)),
        ("year", ParsedTransform(TransformName.YEAR)),
        ("bucket[16]", ParsedTransform(TransformName.BUCKET, 16)),
        ("truncate[4]", ParsedTransform(TransformName.TRUNCATE, 4)),
    ],
)
def test_transform_syntax(text: str, parsed: ParsedTransform) -> None:
    assert parse_transform(text) == parsed
    assert str(parsed) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "hourly",
            "'hourly' is not a transform; use one of identity, hour, day, month, year, bucket[N], "
            "truncate[W] (did you mean 'hour'?)",
        ),
        ("days", "(did you mean 'day'?)"),
        ("bucket", "(did you mean 'bucket[N]'?)"),
        ("bucket(16)", "'bucket(16)' is not a transform; write 'bucket[16]'"),
        ("bucket[0]", "the bucket count N must be between 1 and"),
        ("truncate[-1]", "the truncate width W must be between 1 and"),
        ("Day", "(did you mean 'day'?)"),
        ("void", "is not a transform"),
    ],
)
def test_bad_transform_messages(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_transform(text)
    assert message in str(caught.value)


# Which source columns each transform accepts (Iceberg spec, "Partition Transforms").
ACCEPTS = {
    "identity": set(ALL_TYPES),
    "year": {"dt", "ts", "tz"},
    "month": {"dt", "ts", "tz"},
    "day": {"dt", "ts", "tz"},
    "hour": {"ts", "tz"},
    "bucket[8]": {"i", "l", "dec", "dt", "ts", "tz", "s", "u", "fx", "bin"},
    "truncate[3]": {"i", "l", "dec", "s", "bin"},
}


@pytest.mark.parametrize("transform", sorted(ACCEPTS))
def test_transform_source_types(transform: str) -> None:
    for column, column_type in ALL_TYPES.items():
        problems = layout_problems(SCHEMA, [PartitionField(field=column, transform=transform)], [])
        if column in ACCEPTS[transform]:
            assert problems == [], (transform, column)
        else:
            ((loc, message),) = problems
            assert loc == ("partitioning", 0, "transform")
            assert f"cannot partition {column!r} of type {column_type}" in message


def test_partition_on_struct_member_list_and_struct() -> None:
    assert layout_problems(SCHEMA, [PartitionField(field="ship.country")], []) == []
    assert (
        "use a column outside lists and maps"
        in layout_problems(SCHEMA, [PartitionField(field="tags.x")], [])[0][1]
    )
    assert (
        "cannot partition 'ship' of type struct"
        in layout_problems(SCHEMA, [PartitionField(field="ship")], [])[0][1]
    )
    assert (
        "cannot partition 'kv' of type map" in layout_problems(SCHEMA, [PartitionField(field="kv")], [])[0][1]
    )


def test_sort_fields_must_be_primitive_columns() -> None:
    problems = layout_problems(
        SCHEMA, [], [SortField(field="tz"), SortField(field="tags"), SortField(field="nope")]
    )
    assert [loc for loc, _ in problems] == [("sortOrder", 1, "field"), ("sortOrder", 2, "field")]
    assert "sort by a primitive column" in problems[0][1]
    assert "no column 'nope'" in problems[1][1]


def test_sort_null_order_defaults_follow_iceberg() -> None:
    assert SortField(field="a").null_order is NullOrder.FIRST
    assert SortField(field="a", direction="desc").null_order is NullOrder.LAST
    assert SortField(field="a", direction="desc", nulls="first").null_order is NullOrder.FIRST


@pytest.mark.parametrize(
    ("partitioning", "message"),
    [
        (
            [{"field": "ts", "transform": "day"}, {"field": "ts", "transform": "day"}],
            "is already partitioning[0]",
        ),
        (
            [{"field": "ts", "transform": "day"}, {"field": "ts", "transform": "hour"}],
            "already has a time transform",
        ),
    ],
)
def test_redundant_partition_fields_are_refused(partitioning: list[dict[str, str]], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        TableSpec.model_validate({"partitioning": partitioning})


def test_two_transforms_of_different_kinds_on_one_column_are_fine() -> None:
    TableSpec.model_validate(
        {"partitioning": [{"field": "ts", "transform": "day"}, {"field": "ts", "transform": "bucket[4]"}]}
    )


def spec_with(table: dict[str, Any], transforms: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "source": {"bootstrapServers": "k:9092", "topic": "t"},
        "format": {"schema": [{"name": "ts", "type": "timestamptz"}]},
        "table": table,
        "transforms": transforms or {},
    }


def test_layout_is_checked_against_the_schema_without_select() -> None:
    with pytest.raises(ValidationError, match="no column 'when'"):
        StreamingTableSpec.model_validate(
            spec_with({"partitioning": [{"field": "when", "transform": "day"}]})
        )


def test_layout_check_waits_for_run_time_with_select() -> None:
    spec = StreamingTableSpec.model_validate(
        spec_with(
            {"partitioning": [{"field": "when", "transform": "day"}]},
            {"select": ["ts AS when"]},
        )
    )
    assert spec.table.partitioning[0].field == "when"


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        ({"name": "lake", "type": "rest", "uri": "catalog:8181"}, "starts with http:// or https://"),
        ({"name": "lake", "uri": "sqlite:////tmp/c.db"}, "needs a warehouse location"),
        ({"name": "lake", "uri": "mongodb://x", "warehouse": "/w"}, "is a database URL"),
        (
            {"name": "lake", "uri": "jdbc:postgresql://db/x?password=p", "warehouse": "/w"},
            "carries a password",
        ),
        (
            {"name": "lake", "type": "rest", "uri": "https://c", "properties": {"token": "t"}},
            "token looks secret; move it to secretProperties",
        ),
        (
            {"name": "lake", "type": "rest", "uri": "https://c", "secretProperties": {"token": "t"}},
            "inline secret",
        ),
        ({"name": "my-lake", "type": "rest", "uri": "https://c"}, "String should match pattern"),
    ],
)
def test_catalog_config_problems(catalog: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CatalogSpec.model_validate(catalog)


def test_valid_catalogs() -> None:
    sql = CatalogSpec.model_validate(
        {"name": "lake", "uri": "sqlite:////var/lib/icefall/catalog.db", "warehouse": "/var/lib/icefall/wh"}
    )
    assert sql.type.value == "sql"
    rest = CatalogSpec.model_validate(
        {
            "name": "lake",
            "type": "rest",
            "uri": "https://catalog:8181",
            "secretProperties": {"credential": {"secretKeyRef": {"name": "rest", "key": "credential"}}},
        }
    )
    assert rest.secret_properties["credential"].secret_key_ref is not None
