"""A table's schema follows its records: a spec's new field after `kubectl apply`, a producer's new writer
schema, each in the batch that first needs it; what Iceberg cannot follow is refused with the field named.

Proves, with the real broker, Spark and the embedded catalog:
- json: a spec that adds an optional field and widens a decimal evolves the existing table before the next
  batch; old rows read null, new rows carry the field, compared with their Kafka records by content;
  compaction rewrites files of both schemas together; a spec that adds a required field is refused at
  start, naming the field and the fix;
- avro: a writer schema that adds a field and widens an int lands both in the batch that first carries it
  (and a fresh read decodes the records past the commit into the new columns); no Spark job reads a batch
  for its schema ids: a writer starts with its subject's latest schema, and a batch that meets another
  writer schema (an older version, another subject's) is written once more with it (one of known ids is
  not);
  a later writer schema that changes a type is refused (counted, logged) and its records that do not fit go
  to the dead-letter table with the reason, while those that fit are ingested;
- a writer killed right after the schema change (`main.after-schema-change`) and started again ingests
  every record exactly once, and the new field holds each record's value.

`icefall verify`'s audit agrees by content after each change: a field is compared only for the rows
written after it was added. The Avro writer schemas come from the test stack's registry.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import TableMismatchError, ensure_tables
from icefall.commands.verify import verify_table
from icefall.commit.state import SchemaChange, schema_changes
from icefall.compact.runner import MaintenanceRunner, file_leases
from icefall.compact.worker import Outcome
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.ingest.union_read import union_read
from icefall.plan.maintenance_items import CompactPartition, MaintenancePolicy
from icefall.plan.names import table_leases
from icefall.runtime import failpoints, metrics
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import assert_exactly_once, drain, started_ingestor, watermarks

pytestmark = pytest.mark.integration

V1_FIELDS = """
      - {name: id, type: long, required: true}
      - {name: customer, type: string}
      - {name: amount, type: "decimal(10,2)"}
      - {name: ts, type: timestamptz, required: true}"""
V2_FIELDS = V1_FIELDS.replace('"decimal(10,2)"', '"decimal(12,2)"') + "\n      - {name: note, type: string}"


def json_manifest(name: str, topic: str, bootstrap: str, fields: str) -> str:
    return f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {name.replace("_", "-")}}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  format:
    type: json
    schema:{fields}
  table: {{namespace: it, name: {name}}}
  freshness: {{targetSeconds: 2}}
  batch: {{maxRecords: 1000, minIntervalSeconds: 0}}
"""


def produce_json(kafka: KafkaBroker, topic: str, ids: Iterable[int]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in ids:
        record = {
            "id": i,
            "customer": f"c{i}",
            "amount": f"{i}.25",
            "ts": "2026-11-26T10:00:00Z",
            "note": f"n{i}",
        }
        producer.produce(topic, key=str(i), value=json.dumps(record))
    assert producer.flush(30) == 0


def test_a_spec_with_a_new_field_evolves_the_table(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-evolve-json", "evolve_json"
    kafka.create_topic(topic, partitions=2)
    v1 = load_manifest(json_manifest(name, topic, kafka.bootstrap, V1_FIELDS))
    v2 = load_manifest(json_manifest(name, topic, kafka.bootstrap, V2_FIELDS))
    produce_json(kafka, topic, range(10))
    with started_ingestor(v1, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
    produce_json(kafka, topic, range(10, 20))
    with started_ingestor(v2, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        assert sum(r.records_written for r in drain(ingestor)) == 10

    table = catalog_config.pyiceberg().load_table(("it", name))
    schema = table.schema()
    assert str(schema.find_field("amount").field_type) == "decimal(12, 2)"
    assert not schema.find_field("note").required
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["amount"], r["note"]) for r in rows] == [
        (i, Decimal(f"{i}.25"), None if i < 10 else f"n{i}") for i in range(20)
    ]
    # Compaction rewrites files of both schemas into one; rows stay as they were.
    runner = MaintenanceRunner(
        spark,
        catalog_config,
        v2.table_identifier,
        MaintenancePolicy(min_files_to_compact=2),
        file_leases(tmp_path / "leases", "worker-1"),
        table_leases=table_leases(v2),
    )
    step = runner.step()
    assert isinstance(step.item, CompactPartition) and step.result is not None, step
    assert step.result.outcome is Outcome.DONE
    table.refresh()
    assert sorted((r["id"], r["note"]) for r in table.scan().to_arrow().to_pylist()) == [
        (r["id"], r["note"]) for r in rows
    ]
    # The audit compares `note` only for the rows written after it was added (their records had it all along).
    report = verify_table(v2, catalog_config, spark=spark)
    assert report.ok and report.content_checked, report.render()

    required = V2_FIELDS + "\n      - {name: region, type: string, required: true}"
    v3 = load_manifest(json_manifest(name, topic, kafka.bootstrap, required))
    with pytest.raises(TableMismatchError) as refused:
        started_ingestor(v3, catalog_config, spark, tmp_path / "lease.json").__enter__()
    assert refused.value.differences == (
        f"the table it.{name}: field 'region' is new in spec.format.schema and required, but the rows "
        "already in the table have no value for it: make it optional (required: false)",
    )


#: A list of non-null strings: from_avro returns it as a list that may hold nulls.
TAGS = {"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None}
ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "int"}, TAGS],
}
ORDER_V2: dict[str, Any] = {
    **ORDER_V1,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "long"},
        TAGS,
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
ORDER_V3: dict[str, Any] = {
    **ORDER_V1,
    "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "string"}],
}


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def test_a_writer_schema_with_a_new_field_lands_in_the_batch_that_carries_it(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic, name = "it-evolve-avro", "evolve_avro"
    kafka.create_topic(topic, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(ORDER_V1))
    v2 = AvroSerializer(client, json.dumps(ORDER_V2))
    st = load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: evolve-avro}}
spec:
  source: {{bootstrapServers: "{kafka.bootstrap}", topic: {topic}}}
  format: {{type: avro, registry: {{url: "{schema_registry.url}"}}}}
  table: {{namespace: it, name: {name}}}
  freshness: {{targetSeconds: 2}}
"""
    )
    producer = Producer({"bootstrap.servers": kafka.bootstrap})

    def send(values: Iterable[bytes | None]) -> None:
        for value in values:
            assert value is not None
            producer.produce(topic, value=value)
        assert producer.flush(30) == 0

    table_name = f"it.{name}"
    send(
        v1({"id": i, "qty": i, "tags": [f"t{i}"]}, context) for i in range(3)
    )  # registers v1: the table is made from it
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        table = catalog_config.pyiceberg().load_table(table_name)
        assert [f.name for f in table.schema().fields] == ["id", "qty", "tags", "_kafka"]
        # The first batch decoded with the subject's registered schema: written once.
        assert rewritten(table_name) == 0

        send(v2({"id": i, "qty": 2**40 + i, "note": f"n{i}"}, context) for i in range(3, 6))
        (report,) = drain(ingestor)
        assert report.records_written == 3
        # v2's id was met as the batch was written: written once more with v2, committed once.
        assert rewritten(table_name) == 1
        table.refresh()
        schema = table.schema()
        assert [(f.name, str(f.field_type), f.required) for f in schema.fields[:4]] == [
            ("id", "long", True),
            ("qty", "long", True),
            ("tags", "list<string>", False),
            ("note", "string", False),
        ]
        # The batch that first carried `note` is the snapshot that holds it.
        assert table.current_snapshot().summary["added-records"] == "3"  # type: ignore[union-attr]
        # The table remembers which rows came before the change (for the audit).
        assert schema_changes(table.properties) == [SchemaChange(schema.schema_id, {0: 3})]
        # A fresh read decodes the records past the commit into the evolved columns too.
        send([v2({"id": 99, "qty": 9, "note": "fresh"}, context)])
        with union_read(st, catalog_config, spark=spark) as fresh:
            read = sorted((r["id"], r["note"]) for r in fresh.frame.select("id", "note").collect())
        assert read == [*((i, None) for i in range(3)), *((i, f"n{i}") for i in range(3, 6)), (99, "fresh")]
        drain(ingestor)
        assert rewritten(table_name) == 1  # v2 is known now: written once

        # A producer that changes qty's type: the registry refuses it under the topic's subject (BACKWARD),
        # so it registers under another subject (as the record name strategies do) and frames by that id.
        v3_id = client.register_schema(f"{topic}-legacy", Schema(json.dumps(ORDER_V3), "AVRO"))
        send([framed(v3_id, ORDER_V3, {"id": 6, "qty": "7"}), framed(v3_id, ORDER_V3, {"id": 7, "qty": "x"})])
        (report,) = drain(ingestor)
        assert (report.records_written, report.records_dead_lettered) == (1, 1)
        assert rewritten(table_name) == 2
        refused = metrics.REGISTRY.get_sample_value("icefall_schema_changes_refused", {"table": table_name})
        assert refused == 1
        assert report.schema_refused == (
            f"field 'qty': the table has long, writer schema id {v3_id} has string; Iceberg cannot change it "
            "(it widens only int to long, float to double and a decimal's precision): keep the type, or "
            "write the new values to a new field",
        )

    table.refresh()
    assert str(table.schema().find_field("qty").field_type) == "long"
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows[0]["tags"] == ["t0"]
    assert [(r["id"], r["qty"], r["note"]) for r in rows] == [
        *((i, i, None) for i in range(3)),
        *((i, 2**40 + i, f"n{i}") for i in range(3, 6)),
        (6, 7, None),
        (99, 9, "fresh"),
    ]
    dead = catalog_config.pyiceberg().load_table(f"{table_name}_dlq").scan().to_arrow().to_pylist()
    assert [(r["offset"], r["error"]) for r in dead] == [
        (8, "field 'qty': the writer's value does not fit long")
    ]
    changes = metrics.REGISTRY.get_sample_value("icefall_schema_changes_total", {"table": table_name})
    assert changes == 1
    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok and report.content_checked, report.render()


def test_a_first_batch_decodes_with_the_subjects_latest_schema_and_meets_the_others_as_it_is_written(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    topic, name = "it-evolve-registered", "evolve_registered"
    kafka.create_topic(topic, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1_id = client.register_schema(f"{topic}-value", Schema(json.dumps(ORDER_V1), "AVRO"))
    v2 = AvroSerializer(client, json.dumps(ORDER_V2))  # registers v2: the subject's latest
    producer = Producer({"bootstrap.servers": kafka.bootstrap})

    def send(values: Iterable[bytes]) -> None:
        for value in values:
            producer.produce(topic, value=value)
        assert producer.flush(30) == 0

    send(v2({"id": i, "qty": i, "note": f"n{i}"}, context) for i in range(3))
    st = load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: evolve-registered}}
spec:
  source: {{bootstrapServers: "{kafka.bootstrap}", topic: {topic}}}
  format: {{type: avro, registry: {{url: "{schema_registry.url}"}}}}
  table: {{namespace: it, name: {name}}}
"""
    )
    table_name = f"it.{name}"
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        assert [(r.records_written, r.records_dead_lettered) for r in drain(ingestor)] == [(3, 0)]
        # The subject's latest id was learnt before the first batch (no Spark job for it): written once.
        v2_id = client.get_latest_version(f"{topic}-value").schema_id
        assert (sorted(ingestor.writer.known.values), rewritten(table_name)) == ([v2_id], 0)
        # An older version, and an id registered under another subject (as the record name strategies
        # do), are met as the batch holding them is written: written again with them, committed once.
        send([framed(v1_id, ORDER_V1, {"id": 3, "qty": 3, "tags": ["a"]})])
        assert [(r.records_written, r.records_dead_lettered) for r in drain(ingestor)] == [(1, 0)]
        assert rewritten(table_name) == 1
        other = client.register_schema(
            f"{topic}-other", Schema(json.dumps({**ORDER_V2, "doc": "another subject"}), "AVRO")
        )
        send([framed(other, ORDER_V2, {"id": 4, "qty": 4, "tags": None, "note": "o"})])
        assert [(r.records_written, r.records_dead_lettered) for r in drain(ingestor)] == [(1, 0)]
        assert rewritten(table_name) == 2
        assert sorted(ingestor.writer.known.values) == sorted([v1_id, v2_id, other])
    rows = catalog_config.pyiceberg().load_table(table_name).scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["note"]) for r in rows) == [
        *((i, f"n{i}") for i in range(3)),
        (3, None),
        (4, "o"),
    ]


def rewritten(table_name: str) -> float:
    """Batches written again with a writer schema met as they were written."""
    sample = metrics.REGISTRY.get_sample_value(
        "icefall_ingest_batches_rewritten_total", {"table": table_name}
    )
    return sample or 0


def test_a_writer_killed_after_the_schema_change_ingests_exactly_once(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    topic, name = "it-evolve-kill", "evolve_kill"
    kafka.create_topic(topic, partitions=2)
    manifest, state = tmp_path / "table.yaml", tmp_path / "state"

    def run(fields: str, armed: str | None = None) -> subprocess.CompletedProcess[str]:
        manifest.write_text(json_manifest(name, topic, kafka.bootstrap, fields))
        return run_until_caught_up(manifest, state, armed)

    # The table as a writer with the old spec made it (no Spark needed to create it).
    config = CatalogConfig.embedded(state)
    ensure_tables(config.pyiceberg(), load_manifest(json_manifest(name, topic, kafka.bootstrap, V1_FIELDS)))
    produce_json(kafka, topic, range(40))
    killed = run(V2_FIELDS, "main.after-schema-change=exit")
    assert killed.returncode == failpoints.EXIT_STATUS, killed.stderr[-3000:]
    assert "failpoint main.after-schema-change triggered" in killed.stderr
    last = run(V2_FIELDS)
    assert last.returncode == 0, last.stderr[-3000:]

    assert_exactly_once(config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)
    table = config.pyiceberg().load_table(("it", name))
    assert sorted((r["id"], r["note"]) for r in table.scan().to_arrow().to_pylist()) == [
        (i, f"n{i}") for i in range(40)
    ]
    # The writer after the crash found the column there: one change, made before any row was committed.
    assert [c.offsets for c in schema_changes(table.properties)] == [{}]
