"""Avro records produced through a real schema registry land in an Iceberg table, and audit by content.

Proves, with the real broker, Spark (spark-avro), the embedded catalog and the test stack's schema registry
(Apicurio, Confluent-compatible API, BACKWARD compatibility):
- records serialized by confluent-kafka's `AvroSerializer` (which registers v1, then v2 adding an optional
  field: two writer schemas in one batch) are ingested by an `Ingestor` that gets its writer schemas from
  `spec.format.registry.url` through the real `WriterSchemas`; without an inline schema the table's columns
  come from the subject's latest schema (columns, required, docs, logical types);
- a wrong magic byte, an id the registry does not know and undecodable bytes are in the dead-letter table
  with their reasons; every produced offset is in exactly one of the two tables, and `icefall verify`'s
  audit (`verify_table`) agrees by content for the spec without an inline schema and for one with it;
- the registry stopped while records wait is an outage: ingestion retries, counts it in
  `icefall_ingest_outages_total{service="registry"}`, dead-letters nothing, and once the registry answers
  again every record lands exactly once.

Not proved here: the operator's view of a registry outage (the driver reports freshness, and the table
falls behind its target; no condition names the registry), keyed modes with Avro (test_avro_keyed.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.commands.verify import verify_table
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.ingest.engine import BatchReport
from icefall.runtime import metrics
from icefall.testing.streams import (
    assert_exactly_once,
    drain,
    registry_table,
    started_ingestor,
    table_offsets,
    watermarks,
)

pytestmark = pytest.mark.integration

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [
        {"name": "id", "type": "long", "doc": "Order id."},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    ],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
#: The columns the table gets from V2, as an inline schema.
INLINE_SCHEMA = """
    schema:
      - {name: id, type: long, required: true}
      - {name: amount, type: "decimal(10,2)", required: true}
      - {name: ts, type: timestamptz, required: true}
      - {name: status, type: string, required: true}
      - {name: note, type: string}
"""
NOT_AN_ID = 2**31 - 1  # an id no registry of this test stack hands out


def manifest(
    name: str, topic: str, kafka: KafkaBroker, registry_url: str, *, inline: bool = False
) -> StreamingTable:
    schema = INLINE_SCHEMA if inline else ""
    return registry_table(name, topic, kafka.bootstrap, registry_url, "avro", schema=schema)


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "amount": Decimal(f"{i}.50"), "ts": 1_780_000_000_000 + i, "status": "PAID", **extra}


def serialized_orders(registry_url: str, topic: str) -> list[bytes]:
    """Orders 0-4 by a v1 serializer, 5-9 by a v2 one (each registers its schema, as producers do)."""
    client = SchemaRegistryClient({"url": registry_url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(V1))
    v2 = AvroSerializer(client, json.dumps(V2))
    values = [v1(order(i), context) for i in range(5)]
    values += [v2(order(i, note=f"n{i}"), context) for i in range(5, 10)]
    assert all(values)
    return [v for v in values if v is not None]


def send(kafka: KafkaBroker, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(30) == 0


def schema_id(value: bytes) -> int:
    return int.from_bytes(value[1:5], "big")


def test_avro_through_the_registry_to_a_table_with_two_writer_schemas_and_dead_letters(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic = "it-avro-orders"
    kafka.create_topic(topic, partitions=1)
    values = serialized_orders(schema_registry.url, topic)
    assert schema_id(values[0]) != schema_id(values[5])  # two writer schemas in one batch
    values += [
        b"\x07" + values[0][1:],  # offset 10: wrong magic byte
        b"\x00" + NOT_AN_ID.to_bytes(4, "big") + values[0][5:],  # 11: an id the registry does not know
        values[0][:5] + b"\x01",  # 12: bytes that do not decode with v1
    ]
    send(kafka, topic, values)

    st = manifest("avro_orders", topic, kafka, schema_registry.url)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = drain(ingestor)
    assert sum(r.records_read for r in reports) == 13
    assert sum(r.records_dead_lettered for r in reports) == 3

    catalog = catalog_config.pyiceberg()
    table = catalog.load_table("it.avro_orders")
    schema = table.schema()
    assert [f.name for f in schema.fields][5:] == ["_kafka"]
    assert [(f.name, str(f.field_type), f.required) for f in schema.fields[:5]] == [
        ("id", "long", True),
        ("amount", "decimal(10, 2)", True),
        ("ts", "timestamptz", True),
        ("status", "string", True),
        ("note", "string", False),
    ]
    assert schema.find_field("id").doc == "Order id."
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["amount"], r["status"], r["note"]) for r in rows] == [
        (i, Decimal(f"{i}.50"), "PAID", None if i < 5 else f"n{i}") for i in range(10)
    ]
    assert rows[0]["ts"].timestamp() * 1000 == 1_780_000_000_000

    dead = catalog.load_table("it.avro_orders_dlq").scan().to_arrow().to_pylist()
    assert {r["offset"]: r["error"] for r in dead} == {
        10: "wrong magic byte 0x07: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)",
        11: f"unknown schema id {NOT_AN_ID} (the registry has no Avro schema with this id)",
        12: f"bytes do not decode as Avro with writer schema id {schema_id(values[0])}",
    }

    # `icefall verify` decodes the records as ingestion did: by content, without and with an inline schema.
    report = assert_exactly_once(
        catalog_config,
        "avro_orders",
        watermarks(kafka, topic),
        {(0, 10), (0, 11), (0, 12)},
        bootstrap=kafka.bootstrap,
        spark=spark,
        st=st,
    )
    assert report is not None and report.content_checked
    inline = manifest("avro_orders", topic, kafka, schema_registry.url, inline=True)
    report = verify_table(inline, catalog_config, spark=spark)
    assert report.ok and report.content_checked, report.render()


def test_a_registry_outage_is_waited_out_without_dead_letters(
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A registry of its own: stopping the session's would empty it (its storage is in memory)."""
    registry = SchemaRegistryServer(tmp_path / "registry").start()
    try:
        with caplog.at_level(logging.WARNING, logger="icefall.ingest.outages"):
            _outage(kafka, registry, spark, catalog_config, tmp_path)
    finally:
        registry.stop()
    lines = [r for r in caplog.records if r.name == "icefall.ingest.outages"]
    # The first thing asked: the subject's latest schema, before the first batch (no job reads its ids).
    subject = "'it-avro-registry-outage-value'"
    where = f"cannot reach the schema registry at {registry.url} (the latest version of subject {subject}"
    assert lines and all(r.exc_info is None for r in lines)
    assert where in lines[0].getMessage() and "answers again" in lines[-1].getMessage()


def _outage(
    kafka: KafkaBroker,
    registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic = "it-avro-registry-outage"
    kafka.create_topic(topic, partitions=1)
    # An inline schema: the table is made without asking the registry, which is down when ingestion starts.
    st = manifest("avro_registry_outage", topic, kafka, registry.url, inline=True)
    send(kafka, topic, serialized_orders(registry.url, topic))
    registry.stop()
    label = ("it.avro_registry_outage", "registry")
    outages_before = metrics.OUTAGES.labels(*label)._value.get()
    retries_before = metrics.UNAVAILABLE_RETRIES.labels(*label)._value.get()
    stop = threading.Event()
    failed: list[BaseException] = []
    landed: list[BatchReport] = []

    def ingest() -> None:
        try:
            with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
                ingestor.run(stop.is_set, lambda report: landed.append(report) if report else None)
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=ingest, name="ingest")
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while metrics.UNAVAILABLE_RETRIES.labels(*label)._value.get() < retries_before + 2:
            assert not failed, failed
            assert time.monotonic() < deadline, "no registry outage seen in 90 s"
            time.sleep(0.2)
        assert metrics.UNAVAILABLE.labels(*label)._value.get() == 1
        assert not landed
        # Back, empty (in-memory storage): the same registrations in the same order give the same ids.
        registry.start()
        client = SchemaRegistryClient({"url": registry.url})
        for schema in (V1, V2):
            client.register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))
        high = watermarks(kafka, topic)
        deadline = time.monotonic() + 120
        while not landed or landed[-1].offsets != high:
            assert not failed, failed
            assert time.monotonic() < deadline, f"not caught up after the outage: {landed}"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(120)
    assert not failed, failed
    assert metrics.OUTAGES.labels(*label)._value.get() == outages_before + 1
    assert metrics.UNAVAILABLE.labels(*label)._value.get() == 0
    main, dead = table_offsets(catalog_config, "avro_registry_outage")
    assert not dead and sum(main.values()) == 10
    assert_exactly_once(catalog_config, "avro_registry_outage", high, set())
