"""Records Kafka's retention deletes before ingestion are skipped, counted and reported, never silently.

Proves, against real Kafka (records deleted with `AdminClient.delete_records`, which moves the low watermark
exactly as retention does), Spark and the catalog, in process:
- ingestion continues from the earliest offset Kafka still holds, with every other record in the table
  (or the dead-letter table) exactly once, checked record by record and by the auditor, which reports the
  deleted offsets as lost to retention, not missing;
- the loss is loud: an ERROR log naming the partition and offsets, `icefall_data_loss_records_total`, and
  the table property `icefall.lost-records` (cumulative, set by the commit that skips the records), which
  `icefall status` prints;
- retention that empties a partition with nothing left to read still lands in the table at once (a commit
  with no rows moves the partition to its low watermark and adds the loss);
- records deleted after they were ingested are not a loss;
- with `spec.source.onDataLoss: Halt` nothing is skipped: the batch that would skip raises
  DataLossHaltedError naming the partition and the lost offsets before anything is read or committed,
  `icefall run` ends with that one line and exit code 5 (no traceback), and the table is untouched; set
  back to Continue, the same table skips and counts them (`icefall.lost-records`), the rest exactly once.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from icefall import cli
from icefall.api import OnDataLoss, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commands.run import EXIT_DATA_LOSS
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import DataLossHaltedError, Ingestor
from icefall.runtime import metrics
from icefall.testing.streams import (
    assert_exactly_once,
    drain,
    manifest_text,
    produce,
    streaming_table,
    watermarks,
)

pytestmark = pytest.mark.integration


def delete_records(kafka: KafkaBroker, topic: str, before: dict[int, int]) -> None:
    """Delete the records below `before[p]` of partition p: the low watermark moves there, like retention."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    wanted = [TopicPartition(topic, p, offset) for p, offset in before.items()]
    for future in admin.delete_records(wanted).values():
        future.result(30)


def lost_metric(table: str) -> float:
    value = metrics.REGISTRY.get_sample_value("icefall_data_loss_records_total", {"table": table})
    return value or 0.0


def test_records_deleted_by_retention_are_skipped_counted_and_reported(  # noqa: PLR0917 (fixtures)
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, name = "it-retention", "retention"
    kafka.create_topic(topic, partitions=2)
    # 50 records per partition; ids 0, 7, 14, ... are malformed (both partitions get some).
    bad = produce(kafka, topic, 0, 100, bad_every=7, partitions=[0, 1])
    st = streaming_table(name, topic, kafka.bootstrap, batch={"maxRecords": 40, "minIntervalSeconds": 0})
    lease = FileLease(tmp_path / "lease.json", "w", duration_seconds=30)
    ingestor = Ingestor(st, catalog_config, spark, lease)
    ingestor.start(lease_timeout=10)
    metric_before = lost_metric("it.retention")
    try:
        first = ingestor.run_batch()
        assert first is not None and first.offsets == {0: 20, 1: 20}

        # Retention deletes 20..34 of partition 0 before they were read (a loss of 15), and only records
        # of partition 1 that were already ingested (no loss).
        delete_records(kafka, topic, {0: 35, 1: 10})
        caplog.set_level(logging.ERROR, logger="icefall.ingest.engine")
        reports = drain(ingestor)
        assert sum(r.data_loss for r in reports) == 15
        table = catalog_config.pyiceberg().load_table(("it", name))
        assert read_committed(table).lost_records == 15
        assert table.properties["icefall.lost-records"] == "15"
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
            "it.retention: DATA LOSS: partition 0: records 20..34 were deleted by topic retention before "
            "they were ingested; continuing from 35"
        ]

        # Partition 1 gets 10 records that retention deletes before any batch reads them: nothing is left
        # to read anywhere, and the loss is still committed at once.
        bad |= produce(kafka, topic, 100, 10, bad_every=7, partitions=[1])
        delete_records(kafka, topic, {1: 60})
        loss_only = ingestor.run_batch()
        assert loss_only is not None
        assert (loss_only.records_read, loss_only.data_loss, loss_only.offsets) == (0, 10, {0: 50, 1: 60})
        assert ingestor.run_batch() is None
    finally:
        ingestor.close()

    lost = {(0, o) for o in range(20, 35)} | {(1, o) for o in range(50, 60)}
    high = watermarks(kafka, topic)
    assert high == {0: 50, 1: 60}
    report = assert_exactly_once(catalog_config, name, high, bad, lost=lost, bootstrap=kafka.bootstrap)
    assert report is not None
    # The auditor cannot compare [start, low watermark) with Kafka any more: it counts it as lost to
    # retention, of which the offsets the table holds (ingested before the deletion) are `unverified`.
    p0, p1 = report.partition(0), report.partition(1)
    assert (p0.missing, p0.lost_to_retention, p0.unverified) == (0, 35, 20)
    assert (p1.missing, p1.lost_to_retention, p1.unverified) == (0, 60, 50)
    assert p0.lost_to_retention - p0.unverified + p1.lost_to_retention - p1.unverified == 25

    committed = read_committed(catalog_config.pyiceberg().load_table(("it", name)))
    assert committed.lost_records == 25
    assert lost_metric("it.retention") - metric_before == 25
    assert any(
        "partition 1: records 50..59 were deleted" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
    )

    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap))
    capsys.readouterr()
    assert cli.main(["status", "-f", str(manifest), "--state-dir", str(catalog_config.database.parent)]) == 0
    out = capsys.readouterr().out
    assert "lost to retention 25 records" in out
    assert "DATA LOSS: 25 records were deleted by Kafka retention" in out


def test_on_data_loss_halt_stops_before_skipping_and_continue_then_skips(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-retention-halt", "retention_halt"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 60, partitions=[0, 1])
    text = manifest_text(name, topic, kafka.bootstrap, batch={"maxRecords": 40, "minIntervalSeconds": 0})
    halting = text.replace(f"topic: {topic}}}", f"topic: {topic}, onDataLoss: Halt}}", 1)
    st = load_manifest(halting)
    assert st.spec.source.on_data_loss is OnDataLoss.HALT
    catalog = catalog_config.pyiceberg()
    ingestor = Ingestor(
        st, catalog_config, spark, FileLease(tmp_path / "lease.json", "w", duration_seconds=30)
    )
    ingestor.start(lease_timeout=10)
    try:
        first = ingestor.run_batch()
        assert first is not None and first.offsets == {0: 20, 1: 20}
        delete_records(kafka, topic, {0: 25})  # 20..24 of partition 0 never read
        with pytest.raises(DataLossHaltedError) as halted:
            ingestor.run_batch()
    finally:
        ingestor.close()
    line = str(halted.value)
    assert "partition 0 offsets 20..24 (5 records)" in line and "partition 1" not in line
    assert "spec.source.onDataLoss: Continue" in line and "retention" in line and "\n" not in line
    untouched = read_committed(catalog.load_table(("it", name)))
    assert (untouched.offsets, untouched.lost_records) == ({0: 20, 1: 20}, 0)

    manifest = tmp_path / "table.yaml"
    manifest.write_text(halting)
    run = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "run", "-f", str(manifest),
         "--state-dir", str(catalog_config.database.parent),
         "--until-caught-up", "--no-maintenance", "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == EXIT_DATA_LOSS, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert run.stderr.strip().splitlines()[-1] == f"icefall: {line}"
    assert read_committed(catalog.load_table(("it", name))).offsets == {0: 20, 1: 20}

    # The documented way on: Continue skips them, counted in the table; the rest lands exactly once.
    ingestor = Ingestor(
        load_manifest(text),
        catalog_config,
        spark,
        FileLease(tmp_path / "lease.json", "w", duration_seconds=30),
    )
    ingestor.start(lease_timeout=10)
    try:
        reports = drain(ingestor)
    finally:
        ingestor.close()
    assert sum(r.skipped for r in reports) == 5 and reports[-1].lost_records == 5
    assert read_committed(catalog.load_table(("it", name))).lost_records == 5
    lost = {(0, offset) for offset in range(20, 25)}
    assert_exactly_once(
        catalog_config, name, watermarks(kafka, topic), bad, lost=lost, bootstrap=kafka.bootstrap
    )
