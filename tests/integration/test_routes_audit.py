"""`icefall verify` and `icefall read` per destination of a routed table (`spec.routes`), against real Kafka,
Spark and the embedded catalog.

Proves, on one ingestion left with a route table ahead of the others (a batch failing right after the first
route's commit): the audit by content finds every destination right, each up to its own committed offsets
(`spec.table` with its dead-letter table); a row deleted from one route table is missing there and a row of
`spec.table` copied into another route table is in the wrong table, each reported under its destination
while the others stay OK; `read --table` reads each destination plus the records past its own offsets routed
to it — exactly the records whose content names that table — and refuses a table it does not write, naming
the choices. With `unrouted: DeadLetter`, an unrouted record must be a dead letter with the unrouted reason:
a malformed record's dead letter given that reason is wrong. A dynamic route (`spec.dynamicRoute`): each
table it created is audited from the batch that created it, a clean run verifies with nothing duplicated,
missing or wrong, each refused name's records are dead letters with the writer's reason (not an identifier,
the dead-letter table's name, a table the route did not create until the cap was full, past the cap after);
`read --table` reads a created table and spec.table each with the tail the writer routes there; a row
deleted from a created table is missing there, a row copied into another in the wrong table there, a dead
letter given another refusal's reason wrong under spec.table, and a table made by hand with the owner
property but never committed is noted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.expressions import EqualTo
from pyspark.sql import SparkSession

from icefall.api import UNROUTED_REASON, load_manifest
from icefall.audit.routed import RoutedAuditReport
from icefall.catalog import CatalogConfig
from icefall.commands.verify import verify_table
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.union_read import ReadError, union_read
from icefall.runtime import failpoints
from icefall.testing.streams import NAMESPACE, drain, manifest_text, produce, started_ingestor

pytestmark = pytest.mark.integration

ROUTES = """  routes:
    - table: {{name: {name}_vip}}
      when: "customer IN ('c0', 'c1')"
    - table: {{name: {name}_even}}
      when: "CAST(_kafka.key AS BIGINT) % 2 = 0"
  unrouted: {unrouted}
"""


def routed_manifest(name: str, topic: str, kafka: KafkaBroker, unrouted: str = "Table") -> str:
    text = manifest_text(name, topic, kafka.bootstrap, batch={"maxRecords": 60, "minIntervalSeconds": 0})
    return text + ROUTES.format(name=name, unrouted=unrouted)


def ids_by_table(kafka: KafkaBroker, topic: str, name: str) -> dict[str, set[int]]:
    """The ids of the topic's well-formed records by the table their content names (unrouted: Table)."""
    from confluent_kafka import Consumer, TopicPartition

    from icefall.testing.streams import watermarks

    high = watermarks(kafka, topic)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "routes-audit"})
    tables: dict[str, set[int]] = {}
    try:
        for partition, end in high.items():
            consumer.assign([TopicPartition(topic, partition, 0)])
            seen = 0
            while seen < end:
                message = consumer.poll(10)
                assert message is not None and message.error() is None
                seen = message.offset() + 1
                try:
                    record = json.loads(message.value() or b"")
                except ValueError:
                    continue
                table = name
                if record["customer"] in ("c0", "c1"):
                    table = f"{name}_vip"
                elif record["id"] % 2 == 0:
                    table = f"{name}_even"
                tables.setdefault(table, set()).add(record["id"])
    finally:
        consumer.close()
    return tables


def verified(st: Any, config: CatalogConfig, spark: SparkSession) -> RoutedAuditReport:
    report = verify_table(st, config, spark=spark)
    assert isinstance(report, RoutedAuditReport)
    return report


def test_verify_and_read_each_destination_up_to_its_own_offsets(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_audit", "it-routes-audit"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 120, bad_every=10)
    st = load_manifest(routed_manifest(name, topic, kafka))
    catalog = catalog_config.pyiceberg()
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        produce(kafka, topic, 120, 40, bad_every=10)
        with failpoints.armed("route.after-commit", "raise"), pytest.raises(failpoints.FailpointError):
            ingestor.run_batch()  # the first route commits the batch; the second, the DLQ and the table not
    tables = {t: catalog.load_table((NAMESPACE, t)) for t in (name, f"{name}_vip", f"{name}_even")}
    offsets = {t: read_committed(table).offsets for t, table in tables.items()}
    assert offsets[f"{name}_vip"] != offsets[name] == offsets[f"{name}_even"], offsets

    report = verified(st, catalog_config, spark)
    assert report.ok, report.render()
    for destination, table in (
        ("spec.table", name),
        ("routes[0]", f"{name}_vip"),
        ("routes[1]", f"{name}_even"),
    ):
        audit = report.destination(destination)
        assert audit.table == f"{NAMESPACE}.{table}" and audit.content_checked
        assert {p.partition: p.committed for p in audit.partitions} == offsets[table], destination
    assert report.destination("spec.table").dlq_table == f"{NAMESPACE}.{name}_dlq"
    assert sum(p.in_dlq for p in report.destination("spec.table").partitions) == 12  # 120 records, 1 in 10

    # read: each destination plus the tail past its own offsets routed to it, exactly its records.
    want = ids_by_table(kafka, topic, name)
    for table in (name, f"{name}_vip", f"{name}_even"):
        with union_read(st, catalog_config, spark=spark, table_name=f"{NAMESPACE}.{table}") as result:
            ids = [row["id"] for row in result.frame.select("id").collect()]
            assert sorted(ids) == sorted(want[table]), table
            assert {p: start for p, (start, _) in result.cut.partitions.items()} == offsets[table], table
            assert result.cut.routed_elsewhere > 0 or table == f"{name}_vip", table
    with pytest.raises(ReadError, match=rf"choose one of {NAMESPACE}.{name}, {NAMESPACE}.{name}_vip, "):
        union_read(st, catalog_config, spark=spark, table_name=f"{NAMESPACE}.{name}_dlq")

    # A row deleted from one route table, a row of spec.table copied into another: each under its table.
    vip_id, other_id = min(want[f"{name}_vip"]), min(want[name])
    tables[f"{name}_vip"].delete(EqualTo("id", vip_id))
    copied = tables[name].scan(row_filter=EqualTo("id", other_id)).to_arrow()
    assert copied.num_rows == 1
    tables[f"{name}_even"].append(copied)
    broken = verified(st, catalog_config, spark)
    assert not broken.ok
    vip, even = broken.destination("routes[0]"), broken.destination("routes[1]")
    assert (vip.missing, vip.wrong_table, vip.wrong) == (1, 0, 0), broken.render()
    assert (even.missing, even.wrong_table, even.wrong) == (0, 1, 0), broken.render()
    assert broken.destination("spec.table").ok, broken.render()
    at = copied.column("_kafka").to_pylist()[0]
    partition, offset = at["partition"], at["offset"]
    text = broken.render()
    assert f"[routes[1]] {NAMESPACE}.{name}_even" in text
    assert f"partition {partition}: rows of records another destination takes, at offsets {offset}" in text
    assert "FAILED: routes[0], routes[1]" in text


def test_an_unrouted_record_is_a_dead_letter_with_the_unrouted_reason(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_audit_dl", "it-routes-audit-dl"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 30, bad_every=7)
    st = load_manifest(routed_manifest(name, topic, kafka, unrouted="DeadLetter"))
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
    report = verified(st, catalog_config, spark)
    assert report.ok, report.render()
    dlq = catalog_config.pyiceberg().load_table((NAMESPACE, f"{name}_dlq"))
    rows = dlq.scan().to_arrow()
    reasons = rows.column("error").to_pylist()
    malformed = next(i for i, reason in enumerate(reasons) if reason != UNROUTED_REASON)
    assert UNROUTED_REASON in reasons
    # The malformed record's dead letter, said to be unrouted instead (Spark: the table is partitioned).
    offset = rows.column("offset")[malformed].as_py()
    spark.sql(
        f'UPDATE {catalog_config.name}.{NAMESPACE}.{name}_dlq SET error = "{UNROUTED_REASON}" '
        f"WHERE offset = {offset}"
    )
    broken = verified(st, catalog_config, spark).destination("spec.table")
    assert not broken.ok and broken.wrong == 1
    assert broken.partition(0).wrong_examples == (offset,)


#: Record i's `customer` (the dynamic route's field): two tables from the start, a name that is not an
#: identifier, the dead-letter table's name, a table the route did not create, one past `maxTables` 3, no
#: name; from offset 21 on a new table too, sorted before the one the route did not create (which then
#: is past the cap: the writer counts the refused creation in its batch).
EARLY = ("a", "b", "bad-x", "dlq", "hand", "zz", None)
LATE = ("a", "b", "bad-x", "dlq", "hand", "zz", None, "c")


def customer(i: int) -> str | None:
    kinds = EARLY if i < 21 else LATE
    return kinds[i % len(kinds)]


def produce_named(kafka: KafkaBroker, topic: str, start: int, count: int) -> None:
    """Records `start..start+count-1` of `customer(i)`, keyed by id; every 10th (from 9) malformed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        value = {"id": i, "customer": customer(i), "amount": 1.5, "ts": "2026-11-22T10:00:00Z"}
        producer.produce(topic, key=str(i), value="{not json" if i % 10 == 9 else json.dumps(value))
    assert producer.flush(60) == 0


def test_verify_and_read_the_tables_a_dynamic_route_created(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    import pyarrow as pa

    from icefall.api.routes import DYNAMIC_OWNER_PROPERTY
    from icefall.plan.routing import not_created_reason

    name, topic = "routes_audit_dyn", "it-routes-audit-dyn"
    kafka.create_topic(topic, partitions=1)
    text = manifest_text(name, topic, kafka.bootstrap, batch={"maxRecords": 100, "minIntervalSeconds": 0})
    route = f'{{from: Field, name: customer, nameTemplate: "{name}_{{value}}", maxTables: 3}}'
    st = load_manifest(f"{text}  dynamicRoute: {route}\n")
    catalog = catalog_config.pyiceberg()
    catalog.create_namespace_if_not_exists(NAMESPACE)
    blank = pa.schema([pa.field("x", pa.int64())])
    catalog.create_table((NAMESPACE, f"{name}_hand"), schema=blank)  # no owner property: never written
    produce_named(kafka, topic, 0, 21)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)  # one batch: a and b created, hand refused (not created), zz past the cap
        produce_named(kafka, topic, 21, 32)
        drain(ingestor)  # one batch: c created, hand and zz past the cap
    produce_named(kafka, topic, 53, 16)  # past every table's offsets: the tail of a read
    tables = {k: catalog.load_table((NAMESPACE, f"{name}_{k}")) for k in ("a", "b", "c")}
    assert read_committed(tables["c"]).start_offsets == {0: 21}, "created by the second batch"

    report = verified(st, catalog_config, spark)
    assert report.ok, report.render()
    labels = [d.destination for d in report.destinations]
    assert labels == ["spec.table", *(f"dynamicRoute:{name}_{k}" for k in ("a", "b", "c"))]
    for d in report.destinations:
        counts = [(p.duplicates, p.missing, p.wrong, p.wrong_table) for p in d.report.partitions]
        assert counts == [(0, 0, 0, 0)] and d.report.content_checked, d.destination
    main = report.destination("spec.table").partition(0)
    refused = ("bad-x", "dlq", "hand", "zz")
    assert main.in_dlq == sum(1 for i in range(53) if i % 10 == 9 or customer(i) in refused)
    assert main.in_table == sum(1 for i in range(53) if i % 10 != 9 and customer(i) is None)
    assert report.destination(f"dynamicRoute:{name}_c").partition(0).start == 21
    dlq = catalog.load_table((NAMESPACE, f"{name}_dlq")).scan().to_arrow()
    reasons = {r["offset"]: r["error"] for r in dlq.select(["offset", "error"]).to_pylist()}
    assert reasons[4] == not_created_reason(f"{name}_hand") and "past maxTables 3" in reasons[28]

    # read: a created table, and spec.table (no record that computes a name), each with its tail.
    for kind in ("c", None):
        table_name = f"{NAMESPACE}.{name}" + (f"_{kind}" if kind else "")
        want = [i for i in range(69) if i % 10 != 9 and customer(i) == kind]
        with union_read(st, catalog_config, spark=spark, table_name=table_name) as result:
            assert sorted(r["id"] for r in result.frame.select("id").collect()) == want, table_name
    with pytest.raises(ReadError, match=rf"{NAMESPACE}.{name}_b, {NAMESPACE}.{name}_c$"):
        union_read(st, catalog_config, spark=spark, table_name=f"{NAMESPACE}.{name}_hand")

    # A row deleted from one created table, a row of another copied into it, a dead letter's reason
    # changed, a table made by hand with the owner property: each reported where it is.
    a_id = tables["a"].scan().to_arrow().column("id")[0].as_py()
    tables["a"].delete(EqualTo("id", a_id))
    copied = tables["b"].scan(row_filter=EqualTo("id", 33)).to_arrow()  # offset 33: past c's start
    assert copied.num_rows == 1
    tables["c"].append(copied)
    wrong_reason = not_created_reason(f"{name}_zz")
    spark.sql(
        f'UPDATE {catalog_config.name}.{NAMESPACE}.{name}_dlq SET error = "{wrong_reason}" WHERE offset = 28'
    )
    owner = {DYNAMIC_OWNER_PROPERTY: f"{NAMESPACE}.{name}"}
    catalog.create_table((NAMESPACE, f"{name}_ghost"), schema=blank, properties=owner)
    broken = verified(st, catalog_config, spark)
    assert not broken.ok
    a, b, c = (broken.destination(f"dynamicRoute:{name}_{k}") for k in ("a", "b", "c"))
    assert (a.missing, a.wrong, a.wrong_table) == (1, 0, 0), broken.render()
    assert b.ok and (c.wrong_table, c.partition(0).wrong_table_examples) == (1, (33,)), broken.render()
    assert broken.destination("spec.table").partition(0).wrong_examples == (28,), broken.render()
    assert any(f"{NAMESPACE}.{name}_ghost" in note for note in broken.notes), broken.render()
