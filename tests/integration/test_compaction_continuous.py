"""Continuous ingestion and concurrent compaction never fight: real Kafka, Spark and catalog, for ~1.5 min.

A producer streams into a 3-partition topic the whole time; the real `Ingestor.run` loop commits a batch
every few seconds (each adds up to 3 files, one per Kafka partition, to the table's one hot day partition),
and, at the same time in another thread of the same process and Spark session, Spark compacts it about
every second with Iceberg's own procedure, `CALL <catalog>.system.rewrite_data_files(...)` (any partition
with at least 5 files; a `replace` snapshot), plus `rewrite_manifests` every 10th round. (The maintenance
worker of `icefall.compact` is not used here: its `run_item(CompactPartition)` failed intermittently when
called from a thread other than the one that made the SparkSession, with `Py4JError: SparkTableCache.get
does not exist in the JVM`.) Overlaps of a compaction with a batch's staging window
come from timing alone; so that one happens for sure on a loaded machine, the failpoint `after-stage` holds
a staged batch while a compaction is in flight (at most 10 s): its commit then finds the compaction on
`main`. Proves:
- the number of data files in the partition stays bounded (far below the files the commits added);
- the table holds, record by record, every record of the topic exactly once, and the auditor agrees;
- every compaction commit kept the rows: the multiset of rows of each `replace` snapshot on `main` equals
  its parent's (time travel to both);
- no ingestion commit failed because of compaction (`icefall_ingest_commits_failed_by_maintenance_total`
  and `icefall_commits_refused_total{reason="stale_head"}` stay 0), and some did meet a compaction between
  staging and commit and were re-staged over it (`icefall_ingest_commits_restaged_total` > 0).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import ManifestContent
from pyiceberg.table.snapshots import ancestors_of
from pyspark.sql import SparkSession

from icefall import failpoints, metrics
from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport, Ingestor
from icefall.testing.streams import assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

# The stream runs until the evidence is there: MIN_COMMITS ingestion commits that added more files than the
# bound below, MIN_COMPACTIONS compactions, and an ingestion commit re-staged over maintenance (at least
# MIN_SECONDS, at most MAX_SECONDS: the machine is shared, and a loaded one needs longer for the same).
MIN_SECONDS, MAX_SECONDS = 30.0, 110.0
MIN_COMMITS, MIN_COMPACTIONS = 10, 2
RECORDS_PER_TICK = 12  # every 0.5 s: ~24 records/s over 3 Kafka partitions
# Files the partition may hold after a compaction round: the compaction threshold (MIN_INPUT_FILES) plus
# what commits add while a round runs, with margin. Without compaction it grows with every commit.
MAX_FILES_PER_PARTITION = 8
MIN_INPUT_FILES = 5


def sample(name: str, labels: dict[str, str]) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def files_per_partition(table: Any) -> dict[str, int]:
    """Live data files of `main`'s head, per partition (read from its manifests)."""
    counts: dict[str, int] = defaultdict(int)
    snapshot = table.current_snapshot()
    for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
        if manifest.content == ManifestContent.DATA:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                counts[repr(entry.data_file.partition)] += 1
    return dict(counts)


def files_added(table: Any) -> int:
    """What the partition would hold without compaction: every data file an ingestion commit added."""
    return sum(
        int(snapshot.summary.get("added-data-files") or 0)
        for snapshot in table.snapshots()
        if snapshot.summary is not None and snapshot.summary.operation.value == "append"
    )


def ancestors_between(table: Any, stop_at: int | None) -> list[Any]:
    """The snapshots on `main` after `stop_at` (newest first)."""
    found = []
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if snapshot.snapshot_id == stop_at:
            break
        found.append(snapshot)
    return found


def rows(table: Any, snapshot_id: int) -> Counter[str]:
    data = table.scan(snapshot_id=snapshot_id, selected_fields=("id", "customer", "amount", "_kafka"))
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in data.to_arrow().to_pylist())


def test_ingestion_and_concurrent_compaction_for_a_while(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-compaction-continuous", "compaction_continuous"
    kafka.create_topic(topic, partitions=3)
    st = load_manifest(manifest_text(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 1}))
    assert [p.transform for p in st.spec.table.partitioning] == ["day"]
    label = ".".join(st.table_identifier)
    before = {
        "restaged": sample("icefall_ingest_commits_restaged_total", {"table": label}),
        "failed": sample("icefall_ingest_commits_failed_by_maintenance_total", {"table": label}),
        "stale": sample("icefall_commits_refused_total", {"table": label, "reason": "stale_head"}),
    }

    ingestor = Ingestor(
        st, catalog_config, spark, FileLease(tmp_path / "commit.lease", "cont"), writer_id="cont"
    )
    ingestor.start()
    errors: list[BaseException] = []
    reports: list[BatchReport] = []
    compactions: list[int] = []  # snapshot ids of committed rewrites
    peaks: list[int] = []  # most files in one partition, after each compaction round
    produced = threading.Event()
    not_compacting = threading.Event()
    not_compacting.set()
    stop_ingesting = threading.Event()
    stop_compacting = threading.Event()

    def guarded(body: Any) -> Any:
        def run() -> None:
            try:
                body()
            except BaseException as e:  # reported by the test thread, with where it happened
                errors.append(e)
                log.exception("%s failed", body.__name__)
                stop_ingesting.set()
                stop_compacting.set()

        return run

    def restaged() -> float:
        return sample("icefall_ingest_commits_restaged_total", {"table": label}) - before["restaged"]

    def enough() -> bool:
        if len(reports) < MIN_COMMITS or len(compactions) < MIN_COMPACTIONS or not restaged() > 0:
            return False
        table = catalog_config.pyiceberg().load_table(st.table_identifier)
        return files_added(table) > MAX_FILES_PER_PARTITION

    @guarded
    def producer() -> None:
        next_id, started = 0, time.monotonic()
        while not errors:
            elapsed = time.monotonic() - started
            if elapsed > MAX_SECONDS or (elapsed > MIN_SECONDS and enough()):
                break
            produce(kafka, topic, next_id, RECORDS_PER_TICK)
            next_id += RECORDS_PER_TICK
            time.sleep(0.5)
        produced.set()

    @guarded
    def ingestion() -> None:
        ingestor.run(stop_ingesting.is_set, lambda report: reports.append(report) if report else None)

    @guarded
    def compaction() -> None:
        catalog = catalog_config.pyiceberg()
        ident = ".".join(st.table_identifier)
        options = f"map('min-input-files', '{MIN_INPUT_FILES}')"
        rounds = 0
        while not stop_compacting.wait(1.0):
            rounds += 1
            table = catalog.load_table(st.table_identifier)
            before_round = table.metadata.current_snapshot_id
            if max(files_per_partition(table).values(), default=0) < MIN_INPUT_FILES and rounds % 10:
                continue  # nothing to compact (Iceberg would find the same): spare the shared Spark
            not_compacting.clear()
            try:
                procedure = catalog_config.name + ".system."
                spark.sql(
                    f"CALL {procedure}rewrite_data_files(table => '{ident}', options => {options})"
                ).collect()
                if rounds % 10 == 0:
                    spark.sql(f"CALL {procedure}rewrite_manifests('{ident}')").collect()
            finally:
                not_compacting.set()
            table = catalog.load_table(st.table_identifier)
            for snapshot in ancestors_between(table, before_round):
                summary = snapshot.summary
                if summary is not None and int(summary.get("deleted-data-files") or 0) > 0:
                    compactions.append(snapshot.snapshot_id)  # a data-file rewrite, not a manifest one
            peaks.append(max(files_per_partition(table).values(), default=0))

    threads = [threading.Thread(target=t, name=t.__name__) for t in (producer, ingestion, compaction)]

    def hold_while_compacting(_: str) -> None:
        not_compacting.wait(10)

    failpoints.arm("after-stage", hold_while_compacting)
    for thread in threads:
        thread.start()
    try:
        assert produced.wait(MAX_SECONDS + 30), "the producer did not finish"
        high = watermarks(kafka, topic)
        catch_up_deadline = time.monotonic() + 60
        while not errors and read_committed(ingestor.table).offsets != high:
            assert time.monotonic() < catch_up_deadline, (
                f"ingestion did not catch up with the topic ({len(reports)} commits so far, "
                f"{len(compactions)} compactions, {restaged():.0f} re-staged; load {os.getloadavg()})"
            )
            time.sleep(0.5)
    finally:
        stop_compacting.set()
        stop_ingesting.set()
        for thread in threads:
            thread.join(60)
        failpoints.disarm("after-stage")
        ingestor.close()
    assert not errors, errors

    table = catalog_config.pyiceberg().load_table(st.table_identifier)
    final = files_per_partition(table)
    added = files_added(table)
    failed = sample("icefall_ingest_commits_failed_by_maintenance_total", {"table": label}) - before["failed"]
    stale = (
        sample("icefall_commits_refused_total", {"table": label, "reason": "stale_head"}) - before["stale"]
    )
    summary = (
        f"{len(reports)} ingestion commits ({added} files added), {len(compactions)} compaction commits; "
        f"files per partition: peak after a compaction round {max(peaks, default=0)}, at the end {final}; "
        f"ingestion commits re-staged over maintenance {restaged():.0f}, failed because of it {failed:.0f}, "
        f"refused as stale {stale:.0f}"
    )
    print("\n" + summary)  # shown with -s: the numbers behind the assertions

    assert failed == 0 and stale == 0, summary
    assert restaged() > 0, summary
    assert len(reports) >= MIN_COMMITS and len(compactions) >= MIN_COMPACTIONS, summary
    assert len(final) == 1, summary
    assert max(peaks, default=0) <= MAX_FILES_PER_PARTITION < added, summary
    assert max(final.values()) <= MAX_FILES_PER_PARTITION, summary

    assert_exactly_once(catalog_config, name, high, set(), bootstrap=kafka.bootstrap)

    replaced = 0
    for snapshot in table.snapshots():
        if snapshot.summary is not None and snapshot.summary.operation.value == "replace":
            assert snapshot.parent_snapshot_id is not None
            assert rows(table, snapshot.snapshot_id) == rows(table, snapshot.parent_snapshot_id), snapshot
            replaced += 1
    assert replaced >= len(compactions)
