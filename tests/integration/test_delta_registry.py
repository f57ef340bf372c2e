"""Delta Lake tables (`spec.table.format: delta`) of registry formats: Avro, Protobuf and JSON Schema records
produced through the test stack's schema registry (Apicurio, Confluent-compatible API, BACKWARD) by
confluent-kafka's serializers, ingested by a `DeltaIngestor` with the real `WriterSchemas`.

Proves: without an inline schema the table's columns are the subject's latest schema when the writer starts
(Avro: required, decimal, timestamp, enum as string); a producer's v2 writer schema with a new optional
field, registered while the writer runs, adds the column in the log entry of the batch that first holds
its records (that batch written again with it before anything is committed: one version more), old rows
null in it, new rows with their values, read by delta-rs and by Spark's Delta reader alike; a wrong magic
byte, an unknown schema id and undecodable bytes are in the Delta dead-letter table with their reasons;
`icefall verify` audits the table and its dead-letter table clean by content; a writer schema whose field
changes type (registered under another subject) is refused naming the field, the writer schema and the fix,
nothing of its batch committed. Protobuf (.proto text registered by hand) and JSON Schema: the columns
from the subject, a v2 adding an optional field followed, `icefall verify` clean.

Not proved here: keyed (upsert, cdc) Delta tables of a registry format; a registry outage during a Delta
table's batch (the same `WriterSchemas` and outage handling as Iceberg's: test_avro_ingest.py);
`icefall run` of such a table (the same `DeltaIngestor`); Protobuf and JSON Schema dead letters (their
decoders are the Iceberg path's: test_protobuf_ingest.py, test_jsonschema_ingest.py).
"""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyspark.sql import SparkSession

from icefall.api import StreamingTable
from icefall.api.manifest import parse_manifest
from icefall.catalog.delta_schema import DeltaSchemaRefusedError
from icefall.commands.delta import verify_delta_table
from icefall.commit.delta import DeltaLog
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.ingest.delta_sink import DeltaIngestor
from icefall.kafka.protobuf import descriptor_set_text
from icefall.testing.delta import delta_manifest, drain, plain, read_with_sparks_delta_reader, start_writer
from icefall.testing.streams import watermarks

pytestmark = pytest.mark.integration

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    ],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
#: amount changes type: BACKWARD refuses it under the topic's subject, so it goes under another one.
V3: dict[str, Any] = {**V1, "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "string"}]}
NOT_AN_ID = 2**31 - 1  # an id no registry of this test stack hands out
TS_MS = 1_780_000_000_000


class Table:
    """A Delta table of a registry format on a new one-partition topic, and its writers."""

    def __init__(
        self, kafka: KafkaBroker, registry: SchemaRegistryServer, tmp_path: Path, name: str, format_type: str
    ) -> None:
        self.kafka, self.topic = kafka, f"it-delta-{name}"
        kafka.create_topic(self.topic, partitions=1)
        self.location = str(tmp_path / name)
        self.dead_letters = str(tmp_path / f"{name}_dlq")
        self.state = tmp_path / "state"
        self.st: StreamingTable = parse_manifest(
            delta_manifest(
                name,
                kafka.bootstrap,
                self.topic,
                self.location,
                max_records=100,
                format_lines=f'  format: {{type: {format_type}, registry: {{url: "{registry.url}"}}}}',
            )
        )
        self.client = SchemaRegistryClient({"url": registry.url})
        self.context = SerializationContext(self.topic, MessageField.VALUE)
        self.writers = 0

    def writer(self, spark: SparkSession) -> DeltaIngestor:
        self.writers += 1
        return start_writer(self.st, spark, self.location, self.state / "leases", f"writer-{self.writers}")

    def send(self, values: list[bytes | None]) -> None:
        producer = Producer({"bootstrap.servers": self.kafka.bootstrap, "enable.idempotence": True})
        for value in values:
            assert value is not None
            producer.produce(self.topic, value=value, key=b"k")
        assert producer.flush(30) == 0

    def schema(self) -> list[tuple[str, Any, bool]]:
        schema = json.loads(DeltaLog(self.location).snapshot().schema_string or "{}")
        return [(f["name"], f["type"], f["nullable"]) for f in schema["fields"]]

    def rows(self) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        return sorted(DeltaTable(self.location).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])

    def verify_clean(self, spark: SparkSession, *, dead: int = 0) -> None:
        report = verify_delta_table(self.st, self.state, spark=spark)
        assert report.ok and report.content_checked, report.render()
        assert sum(p.in_dlq for p in report.partitions) == dead, report.render()
        assert DeltaLog(self.location).snapshot().committed.offsets == watermarks(self.kafka, self.topic)


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "amount": Decimal(f"{i}.50"), "ts": TS_MS + i, "status": "PAID", **extra}


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def schema_change_kinds(location: str, column: str) -> tuple[int, set[str]]:
    """The version whose log entry first holds `column`, and the kinds of action in it."""
    log = DeltaLog(location)
    for version in range(log.latest_version() + 1):
        actions = log.actions(version)
        if any(f'"{column}"' in a.get("metaData", {}).get("schemaString", "") for a in actions):
            return version, {next(iter(a)) for a in actions}
    raise AssertionError(f"no log entry holds the column {column}")


def test_avro_writer_schemas_evolve_a_delta_table_in_the_batch_that_carries_them(
    kafka: KafkaBroker, schema_registry: SchemaRegistryServer, spark: SparkSession, tmp_path: Path
) -> None:
    table = Table(kafka, schema_registry, tmp_path, "avro", "avro")
    v1 = AvroSerializer(table.client, json.dumps(V1))
    first = [v1(order(i), table.context) for i in range(5)]  # registers v1: the table is made from it
    v1_id = int.from_bytes((first[0] or b"")[1:5], "big")
    table.send(
        [
            *first,
            b"\x07" + (first[0] or b"")[1:],  # offset 5: wrong magic byte
            b"\x00" + NOT_AN_ID.to_bytes(4, "big") + (first[0] or b"")[5:],  # 6: an unknown id
            (first[0] or b"")[:5] + b"\x01",  # 7: bytes that do not decode with v1
        ]
    )
    writer = table.writer(spark)
    try:
        # (Nullable, as every Delta table Icefall makes: the required fields are checked as records decode.)
        assert [(name, kind) for name, kind, _ in table.schema()[:4]] == [
            ("id", "long"),
            ("amount", "decimal(10,2)"),
            ("ts", "timestamp"),
            ("status", "string"),
        ]
        assert [name for name, _, _ in table.schema()[4:]] == ["_kafka"]
        [report] = drain(writer)
        assert (report.records_written, report.records_dead_lettered) == (5, 3)

        # A producer's v2 adds an optional field: registered now, met by the writer in the next batch.
        v2 = AvroSerializer(table.client, json.dumps(V2))
        table.send([v2(order(i, note=f"n{i}"), table.context) for i in range(8, 11)])
        before = DeltaLog(table.location).latest_version()
        [report] = drain(writer)
        assert report.records_written == 3
    finally:
        writer.close()
    assert [name for name, _, _ in table.schema()] == ["id", "amount", "ts", "status", "note", "_kafka"]
    assert ("note", "string", True) in table.schema()
    # Written twice (the first write decoded v2's records as an unknown id), committed once: the column,
    # the rows that first fill it and their offsets in one log entry.
    assert schema_change_kinds(table.location, "note") == (before + 1, {"commitInfo", "metaData", "add"})
    assert DeltaLog(table.location).latest_version() == before + 1

    rows = table.rows()
    assert [(r["id"], r["amount"], r["status"], r["note"]) for r in rows] == [
        (i, Decimal(f"{i}.50"), "PAID", None if i < 5 else f"n{i}") for i in [*range(5), *range(8, 11)]
    ]
    assert rows[0]["ts"].timestamp() * 1000 == TS_MS
    by_spark = read_with_sparks_delta_reader(table.location, tmp_path / "by-spark")
    assert sorted((plain(r) for r in by_spark), key=lambda r: r["id"]) == [plain(r) for r in rows]

    from deltalake import DeltaTable

    dead = DeltaTable(table.dead_letters).to_pyarrow_table().to_pylist()
    assert {r["offset"]: r["error"] for r in dead} == {
        5: "wrong magic byte 0x07: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)",
        6: f"unknown schema id {NOT_AN_ID} (the registry has no Avro schema with this id)",
        7: f"bytes do not decode as Avro with writer schema id {v1_id}",
    }
    table.verify_clean(spark, dead=3)

    # A writer schema whose field changes type: refused naming it and the fix, nothing committed.
    v3_id = table.client.register_schema(f"{table.topic}-legacy", Schema(json.dumps(V3), "AVRO"))
    table.send([framed(v3_id, V3, {"id": 11, "amount": "7"})])
    committed = DeltaLog(table.location).snapshot()
    writer = table.writer(spark)
    try:
        with pytest.raises(DeltaSchemaRefusedError) as refused:
            writer.run_batch()
    finally:
        writer.close()
    message = str(refused.value)
    assert f"field 'amount': the table has decimal(10,2), writer schema id {v3_id} has string" in message
    assert "write the new values to a new field" in message and "a new spec.table.location" in message
    after = DeltaLog(table.location).snapshot()
    assert (after.version, after.committed.offsets) == (committed.version + 1, committed.committed.offsets)
    assert after.schema_string == committed.schema_string  # only the new writer's epoch claimed


PROTO_V1 = """syntax = "proto3";
package shop;

message Order {
  int64 id = 1;
  double amount = 2;
  string status = 3;
}
"""
PROTO_V2 = PROTO_V1.replace("  string status = 3;\n", "  string status = 3;\n  optional string note = 4;\n")


def order_class(text: str) -> Any:
    """The class of message shop.Order of .proto `text`, compiled as ingestion compiles it."""
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(descriptor_set_text(text)))
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_protobuf_writer_schemas_evolve_a_delta_table(
    kafka: KafkaBroker, schema_registry: SchemaRegistryServer, spark: SparkSession, tmp_path: Path
) -> None:
    table = Table(kafka, schema_registry, tmp_path, "proto", "protobuf")
    subject = f"{table.topic}-value"
    v1_id = table.client.register_schema(subject, Schema(PROTO_V1, "PROTOBUF"))
    order_v1 = order_class(PROTO_V1)

    def framed_proto(schema_id: int, built: Any) -> bytes:
        return b"\x00" + schema_id.to_bytes(4, "big") + b"\x00" + built.SerializeToString()

    table.send([framed_proto(v1_id, order_v1(id=i, amount=i + 0.5, status="PAID")) for i in range(3)])
    writer = table.writer(spark)
    try:
        assert [name for name, _, _ in table.schema()] == ["id", "amount", "status", "_kafka"]
        drain(writer)
        v2_id = table.client.register_schema(subject, Schema(PROTO_V2, "PROTOBUF"))
        order_v2 = order_class(PROTO_V2)
        table.send(
            [framed_proto(v2_id, order_v2(id=i, amount=i + 0.5, status="NEW", note=f"n{i}")) for i in (3, 4)]
        )
        drain(writer)
    finally:
        writer.close()
    assert [name for name, _, _ in table.schema()] == ["id", "amount", "status", "note", "_kafka"]
    assert [(r["id"], r["status"], r["note"]) for r in table.rows()] == [
        *((i, "PAID", None) for i in range(3)),
        *((i, "NEW", f"n{i}") for i in (3, 4)),
    ]
    table.verify_clean(spark)


JSON_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number"},
        "ts": {"type": "string", "format": "date-time"},
    },
    "required": ["id", "amount", "ts"],
    "additionalProperties": False,  # closed: adding an optional property is backward compatible
}
JSON_V2: dict[str, Any] = {
    **JSON_V1,
    "properties": {**JSON_V1["properties"], "note": {"type": ["string", "null"]}},
}


def test_json_schema_writer_schemas_evolve_a_delta_table(
    kafka: KafkaBroker, schema_registry: SchemaRegistryServer, spark: SparkSession, tmp_path: Path
) -> None:
    table = Table(kafka, schema_registry, tmp_path, "jsonschema", "jsonSchema")
    ts = datetime(2026, 5, 1, 10, 0, tzinfo=UTC).isoformat().replace("+00:00", "Z")
    v1 = JSONSerializer(json.dumps(JSON_V1), table.client)
    table.send([v1({"id": i, "amount": i + 0.5, "ts": ts}, table.context) for i in range(3)])
    writer = table.writer(spark)
    try:
        assert [(name, kind) for name, kind, _ in table.schema()[:3]] == [
            ("id", "long"),
            ("amount", "double"),
            ("ts", "timestamp"),
        ]
        drain(writer)
        v2 = JSONSerializer(json.dumps(JSON_V2), table.client)
        table.send(
            [v2({"id": i, "amount": i + 0.5, "ts": ts, "note": f"n{i}"}, table.context) for i in (3, 4)]
        )
        drain(writer)
    finally:
        writer.close()
    assert [name for name, _, _ in table.schema()] == ["id", "amount", "ts", "note", "_kafka"]
    assert [(r["id"], r["note"]) for r in table.rows()] == [
        (0, None),
        (1, None),
        (2, None),
        (3, "n3"),
        (4, "n4"),
    ]
    table.verify_clean(spark)
