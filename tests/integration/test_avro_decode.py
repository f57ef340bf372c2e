"""Confluent-framed Avro decodes in Spark with spark-avro's `from_avro`, one writer schema per schema id.

Proves, on the real Spark session with the spark-avro jar the project fetches and the test stack's schema
registry: records serialized by confluent-kafka's `AvroSerializer` (which registers their schemas) decode
into the table's columns by content, logical types included, with the writer schemas the real
`WriterSchemas.lookup` fetches by id, each batch asking once for the ids it holds; one batch holding two
writer schema versions (the later one adds an optional field) decodes each record with its own writer
schema, projected onto the table's fields; a wrong magic byte, an id the registry does not know, bytes
that do not decode, a value too short for the header and a missing required field go to the dead-letter
rows with their precise reasons.

Not proved here: ingestion end to end and the registry going away (test_avro_ingest.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

from icefall.api import StreamingTableSpec, load_manifest
from icefall.decode.decode import DEAD_LETTER_COLUMNS, KAFKA_COLUMN, Decoder, split
from icefall.devstack.registry import SchemaRegistryServer
from icefall.kafka.registry import WriterSchemas
from icefall.testing.streams import kafka_source_frame

pytestmark = pytest.mark.integration

PRODUCED = datetime(2026, 3, 1, 12, 0, 0)

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}],
}

TABLE_SCHEMA = """
      - {name: id, type: long, required: true}
      - {name: amount, type: "decimal(10,2)"}
      - {name: ts, type: timestamptz}
      - {name: day, type: date}
      - {name: ref, type: uuid}
      - {name: status, type: string}
      - {name: note, type: string}
      - {name: coupon, type: string}
"""


NOT_AN_ID = 2**31 - 1  # an id the registry does not hand out


def make_spec(registry_url: str) -> StreamingTableSpec:
    manifest = f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "localhost:9092", topic: orders}}
  format:
    type: avro
    registry: {{url: "{registry_url}"}}
    schema:
{TABLE_SCHEMA}
  deadLetter: {{maxRecordBytes: 1000}}
"""
    return load_manifest(manifest).spec


class Registry:
    """The test stack's registry: records serialized by `AvroSerializer` (registering their schema under
    `<topic>-value`), and the decoder's lookup, the real `WriterSchemas.lookup`, recording the ids asked."""

    def __init__(self, server: SchemaRegistryServer, spec: StreamingTableSpec) -> None:
        assert spec.format.registry is not None
        self.client = SchemaRegistryClient({"url": server.url})
        self.writer_schemas = WriterSchemas(spec.format.registry)
        self.asked: list[list[int]] = []

    def serialize(self, topic: str, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
        value = AvroSerializer(self.client, json.dumps(schema))(
            record, SerializationContext(topic, MessageField.VALUE)
        )
        assert value is not None
        return value

    def __call__(self, ids: Iterable[int]) -> dict[int, str | None]:
        wanted = list(ids)
        self.asked.append(wanted)
        return self.writer_schemas.lookup(wanted)


def schema_id(value: bytes) -> int:
    return int.from_bytes(value[1:5], "big")


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i,
        "amount": Decimal(f"{i}.25"),
        "ts": datetime(2026, 3, 1, 10, i, 0, tzinfo=UTC),
        "day": date(2026, 3, i),
        "ref": str(uuid.UUID(int=i)),
        "status": "PAID" if i % 2 else "NEW",
        "note": None if i % 2 else f"note {i}",
        **extra,
    }


def decode_batch(
    spark: SparkSession, spec: StreamingTableSpec, values: list[bytes], registry: Registry
) -> tuple[list[Any], list[Any]]:
    decoded = Decoder(spec, schemas=registry).decode(kafka_source_frame(spark, values, produced=PRODUCED))
    prepared = split(decoded, spec)
    good = sorted(prepared.good.collect(), key=lambda r: r[KAFKA_COLUMN]["offset"])
    bad = sorted(prepared.bad.collect(), key=lambda r: r["offset"])
    return good, bad


@pytest.fixture
def spec(schema_registry: SchemaRegistryServer) -> StreamingTableSpec:
    return make_spec(schema_registry.url)


@pytest.fixture
def registry(schema_registry: SchemaRegistryServer, spec: StreamingTableSpec) -> Registry:
    return Registry(schema_registry, spec)


def test_avro_records_decode_by_content_with_logical_types(
    spark: SparkSession, spec: StreamingTableSpec, registry: Registry
) -> None:
    values = [registry.serialize("it-avro-decode-types", V1, order(i)) for i in (1, 2)]
    good, bad = decode_batch(spark, spec, values, registry)
    assert bad == []
    assert registry.asked == [[schema_id(values[0])]]
    rows = [{k: v for k, v in r.asDict().items() if k != KAFKA_COLUMN} for r in good]
    assert rows == [
        {
            "id": i,
            "amount": Decimal(f"{i}.25"),
            "ts": datetime(2026, 3, 1, 10, i, 0),  # the session's time zone is UTC
            "day": date(2026, 3, i),
            "ref": str(uuid.UUID(int=i)),
            "status": "PAID" if i % 2 else "NEW",
            "note": None if i % 2 else f"note {i}",
            "coupon": None,
        }
        for i in (1, 2)
    ]
    assert [r[KAFKA_COLUMN]["offset"] for r in good] == [0, 1]


def test_a_batch_with_two_schema_versions_reads_each_record_with_its_writer_schema(
    spark: SparkSession, spec: StreamingTableSpec, registry: Registry
) -> None:
    topic = "it-avro-decode-versions"
    values = [
        registry.serialize(topic, V1, order(1)),
        registry.serialize(topic, V2, order(2, coupon="SPRING")),
        registry.serialize(topic, V1, order(3)),
        registry.serialize(topic, V2, order(4, coupon=None)),
    ]
    v1, v2 = schema_id(values[0]), schema_id(values[1])
    assert v1 != v2 and schema_id(values[2]) == v1
    good, bad = decode_batch(spark, spec, values, registry)
    assert bad == []
    assert registry.asked == [sorted([v1, v2])]
    assert [(r["id"], r["coupon"], r["amount"]) for r in good] == [
        (1, None, Decimal("1.25")),
        (2, "SPRING", Decimal("2.25")),
        (3, None, Decimal("3.25")),
        (4, None, Decimal("4.25")),
    ]


def test_bad_records_are_dead_lettered_with_precise_reasons(
    spark: SparkSession, spec: StreamingTableSpec, registry: Registry
) -> None:
    no_id: dict[str, Any] = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "id"]}
    good_record = registry.serialize("it-avro-decode-bad", V1, order(1))
    no_id_record = registry.serialize(
        "it-avro-decode-bad-no-id", no_id, {k: v for k, v in order(5).items() if k != "id"}
    )
    v1 = schema_id(good_record)
    values = [
        good_record,  # 0: good
        b"\x01" + good_record[1:],  # 1: wrong magic byte
        b"\x00" + NOT_AN_ID.to_bytes(4, "big") + good_record[5:],  # 2: an id the registry does not know
        good_record[:5] + b"\xff\xff\xff",  # 3: bytes that do not decode
        b"\x00\x00",  # 4: too short for the header
        no_id_record,  # 5: the writer has no required field id
        b"{" + b"x" * 1200,  # 6: over maxRecordBytes
    ]
    good, bad = decode_batch(spark, spec, values, registry)
    assert [r["id"] for r in good] == [1]
    assert list(bad[0].asDict()) == list(DEAD_LETTER_COLUMNS)
    reasons = {r["offset"]: r["error"] for r in bad}
    assert reasons == {
        1: "wrong magic byte 0x01: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)",
        2: f"unknown schema id {NOT_AN_ID} (the registry has no Avro schema with this id)",
        3: f"bytes do not decode as Avro with writer schema id {v1}",
        4: "too short for the Confluent wire format: 2 bytes "
        "(a magic byte and a 4-byte schema id come first)",
        5: "required field 'id' is missing or null, and writer schema id "
        f"{schema_id(no_id_record)} has no such field",
        6: "record is 1201 bytes, over the limit of 1000 (spec.deadLetter.maxRecordBytes)",
    }
    assert sorted(registry.asked[0]) == sorted([v1, schema_id(no_id_record), NOT_AN_ID])
    assert bad[0]["value"] == values[1]
    assert bad[0]["key"] == b"k1"


def test_a_writer_value_that_does_not_fit_the_table_type_is_named(
    spark: SparkSession, spec: StreamingTableSpec, registry: Registry
) -> None:
    wide: dict[str, Any] = {
        **V1,
        "fields": [{"name": "id", "type": "string"} if f["name"] == "id" else f for f in V1["fields"]],
    }
    value = registry.serialize("it-avro-decode-wide", wide, order(1, id="not-a-number"))
    good, bad = decode_batch(spark, spec, [value], registry)
    assert good == []
    assert [r["error"] for r in bad] == ["field 'id': the writer's value does not fit long"]
