"""Keyed tables (`spec.mode` upsert and cdc) of Avro records, keys and values, through the real registry.

Proves, with the real broker, Spark (spark-avro), the embedded catalog and the test stack's schema registry
(Apicurio, Confluent-compatible API), producing with confluent-kafka's `AvroSerializer` for keys (subject
`<topic>-key`) and values as Kafka Connect's AvroConverter does:
- upsert: a record's Avro value is the row, the later one per key wins across batches, a tombstone deletes
  the key its Kafka key names (a framed Avro key record, a plain text key, a LongSerializer key), a value
  whose writer schema lacks the key field takes it from the Avro key; the table's columns come from the
  subject's latest value schema;
- cdc: Debezium's Avro envelope (before/after records, source, op, ts_ms): r, c, u write the after image,
  d deletes the key of its before image (or of the Avro key when it has none), Debezium's tombstone after a
  delete; with `sequenceBy: [source.lsn]` a late older u after a d stays out and a stale u is skipped; the
  table's columns are the envelope's after record, not the envelope;
- dead letters with the JSON path's reasons (op t, c without after image, a tombstone whose key gives no
  id) and the Avro ones (wrong magic byte, unknown schema id);
- `icefall verify` (`verify_table` → `audit_keyed`) decodes like ingestion and finds the table equal, by
  content, to the topic's last change per key, and its dead letters complete.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commands.verify import verify_table
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.testing.streams import drain, started_ingestor

pytestmark = pytest.mark.integration

NOT_AN_ID = 2**31 - 1  # an id no registry of this test stack hands out

ROW: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "status", "type": "string"},
        {"name": "amount", "type": ["null", "double"], "default": None},
    ],
}
#: The same row without its key field (another producer's schema, under a subject of its own).
ROW_WITHOUT_ID: dict[str, Any] = {**ROW, "fields": ROW["fields"][1:]}
KEY: dict[str, Any] = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
#: Debezium's envelope as its AvroConverter registers it: the row defined in before, named by after.
ENVELOPE: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": "dbserver1.shop.orders",
    "fields": [
        {"name": "before", "type": ["null", ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "connector", "type": "string"},
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def manifest(name: str, topic: str, kafka: KafkaBroker, registry_url: str, extra: str) -> StreamingTable:
    """An Avro keyed table `it.<name>` without an inline schema: its columns come from the registry."""
    return load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {name.replace("_", "-")}}}
spec:
  source: {{bootstrapServers: "{kafka.bootstrap}", topic: {topic}}}
  format:
    type: avro
    registry: {{url: "{registry_url}"}}
  table: {{namespace: it, name: {name}}}
  freshness: {{targetSeconds: 2}}
{extra}
"""
    )


class Serializers:
    """Keys and values of `topic` in the Confluent wire format, registered as Kafka Connect does."""

    def __init__(self, registry_url: str, topic: str, value_schema: dict[str, Any]) -> None:
        self.client = SchemaRegistryClient({"url": registry_url})
        self.keys = SerializationContext(topic, MessageField.KEY)
        self.values = SerializationContext(topic, MessageField.VALUE)
        self.key_serializer = AvroSerializer(self.client, json.dumps(KEY))
        self.value_serializer = AvroSerializer(self.client, json.dumps(value_schema))

    def key(self, i: int) -> bytes:
        data = self.key_serializer({"id": i}, self.keys)
        assert data is not None
        return data

    def value(self, record: dict[str, Any]) -> bytes:
        data = self.value_serializer(record, self.values)
        assert data is not None
        return data


def send(kafka: KafkaBroker, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0


def run_to_end(st: StreamingTable, config: CatalogConfig, spark: SparkSession, tmp_path: Path) -> int:
    with started_ingestor(st, config, spark, tmp_path / f"{st.table_name}.lease") as ingestor:
        return sum(r.records_read for r in drain(ingestor))


def table_rows(config: CatalogConfig, name: str) -> dict[int, tuple[str, float | None]]:
    rows = config.pyiceberg().load_table(("it", name)).scan().to_arrow().to_pylist()
    by_id = {r["id"]: (r["status"], r["amount"]) for r in rows}
    assert len(by_id) == len(rows), f"a key appears twice: {sorted(r['id'] for r in rows)}"
    return by_id


def dead_letters(config: CatalogConfig, name: str) -> dict[int, str]:
    rows = config.pyiceberg().load_table(("it", f"{name}_dlq")).scan().to_arrow().to_pylist()
    return {r["offset"]: r["error"] for r in rows}


def reframed(value: bytes, *, magic: bytes = b"\x00", schema_id: int | None = None) -> bytes:
    framed_id = value[1:5] if schema_id is None else schema_id.to_bytes(4, "big")
    return magic + framed_id + value[5:]


def test_upsert_with_avro_keys_and_values(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic = "it-avro-upsert"
    kafka.create_topic(topic, partitions=1)
    avro = Serializers(schema_registry.url, topic, ROW)
    # A producer whose values lack the key field: its schema under a subject of its own, so the topic's
    # latest value schema (the table's columns) stays ROW.
    without_id = AvroSerializer(
        avro.client,
        json.dumps(ROW_WITHOUT_ID),
        conf={"subject.name.strategy": lambda ctx, name: f"{topic}-without-id-value"},
    )

    def row(i: int, status: str, amount: float | None = None) -> bytes:
        return avro.value({"id": i, "status": status, "amount": amount})

    send(kafka, topic, [(avro.key(i), row(i, "v1", float(i))) for i in range(1, 8)])
    st = manifest("avro_upsert", topic, kafka, schema_registry.url, "  mode: upsert\n  key: [id]")
    assert run_to_end(st, catalog_config, spark, tmp_path) == 7
    assert table_rows(catalog_config, "avro_upsert") == {i: ("v1", float(i)) for i in range(1, 8)}
    table = catalog_config.pyiceberg().load_table(("it", "avro_upsert"))
    assert [f.name for f in table.schema().fields] == ["id", "status", "amount", "_kafka"]
    assert table.schema().identifier_field_names() == {"id"}

    value = row(1, "v2")
    send(
        kafka,
        topic,
        [
            (avro.key(1), value),  # offset 7: an update
            (avro.key(2), None),  # 8: a tombstone with an Avro key
            (b"3", None),  # 9: a tombstone with a plain text key
            (struct.pack(">q", 4), None),  # 10: a tombstone with a LongSerializer key
            (avro.key(5), row(5, "v2")),  # 11: deleted and written again in one batch
            (avro.key(5), None),
            (avro.key(5), row(5, "v3", 5.5)),
            (avro.key(6), without_id({"status": "id from the key", "amount": None}, avro.values)),  # 14
            (b"not a key", None),  # 15: a tombstone whose key gives no id
            (avro.key(7), reframed(value, magic=b"\x01")),  # 16: wrong magic byte
            (avro.key(7), reframed(value, schema_id=NOT_AN_ID)),  # 17: unknown schema id
            (avro.key(8), row(8, "new")),
        ],
    )
    assert run_to_end(st, catalog_config, spark, tmp_path) == 12
    expected = {
        1: ("v2", None),
        5: ("v3", 5.5),
        6: ("id from the key", None),
        7: ("v1", 7.0),
        8: ("new", None),
    }
    assert table_rows(catalog_config, "avro_upsert") == expected
    assert dead_letters(catalog_config, "avro_upsert") == {
        15: "tombstone (null value): the Kafka key gives no value for key field 'id' (a Confluent-framed "
        "Avro record with the key fields, a JSON object with them, or the bare value of a one-column key)",
        16: "wrong magic byte 0x01: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)",
        17: f"unknown schema id {NOT_AN_ID} (the registry has no Avro schema with this id)",
    }

    # `icefall verify`: the table is the topic's last change per key, by content (finding a tampered row is
    # the JSON path's test: the comparison does not depend on the format).
    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok, report.render()
    assert (report.records, report.keys, report.rows) == (19, 5, 5)


def test_cdc_with_debezium_avro_envelopes(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic = "it-avro-cdc"
    kafka.create_topic(topic, partitions=1)
    avro = Serializers(schema_registry.url, topic, ENVELOPE)

    def image(i: int, status: str, amount: float | None = None) -> dict[str, Any]:
        return {"id": i, "status": status, "amount": amount}

    def event(op: str, before: Any, after: Any, lsn: int | None) -> bytes:
        source = {"connector": "postgresql", "lsn": lsn}
        return avro.value({"before": before, "after": after, "source": source, "op": op, "ts_ms": 1})

    send(
        kafka,
        topic,
        [
            (avro.key(1), event("r", None, image(1, "snapshot"), 10)),
            (avro.key(2), event("c", None, image(2, "created"), 20)),
            (avro.key(3), event("c", None, image(3, "created", 3.0), 30)),
            (avro.key(1), event("u", image(1, "snapshot"), image(1, "updated", 9.0), 40)),
            (avro.key(2), event("d", image(2, "created"), None, 50)),
            (avro.key(2), None),  # 5: Debezium's tombstone after a delete (no position: not applied)
            (avro.key(4), event("c", None, image(4, "created"), 60)),
            (avro.key(5), event("t", None, None, 61)),  # 7: truncate
            (avro.key(6), event("c", None, None, 62)),  # 8: a create without an after image
            (avro.key(7), event("c", None, image(7, "no position"), None)),  # 9
            (avro.key(8), reframed(event("c", None, image(8, "x"), 63), magic=b"\x02")),  # 10
        ],
    )
    extra = "  mode: cdc\n  key: [id]\n  sequenceBy: [source.lsn]"
    st = manifest("avro_cdc", topic, kafka, schema_registry.url, extra)
    assert run_to_end(st, catalog_config, spark, tmp_path) == 11
    assert table_rows(catalog_config, "avro_cdc") == {
        1: ("updated", 9.0),
        3: ("created", 3.0),
        4: ("created", None),
    }
    table = catalog_config.pyiceberg().load_table(("it", "avro_cdc"))
    assert [f.name for f in table.schema().fields] == ["id", "status", "amount", "_kafka", "_sequence"]

    send(
        kafka,
        topic,
        [
            (avro.key(2), event("u", None, image(2, "late, older than its delete"), 45)),  # stays out
            (avro.key(3), event("u", None, image(3, "stale"), 25)),  # older than the row: skipped
            (avro.key(4), event("d", None, None, 70)),  # no before image: the Avro key's id
            (avro.key(9), event("c", None, image(9, "created"), 80)),
            (avro.key(9), reframed(event("u", None, image(9, "x"), 81), schema_id=NOT_AN_ID)),  # 15
        ],
    )
    assert run_to_end(st, catalog_config, spark, tmp_path) == 5
    assert table_rows(catalog_config, "avro_cdc") == {
        1: ("updated", 9.0),
        3: ("created", 3.0),
        9: ("created", None),
    }
    assert dead_letters(catalog_config, "avro_cdc") == {
        7: "Debezium op 't' is not one of c, r, u, d",
        8: "Debezium op 'c' has no after image",
        9: "Debezium event has no source.lsn (spec.sequenceBy orders a key's changes by it)",
        10: "wrong magic byte 0x02: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)",
        15: f"unknown schema id {NOT_AN_ID} (the registry has no Avro schema with this id)",
    }

    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok and report.dead_letters_missing == 0, report.render()
    assert (report.records, report.keys, report.rows) == (16, 3, 3)
