"""`icefall verify` and `icefall read` per destination of a routed table (`spec.routes`), against real Kafka,
Spark and the embedded catalog.

Proves, on one ingestion left with a route table ahead of the others (a batch failing right after the first
route's commit): the audit by content finds every destination right, each up to its own committed offsets
(`spec.table` with its dead-letter table); a row deleted from one route table is missing there and a row of
`spec.table` copied into another route table is in the wrong table, each reported under its destination
while the others stay OK; `read --table` reads each destination plus the records past its own offsets routed
to it — exactly the records whose content names that table — and refuses a table it does not write, naming
the choices. With `unrouted: DeadLetter`, an unrouted record must be a dead letter with the unrouted reason:
a malformed record's dead letter given that reason is wrong.
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
