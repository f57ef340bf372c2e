"""Protobuf records produced through a real schema registry land in an Iceberg table, and audit by content.

Proves, with the real broker, Spark, the embedded catalog and the test stack's schema registry (Apicurio,
Confluent-compatible API, BACKWARD): the table's columns come from the subject's latest schema registered as
.proto text (as Java serializers register it: compiled with protoc), with nested messages, repeated, maps,
enums, oneofs, Timestamp and wrappers; records serialized by confluent-kafka's `ProtobufSerializer` (which
registers a base64 descriptor under the record-name subject: a second writer schema in the batch) and
records framed by hand against the text schema (message index [0]) both land by content; a record whose
message index names the schema's second message is decoded as that message (it lacks the table's required
id: a dead letter saying so); a wrong magic byte, an unknown id, a message index naming no message, bytes
that do not decode as the message and a message whose Timestamp has no RFC 3339 text (past 9999) are dead
letters with their reasons, not a failed batch; a later version of the
subject that adds a field adds the column (schema evolution) and its records land with it; every offset is
in exactly one of the two tables, and `icefall verify`'s audit agrees by content.

Not proved here: keyed modes with Protobuf (refused by the spec), schema references other than the
well-known types (refused), a registry that serves `?format=serialized` (Confluent's; Apicurio ignores it).
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyspark.sql import SparkSession

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.kafka.protobuf import descriptor_set_text
from icefall.testing.streams import assert_exactly_once, drain, registry_table, started_ingestor, watermarks

pytestmark = pytest.mark.integration

V1 = """syntax = "proto3";
package shop;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Status {
  NEW = 0;
  PAID = 1;
}

message Order {
  message Customer {
    string id = 1;
    bool vip = 2;
  }
  int64 id = 1;
  double amount = 2;
  google.protobuf.Timestamp ts = 3;
  Status status = 4;
  repeated string tags = 5;
  Customer customer = 6;
  map<string, int32> attrs = 7;
  google.protobuf.StringValue coupon = 8;
  oneof payment {
    string card = 9;
    bool cash = 10;
  }
}

message Refund {
  int64 order_id = 1;
}
"""
V2 = V1.replace("    bool cash = 10;\n  }\n", "    bool cash = 10;\n  }\n  optional string note = 11;\n")
NOT_AN_ID = 2**31 - 1  # an id no registry of this test stack hands out
BASE_TS = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)


def classes(text: str) -> dict[str, Any]:
    """The message classes of .proto `text` (compiled as ingestion compiles it), by full name."""
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(descriptor_set_text(text)))
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        for name in ("shop.Order", "shop.Refund")
    }


def manifest(name: str, topic: str, kafka: KafkaBroker, registry_url: str) -> StreamingTable:
    return registry_table(name, topic, kafka.bootstrap, registry_url, "protobuf")


def order(i: int, **extra: Any) -> dict[str, Any]:
    """The fields of order `i` as the message is built (and as the table holds them)."""
    return {
        "id": i,
        "amount": i + 0.5,
        "ts": BASE_TS.replace(minute=i),
        "status": "PAID" if i % 2 else "NEW",
        "tags": [f"t{i}"] if i % 3 else [],
        "customer": {"id": f"c{i}", "vip": i % 2 == 0} if i != 4 else None,
        "attrs": {"n": i},
        "coupon": f"x{i}" if i % 2 else None,
        "card": "visa" if i % 2 else None,
        "cash": None if i % 2 else True,
        **extra,
    }


def message(cls: Any, fields: dict[str, Any]) -> Any:
    built = cls(id=fields["id"], amount=fields["amount"], status=fields["status"], tags=fields["tags"])
    built.ts.FromDatetime(fields["ts"])
    if fields["customer"] is not None:
        built.customer.id = fields["customer"]["id"]
        built.customer.vip = fields["customer"]["vip"]
    built.attrs.update(fields["attrs"])
    if fields["coupon"] is not None:
        built.coupon.value = fields["coupon"]
    if fields["card"] is not None:
        built.card = fields["card"]
    if fields["cash"] is not None:
        built.cash = fields["cash"]
    if fields.get("note") is not None:
        built.note = fields["note"]
    return built


def framed(schema_id: int, built: Any, index: bytes = b"\x00") -> bytes:
    """Confluent's wire format, by hand: magic byte, schema id, message index, the message."""
    return b"\x00" + schema_id.to_bytes(4, "big") + index + built.SerializeToString()


def send(kafka: KafkaBroker, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(30) == 0


def test_protobuf_records_through_the_registry_with_evolution_and_dead_letters(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic = "it-protobuf-orders"
    kafka.create_topic(topic, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    text_id = client.register_schema(f"{topic}-value", Schema(V1, "PROTOBUF"))
    v1 = classes(V1)
    Order, Refund = v1["shop.Order"], v1["shop.Refund"]  # noqa: N806 (classes)
    serializer = ProtobufSerializer(
        Order,
        client,
        {"use.deprecated.format": False, "subject.name.strategy": record_subject_name_strategy},
    )
    context = SerializationContext(topic, MessageField.VALUE)
    values = [serializer(message(Order, order(i)), context) or b"" for i in range(3)]  # offsets 0-2
    values += [framed(text_id, message(Order, order(i))) for i in range(3, 6)]  # 3-5
    assert values[0][1:5] != text_id.to_bytes(4, "big")  # two writer schemas in one batch
    values += [
        b"\x07" + values[3][1:],  # 6: wrong magic byte
        framed(NOT_AN_ID, message(Order, order(7))),  # 7: an id the registry does not know
        framed(text_id, message(Order, order(8)), index=b"\x02\x04"),  # 8: index [2]: no such message
        framed(text_id, Refund(order_id=9), index=b"\x02\x02"),  # 9: index [1]: a Refund, no id
        b"\x00" + text_id.to_bytes(4, "big") + b"\x00\x0f\x01",  # 10: not an Order's bytes
    ]
    far = message(Order, order(13))
    far.ts.seconds = 300_000_000_000  # past 9999-12-31: no RFC 3339 text
    values.append(framed(text_id, far))  # 11
    send(kafka, topic, values)

    st = manifest("protobuf_orders", topic, kafka, schema_registry.url)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = drain(ingestor)
        assert sum(r.records_read for r in reports) == 12
        catalog = catalog_config.pyiceberg()
        schema = catalog.load_table("it.protobuf_orders").schema()
        assert [(f.name, str(f.field_type), f.required) for f in schema.fields[:10]] == [
            ("id", "long", True),
            ("amount", "double", True),
            ("ts", "timestamptz", False),
            ("status", "string", True),
            ("tags", "list<string>", True),
            ("customer", str(schema.find_field("customer").field_type), False),
            ("attrs", "map<string, int>", True),
            ("coupon", "string", False),
            ("card", "string", False),
            ("cash", "boolean", False),
        ]
        assert [f.name for f in schema.fields][10:] == ["_kafka"]

        # A later version of the subject adds a field: the table follows it in the batch that carries it.
        text_v2 = client.register_schema(f"{topic}-value", Schema(V2, "PROTOBUF"))
        v2 = classes(V2)["shop.Order"]
        send(kafka, topic, [framed(text_v2, message(v2, order(i, note=f"n{i}"))) for i in range(11, 13)])
        drain(ingestor)

    table = catalog.load_table("it.protobuf_orders")
    assert table.schema().find_field("note").required is False
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    expected = [order(i) for i in range(6)] + [order(i, note=f"n{i}") for i in range(11, 13)]
    assert [{k: v for k, v in r.items() if k != "_kafka"} for r in rows] == [
        {**o, "attrs": list(o["attrs"].items()), "note": o.get("note")} for o in expected
    ]

    dead = catalog.load_table("it.protobuf_orders_dlq").scan().to_arrow().to_pylist()
    magic = "not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)"
    errors = {r["offset"]: r["error"] for r in dead}
    # A Refund has none of an Order's fields: the first of the reasons is the id's.
    assert errors.pop(9).startswith("required field 'id' is missing or null; required field 'amount'")
    assert errors == {
        6: f"wrong magic byte 0x07: {magic}",
        7: f"unknown schema id {NOT_AN_ID} (the registry has no Protobuf schema with this id)",
        8: f"message index [2] names no message of schema id {text_id}",
        10: f"bytes do not decode as protobuf message shop.Order of schema id {text_id}",
        11: f"bytes do not decode as protobuf message shop.Order of schema id {text_id}",
    }

    report = assert_exactly_once(
        catalog_config,
        "protobuf_orders",
        watermarks(kafka, topic),
        {(0, o) for o in range(6, 12)},
        bootstrap=kafka.bootstrap,
        spark=spark,
        st=st,
    )
    assert report is not None and report.content_checked
