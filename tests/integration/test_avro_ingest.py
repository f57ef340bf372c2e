"""Avro records from a real Kafka topic land in an Iceberg table whose columns come from the Avro schema.

Proves, with the real broker, Spark (spark-avro) and the embedded catalog: an avro StreamingTable without an
inline schema creates its table from the subject's latest schema (columns, required, docs, logical types);
Confluent-framed records of two writer schema versions in one topic are ingested by content; a wrong magic
byte, an unknown schema id and undecodable bytes are in the dead-letter table with their reasons; every
produced offset is in exactly one of the two tables.

Not proved here: a registry server. None installs from the package registries this project reaches (see
the branch's report), so the writer schemas are given to the `Ingestor` as `Registry` answers (by id, and
the latest per topic) from the schemas this test frames its records with; the registry client itself
(`icefall.kafka.registry.WriterSchemas`) is not exercised.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.testing.streams import drain

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
LATEST = V2


class GivenSchemas:
    """The answers a registry holding V1 (id 1) and V2 (id 2) gives; see the module docstring."""

    def __init__(self) -> None:
        self.by_id = {1: json.dumps(V1), 2: json.dumps(V2)}

    def lookup(self, ids: Iterable[int]) -> dict[int, str | None]:
        return {i: self.by_id.get(i) for i in ids}

    def latest_schema(self, topic: str) -> str:
        return json.dumps(LATEST)


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def order(i: int) -> dict[str, Any]:
    return {"id": i, "amount": Decimal(f"{i}.50"), "ts": 1_780_000_000_000 + i, "status": "PAID"}


def test_avro_topic_to_table_with_two_schema_versions_and_dead_letters(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-avro-orders"
    kafka.create_topic(topic, partitions=1)
    values = [framed(1, V1, order(i)) for i in range(5)]
    values += [framed(2, V2, {**order(i), "note": f"n{i}"}) for i in range(5, 10)]
    values += [
        b"\x07" + values[0][1:],  # offset 10: wrong magic byte
        b"\x00" + (99).to_bytes(4, "big") + values[0][5:],  # 11: unknown schema id
        b"\x00" + (1).to_bytes(4, "big") + b"\x01",  # 12: bytes that do not decode
    ]
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for value in values:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(30) == 0

    st = load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: avro-orders}}
spec:
  source: {{bootstrapServers: "{kafka.bootstrap}", topic: {topic}}}
  format: {{type: avro, registry: {{url: "http://127.0.0.1:1"}}}}
  table: {{namespace: it, name: avro_orders, partitioning: [{{field: ts, transform: day}}]}}
  freshness: {{targetSeconds: 2}}
"""
    )
    ingestor = Ingestor(
        st, catalog_config, spark, FileLease(tmp_path / "lease.json", "w"), registry=GivenSchemas()
    )
    ingestor.start(lease_timeout=10)
    try:
        reports = drain(ingestor)
    finally:
        ingestor.close()
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
        11: "unknown schema id 99 (the registry has no Avro schema with this id)",
        12: "bytes do not decode as Avro with writer schema id 1",
    }
