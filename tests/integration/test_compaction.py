"""Compaction and table maintenance against real Spark (Iceberg runtime), the SQLite catalog and Kafka.

What this proves:
- `read_table_view` sees a real table as the planner needs it: live files with partitions, every snapshot
  with its refs (a staging branch included), the storage listing, and an unreferenced file as an orphan;
  a planned manifest rewrite folds one-manifest-per-commit into one.
- Compacting an ingested partition of many small files: fewer files, the same rows (as a multiset), the
  `icefall.*` properties untouched, and ingestion resumes afterwards exactly once.
- Aggressive snapshot expiry (keep only main's head) never breaks resume: a restarted writer is still
  exactly once.
- Retention drops exactly the rows of the expired partitions, with a metadata-only delete.
- A worker (`icefall compact` in a subprocess) killed at the failpoint `main.mid-rewrite` leaves the table
  unchanged; its new files are orphans that `RemoveOrphans` deletes once the (injected) clock is past the
  safety window.
- In-process maintenance between batches keeps the file count of a partition bounded over many small
  batches (without it every batch adds files), and ingestion stays exactly once; on a thread of its own
  beside `Ingestor.run` (what `icefall run` does) it compacts while batches commit, exactly once too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.compact.runner import MaintenanceRunner, embedded_maintenance, file_leases
from icefall.compact.view import read_table_view, to_local_path
from icefall.compact.worker import Outcome, kind_of, run_item
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.plan.maintenance import plan_maintenance
from icefall.plan.maintenance_items import (
    DAY_MS,
    HOUR_MS,
    ApplyRetention,
    CompactPartition,
    ExpireSnapshots,
    MaintenancePolicy,
    RemoveOrphans,
    RetentionPolicy,
    RewriteManifests,
    TimeTransform,
)
from icefall.plan.names import table_leases
from icefall.runtime import metrics
from icefall.testing.streams import (
    NAMESPACE,
    assert_exactly_once,
    drain,
    manifest_text,
    produce,
    streaming_table,
    watermarks,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOW_MS = 1_795_000_000_000  # a fixed "now" (2026-11-18): the planner's clock is an argument


def rows_multiset(config: CatalogConfig, identifier: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
    table = config.pyiceberg().load_table(identifier).scan().to_arrow()
    return Counter(tuple(map(repr, row.values())) for row in table.to_pylist())


def data_files(config: CatalogConfig, identifier: tuple[str, ...]) -> list[Any]:
    view = read_table_view(config.pyiceberg().load_table(identifier), list_storage=False)
    return list(view.files)


def icefall_properties(config: CatalogConfig, identifier: tuple[str, ...]) -> dict[str, str]:
    props = config.pyiceberg().load_table(identifier).properties
    return {k: v for k, v in props.items() if k.startswith("icefall.")}


def small_file_table(spark: SparkSession, config: CatalogConfig, name: str, inserts: int) -> tuple[str, ...]:
    """`it.<name>`, partitioned by day(ts) and p: `inserts` one-row files in each of p='a' and p='b'."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {config.name}.{NAMESPACE}")
    spark.sql(
        f"CREATE TABLE {config.name}.{NAMESPACE}.{name} (id bigint, ts timestamp, p string) USING iceberg "
        "PARTITIONED BY (days(ts), p) TBLPROPERTIES ('format-version'='2')"
    )
    for i in range(inserts):
        spark.sql(
            f"INSERT INTO {config.name}.{NAMESPACE}.{name} VALUES "
            f"({i}, TIMESTAMP '2026-11-20 10:00:00', 'a'), ({1000 + i}, TIMESTAMP '2026-11-20 11:00:00', 'b')"
        )
    return (NAMESPACE, name)


def test_view_of_a_real_table(spark: SparkSession, catalog_config: CatalogConfig) -> None:
    identifier = small_file_table(spark, catalog_config, "view_t", inserts=3)
    table = catalog_config.pyiceberg().load_table(identifier)
    head = table.current_snapshot()
    assert head is not None
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().create_branch(first, "icefall_stage_w_1").commit()
    table = catalog_config.pyiceberg().load_table(identifier)
    stray_dir = Path(to_local_path(table.location()) or "") / "data"
    stray = stray_dir / "stray-orphan.parquet"
    stray.write_bytes(b"not referenced by any metadata")

    view = read_table_view(table)

    assert len(view.files) == 6
    assert {f.partition[1] for f in view.files} == {"a", "b"}
    assert view.partition_fields == ("ts_day", "p")
    assert all(f.size_bytes > 0 and f.record_count == 1 for f in view.files)
    by_id = {s.snapshot_id: s for s in view.snapshots}
    assert len(by_id) == 3 and all(s.is_on_main for s in view.snapshots)
    assert by_id[head.snapshot_id].refs == ("main",)
    assert by_id[first].refs == ("icefall_stage_w_1",)
    assert {m.path for m in view.manifests} <= view.referenced_paths
    assert len(view.manifests) == 3
    listed = {o.path for o in view.storage}
    assert {f.path for f in view.files} <= listed  # same spelling for Spark's and the listing's paths
    assert {m.path for m in view.manifests} <= listed
    unreferenced = listed - view.referenced_paths
    assert unreferenced == {f"file://{stray}"}
    # The planner: nothing is an orphan inside the window; the stray file is, after it.
    policy = MaintenancePolicy(orphan_min_age_ms=HOUR_MS)
    assert not [
        w for w in plan_maintenance(view, policy, int(time.time() * 1000)) if isinstance(w, RemoveOrphans)
    ]
    later = int(time.time() * 1000) + 2 * HOUR_MS
    orphans = [w for w in plan_maintenance(view, policy, later) if isinstance(w, RemoveOrphans)]
    assert orphans and orphans[0].paths == (f"file://{stray}",)

    # One manifest per commit: a manifest rewrite folds them, rows untouched.
    rows_before = rows_multiset(catalog_config, identifier)
    tidy = MaintenancePolicy(manifest_count_threshold=2)
    rewrite = [w for w in plan_maintenance(view, tidy, later) if isinstance(w, RewriteManifests)]
    assert len(rewrite) == 1 and len(rewrite[0].manifests) == 3
    assert run_item(spark, catalog_config, identifier, rewrite[0]).outcome is Outcome.DONE
    after = read_table_view(catalog_config.pyiceberg().load_table(identifier), list_storage=False)
    assert len(after.manifests) == 1 and len(after.files) == 6
    assert rows_multiset(catalog_config, identifier) == rows_before


def test_compaction_keeps_rows_and_resume_state(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    kafka.create_topic("it-compact", partitions=2)
    bad = produce(kafka, "it-compact", 0, 240, bad_every=40)
    st = streaming_table("compact_t", "it-compact", kafka.bootstrap, batch={"maxRecords": 20})
    identifier = st.table_identifier
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "commit.json", "writer-1"))
    ingestor.start(lease_timeout=10)
    try:
        assert len(drain(ingestor)) >= 10
        files_before = data_files(catalog_config, identifier)
        rows_before = rows_multiset(catalog_config, identifier)
        props_before = icefall_properties(catalog_config, identifier)
        assert len(files_before) >= 10 and len({f.partition for f in files_before}) == 1

        runner = MaintenanceRunner(
            spark,
            catalog_config,
            identifier,
            MaintenancePolicy(min_files_to_compact=5),
            file_leases(tmp_path / "leases", "worker-1"),
            table_leases=table_leases(st),
        )
        step = runner.step()
        assert isinstance(step.item, CompactPartition), step
        assert step.result is not None and step.result.outcome is Outcome.DONE
        assert step.result.files_rewritten == len(files_before)

        files_after = data_files(catalog_config, identifier)
        assert len(files_after) < len(files_before) and len(files_after) <= 2
        assert rows_multiset(catalog_config, identifier) == rows_before
        assert icefall_properties(catalog_config, identifier) == props_before
        label = ".".join(identifier)
        done = metrics.REGISTRY.get_sample_value(
            "icefall_maintenance_items_total", {"table": label, "kind": "CompactPartition", "outcome": "done"}
        )
        assert done == 1
        rewritten = metrics.REGISTRY.get_sample_value(
            "icefall_compaction_rewritten_files_total", {"table": label}
        )
        assert rewritten == len(files_before)

        # The same writer keeps going after the compaction commit moved main.
        bad |= produce(kafka, "it-compact", 240, 60, bad_every=40)
        assert drain(ingestor)
    finally:
        ingestor.close()
    assert_exactly_once(
        catalog_config, "compact_t", watermarks(kafka, "it-compact"), bad, bootstrap=kafka.bootstrap
    )


def test_aggressive_expiry_then_restart_is_exactly_once(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    kafka.create_topic("it-expire", partitions=2)
    bad = produce(kafka, "it-expire", 0, 120, bad_every=30)
    st = streaming_table("expire_t", "it-expire", kafka.bootstrap, batch={"maxRecords": 30})
    identifier = st.table_identifier
    first = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "commit.json", "writer-1"))
    first.start(lease_timeout=10)
    try:
        drain(first)
    finally:
        first.close()
    table = catalog_config.pyiceberg().load_table(identifier)
    snapshots_before = len(table.metadata.snapshots)
    head = table.metadata.current_snapshot_id
    assert snapshots_before >= 4 and head is not None
    # A crashed writer's staging branch at an old snapshot: a ref head, so it must survive expiry.
    staged = table.metadata.snapshots[1].snapshot_id
    table.manage_snapshots().create_branch(staged, "icefall_stage_crashed_1").commit()
    table = catalog_config.pyiceberg().load_table(identifier)
    props_before = icefall_properties(catalog_config, identifier)

    policy = MaintenancePolicy(snapshot_max_age_ms=0, snapshot_min_keep=1)
    view = read_table_view(table, list_storage=False)
    expiry = [
        w
        for w in plan_maintenance(view, policy, int(time.time() * 1000) + 1000)
        if isinstance(w, ExpireSnapshots)
    ]
    assert len(expiry) == 1 and not {head, staged} & set(expiry[0].expire_ids)
    result = run_item(spark, catalog_config, identifier, expiry[0])
    assert result.outcome is Outcome.DONE
    table = catalog_config.pyiceberg().load_table(identifier)
    remaining = {s.snapshot_id for s in table.metadata.snapshots}
    # Iceberg may also expire the staged snapshot's base (see worker.py, "Not guaranteed"): nothing else.
    base = table.metadata.snapshot_by_id(staged)
    assert base is not None
    assert {head, staged} <= remaining <= {head, staged, base.parent_snapshot_id}
    assert set(expiry[0].expire_ids) <= set(result.expired_ids)
    assert icefall_properties(catalog_config, identifier) == props_before

    bad |= produce(kafka, "it-expire", 120, 60, bad_every=30)
    second = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "commit.json", "writer-2"))
    second.start(lease_timeout=10)
    try:
        assert drain(second)
    finally:
        second.close()
    assert_exactly_once(
        catalog_config, "expire_t", watermarks(kafka, "it-expire"), bad, bootstrap=kafka.bootstrap
    )


def test_retention_drops_exactly_the_expired_partitions(
    spark: SparkSession, catalog_config: CatalogConfig
) -> None:
    name = "retention_t"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog_config.name}.{NAMESPACE}")
    spark.sql(
        f"CREATE TABLE {catalog_config.name}.{NAMESPACE}.{name} (id bigint, ts timestamp) USING iceberg "
        "PARTITIONED BY (days(ts)) TBLPROPERTIES ('format-version'='2')"
    )
    day0 = NOW_MS // DAY_MS * DAY_MS  # midnight of "today"
    # Rows on the 6 days up to today, three per day at 00:00, 12:00 and 23:59:59.999.
    rows = [
        (day * 10 + k, day0 - day * DAY_MS + offset)
        for day in range(6)
        for k, offset in enumerate((0, 12 * HOUR_MS, DAY_MS - 1))
    ]
    values = ", ".join(f"({i}, timestamp_millis({ms}))" for i, ms in rows)
    spark.sql(f"INSERT INTO {catalog_config.name}.{NAMESPACE}.{name} VALUES {values}")
    identifier = (NAMESPACE, name)
    table = catalog_config.pyiceberg().load_table(identifier)
    max_age = 2 * DAY_MS + 6 * HOUR_MS  # cut-off at day0 - 2d - 6h: days 3, 4, 5 end before it
    policy = MaintenancePolicy(
        retention=RetentionPolicy("ts_day", "ts", TimeTransform.DAY, max_age),
        orphan_min_age_ms=HOUR_MS,
    )
    work = plan_maintenance(read_table_view(table), policy, NOW_MS)
    retention = [w for w in work if isinstance(w, ApplyRetention)]
    assert len(retention) == 1 and len(retention[0].partitions) == 3

    result = run_item(spark, catalog_config, identifier, retention[0])

    assert result.outcome is Outcome.DONE and result.metadata_only is True
    cutoff = NOW_MS - max_age
    expected = {i for i, ms in rows if (ms // DAY_MS + 1) * DAY_MS > cutoff}
    left = catalog_config.pyiceberg().load_table(identifier).scan().to_arrow().column("id").to_pylist()
    assert sorted(left) == sorted(expected)
    assert len(expected) == 9  # days 0, 1, 2 whole; days 3, 4, 5 gone whole (one of them straddles nothing)


def test_killed_worker_mid_rewrite_leaves_only_orphans(
    spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    identifier = small_file_table(spark, catalog_config, "killed_t", inserts=6)
    before = catalog_config.pyiceberg().load_table(identifier)
    head = before.metadata.current_snapshot_id
    rows_before = rows_multiset(catalog_config, identifier)
    listed_before = {o.path for o in read_table_view(before).storage}

    manifest = tmp_path / "killed.yaml"
    document = yaml.safe_load(manifest_text("killed_t", "it-unused", "127.0.0.1:1"))
    document["spec"]["table"]["catalog"] = {
        "name": catalog_config.name,
        "type": "sql",
        "uri": catalog_config.uri,
        "warehouse": catalog_config.warehouse,
    }
    manifest.write_text(yaml.safe_dump(document))
    env = {**os.environ, "ICEFALL_FAILPOINTS": "main.mid-rewrite=exit"}
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "compact", "-f", str(manifest), "--state-dir", str(tmp_path),
         "--once", "--master", "local[1]"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 137, done.stdout[-3000:] + done.stderr[-3000:]

    after = catalog_config.pyiceberg().load_table(identifier)
    assert after.metadata.current_snapshot_id == head
    assert rows_multiset(catalog_config, identifier) == rows_before
    view = read_table_view(after)
    partial = {o.path for o in view.storage} - listed_before
    assert partial, "the killed rewrite wrote no file before the failpoint"
    assert not partial & view.referenced_paths

    policy = MaintenancePolicy(orphan_min_age_ms=HOUR_MS)
    assert not [
        w for w in plan_maintenance(view, policy, int(time.time() * 1000)) if isinstance(w, RemoveOrphans)
    ]
    later = int(time.time() * 1000) + HOUR_MS + 60_000
    orphans = [w for w in plan_maintenance(view, policy, later) if isinstance(w, RemoveOrphans)]
    assert len(orphans) == 1 and set(orphans[0].paths) == partial
    result = run_item(spark, catalog_config, identifier, orphans[0])
    assert set(result.deleted_paths) == partial
    assert not any(Path(to_local_path(p) or "").exists() for p in partial)
    assert rows_multiset(catalog_config, identifier) == rows_before


def test_in_process_maintenance_keeps_partition_file_count_bounded(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """The hook `icefall run` calls between batches (`embedded_maintenance(...).between_batches`), driven
    batch by batch here: a subprocess on this shared 2-core machine makes too few batches in a fixed time."""
    topic = "it-run-compact"
    kafka.create_topic(topic, partitions=2)
    st = load_manifest(
        manifest_text("run_compact", topic, kafka.bootstrap) + "  compaction: {embeddedIntervalSeconds: 0}\n"
    )
    maintenance = embedded_maintenance(st, catalog_config, spark, tmp_path / "leases")
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "commit.json", "writer-1"))
    ingestor.start(lease_timeout=10)
    most_files = most_added = written = 0
    try:
        for round_ in range(7):
            before = len(data_files(catalog_config, st.table_identifier))
            produce(kafka, topic, round_ * 10, 10)
            written += len(drain(ingestor))
            after = len(data_files(catalog_config, st.table_identifier))
            most_files, most_added = max(most_files, after), max(most_added, after - before)
            maintenance.between_batches(None)  # caught up: what the run loop's idle poll reports
    finally:
        ingestor.close()
    compactions = [s for s in maintenance.steps if isinstance(s.item, CompactPartition)]
    appended = sum(
        int(s.summary.additional_properties.get("added-data-files", "0"))
        for s in catalog_config.pyiceberg().load_table(st.table_identifier).metadata.snapshots
        if s.summary and s.summary.operation.value == "append"
    )
    print(f"{written} batches wrote {appended} files; {len(compactions)} compactions; at most {most_files}")
    assert written >= 7 and appended >= 7
    assert compactions and all(s.result and s.result.outcome is Outcome.DONE for s in compactions)
    # Compaction starts at 5 small files (policy_from_spec's default). The compacted file is small too and
    # joins a later compaction once as much data has gathered beside it (tiers, plan/maintenance.py): 7
    # rounds make at most one such tier, so after each pause at most 4 + 1 remain, and a round adds
    # `most_added`.
    assert most_files <= 4 + 1 + most_added, (most_files, most_added)
    assert most_files < appended, (most_files, appended)
    assert_exactly_once(catalog_config, "run_compact", watermarks(kafka, topic), set())


def test_in_process_maintenance_runs_on_its_thread_beside_the_batches(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """`icefall run`'s shape: `Ingestor.run` commits batches while maintenance runs on a thread of its own in
    the same Spark session (offered every report); small files are compacted meanwhile, and every record
    lands once whether a maintenance commit came between a batch's stage and its commit or not."""
    topic = "it-run-compact-thread"
    kafka.create_topic(topic, partitions=2)
    name = "run_compact_thread"
    st = load_manifest(
        manifest_text(name, topic, kafka.bootstrap) + "  compaction: {embeddedIntervalSeconds: 0}\n"
    )
    maintenance = embedded_maintenance(st, catalog_config, spark, tmp_path / "leases")
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "commit.json", "writer-1"))
    reports: list[object] = []
    produced = 10
    deadline = time.monotonic() + 300

    def compacted() -> bool:
        return any(
            isinstance(s.item, CompactPartition) and s.result is not None and s.result.outcome is Outcome.DONE
            for s in maintenance.steps
        )

    def on_batch(report: object) -> None:
        nonlocal produced
        reports.append(report)
        if not compacted() and time.monotonic() < deadline:  # small files keep coming until a compaction
            produce(kafka, topic, produced, 10)
            produced += 10
        maintenance.offer(report)  # type: ignore[arg-type]

    produce(kafka, topic, 0, 10)
    maintenance.start()
    ingestor.start(lease_timeout=10)
    try:
        ingestor.run(lambda: time.monotonic() > deadline or (compacted() and reports[-1] is None), on_batch)
    finally:
        ingestor.close()
        assert maintenance.stop(timeout=120)
    batches = sum(r is not None for r in reports)
    steps = [kind_of(s.item) for s in maintenance.steps if s.item is not None]
    print(f"{batches} batches, {produced} records, maintenance steps: {steps}")
    assert compacted(), f"no compaction in {batches} batches"
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set())
    cache = maintenance.runner.manifests
    maintenance.runner.plan()
    read = cache.files_read
    maintenance.runner.plan()  # the table has not changed since: no manifest or manifest list is read again
    assert cache.files_read == read > 0
