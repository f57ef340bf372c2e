"""JSON Schema records produced through a real schema registry land in an Iceberg table, and audit by content.

Proves, with the real broker, Spark, the embedded catalog and the test stack's schema registry (Apicurio,
Confluent-compatible API): records serialized by confluent-kafka's `JSONSerializer` (magic byte, schema id,
JSON text) are ingested by an `Ingestor` whose table columns come from the subject's latest JSON Schema
(types, formats, required, `$ref`, docs); a wrong magic byte, an id the registry does not know, an id
whose schema is Avro, text that is not JSON after the header and a record without a required field are in
the dead-letter table with their reasons; a later writer schema that adds a property adds the column
(schema evolution) and its records land with it; every produced offset is in exactly one of the two
tables, and `icefall verify`'s audit agrees by content.

Not proved here: keyed modes with JSON Schema (refused by the spec), a registry outage (the same
`WriterSchemas` as Avro: test_avro_ingest.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.testing.streams import assert_exactly_once, drain, registry_table, started_ingestor, watermarks

pytestmark = pytest.mark.integration

V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer", "description": "Order id."},
        "amount": {"type": "number"},
        "ts": {"type": "string", "format": "date-time"},
        "status": {"type": "string", "enum": ["NEW", "PAID"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "customer": {"$ref": "#/definitions/Customer"},
    },
    "required": ["id", "amount", "ts", "status"],
    # A closed content model: adding an optional property is then a backward-compatible change.
    "additionalProperties": False,
    "definitions": {
        "Customer": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "vip": {"type": "boolean"}},
            "required": ["id"],
        }
    },
}
V2: dict[str, Any] = {**V1, "properties": {**V1["properties"], "note": {"type": ["string", "null"]}}}
NOT_AN_ID = 2**31 - 1  # an id no registry of this test stack hands out
BASE_TS = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)


def manifest(name: str, topic: str, kafka: KafkaBroker, registry_url: str) -> StreamingTable:
    return registry_table(name, topic, kafka.bootstrap, registry_url, "jsonSchema")


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i,
        "amount": i + 0.5,
        "ts": BASE_TS.replace(minute=i).isoformat().replace("+00:00", "Z"),
        "status": "PAID",
        "tags": [f"t{i}"],
        "customer": {"id": f"c{i}", "vip": i % 2 == 0},
        **extra,
    }


def send(kafka: KafkaBroker, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(30) == 0


def schema_id(value: bytes) -> int:
    return int.from_bytes(value[1:5], "big")


def test_json_schema_records_through_the_registry_with_evolution_and_dead_letters(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic = "it-jsonschema-orders"
    kafka.create_topic(topic, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = JSONSerializer(json.dumps(V1), client)
    first: list[bytes] = [v for v in (v1(order(i), context) for i in range(5)) if v is not None]
    avro_id = client.register_schema(
        f"{topic}-avro-value",
        Schema(
            json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "long"}]}), "AVRO"
        ),
    )
    header = first[0][:5]
    bad = [
        b"\x07" + first[0][1:],  # offset 5: wrong magic byte
        b"\x00" + NOT_AN_ID.to_bytes(4, "big") + first[0][5:],  # 6: an id the registry does not know
        b"\x00" + avro_id.to_bytes(4, "big") + first[0][5:],  # 7: an id of an Avro schema
        header + b'{"id": 1, "amount":',  # 8: not JSON after the header
        header + json.dumps({k: v for k, v in order(9).items() if k != "id"}).encode(),  # 9: no id
        b"\x00\x00",  # 10: too short for the header
    ]
    send(kafka, topic, first + bad)

    st = manifest("jsonschema_orders", topic, kafka, schema_registry.url)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = drain(ingestor)
        assert sum(r.records_read for r in reports) == 11
        catalog = catalog_config.pyiceberg()
        schema = catalog.load_table("it.jsonschema_orders").schema()
        assert [(f.name, str(f.field_type), f.required) for f in schema.fields[:5]] == [
            ("id", "long", True),
            ("amount", "double", True),
            ("ts", "timestamptz", True),
            ("status", "string", True),
            ("tags", "list<string>", False),
        ]
        assert schema.find_field("id").doc == "Order id."
        assert schema.find_field("customer.id").required
        assert "note" not in [f.name for f in schema.fields]

        # A writer schema that adds a property: the table follows it in the batch that first carries it.
        v2 = JSONSerializer(json.dumps(V2), client)
        second = [v2(order(i, note=f"n{i}"), context) for i in range(11, 14)]
        send(kafka, topic, [v for v in second if v is not None])
        drain(ingestor)
    assert schema_id(second[0] or b"") != schema_id(first[0])

    table = catalog.load_table("it.jsonschema_orders")
    assert table.schema().find_field("note").required is False
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    expected = [order(i) for i in range(5)] + [order(i, note=f"n{i}") for i in range(11, 14)]
    assert [
        {
            **{k: r[k] for k in ("id", "amount", "status", "tags", "customer", "note")},
            "ts": r["ts"].isoformat(),
        }
        for r in rows
    ] == [
        {
            **{k: o[k] for k in ("id", "amount", "status", "tags", "customer")},
            "note": o.get("note"),
            "ts": datetime.fromisoformat(o["ts"]).isoformat(),
        }
        for o in expected
    ]

    dead = catalog.load_table("it.jsonschema_orders_dlq").scan().to_arrow().to_pylist()
    magic = "not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)"
    assert {r["offset"]: r["error"] for r in dead} == {
        5: f"wrong magic byte 0x07: {magic}",
        6: f"unknown schema id {NOT_AN_ID} (the registry has no JSON Schema with this id)",
        7: f"unknown schema id {avro_id} (the registry has no JSON Schema with this id)",
        8: """malformed JSON: '{"id": 1, "amount":'""",
        9: "required field 'id' is missing or null",
        10: "too short for the Confluent wire format: 2 bytes (a magic byte and a 4-byte schema id come "
        "first)",
    }

    # `icefall verify` decodes the records as ingestion did, by content.
    report = assert_exactly_once(
        catalog_config,
        "jsonschema_orders",
        watermarks(kafka, topic),
        {(0, o) for o in range(5, 11)},
        bootstrap=kafka.bootstrap,
        spark=spark,
        st=st,
    )
    assert report is not None and report.content_checked
