"""A JSON Schema object schema becomes the table's fields the way the JSON decoder reads its records.

Proves: properties in order, `required` (and that a nullable listed property stays optional), docs from
description/title; string formats (date-time, date, uuid), integer as long, number as double, booleans,
string enums; nullability by a type list and by oneOf/anyOf with null; arrays, nested objects as structs,
additionalProperties-only objects as maps; `$ref` to #/definitions and #/$defs; the Iceberg schema built
from the result; and that unions of several types, untyped properties, patternProperties-only objects,
foreign or recursive `$ref`s and non-object roots are refused with the field named. No registry here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from icefall.api import to_iceberg_schema
from icefall.api.json_schema import JsonSchemaError, fields_from_json_schema

pytestmark = pytest.mark.unit

ORDER: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer", "description": "Order id."},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "ts": {"type": "string", "format": "date-time"},
        "day": {"type": ["string", "null"], "format": "date"},
        "ref": {"type": "string", "format": "uuid"},
        "status": {"enum": ["NEW", "PAID"]},
        "note": {"oneOf": [{"type": "null"}, {"type": "string", "title": "A note"}]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": ["number", "null"]}},
        "customer": {"$ref": "#/definitions/Customer"},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "address": {"$ref": "#/$defs/Address"},
    },
    "required": ["id", "amount", "ts", "day", "status", "note", "tags", "customer"],
    "definitions": {
        "Customer": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "vip": {"type": "boolean"}},
            "required": ["id"],
        }
    },
    "$defs": {"Address": {"properties": {"city": {"type": "string"}}}},
}


def test_an_object_schema_becomes_fields_in_order_with_types_and_required() -> None:
    fields = fields_from_json_schema(json.dumps(ORDER))
    dumped = [f.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True) for f in fields]
    assert dumped == [
        {"name": "id", "type": "long", "required": True, "doc": "Order id."},
        {"name": "amount", "type": "double", "required": True},
        {"name": "paid", "type": "boolean"},
        {"name": "ts", "type": "timestamptz", "required": True},
        {"name": "day", "type": "date"},  # listed, but it admits null
        {"name": "ref", "type": "uuid"},
        {"name": "status", "type": "string", "required": True},
        {"name": "note", "type": "string", "doc": "A note"},
        {
            "name": "tags",
            "type": "list",
            "required": True,
            "element": {"type": "string"},
            "elementRequired": True,
        },
        {"name": "scores", "type": "list", "element": {"type": "double"}},
        {
            "name": "customer",
            "type": "struct",
            "required": True,
            "fields": [
                {"name": "id", "type": "string", "required": True},
                {"name": "vip", "type": "boolean"},
            ],
        },
        {
            "name": "attrs",
            "type": "map",
            "key": {"type": "string"},
            "value": {"type": "long"},
            "valueRequired": True,
        },
        {"name": "address", "type": "struct", "fields": [{"name": "city", "type": "string"}]},
    ]
    schema = to_iceberg_schema(fields)
    assert schema.find_field("customer.id").required and not schema.find_field("customer.vip").required
    assert str(schema.find_field("attrs").field_type).startswith("map<string, long>")


@pytest.mark.parametrize(
    ("prop", "message"),
    [
        ({"type": ["string", "integer"]}, "field 'bad': a union of 2 non-null types (string, integer)"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "field 'bad': oneOf of 2 non-null schemas"),
        ({}, "field 'bad': {} admits any value"),
        (True, "field 'bad': true admits any value"),
        ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties only"),
        ({"type": "object"}, "field 'bad': an object with no properties has no columns"),
        ({"$ref": "other.json#/X"}, "field 'bad': $ref 'other.json#/X' is not to #/definitions/"),
        ({"$ref": "#/definitions/Nope"}, "names no definition"),
        ({"$ref": "#/definitions/Node"}, "nests deeper than 8 levels"),
        ({"type": "array"}, "field 'bad': an array without items"),
        ({"type": "array", "items": {"type": ["string", "boolean"]}}, "field 'bad[]': a union of 2"),
        (
            {"type": "object", "properties": {"x": {"type": "null"}}},
            "field 'bad.x': type null holds no value",
        ),
        ({"allOf": [{"type": "string"}]}, "field 'bad': allOf is not supported"),
    ],
)
def test_what_cannot_map_is_refused_with_the_field_named(prop: Any, message: str) -> None:
    document = {
        "type": "object",
        "properties": {"ok": {"type": "string"}, "bad": prop},
        "definitions": {
            "Node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/Node"}}},
        },
    }
    with pytest.raises(JsonSchemaError) as raised:
        fields_from_json_schema(json.dumps(document))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "text", ["not json", "[1]", '{"type": "string"}', '{"type": "object"}', '{"properties": {}}']
)
def test_a_schema_that_is_not_an_object_with_properties_is_refused(text: str) -> None:
    with pytest.raises(JsonSchemaError, match=r"not (JSON|a JSON Schema object schema|an object schema)"):
        fields_from_json_schema(text)
