"""The auditor compares rows with their Kafka records by content, against a real broker, Spark and catalog.

Proves, on tables filled by real ingestion and then altered behind Icefall's back with Spark SQL:
- a main-table row whose value no longer matches its record (UPDATE) fails the audit, which names its
  partition and offset; `icefall verify` exits 1 and prints them;
- a dead-letter row whose bytes no longer match its record fails the same way;
- with a filter in the spec, the filter is evaluated again: a row deleted from the table is missing, not
  "filtered" (the offset-only audit took every absent record for a filtered one).

Not proved here: the offset-level findings (duplicates, unexpected rows, retention), which
`test_audit.py` covers, or audits after an offset reset (`test_kafka_semantics.py`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from icefall import cli
from icefall.api import load_manifest
from icefall.audit import content as audit_content
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor, read_kafka
from icefall.plan.offsets import OffsetRange
from icefall.testing.streams import (
    NAMESPACE,
    assert_exactly_once,
    audit,
    drain,
    manifest_text,
    produce,
    watermarks,
)

pytestmark = pytest.mark.integration

FILTER = "amount > 20"


def ingest(
    kafka: KafkaBroker,
    spark: SparkSession,
    config: CatalogConfig,
    tmp_path: Path,
    name: str,
    *,
    extra: str = "",
) -> tuple[str, set[tuple[int, int]]]:
    """Topic `it-<name>` (2 partitions, 40 events, every 9th malformed) ingested into `it.<name>`; returns
    the manifest text and the bad records' coordinates."""
    topic = f"it-{name.replace('_', '-')}"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 40, bad_every=9)
    text = manifest_text(name, topic, kafka.bootstrap) + extra
    st = load_manifest(text)
    lease = FileLease(tmp_path / f"{name}.lease.json", "w", duration_seconds=30)
    ingestor = Ingestor(st, config, spark, lease)
    ingestor.start(lease_timeout=10)
    try:
        drain(ingestor)
    finally:
        ingestor.close()
    return text, bad


def where(spark: SparkSession, config: CatalogConfig, name: str, condition: str) -> tuple[int, int]:
    row = spark.sql(
        f"SELECT _kafka.partition AS p, _kafka.offset AS o FROM {config.name}.{NAMESPACE}.{name} "
        f"WHERE {condition}"
    ).collect()
    assert len(row) == 1, row
    return int(row[0]["p"]), int(row[0]["o"])


def test_a_row_changed_behind_icefalls_back_fails_naming_its_offset(
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = "content_main"
    text, bad = ingest(kafka, spark, catalog_config, tmp_path, name)
    topic = f"it-{name.replace('_', '-')}"
    report = assert_exactly_once(
        catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap, spark=spark
    )
    assert report is not None and report.content_checked and report.wrong == 0, report.render()

    partition, offset = where(spark, catalog_config, name, "id = 7")
    spark.sql(f"UPDATE {catalog_config.name}.{NAMESPACE}.{name} SET customer = 'tampered' WHERE id = 7")

    report = audit(catalog_config, name, kafka.bootstrap, spark=spark)
    assert not report.ok, report.render()
    changed = report.partition(partition)
    assert (changed.wrong, changed.wrong_examples) == (1, (offset,)), report.render()
    assert report.duplicates == report.missing == report.unexpected == 0, report.render()
    assert changed.result == "FAIL: 1 wrong"
    named = f"partition {partition}: wrong rows (content differs from the Kafka record) at offsets {offset}"
    assert named in report.render()

    manifest = tmp_path / "table.yaml"
    manifest.write_text(text)
    state_dir = str(catalog_config.database.parent)
    assert cli.main(["verify", "-f", str(manifest), "--state-dir", state_dir]) == 1
    out = capsys.readouterr().out
    assert "by content: FAILED" in out and f"partition {partition}: wrong rows" in out, out


def test_an_audit_reads_the_topic_in_tasks_of_bounded_size(
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An audit reads and caches the whole topic. With one Spark task per partition, a partition was cached
    as one block, and the audit of a 1,000,000-key table ran a 1 GB driver out of heap: the read is cut
    into tasks of at most `RECORDS_PER_TASK` offsets, and the audit judges the same."""
    name = "content_split"
    text, _ = ingest(kafka, spark, catalog_config, tmp_path, name)
    high = watermarks(kafka, f"it-{name.replace('_', '-')}")
    ranges = tuple(OffsetRange(p, 0, end) for p, end in sorted(high.items()))
    spec = load_manifest(text).spec
    whole = read_kafka(spark, spec, ranges, {})
    split = read_kafka(spark, spec, ranges, {}, records_per_task=7)
    assert whole.rdd.getNumPartitions() == len(high)
    assert split.rdd.getNumPartitions() == sum(math.ceil(end / 7) for end in high.values())
    columns = ("partition", "offset", "value")
    assert sorted(split.select(*columns).collect()) == sorted(whole.select(*columns).collect())

    monkeypatch.setattr(audit_content, "RECORDS_PER_TASK", 7)
    partition, offset = where(spark, catalog_config, name, "id = 11")
    spark.sql(f"UPDATE {catalog_config.name}.{NAMESPACE}.{name} SET amount = -1 WHERE id = 11")
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark)
    assert report.content_checked and report.wrong == 1, report.render()
    assert report.partition(partition).wrong_examples == (offset,), report.render()


def test_a_dead_letter_row_is_compared_by_content_too(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name = "content_dlq"
    _, bad = ingest(kafka, spark, catalog_config, tmp_path, name)
    assert bad
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark)
    assert report.ok and report.content_checked, report.render()

    partition, offset = sorted(bad)[0]
    spark.sql(
        f"UPDATE {catalog_config.name}.{NAMESPACE}.{name}_dlq SET value = CAST('{{}}' AS BINARY) "
        f"WHERE partition = {partition} AND offset = {offset}"
    )
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark)
    assert not report.ok, report.render()
    assert report.partition(partition).wrong_examples == (offset,), report.render()
    assert report.wrong == 1


def test_the_filter_is_evaluated_again_so_a_deleted_row_is_missing(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name = "content_filter"
    text, _ = ingest(
        kafka, spark, catalog_config, tmp_path, name, extra=f'  transforms: {{filter: "{FILTER}"}}\n'
    )
    st = load_manifest(text)
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark, st=st)
    assert report.ok and report.filtered > 0, report.render()
    filtered = report.filtered

    partition, offset = where(spark, catalog_config, name, "id = 30")  # amount 37.5: kept by the filter
    spark.sql(f"DELETE FROM {catalog_config.name}.{NAMESPACE}.{name} WHERE id = 30")
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark, st=st)
    assert not report.ok, report.render()
    assert (report.missing, report.filtered) == (1, filtered), report.render()
    assert report.partition(partition).missing_examples == (offset,)
