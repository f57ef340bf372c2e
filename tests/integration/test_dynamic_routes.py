"""Dynamic routes (`spec.dynamicRoute`): one topic into a table per event type, created on first use,
against real Kafka, Spark and the embedded catalog, audited by content (each record's value says which
table it belongs in).

Proves: a name computed from a field, a header, the key or the topic (a pattern's group, a template
around it; null when the pattern does not match or the condition is false); one topic with four event
types fills four tables created on first use (the owner property set), a type whose name is not an
identifier and one more type past `maxTables` are dead letters with reasons quoting the name, records
with no name go to spec.table, malformed ones to the dead letters, each record exactly once, every table
committed to the topic's end and read by the driver's meter for its status report; a restarted writer
finds its four tables in the catalog before any batch and keeps filling them; `icefall run` killed after
creating tables (before any commit) and between two dynamic tables' commits, then run to the end, leaves
each table exactly its records (and `icefall verify` says so, table by table); a recreated topic is reset
by `icefall reset-offsets` in every dynamic table too, each then taking the new topic's records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.api.routes import DYNAMIC_OWNER_PROPERTY
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.table_meter import TableMeter
from icefall.testing.live_run import killed_at_each, run_until_caught_up
from icefall.testing.streams import (
    NAMESPACE,
    drain,
    kafka_source_frame,
    manifest_text,
    recreate_topic,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration

#: The event type of record i is TYPES[i % 7]: four tables, a name that is not an identifier, one type
#: past the cap (sorted last, so the cap keeps the four whatever a batch holds), no type.
TYPES = ("click", "view", "buy", "share", "bad-type", "zz_extra", None)
TABLES = ("buy", "click", "share", "view")
DYNAMIC = """  dynamicRoute: {{from: Field, name: customer, nameTemplate: "{name}_{{value}}", maxTables: 4}}
"""


def dynamic_manifest(name: str, topic: str, kafka: KafkaBroker) -> str:
    text = manifest_text(name, topic, kafka.bootstrap, batch={"maxRecords": 60, "minIntervalSeconds": 0})
    return text + DYNAMIC.format(name=name)


def produce_events(kafka: KafkaBroker, topic: str, start: int, count: int) -> None:
    """Events `start..start+count-1`, keyed by id, of type TYPES[i % 7]; every 10th malformed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        value = {"id": i, "customer": TYPES[i % 7], "amount": 1.5, "ts": "2026-11-22T10:00:00Z"}
        producer.produce(topic, key=str(i), value="{not json" if i % 10 == 0 else json.dumps(value))
    assert producer.flush(60) == 0


def expected_rows(kafka: KafkaBroker, topic: str, name: str) -> dict[str, set[tuple[int, int, Any]]]:
    """Each table's (partition, offset, id) from the records' content; the dead letters' (partition,
    offset, the reason's words or None for a malformed record)."""
    from confluent_kafka import Consumer

    total = sum(watermarks(kafka, topic).values())
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": f"content-{topic}-{total}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    expected: dict[str, set[tuple[int, int, Any]]] = {}
    seen = 0
    try:
        consumer.subscribe([topic])
        while seen < total:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topic}: {seen} of {total}"
            seen += 1
            p, o, value = message.partition(), message.offset(), message.value()
            try:
                record = json.loads(value)
            except ValueError:
                expected.setdefault(f"{name}_dlq", set()).add((p, o, None))
                continue
            kind = record["customer"]
            if kind is None:
                table, key = name, record["id"]
            elif kind == "bad-type":
                table, key = f"{name}_dlq", f"'{name}_bad-type' is not a valid identifier"
            elif kind == "zz_extra":
                table, key = f"{name}_dlq", "past maxTables 4"
            else:
                table, key = f"{name}_{kind}", record["id"]
            expected.setdefault(table, set()).add((p, o, key))
    finally:
        consumer.close()
    return expected


def assert_routed(config: CatalogConfig, name: str, kafka: KafkaBroker, topic: str) -> None:
    """Every record in exactly the table its content names, once; each table at the topic's end."""
    catalog = config.pyiceberg()
    expected = expected_rows(kafka, topic, name)
    high = watermarks(kafka, topic)
    for table in (name, f"{name}_dlq", *(f"{name}_{t}" for t in TABLES)):
        loaded = catalog.load_table((NAMESPACE, table))
        if table.endswith("_dlq"):
            rows = loaded.scan(selected_fields=("partition", "offset", "error")).to_arrow().to_pylist()
            counted = Counter((r["partition"], r["offset"], r["error"]) for r in rows)
            words = {key for *_, key in expected[table] if key is not None}
            got = {(p, o, next((w for w in words if w in e), None)) for p, o, e in counted}
        else:
            rows = loaded.scan(selected_fields=("id", "_kafka")).to_arrow().to_pylist()
            counted = Counter((r["_kafka"]["partition"], r["_kafka"]["offset"], r["id"]) for r in rows)
            got = set(counted)
            assert read_committed(loaded).offsets == high, table
        assert max(counted.values(), default=1) == 1, f"{table}: duplicates"
        want = expected.get(table, set())
        assert got == want, f"{table}: extra {sorted(got - want)[:5]}, missing {sorted(want - got)[:5]}"
    assert not catalog.table_exists((NAMESPACE, f"{name}_zz_extra")), "no table past maxTables"


def test_names_come_from_a_field_a_header_the_key_or_the_topic(spark: SparkSession) -> None:
    from icefall.decode.decode import decode
    from icefall.ingest.routes import NAME_COLUMN, Routing

    text = manifest_text("dyn_names", "orders", "k:9092")
    values = [{"id": i, "customer": f"c{i}", "amount": 1, "ts": "2026-11-22T10:00:00Z"} for i in range(3)]
    frame = kafka_source_frame(spark, values, produced=datetime.now(UTC))

    def names(dynamic: str) -> dict[int, str | None]:
        st = load_manifest(text + f"  dynamicRoute: {dynamic}\n")
        routing = Routing(st, lambda identifier, branch: ".".join((*identifier, branch)))
        rows = routing.routed(decode(frame, st.spec)).select("offset", NAME_COLUMN).collect()
        return {r["offset"]: r[NAME_COLUMN] for r in rows}

    assert names('{from: Field, name: customer, nameTemplate: "t_{value}", when: "id > 0"}') == {
        0: None,
        1: "t_c1",
        2: "t_c2",
    }
    assert names(r'{from: Topic, pattern: "^or(d)ers$", nameTemplate: "o_{value}"}') == dict.fromkeys(
        range(3), "o_d"
    )
    assert names(r'{from: Topic, pattern: "^other\\.(.+)$"}') == dict.fromkeys(range(3))  # no match: no name
    assert names('{from: Key, nameTemplate: "k_{value}"}') == {o: f"k_k{o}" for o in range(3)}
    assert names("{from: Header, name: trace}") == {o: f"t-{o}" for o in range(3)}  # refused later, not here


def test_one_topic_into_a_table_per_type_created_on_first_use_exactly_once(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "dyn_split", "it-dyn-split"
    kafka.create_topic(topic, partitions=2)
    produce_events(kafka, topic, 0, 140)
    st = load_manifest(dynamic_manifest(name, topic, kafka))
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = drain(ingestor)
        assert sum(r.records_dead_lettered for r in reports) == 14 + 2 * 20 - 4  # malformed, bad, extra
    assert_routed(catalog_config, name, kafka, topic)
    catalog = catalog_config.pyiceberg()
    click = catalog.load_table((NAMESPACE, f"{name}_click"))
    assert click.properties[DYNAMIC_OWNER_PROPERTY] == f"{NAMESPACE}.{name}"
    # The driver's meter reads each of them for its status report (`status.tables`, `dynamicTables`).
    reading = TableMeter(st, catalog_config).read_once()
    assert reading is not None and reading.dynamic_route
    dynamic = {r.table: r for r in reading.routes if r.dynamic}
    assert sorted(dynamic) == [f"{NAMESPACE}.{name}_{t}" for t in TABLES]
    assert dynamic[f"{NAMESPACE}.{name}_click"].table_uuid == str(click.metadata.table_uuid)
    high = watermarks(kafka, topic)
    assert all(r.facts.offsets_by_topic == {topic: high} for r in dynamic.values())

    produce_events(kafka, topic, 140, 40)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        routing = ingestor.writer.routing
        assert routing is not None and sorted(routing.dynamic_index) == [f"{name}_{t}" for t in TABLES]
        drain(ingestor)
    assert_routed(catalog_config, name, kafka, topic)


@pytest.mark.timeout(3600)  # three `icefall run` processes, each starting Spark: minutes on a loaded machine
def test_kills_after_creating_and_between_dynamic_tables_commits_leave_each_table_its_records(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    name, topic = "dyn_kills", "it-dyn-kills"
    kafka.create_topic(topic, partitions=2)
    produce_events(kafka, topic, 0, 160)
    manifest, state = tmp_path / "table.yaml", tmp_path / "state"
    manifest.write_text(dynamic_manifest(name, topic, kafka))

    killed_at_each(
        manifest,
        state,
        (
            "route.after-create=exit@2",  # two tables created by the first batch, none committed
            "route.after-commit=exit@3",  # three of four committed the batch; the fourth, the table not
        ),
    )
    finished = run_until_caught_up(manifest, state)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "holds the whole batch already" in finished.stderr, "the tables ahead skipped the batch they held"
    assert_routed(CatalogConfig.embedded(state), name, kafka, topic)
    # `icefall verify` audits each created table by content, each up to its own offsets, against the writer's
    # own routing: the same verdict as the content check above.
    verified = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(manifest), "--state-dir", str(state)],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    for table in TABLES:
        assert f"[dynamicRoute:{name}_{table}] {NAMESPACE}.{name}_{table} " in verified.stdout, table
    assert verified.stdout.rstrip().endswith("routed table, 5 destinations: OK"), verified.stdout[-2000:]


def test_a_recreated_topic_is_reset_in_every_dynamic_table(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:

    from icefall import cli
    from icefall.ingest.engine import SourceChangedError

    name, topic = "dyn_reset", "it-dyn-reset"
    kafka.create_topic(topic, partitions=1)
    produce_events(kafka, topic, 1, 20)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(dynamic_manifest(name, topic, kafka))
    st = load_manifest(manifest.read_text())
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        recreate_topic(kafka, topic)
        produce_events(kafka, topic, 101, 7)  # one record of each type
        with pytest.raises(SourceChangedError):
            ingestor.run_batch()
        state_dir = str(catalog_config.database.parent)
        assert cli.main(["reset-offsets", "-f", str(manifest), "--state-dir", state_dir]) == 0
        drain(ingestor)
    catalog = catalog_config.pyiceberg()
    for kind in TABLES:
        loaded = catalog.load_table((NAMESPACE, f"{name}_{kind}"))
        assert read_committed(loaded).offsets == {0: 7}, kind
        assert len(json.loads(loaded.properties["icefall.offset-resets"])) == 1, kind
    after = {}
    for kind in TABLES:
        rows = catalog.load_table((NAMESPACE, f"{name}_{kind}")).scan(selected_fields=("id",)).to_arrow()
        after[kind] = sorted(i for i in rows.column("id").to_pylist() if i > 100)
    expected = {kind: [i for i in range(101, 108) if TYPES[i % 7] == kind] for kind in TABLES}
    assert after == expected, "the new topic's records, each once, in the tables their type names"
