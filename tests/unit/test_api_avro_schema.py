"""An Avro record schema becomes the table's fields the way spark-avro reads it.

Proves: names, docs, required vs union-with-null; logical types (decimal, date, timestamp-millis/micros,
local-timestamp, uuid), enums as strings, fixed, bytes, nested records, arrays and maps; the Iceberg schema
built from the result; and that unions of several types, time-millis and non-records are refused with the
field named. A Debezium envelope's row record (a reference resolved) gives a cdc table's columns. Does not
prove the registry answers (no registry runs here).
"""

from __future__ import annotations

import json

import pytest

from icefall.api import to_iceberg_schema
from icefall.api.avro import AvroSchemaError, fields_from_avro, row_schema

pytestmark = pytest.mark.unit

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [
        {"name": "id", "type": "long", "doc": "Order id."},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "seen",
            "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
            "default": None,
        },
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 16}},
        {"name": "blob", "type": ["null", "bytes"], "default": None},
        {
            "name": "customer",
            "type": {"type": "record", "name": "Customer", "fields": [{"name": "name", "type": "string"}]},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
    ],
}


def test_order_schema_maps_field_by_field() -> None:
    fields = fields_from_avro(json.dumps(ORDER))
    assert [(f.name, f.type, f.required) for f in fields] == [
        ("id", "long", True),
        ("amount", "decimal(12,2)", True),
        ("ts", "timestamptz", True),
        ("seen", "timestamptz", False),
        ("local", "timestamp", True),
        ("day", "date", True),
        ("ref", "uuid", True),
        ("status", "string", True),
        ("hash", "fixed[16]", True),
        ("blob", "binary", False),
        ("customer", "struct", True),
        ("tags", "list", True),
        ("attrs", "map", True),
    ]
    assert fields[0].doc == "Order id."
    assert fields[10].fields is not None and fields[10].fields[0].name == "name"
    assert (
        fields[11].element is not None and fields[11].element.type == "string" and fields[11].element_required
    )
    assert (
        fields[12].value is not None and fields[12].value.type == "double" and not fields[12].value_required
    )
    schema = to_iceberg_schema(fields)
    assert schema.find_field("id").required
    assert not schema.find_field("seen").required


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"name": "x", "type": ["null", "string", "long"]}, "field 'x': a union of 2 non-null types"),
        ({"name": "t", "type": {"type": "int", "logicalType": "time-millis"}}, "field 't': time-millis"),
        ({"name": "n", "type": "null"}, "field 'n': type null holds no value"),
        ({"name": "r", "type": "com.shop.Other"}, "field 'r': type 'com.shop.Other' is a named reference"),
    ],
)
def test_unmappable_fields_are_named(field: dict[str, object], message: str) -> None:
    with pytest.raises(AvroSchemaError, match=message.replace("[", r"\[").replace("(", r"\(")):
        fields_from_avro(json.dumps({"type": "record", "name": "R", "fields": [field]}))


def test_a_non_record_is_refused() -> None:
    with pytest.raises(AvroSchemaError, match="not an Avro record"):
        fields_from_avro('"string"')


def test_an_avro_spec_without_schema_takes_the_latest_registry_schema() -> None:
    from icefall.api import parse_manifest
    from icefall.kafka.registry import with_registry_schema

    st = parse_manifest(
        """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "kafka:9092", topic: orders}
  format: {type: avro, registry: {url: "http://registry:8081"}}
  table: {name: orders, namespace: shop, partitioning: [{field: ts, transform: day}]}
"""
    )
    asked: list[str] = []

    def latest(topic: str) -> str:
        asked.append(topic)
        return json.dumps(ORDER)

    filled = with_registry_schema(st, latest)
    assert asked == ["orders"]
    assert [f.name for f in filled.spec.format.schema_fields] == [f["name"] for f in ORDER["fields"]]
    assert filled.spec.table.partitioning[0].field == "ts"
    assert with_registry_schema(filled, latest) is filled  # an inline schema is kept


#: A Debezium envelope as its AvroConverter registers it: the row record defined in `before`, named again
#: by `after` (a reference), then source, op and ts_ms.
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "dbserver1.shop.orders",
    "fields": [
        {
            "name": "before",
            "type": ["null", {"type": "record", "name": "Value", "fields": ORDER["fields"]}],
            "default": None,
        },
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {"type": "record", "name": "Source", "fields": [{"name": "lsn", "type": "long"}]},
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def test_the_row_of_a_debezium_envelope_is_its_after_record() -> None:
    envelope = json.loads(json.dumps(ENVELOPE))
    row = json.loads(row_schema(json.dumps(envelope)))
    assert row["name"] == "Value"
    assert fields_from_avro(json.dumps(row)) == fields_from_avro(json.dumps(ORDER))
    # The full name resolves too, and an after record defined inline is taken as it is.
    envelope["fields"][1]["type"] = ["null", "dbserver1.shop.orders.Value"]
    assert json.loads(row_schema(json.dumps(envelope)))["name"] == "Value"
    with pytest.raises(AvroSchemaError, match="not a Debezium change event envelope"):
        row_schema(json.dumps(ORDER))


def test_a_cdc_spec_without_schema_takes_the_columns_of_the_envelopes_row() -> None:
    from icefall.api import parse_manifest
    from icefall.kafka.registry import with_registry_schema

    st = parse_manifest(
        """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "kafka:9092", topic: orders}
  format: {type: avro, registry: {url: "http://registry:8081"}}
  table: {name: orders, namespace: shop}
  mode: cdc
  key: [id]
  sequenceBy: [source.lsn]
"""
    )
    envelope = json.loads(json.dumps(ENVELOPE))
    filled = with_registry_schema(st, lambda topic: json.dumps(envelope))
    assert [f.name for f in filled.spec.format.schema_fields] == [f["name"] for f in ORDER["fields"]]
    # The key is checked once the columns are known: a key the row lacks is refused as in the spec.
    missing = json.loads(json.dumps(envelope))
    missing["fields"][0]["type"][1]["fields"] = ORDER["fields"][1:]
    with pytest.raises(Exception, match="'id' is not a top-level field"):
        with_registry_schema(st, lambda topic: json.dumps(missing))
