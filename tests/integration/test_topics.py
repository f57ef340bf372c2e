"""Several topics into one table (`spec.source.topics`), against real Kafka, Spark and the embedded catalog.

Proves: two topics (3 and 2 partitions, malformed records in both) are ingested into one table and its
dead-letter table exactly once per (topic, partition, offset), batches pipelined, each row naming its topic,
checked record by record and by the auditor by content; the committed state keeps offsets, start offsets
and topic ids by topic; a topic added to the list later is read from its earliest record although the spec
starts at `latest`; a topic deleted and created again stops ingestion naming it, and `icefall
reset-offsets` resets that topic alone, after which the audit sets aside its old rows and passes.
Kills at the commit failpoints with two topics: test_failpoint_kills.py.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from icefall import cli
from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.state import OFFSET_RESETS
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport, Ingestor, SourceChangedError
from icefall.testing.streams import (
    NAMESPACE,
    assert_exactly_once_by_topic,
    audit,
    drain,
    manifest_text,
    produce,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration

BATCH = {"maxRecords": 120, "minIntervalSeconds": 0, "pipelined": True}


def run_until_caught_up(ingestor: Ingestor) -> list[BatchReport]:
    """`Ingestor.run` (pipelined, as `icefall run`) until a step finds nothing to read."""
    reports: list[BatchReport] = []
    idle = threading.Event()

    def on_batch(report: BatchReport | None) -> None:
        if report is None:
            idle.set()
        else:
            reports.append(report)

    ingestor.run(idle.is_set, on_batch)
    return reports


def tagged(topic: str, bad: set[tuple[int, int]]) -> set[tuple[str, int, int]]:
    return {(topic, p, o) for p, o in bad}


def test_two_topics_fill_one_table_exactly_once_and_a_third_is_read_from_its_start(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, eu, us, asia = "topics_two", "it-topics-eu", "it-topics-us", "it-topics-asia"
    kafka.create_topic(eu, partitions=3)
    kafka.create_topic(us, partitions=2)
    kafka.create_topic(asia, partitions=1)
    bad = tagged(eu, produce(kafka, eu, 0, 400, bad_every=10)) | tagged(
        us, produce(kafka, us, 0, 250, bad_every=7)
    )
    produce(kafka, asia, 0, 30)  # before the table reads it: a start at `latest` must not skip these
    st = load_manifest(manifest_text(name, [eu, us], kafka.bootstrap, batch=BATCH))
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = run_until_caught_up(ingestor)
    assert sum(r.records_read for r in reports) == 650
    assert sum(r.records_dead_lettered for r in reports) == len(bad)
    high = {eu: watermarks(kafka, eu), us: watermarks(kafka, us)}
    assert_exactly_once_by_topic(
        catalog_config, name, high, bad, bootstrap=kafka.bootstrap, spark=spark, st=st
    )
    table = catalog_config.pyiceberg().load_table((NAMESPACE, name))
    properties = table.properties
    assert json.loads(properties["icefall.offsets"]) == {
        t: {str(p): o for p, o in ends.items()} for t, ends in high.items()
    }
    assert set(json.loads(properties["icefall.topic-id"])) == {eu, us}
    assert "icefall.topic" not in properties

    # A third topic joins; the spec starts new tables at `latest`, but this table is not new.
    later = manifest_text(name, [eu, us, asia], kafka.bootstrap, batch=BATCH)
    st = load_manifest(later.replace("topics:", "startingPosition: {type: latest}, topics:", 1))
    bad |= tagged(us, produce(kafka, us, 250, 50, bad_every=7))
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
    high = {eu: watermarks(kafka, eu), us: watermarks(kafka, us), asia: watermarks(kafka, asia)}
    assert_exactly_once_by_topic(
        catalog_config, name, high, bad, bootstrap=kafka.bootstrap, spark=spark, st=st
    )
    assert read_committed(table).of_topic(asia).start_offsets == {0: 0}


def test_a_recreated_topic_of_several_stops_ingestion_and_is_reset_alone(
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, kept, again = "topics_reset", "it-topics-kept", "it-topics-again"
    kafka.create_topic(kept, partitions=2)
    kafka.create_topic(again, partitions=1)
    produce(kafka, kept, 0, 40)
    produce(kafka, again, 0, 30, partitions=[0])
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, [kept, again], kafka.bootstrap))
    st = load_manifest(manifest.read_text())
    state_dir = str(catalog_config.database.parent)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        table = catalog_config.pyiceberg().load_table((NAMESPACE, name))
        before = read_committed(table)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.delete_topics([again])[again].result(30)
        _recreate(kafka, again)
        produce(kafka, again, 100, 35, partitions=[0])
        produce(kafka, kept, 40, 10)
        with pytest.raises(SourceChangedError, match=rf"topic '{again}' was deleted and created again"):
            ingestor.run_batch()
        assert read_committed(table).snapshot_id == before.snapshot_id, "nothing was committed"
        assert cli.main(["reset-offsets", "-f", str(manifest), "--state-dir", state_dir]) == 0
        assert f"topic '{again}'" in capsys.readouterr().out
        drain(ingestor)
    after = read_committed(table)
    assert after.of_topic(kept).topic_id == before.of_topic(kept).topic_id
    assert after.of_topic(again).topic_id not in (None, before.of_topic(again).topic_id)
    (reset,) = json.loads(table.properties[OFFSET_RESETS])
    assert (reset["topic"], reset["from_offsets"], reset["to_offsets"]) == (again, {"0": 30}, {"0": 0})
    assert cli.main(["status", "-f", str(manifest), "--state-dir", state_dir]) == 0
    status = capsys.readouterr().out
    assert f"{again} " in status and f"{kept} " in status and "INGESTION STOPPED" not in status, status
    # The old topic's 30 rows at offsets 0..29 are set aside; the new topic's 35 and all of `kept` audited.
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark, st=st)
    assert report.ok and report.content_checked, report.render()
    recreated = report.partition(0, again)
    assert (recreated.in_table, recreated.before_reset, recreated.expected) == (35, 30, 35), report.render()
    assert sum(p.in_table for p in report.partitions if p.topic == kept) == 50, report.render()


def _recreate(kafka: KafkaBroker, topic: str, timeout: float = 60) -> None:
    """Create `topic` again as soon as Kafka has finished deleting it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kafka.create_topic(topic, partitions=1)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
