"""Routes over several topics and a registry format, against real Kafka, Spark, the embedded catalog and the
test stack's schema registry, audited by content (each record's topic and value say which table it is in).

Proves: two topics (`source.topics`) routed to two static tables (one by a value field, one by the topic)
plus the unrouted default, each record exactly once in its table across a crash between two destinations'
commits and a restart, every destination committed per topic to each topic's end, `icefall verify`
agreeing per destination and topic, `icefall read --table` giving a route table plus the tail its
records would come from (cut per topic), and a recreated topic reset by `icefall reset-offsets` in every
destination for that topic alone; a `topicPattern` with `dynamicRoute from: Topic` gives a table per topic,
a topic created while the writer runs getting its own table from its first record; Avro records through
the registry routed by a decoded value field and to a table per value, the batch that meets a new writer
schema written again into every route table (its new column added there too, and in the tables it creates
with the table's columns then), dead letters as without routes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Consumer
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commands.table import reset_table
from icefall.commands.verify import verify_table
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.ingest.engine import BatchReport, SourceChangedError
from icefall.ingest.union_read import union_read
from icefall.runtime import failpoints, metrics
from icefall.testing.streams import (
    NAMESPACE,
    REGISTRY_MANIFEST,
    drain,
    manifest_text,
    produce,
    recreate_topic,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration

Row = tuple[str, int, int]  # topic, partition, offset


def records_of(kafka: KafkaBroker, topics: list[str]) -> dict[Row, bytes | None]:
    """Every record of `topics` by (topic, partition, offset)."""
    total = sum(sum(watermarks(kafka, t).values()) for t in topics)
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": f"content-{'-'.join(topics)}-{total}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    records: dict[Row, bytes | None] = {}
    try:
        consumer.subscribe(topics)
        while len(records) < total:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topics}: {len(records)} of {total}"
            records[message.topic(), message.partition(), message.offset()] = message.value()
    finally:
        consumer.close()
    return records


def rows_of(config: CatalogConfig, table: str) -> Counter[Row]:
    """(topic, partition, offset) of each row of `it.<table>` (a dead-letter table's columns or `_kafka`)."""
    loaded = config.pyiceberg().load_table((NAMESPACE, table))
    if table.endswith("_dlq"):
        rows = loaded.scan(selected_fields=("topic", "partition", "offset")).to_arrow().to_pylist()
        return Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    rows = loaded.scan(selected_fields=("_kafka",)).to_arrow().column("_kafka").to_pylist()
    return Counter((r["topic"], r["partition"], r["offset"]) for r in rows)


def ids_of(config: CatalogConfig, table: str) -> set[int]:
    return set(config.pyiceberg().load_table((NAMESPACE, table)).scan().to_arrow().column("id").to_pylist())


def assert_tables(
    config: CatalogConfig, expected: dict[str, set[Row]], kafka: KafkaBroker, topics: list[str]
) -> None:
    """Each table holds exactly its expected records, once; every table but the dead letters is committed
    to each topic's end in every partition it holds (a table created later holds only what it has taken)."""
    high = {t: watermarks(kafka, t) for t in topics}
    for table, want in expected.items():
        rows = rows_of(config, table)
        twice = [k for k, n in rows.items() if n > 1]
        assert not twice, f"{table}: duplicates {twice[:5]}"
        assert set(rows) == want, (
            f"{table}: extra {sorted(set(rows) - want)[:5]}, missing {sorted(want - set(rows))[:5]}"
        )
        if not table.endswith("_dlq"):
            state = read_committed(config.pyiceberg().load_table((NAMESPACE, table)))
            held = {(t, p): o for t, h in state.by_topic().items() for p, o in h.offsets.items()}
            assert held and all(o == high[t][p] for (t, p), o in held.items()), (table, held, high)
            assert {t for t, _, _ in want} <= {t for t, _ in held}, table


def reported_lags(st: Any, config: CatalogConfig, report: BatchReport) -> dict[str, int]:
    """Each table's lag in the driver's status report (`status.writer.tables`) once `report` landed, its
    meter reading the tables now."""
    from icefall.controller.kube import Kube
    from icefall.ingest.table_meter import TableMeter
    from icefall.ingest.writer_status import WriterStatusReporter

    sent: list[dict[str, Any]] = []

    class Patches:
        def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
            sent.append(body)

    meter = TableMeter(st, config)
    assert meter.read_once() is not None
    WriterStatusReporter(cast(Kube, Patches()), NAMESPACE, st.metadata.name, interval=0, meter=meter)(report)
    return {t["table"]: t["lagRecords"] for t in sent[-1]["writer"]["tables"]}


def test_two_topics_into_two_routes_and_the_default_exactly_once_across_a_crash(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, a, b = "rsrc_two", "itrs-two-a", "itrs-two-b"
    kafka.create_topic(a, partitions=2)
    kafka.create_topic(b, partitions=1)
    produce(kafka, a, 0, 80, bad_every=10)
    produce(kafka, b, 100, 40, bad_every=9)
    text = manifest_text(name, [a, b], kafka.bootstrap, batch={"maxRecords": 50, "minIntervalSeconds": 0})
    text += f"""  routes:
    - {{table: {{name: {name}_vip}}, when: "customer IN ('c0', 'c1')"}}
    - {{table: {{name: {name}_b}}, when: "_kafka.topic = '{b}'"}}
"""
    manifest = tmp_path / "table.yaml"
    manifest.write_text(text)
    st = load_manifest(text)

    def expected() -> dict[str, set[Row]]:
        tables: dict[str, set[Row]] = {t: set() for t in (name, f"{name}_vip", f"{name}_b", f"{name}_dlq")}
        for (topic, p, o), value in records_of(kafka, [a, b]).items():
            try:
                record = json.loads(value or b"")
            except ValueError:
                tables[f"{name}_dlq"].add((topic, p, o))
                continue
            vip, in_b = record["customer"] in ("c0", "c1"), topic == b
            tables[f"{name}_vip" if vip else f"{name}_b" if in_b else name].add((topic, p, o))
        return tables

    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        first = ingestor.run_batch()
        assert first is not None and first.topic_ends == {t: watermarks(kafka, t) for t in (a, b)}
        # The next batch: the first route commits it, then the writer dies before the second route's commit.
        with failpoints.armed("route.after-commit", "raise"), pytest.raises(failpoints.FailpointError):
            ingestor.run_batch()
    # Each route table's lag in status: every (topic, partition) it has not committed, against the ends.
    lags = reported_lags(st, catalog_config, first)
    for route in (f"{name}_vip", f"{name}_b"):
        held = read_committed(catalog_config.pyiceberg().load_table((NAMESPACE, route))).by_topic()
        behind = sum(e - held[t].offsets[p] for t, ends in first.topic_ends.items() for p, e in ends.items())
        assert lags[f"{NAMESPACE}.{route}"] == behind > 0, (route, lags, held)
    assert lags[f"{NAMESPACE}.{name}_vip"] != lags[f"{NAMESPACE}.{name}_b"], lags  # one is a batch behind
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
    assert_tables(catalog_config, expected(), kafka, [a, b])
    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok, report.render()
    assert all(set(d.report.topic.split(", ")) == {a, b} for d in report.destinations), report.render()

    # `icefall read --table`: a route table plus the tail of each topic its records would come from.
    held_b = ids_of(catalog_config, f"{name}_b")
    produce(kafka, b, 200, 7)
    with union_read(st, catalog_config, spark=spark, table_name=f"{NAMESPACE}.{name}_b") as fresh:
        ids = [r["id"] for r in fresh.frame.select("id").collect()]
    assert sorted(ids) == sorted(held_b | {i for i in range(200, 207) if i % 7 not in (0, 1)})
    assert fresh.cut.topics[b] == {0: (40, 47)} and fresh.cut.topics[a] == {
        p: (e, e) for p, e in watermarks(kafka, a).items()
    }

    # Topic b deleted and created again: reset in every destination for b alone, then each takes its records.
    recreate_topic(kafka, b)
    produce(kafka, b, 300, 12)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        with pytest.raises(SourceChangedError):
            ingestor.run_batch()
        done, message = reset_table(st, catalog_config.pyiceberg(), "earliest")
        assert done, message
        drain(ingestor)
    catalog = catalog_config.pyiceberg()
    for table in (f"{name}_vip", f"{name}_b", name):
        state = read_committed(catalog.load_table((NAMESPACE, table)))
        assert dict(state.of_topic(b).offsets) == {0: 12}, table
        assert dict(state.of_topic(a).offsets) == watermarks(kafka, a), table
    vip = {i for i in range(300, 312) if i % 7 in (0, 1)}
    assert {i for i in ids_of(catalog_config, f"{name}_vip") if i >= 300} == vip
    assert {i for i in ids_of(catalog_config, f"{name}_b") if i >= 300} == set(range(300, 312)) - vip


def test_a_pattern_with_a_table_per_topic_gives_a_topic_created_while_running_its_table(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, prefix = "rsrc_cdc", "itrs-cdc-"
    kafka.create_topic(f"{prefix}customers", partitions=2)
    kafka.create_topic(f"{prefix}orders", partitions=1)
    produce(kafka, f"{prefix}customers", 0, 40, bad_every=10)
    produce(kafka, f"{prefix}orders", 100, 30)
    text = manifest_text(name, ["x"], kafka.bootstrap, batch={"minIntervalSeconds": 0})
    text = text.replace(
        'topics: ["x"]', f'topicPattern: "{prefix}.*", properties: {{"metadata.max.age.ms": "1000"}}'
    )
    text += f'  dynamicRoute: {{from: Topic, pattern: "^{prefix}(.+)$", nameTemplate: "{name}_{{value}}"}}\n'
    st = load_manifest(text)
    stop, errors, reports = threading.Event(), [], []

    def caught_up(topics: list[str]) -> bool:
        catalog = catalog_config.pyiceberg()
        if not catalog.table_exists((NAMESPACE, name)):
            return False
        state = read_committed(catalog.load_table((NAMESPACE, name)))
        return {t: dict(h.offsets) for t, h in state.by_topic().items()} == {
            t: watermarks(kafka, t) for t in topics
        }

    def wait_for(topics: list[str]) -> None:
        deadline = time.monotonic() + 90
        while not caught_up(topics):
            assert not errors, errors
            assert time.monotonic() < deadline, f"not caught up with {topics}"
            time.sleep(0.5)

    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:

        def run() -> None:
            try:
                ingestor.run(stop.is_set, lambda r: reports.append(r) if isinstance(r, BatchReport) else None)
            except BaseException as error:
                errors.append(error)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            wait_for([f"{prefix}customers", f"{prefix}orders"])
            kafka.create_topic(f"{prefix}payments", partitions=1)
            produce(kafka, f"{prefix}payments", 200, 15)
            topics = [f"{prefix}{t}" for t in ("customers", "orders", "payments")]
            wait_for(topics)
        finally:
            stop.set()
            runner.join(60)
    assert not errors, errors
    assert reports[-1].topic_ends == {t: watermarks(kafka, t) for t in topics}  # each topic it matched
    # Caught up: every table, the ones the route made included, holds each topic's end under its name.
    assert all(n == 0 for n in reported_lags(st, catalog_config, reports[-1]).values())
    expected: dict[str, set[Row]] = {name: set(), f"{name}_dlq": set()}
    for (topic, p, o), value in records_of(kafka, topics).items():
        bad = value is not None and not value.startswith(b'{"')
        table = f"{name}_dlq" if bad else f"{name}_{topic.removeprefix(prefix)}"
        expected.setdefault(table, set()).add((topic, p, o))
    assert_tables(catalog_config, expected, kafka, topics)
    payments = read_committed(catalog_config.pyiceberg().load_table((NAMESPACE, f"{name}_payments")))
    assert dict(payments.of_topic(f"{prefix}payments").start_offsets) == {0: 0}
    # `icefall verify`: each table the route made, per topic from where it started each.
    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok and len(report.destinations) == 4, report.render()


AVRO_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
AVRO_V2: dict[str, Any] = {
    **AVRO_V1,
    "fields": [*AVRO_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}


def test_avro_records_routed_by_a_decoded_field_and_a_new_writer_schema_in_every_table(
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    name, topic = "rsrc_avro", "itrs-avro-orders"
    kafka.create_topic(topic, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})

    def send(schema: dict[str, Any], orders: list[dict[str, Any]], tail: bytes | None = None) -> None:
        serialize = AvroSerializer(client, json.dumps(schema))
        for order in orders:
            producer.produce(topic, value=serialize({"ts": 1_780_000_000_000, **order}, context))
        if tail is not None:
            producer.produce(topic, value=tail)
        assert producer.flush(30) == 0

    send(AVRO_V1, [{"id": i} for i in range(6)], tail=b"\x07not avro")
    text = REGISTRY_MANIFEST.format(
        name=name, k8s_name="rsrc-avro", bootstrap=kafka.bootstrap, topic=topic, format_type="avro",
        registry_url=schema_registry.url, schema="",
    )  # fmt: skip
    text += f'  routes: [{{table: {{name: {name}_even}}, when: "id % 2 = 0"}}]\n'
    # The odd orders of the new writer schema: a table each, created by the batch that evolves the table.
    st = load_manifest(
        text
        + f'  dynamicRoute: {{from: Field, name: id, nameTemplate: "{name}_{{value}}", when: "id >= 6"}}\n'
    )
    rewritten = metrics.INGEST_BATCHES_REWRITTEN.labels(f"{NAMESPACE}.{name}")._value.get()
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        send(AVRO_V2, [{"id": i, "note": f"n{i}"} for i in range(6, 10)])  # a writer schema not met yet
        drain(ingestor)
    assert metrics.INGEST_BATCHES_REWRITTEN.labels(f"{NAMESPACE}.{name}")._value.get() == rewritten + 1
    catalog = catalog_config.pyiceberg()
    even = catalog.load_table((NAMESPACE, f"{name}_even")).scan().to_arrow().to_pylist()
    odd = catalog.load_table((NAMESPACE, name)).scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["note"]) for r in even) == [
        (0, None),
        (2, None),
        (4, None),
        (6, "n6"),
        (8, "n8"),
    ]
    assert sorted((r["id"], r["note"]) for r in odd) == [(1, None), (3, None), (5, None)]
    for i in (7, 9):
        created = catalog.load_table((NAMESPACE, f"{name}_{i}")).scan().to_arrow().to_pylist()
        assert [(r["id"], r["note"]) for r in created] == [(i, f"n{i}")]
    dead = catalog.load_table((NAMESPACE, f"{name}_dlq")).scan().to_arrow().to_pylist()
    assert [(r["offset"], r["error"][:16]) for r in dead] == [(6, "wrong magic byte")]
    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok and all(d.report.content_checked for d in report.destinations), report.render()
    assert {d.destination for d in report.destinations} >= {"routes[0]", f"dynamicRoute:{name}_7"}
