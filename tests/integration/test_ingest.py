"""Ingestion is exactly once against real Kafka, Spark and catalog: after a normal run, and after the process
is killed at every commit failpoint and restarted, each produced record is in the table or the dead-letter
table exactly once, checked record by record by (partition, offset)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor

pytestmark = pytest.mark.integration

MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {k8s_name}}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  format:
    type: json
    schema:
      - {{name: id, type: long, required: true}}
      - {{name: customer, type: string}}
      - {{name: amount, type: "decimal(10,2)"}}
      - {{name: ts, type: timestamptz, required: true}}
  table: {{namespace: it, name: {name}, partitioning: [{{field: ts, transform: day}}]}}
  freshness: {{targetSeconds: 2}}
"""


def produce(
    kafka: KafkaBroker, topic: str, start: int, count: int, bad_every: int = 0
) -> set[tuple[int, int]]:
    """Produce `count` events, every `bad_every`-th malformed; returns the (partition, offset) of bad ones."""
    delivered: list[tuple[int, int, bool]] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        bad = bad_every > 0 and i % bad_every == 0
        value = (
            "{not json"
            if bad
            else json.dumps(
                {"id": i, "customer": f"c{i % 7}", "amount": round(i * 1.25, 2), "ts": "2026-11-22T10:00:00Z"}
            )
        )

        def on_delivery(err: object, msg: object, bad: bool = bad) -> None:
            assert err is None, err
            delivered.append((msg.partition(), msg.offset(), bad))  # type: ignore[attr-defined]

        producer.produce(topic, key=str(i), value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return {(p, o) for p, o, bad in delivered if bad}


def table_offsets(
    config: CatalogConfig, name: str
) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    catalog = config.pyiceberg()
    rows = catalog.load_table(("it", name)).scan(selected_fields=("_kafka",)).to_arrow()
    kafka = rows.column("_kafka").combine_chunks()
    partitions = pc.struct_field(kafka, "partition").to_pylist()
    main = Counter(zip(partitions, pc.struct_field(kafka, "offset").to_pylist(), strict=True))
    dlq_rows = (
        catalog.load_table(("it", f"{name}_dlq")).scan(selected_fields=("partition", "offset")).to_arrow()
    )
    dlq = Counter(
        zip(dlq_rows.column("partition").to_pylist(), dlq_rows.column("offset").to_pylist(), strict=True)
    )
    return main, dlq


def assert_exactly_once(
    config: CatalogConfig, name: str, high: dict[int, int], bad: set[tuple[int, int]]
) -> None:
    main, dlq = table_offsets(config, name)
    expected = {(p, o) for p, end in high.items() for o in range(end)}
    assert max(main.values(), default=1) == 1, (
        f"duplicates in table: {[k for k, n in main.items() if n > 1][:10]}"
    )
    assert max(dlq.values(), default=1) == 1, (
        f"duplicates in DLQ: {[k for k, n in dlq.items() if n > 1][:10]}"
    )
    assert set(dlq) == bad
    assert set(main) == expected - bad
    committed = read_committed(config.pyiceberg().load_table(("it", name)))
    assert committed.offsets == high


def watermarks(kafka: KafkaBroker, topic: str) -> dict[int, int]:
    from icefall.kafka.admin import TopicView

    with TopicView(kafka.bootstrap, topic) as view:
        return {p: high for p, (_, high) in view.watermarks().items()}


def test_ingest_in_process_exactly_once(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    kafka.create_topic("it-orders", partitions=3)
    bad = produce(kafka, "it-orders", 0, 600, bad_every=50)
    st = load_manifest(
        MANIFEST.format(
            name="orders_inproc", k8s_name="orders-inproc", bootstrap=kafka.bootstrap, topic="it-orders"
        )
    )
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "test-writer"))
    ingestor.start(lease_timeout=10)
    reports = []
    try:
        while (report := ingestor.run_batch()) is not None:
            reports.append(report)
        bad |= produce(kafka, "it-orders", 600, 150, bad_every=50)
        while (report := ingestor.run_batch()) is not None:
            reports.append(report)
    finally:
        ingestor.close()
    assert len(reports) >= 2
    assert sum(r.records_read for r in reports) == 750
    assert sum(r.records_dead_lettered for r in reports) == len(bad) == 15
    assert_exactly_once(catalog_config, "orders_inproc", watermarks(kafka, "it-orders"), bad)


@pytest.mark.parametrize("failpoint", ["after-prepare", "after-stage", "before-commit", "after-commit"])
def test_killed_at_failpoint_then_restarted_is_exactly_once(
    kafka: KafkaBroker, tmp_path: Path, failpoint: str
) -> None:
    topic = f"it-crash-{failpoint}"
    name = f"crash_{failpoint.replace('-', '_')}"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 200, bad_every=40)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(
        MANIFEST.format(name=name, k8s_name=name.replace("_", "-"), bootstrap=kafka.bootstrap, topic=topic)
    )
    state = tmp_path / "state"

    def run(*, fail: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "ICEFALL_FAILPOINTS"}
        if fail:
            env["ICEFALL_FAILPOINTS"] = f"{fail}=exit"
        return subprocess.run(
            [sys.executable, "-m", "icefall.cli", "run", "-f", str(manifest), "--state-dir", str(state),
             "--until-caught-up", "--lease-timeout", "30"],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    crashed = run(fail=failpoint)
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    bad |= produce(kafka, topic, 200, 100, bad_every=40)
    finished = run(fail=None)
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    assert_exactly_once(CatalogConfig.embedded(state), name, watermarks(kafka, topic), bad)
