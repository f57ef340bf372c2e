"""Keyed routes (`spec.routes` with `spec.mode` upsert and cdc): one topic of changes into several keyed
tables, against real Kafka, Spark and the embedded catalog, audited by content (the topic's records, read
back from Kafka, say each table's latest row per key).

Proves: an upsert topic split by a value field (`kind`) into two route tables and the table (unrouted)
leaves in each table exactly the latest row of each key whose last change routes there, updates and
tombstones applied (a tombstone has no `kind`: it deletes its key in every destination), malformed records
dead letters, every table committed up to the topic's end, and `icefall read --table` reads each
destination with the changes past its offsets that route to it; a cdc topic with `sequenceBy` routed by the
row image (`after`, `before` for op d) keeps each route table's own remembered deletes (a late older
change of a deleted key stays deleted there, its commit names its own deleted keys file) and sends a
delete without a before image to every destination; `icefall run` killed between the destinations'
commits (after the first route, after both, after the dead letters) then run to the end leaves each
table exactly its latest rows, no key twice, the tables ahead skipping the batches they hold. `icefall
verify` (`icefall.audit.keyed_routes`) finds every destination equal by key to the changes routed to it,
each up to its own offsets (while the routes and the dead letters are ahead of the table too), and names
the table a row of another one was copied into.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import StreamingTable, load_manifest
from icefall.audit.routed import RoutedAuditReport
from icefall.catalog import CatalogConfig
from icefall.commands.verify import verify_table
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.union_read import union_read
from icefall.testing.live_run import killed_at_each, run_until_caught_up
from icefall.testing.streams import (
    KEYED_MANIFEST,
    NAMESPACE,
    Change,
    drain,
    send_changes,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration

ROUTES = """  routes:
    - table: {{name: {name}_a}}
      when: "kind = 'a'"
    - table: {{name: {name}_b}}
      when: "kind = 'b'"
  unrouted: Table
  batch: {{maxRecords: 60, minIntervalSeconds: 0}}
"""
KINDS = ("a", "b", "c")  # a key's kind is fixed (id % 3): c is no route's, it goes to the table


def keyed_routes_manifest(
    name: str, topic: str, kafka: KafkaBroker, mode: str = "upsert", extra: str = ""
) -> str:
    fields = "      - {name: kind, type: string}\n      - {name: status, type: string}"
    text = KEYED_MANIFEST.format(
        name=name, k8s_name=name.replace("_", "-"), bootstrap=kafka.bootstrap, topic=topic, mode=mode,
        sequence_by=extra, fields=fields,
    )  # fmt: skip
    return text + ROUTES.format(name=name)


def upsert_changes(start: int, count: int, seed: int) -> list[Change]:
    """`count` changes of 40 keys: updates (`status` names the change), one in five a tombstone, one in 25
    malformed; the Kafka key is the id, so the default partitioner keeps a key's changes in one partition."""
    rng = random.Random(seed)
    changes: list[Change] = []
    for n in range(start, start + count):
        i = rng.randrange(40)
        value: Any = {"id": i, "kind": KINDS[i % 3], "status": f"v{n}"}
        if n % 25 == 24:
            value = "{not json"
        elif rng.random() < 0.2:
            value = None
        changes.append((None, str(i), value))
    return changes


def topic_records(kafka: KafkaBroker, topic: str) -> list[tuple[int, int, bytes, bytes | None]]:
    """Every record of `topic` as (partition, offset, key, value), in each partition's order."""
    from confluent_kafka import Consumer, TopicPartition

    records = []
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"keyed-{topic}"})
    try:
        for partition, end in watermarks(kafka, topic).items():
            consumer.assign([TopicPartition(topic, partition, 0)])
            offset = -1
            while offset + 1 < end:
                message = consumer.poll(10)
                assert message is not None and message.error() is None, f"{topic}/{partition} at {offset}"
                offset = message.offset()
                records.append((partition, offset, message.key(), message.value()))
    finally:
        consumer.close()
    return records


def expected_rows(kafka: KafkaBroker, topic: str, name: str) -> dict[str, dict[int, tuple[str, int, int]]]:
    """By table, id → (status, partition, offset) of each key's last change, from the topic's content (a
    key's changes are in one partition, in order): absent when that change is a tombstone, else in the
    table its value's kind routes to. A malformed record is a dead letter, no change."""
    last: dict[int, tuple[int, int, dict[str, Any] | None]] = {}
    for partition, offset, key, value in topic_records(kafka, topic):
        try:
            record = None if value is None else json.loads(value)
        except ValueError:
            continue
        last[int(key)] = (partition, offset, record)
    tables: dict[str, dict[int, tuple[str, int, int]]] = {name: {}, f"{name}_a": {}, f"{name}_b": {}}
    for i, (partition, offset, record) in last.items():
        if record is not None:
            table = {"a": f"{name}_a", "b": f"{name}_b"}.get(record["kind"], name)
            tables[table][i] = (record["status"], partition, offset)
    return tables


def assert_latest_rows(config: CatalogConfig, kafka: KafkaBroker, topic: str, name: str) -> None:
    """Each table holds exactly the latest row of the keys its content names, and is committed up to the
    topic's end; the dead-letter table holds the malformed records, once each."""
    high = watermarks(kafka, topic)
    for table, want in expected_rows(kafka, topic, name).items():
        got = table_rows(config, table)
        wrong = {i: (got.get(i), want.get(i)) for i in set(got) | set(want) if got.get(i) != want.get(i)}
        assert not wrong, f"{table}: id -> (table, topic) differ: {dict(sorted(wrong.items())[:5])}"
        assert read_committed(config.pyiceberg().load_table((NAMESPACE, table))).offsets == high, table
    malformed = sorted((p, o) for p, o, _, v in topic_records(kafka, topic) if v == b"{not json")
    dlq = config.pyiceberg().load_table((NAMESPACE, f"{name}_dlq")).scan().to_arrow().to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in dlq) == malformed


def assert_verified(st: StreamingTable, config: CatalogConfig, spark: SparkSession, name: str) -> None:
    """`icefall verify` finds each destination equal by key to the changes routed to it."""
    report = verify_table(st, config, spark=spark)
    assert isinstance(report, RoutedAuditReport) and report.ok, report.render()
    for destination, table in (("spec.table", name), ("routes[0]", f"{name}_a"), ("routes[1]", f"{name}_b")):
        audit = report.destination(destination)
        assert audit.table == f"{NAMESPACE}.{table}" and audit.rows == len(table_rows(config, table)), table


def table_rows(config: CatalogConfig, table: str) -> dict[int, tuple[str, int, int]]:
    """id → (status, partition, offset) of `it.<table>` read by pyiceberg (position deletes applied); no
    key twice."""
    loaded = config.pyiceberg().load_table((NAMESPACE, table))
    rows = loaded.scan(selected_fields=("id", "status", "_kafka")).to_arrow().to_pylist()
    found = {r["id"]: (r["status"], r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in rows}
    assert len(found) == len(rows), f"{table}: a key twice: {sorted(r['id'] for r in rows)}"
    return found


def test_upsert_changes_land_in_their_route_tables_latest_row_per_key(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_upsert", "it-routes-upsert"
    kafka.create_topic(topic, partitions=2)
    send_changes(kafka, topic, upsert_changes(0, 200, seed=1))
    st = load_manifest(keyed_routes_manifest(name, topic, kafka))
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        assert len(drain(ingestor)) >= 4  # several batches: a key's changes span them
        assert_latest_rows(catalog_config, kafka, topic, name)
        catalog = catalog_config.pyiceberg()
        for table in (f"{name}_a", f"{name}_b"):
            assert catalog.load_table((NAMESPACE, table)).schema().identifier_field_names() == {"id"}, table
        # One batch: an update of an `a` key, a tombstone of a `b` key (no kind: every destination
        # deletes it, only its table has it), insert-then-delete of a `c` key, a new `b` key.
        before = expected_rows(kafka, topic, name)
        b_key = min(before[f"{name}_b"])
        send_changes(
            kafka,
            topic,
            [
                (None, "0", {"id": 0, "kind": "a", "status": "last"}),
                (None, str(b_key), None),
                (None, "2", {"id": 2, "kind": "c", "status": "gone"}),
                (None, "2", None),
                (None, "40", {"id": 40, "kind": "b", "status": "new"}),
            ],
        )
        drain(ingestor)
    assert_latest_rows(catalog_config, kafka, topic, name)
    assert table_rows(catalog_config, f"{name}_a")[0][0] == "last"
    assert b_key not in table_rows(catalog_config, f"{name}_b")
    assert table_rows(catalog_config, f"{name}_b")[40][0] == "new"
    assert 2 not in table_rows(catalog_config, name)
    assert_verified(st, catalog_config, spark, name)

    # `icefall read --table`: each destination plus the changes past its offsets routed to it (a tombstone
    # to every one) is the latest row per key the topic's content names for that table.
    send_changes(kafka, topic, upsert_changes(300, 50, seed=3))
    for table, want in expected_rows(kafka, topic, name).items():
        with union_read(st, catalog_config, spark=spark, table_name=f"{NAMESPACE}.{table}") as result:
            rows = result.frame.select("id", "status").collect()
        assert {r["id"]: r["status"] for r in rows} == {i: status for i, (status, _, _) in want.items()}, (
            table
        )
        assert len(rows) == len(want), table

    # A `b` row copied into the `a` table: `icefall verify` names it there (a key the `a` changes do not
    # leave), the other destinations stay equal.
    from pyiceberg.expressions import EqualTo

    a_table = catalog_config.pyiceberg().load_table((NAMESPACE, f"{name}_a"))
    b_table = catalog_config.pyiceberg().load_table((NAMESPACE, f"{name}_b"))
    copied = b_table.scan(row_filter=EqualTo("id", 40)).to_arrow()
    a_table.append(copied)
    broken = verify_table(st, catalog_config, spark=spark)
    a = broken.destination("routes[0]")
    assert (a.unexpected, a.missing, a.wrong, a.duplicates) == (1, 0, 0, 0), broken.render()
    assert a.examples["unexpected"] == ('{"id":40}',)
    assert broken.destination("spec.table").ok and broken.destination("routes[1]").ok, broken.render()
    assert broken.render().endswith("routed table, 3 destinations: FAILED: routes[0]"), broken.render()


def test_cdc_routes_by_the_row_image_each_table_remembering_its_deletes(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_cdc", "it-routes-cdc"
    kafka.create_topic(topic, partitions=1)
    text = keyed_routes_manifest(name, topic, kafka, mode="cdc", extra='\n  sequenceBy: ["source.lsn"]')
    st = load_manifest(text)

    def row(i: int, kind: str, status: str) -> dict[str, Any]:
        return {"id": i, "kind": kind, "status": status}

    def event(op: str, before: Any, after: Any, lsn: int) -> dict[str, Any]:
        return {"op": op, "before": before, "after": after, "source": {"lsn": lsn}}

    send_changes(
        kafka,
        topic,
        [
            (0, {"id": 1}, event("c", None, row(1, "a", "created"), 10)),
            (0, {"id": 2}, event("c", None, row(2, "b", "created"), 11)),
            (0, {"id": 4}, event("c", None, row(4, "c", "created"), 12)),
            (0, {"id": 1}, event("d", row(1, "a", "created"), None, 20)),  # `before` routes it to _a
        ],
    )
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        catalog = catalog_config.pyiceberg()
        assert table_rows(catalog_config, f"{name}_a") == {}
        assert set(table_rows(catalog_config, f"{name}_b")) == {2}
        assert set(table_rows(catalog_config, name)) == {4}
        a_table = catalog.load_table((NAMESPACE, f"{name}_a"))
        remembered = read_committed(a_table).deleted_keys
        assert remembered and remembered.startswith(a_table.location().rstrip("/") + "/metadata/"), remembered
        assert read_committed(catalog.load_table((NAMESPACE, name))).deleted_keys is None, "the d was _a's"
        send_changes(
            kafka,
            topic,
            [
                (0, {"id": 1}, event("u", row(1, "a", "created"), row(1, "a", "late"), 15)),  # before the d
                (0, {"id": 2}, event("u", row(2, "b", "created"), row(2, "b", "stale"), 5)),  # before the c
                (0, {"id": 4}, event("d", None, None, 30)),  # no image: every destination deletes 4
            ],
        )
        drain(ingestor)
    assert table_rows(catalog_config, f"{name}_a") == {}, "a late older change of a remembered delete"
    assert table_rows(catalog_config, f"{name}_b") == {2: ("created", 0, 1)}
    assert table_rows(catalog_config, name) == {}
    high = watermarks(kafka, topic)
    for table in (name, f"{name}_a", f"{name}_b"):
        committed = read_committed(catalog.load_table((NAMESPACE, table)))
        assert committed.offsets == high, table
        assert committed.deleted_keys, f"{table} remembers the delete of 4"
    assert_verified(st, catalog_config, spark, name)


@pytest.mark.timeout(3600)  # four `icefall run` processes, each starting Spark: minutes on a loaded machine
def test_kills_between_the_destinations_commits_leave_each_table_its_latest_rows(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    name, topic = "routes_keyed_kills", "it-routes-keyed-kills"
    kafka.create_topic(topic, partitions=2)
    send_changes(kafka, topic, upsert_changes(0, 240, seed=7))
    manifest, state = tmp_path / "table.yaml", tmp_path / "state"
    manifest.write_text(keyed_routes_manifest(name, topic, kafka))

    logs = killed_at_each(
        manifest,
        state,
        (
            "route.after-commit=exit",  # the first route committed its batch, the second and the table not
            "route.after-commit=exit@3",  # the first route skips what it holds; then two more route commits
            "dlq.after-commit=exit",  # both routes and the dead letters ahead of the table
        ),
    )
    assert "holds the whole batch already" in logs[1], "the route ahead skipped the batch it held"
    verified_by_cli(manifest, state, name)  # both routes and the dead letters ahead of the table
    finished = run_until_caught_up(manifest, state)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_latest_rows(CatalogConfig.embedded(state), kafka, topic, name)
    verified_by_cli(manifest, state, name)


def verified_by_cli(manifest: Path, state: Path, name: str) -> None:
    """`icefall verify` finds each destination equal by key to the changes routed to it, each up to its
    own offsets, and says so per destination."""
    verified = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(manifest), "--state-dir", str(state)],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    for destination, table in (("spec.table", name), ("routes[0]", f"{name}_a"), ("routes[1]", f"{name}_b")):
        assert f"[{destination}] table {NAMESPACE}.{table} (keyed)" in verified.stdout, verified.stdout
    assert verified.stdout.rstrip().endswith("routed table, 3 destinations: OK"), verified.stdout[-2000:]
