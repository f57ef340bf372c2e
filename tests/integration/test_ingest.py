"""Ingestion is exactly once against real Kafka, Spark and catalog: after a normal run, after the process
is killed at a commit failpoint and restarted (on each catalog kind; test_failpoint_kills.py has the
chains that reach every point), when partitions are added to the topic mid-run (read
from their first record by the running writer), and when a new writer resumes a table with a long history
(60 commits), each produced record is in the table or the dead-letter table exactly once, checked record
by record by (partition, offset) and by the auditor. Races between writers: test_ingest_races.py; records
deleted by Kafka retention: test_ingest_retention.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.api.source import StartingPositionType
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport, Ingestor
from icefall.plan.offsets import OffsetRange
from icefall.runtime import metrics
from icefall.testing.streams import (
    NAMESPACE,
    SHARED_CATALOGS,
    assert_exactly_once,
    drain,
    manifest_text,
    produce,
    shared_catalog,
    started_ingestor,
    streaming_table,
    table_offsets,
    watermarks,
)

pytestmark = pytest.mark.integration


def test_ingest_in_process_exactly_once(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    kafka.create_topic("it-orders", partitions=3)
    bad = produce(kafka, "it-orders", 0, 600, bad_every=50)
    st = streaming_table("orders_inproc", "it-orders", kafka.bootstrap)
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

    # The Prometheus metrics tell the same story.
    def sample(name: str, **labels: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(name, {"table": "it.orders_inproc", **labels})

    assert sample("icefall_records_read_total") == 750
    assert sample("icefall_records_written_total") == 735
    assert sample("icefall_records_dead_lettered_total", reason="malformed_json") == 15
    assert (sample("icefall_read_bytes_total") or 0) > 750 * 50
    assert sample("icefall_batch_duration_seconds_count") == len(reports)
    assert sample("icefall_lag_records", partition="0") == 0
    assert sample("icefall_freshness_seconds") == 0
    high = watermarks(kafka, "it-orders")
    assert_exactly_once(catalog_config, "orders_inproc", high, bad, bootstrap=kafka.bootstrap)


IN_MAKE_TEST = {("postgres-azure", "main.after-commit")}
# On the embedded catalog, test_failpoint_kills.py's chains kill at main.after-stage and main.after-commit.
CRASHES = [
    *((kind, point) for kind in ["embedded"] for point in ["main.after-prepare", "main.before-commit"]),
    # The shared catalogs' crashes are `long` (`make test-all`), to keep `make test` within CI's time, but
    # for one on abfss:// (Azurite, the store with the most of Icefall's own FileIO code): `make test`'s
    # exactly-once proof for tables and dead letters in cloud storage other than S3.
    *(
        pytest.param(kind, point, marks=() if (kind, point) in IN_MAKE_TEST else pytest.mark.long)
        for kind in SHARED_CATALOGS
        for point in ["main.after-stage", "main.after-commit"]
    ),
]


@pytest.mark.parametrize(("catalog", "failpoint"), CRASHES)
def test_killed_at_failpoint_then_restarted_is_exactly_once(
    kafka: KafkaBroker, tmp_path: Path, request: pytest.FixtureRequest, catalog: str, failpoint: str
) -> None:
    """`icefall run` killed at a commit failpoint, then run again: on the embedded catalog, and on the shared
    catalogs a cluster uses (PostgreSQL JDBC and Iceberg's REST server, table files in S3, GCS or Azure
    storage), where Spark writes through S3FileIO, GCSFileIO or ADLSFileIO and the compare-and-swap is the
    catalog server's."""
    topic = f"it-crash-{catalog}-{failpoint.replace('.', '-')}"
    name = f"crash_{catalog}_{failpoint}".replace("-", "_").replace(".", "_")
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 200, bad_every=40)
    shared = shared_catalog(request, catalog) if catalog != "embedded" else None
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap, catalog=shared.block if shared else None))
    state = tmp_path / "state"

    def run(*, fail: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "ICEFALL_FAILPOINTS"}
        env.update(shared.env if shared else {})
        if fail:
            env["ICEFALL_FAILPOINTS"] = f"{fail}=exit"
        return subprocess.run(
            [sys.executable, "-m", "icefall.cli", "run", "-f", str(manifest), "--state-dir", str(state),
             "--until-caught-up", "--lease-timeout", "5"],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip

    crashed = run(fail=failpoint)
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    assert f"failpoint {failpoint} triggered" in crashed.stderr, crashed.stderr[-3000:]
    # The killed run's 15 s lease is taken at once (its process is gone): a 5 s lease timeout is enough.
    bad |= produce(kafka, topic, 200, 100, bad_every=40)
    finished = run(fail=None)
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    high = watermarks(kafka, topic)
    st = load_manifest(manifest.read_text())
    config = shared.config(st) if shared else CatalogConfig.embedded(state)
    if shared is not None:
        table = config.pyiceberg().load_table(("it", name))
        assert table.metadata.location.startswith(f"{shared.scheme}://"), table.metadata.location
        dead_letters = config.pyiceberg().load_table(("it", f"{name}_dlq")).metadata.location
        assert dead_letters.startswith(f"{shared.scheme}://"), dead_letters
    assert_exactly_once(config, name, high, bad, bootstrap=kafka.bootstrap)


def test_partitions_added_mid_run_are_read_from_their_start(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-grow", "grow"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 60, bad_every=9, partitions=[0, 1])
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "w"), writer_id="w")
    ingestor.start(lease_timeout=10)
    try:
        assert drain(ingestor)[-1].offsets == {0: 30, 1: 30}
        kafka.add_partitions(topic, 4)
        bad |= produce(kafka, topic, 60, 80, bad_every=9, partitions=[0, 1, 2, 3])
        reports = drain(ingestor)  # the same writer, never restarted
    finally:
        ingestor.close()
    assert sum(r.records_read for r in reports) == 80
    high = watermarks(kafka, topic)
    assert high == {0: 50, 1: 50, 2: 20, 3: 20}
    assert_exactly_once(catalog_config, name, high, bad, bootstrap=kafka.bootstrap)
    committed = read_committed(catalog_config.pyiceberg().load_table(("it", name)))
    assert committed.start_offsets == {0: 0, 1: 0, 2: 0, 3: 0}  # the new partitions from their first record


def mean_ms(reports: list[BatchReport]) -> float:
    return 1000 * sum(r.commit_seconds for r in reports) / len(reports)


def test_a_restart_after_many_small_commits_resumes_exactly_once(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """60 one-batch commits of 2 records each, then a new writer resumes from the table; prints timings."""
    topic, name, commits = "it-history", "history", 60
    kafka.create_topic(topic, partitions=1)
    bad = produce(kafka, topic, 0, 2 * commits, bad_every=25)
    st = streaming_table(name, topic, kafka.bootstrap, batch={"maxRecords": 2, "minIntervalSeconds": 0})
    lease_file = tmp_path / "lease.json"
    first = Ingestor(st, catalog_config, spark, FileLease(lease_file, "first"), writer_id="first")
    first.start(lease_timeout=10)
    started = time.monotonic()
    try:
        reports = drain(first, max_batches=commits)
    finally:
        first.close()
    history_seconds = time.monotonic() - started
    assert len(reports) == commits and {r.records_read for r in reports} == {2}

    bad |= produce(kafka, topic, 2 * commits, 10, bad_every=25)
    table = catalog_config.pyiceberg().load_table(("it", name))
    snapshots = len(table.metadata.snapshots)
    metadata_bytes = Path(table.metadata_location.removeprefix("file://")).stat().st_size
    started = time.monotonic()
    committed = read_committed(table)
    read_seconds = time.monotonic() - started
    assert committed.offsets == {0: 2 * commits}

    restarted = Ingestor(st, catalog_config, spark, FileLease(lease_file, "restarted"), writer_id="restarted")
    started = time.monotonic()
    restarted.start(lease_timeout=10)
    start_seconds = time.monotonic() - started
    try:
        started = time.monotonic()
        resumed = restarted.run_batch()
        first_batch_seconds = time.monotonic() - started
        assert resumed is not None and resumed.offsets == {0: 2 * commits + 2}
        drain(restarted)
    finally:
        restarted.close()
    print(
        f"\n[history] {commits} commits in {history_seconds:.1f}s ({history_seconds / commits:.2f}s each); "
        f"{snapshots} snapshots on the table ({metadata_bytes / 1024:.0f} KiB of metadata JSON); commit "
        f"{mean_ms(reports[:10]):.0f} ms on average in the first 10 batches, "
        f"{mean_ms(reports[-10:]):.0f} ms in the last 10; read_committed {read_seconds * 1000:.0f} ms; "
        f"restart (lease, tables, sweep, reconcile) {start_seconds:.2f}s; first batch after restart "
        f"{first_batch_seconds:.2f}s (of which commit {resumed.commit_seconds * 1000:.0f} ms)"
    )
    high = watermarks(kafka, topic)
    assert high == {0: 2 * commits + 10}
    assert_exactly_once(catalog_config, name, high, bad, bootstrap=kafka.bootstrap)


def test_latest_start_is_pinned_by_the_first_commit(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """`startingPosition: latest` skips what the topic held at the first poll, and only that."""
    kafka.create_topic("it-latest", partitions=2)
    produce(kafka, "it-latest", 0, 40)
    before = watermarks(kafka, "it-latest")
    st = streaming_table("orders_latest", "it-latest", kafka.bootstrap)
    source = st.spec.source.model_copy(
        update={
            "starting_position": st.spec.source.starting_position.model_copy(
                update={"type": StartingPositionType.LATEST}
            )
        }
    )
    st = st.model_copy(update={"spec": st.spec.model_copy(update={"source": source})})
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "latest-writer"))
    ingestor.start(lease_timeout=10)
    try:
        pinned = ingestor.run_batch()
        assert pinned is not None and pinned.records_read == 0
        assert pinned.offsets == before
        produce(kafka, "it-latest", 40, 30)
        reports = list(iter(ingestor.run_batch, None))
    finally:
        ingestor.close()
    assert sum(r.records_read for r in reports) == 30
    main, _ = table_offsets(catalog_config, "orders_latest")
    after = watermarks(kafka, "it-latest")
    assert set(main) == {(p, o) for p in after for o in range(before[p], after[p])}


COUNTS = ("records_read", "records_written", "records_dead_lettered")


def _read_options(spec: Any, ranges: Any, **kwargs: Any) -> dict[str, str]:
    """The options `read_kafka` gives Spark's Kafka source."""
    from icefall.ingest.engine import read_kafka

    options: dict[str, str] = {}

    class Reader:
        read = property(lambda self: self)

        def format(self, _name: str) -> Reader:
            return self

        def option(self, key: str, value: str) -> Reader:
            options[key] = value
            return self

        def load(self) -> None:
            return None

    read_kafka(Reader(), spec, ranges, {}, **kwargs)  # type: ignore[arg-type]
    return options


def _drain_counting_jobs(spark: SparkSession, ingestor: Ingestor) -> tuple[list[BatchReport], int]:
    """`drain(ingestor)`'s reports and how many Spark jobs it started."""
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()  # type: ignore[union-attr]
    before = int(scheduler.nextJobId())
    reports = drain(ingestor)
    return reports, int(scheduler.nextJobId()) - before


def test_a_clean_batch_is_one_spark_job_read_with_the_writers_group(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """A batch without bad records reads Kafka once: the write's jobs (its shuffle's map stage and the
    write) and nothing else, counted on the way; a batch with bad records reads its offsets again for the
    dead-letter path and still commits each record once. Every read uses the writer's one consumer group,
    and no offset is ever committed to it."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, name = "it-onepass", "onepass"
    kafka.create_topic(topic, partitions=2)
    # Sorted as well as partitioned: Iceberg's default (range) distribution would sample the batch in a job
    # of its own, computing it twice.
    text = manifest_text(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    st = load_manifest(text.replace("partitioning: [", "sortOrder: [{field: id}], partitioning: ["))
    assert st.spec.table.sort_order
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "w"), writer_id="w1")
    ingestor.start(lease_timeout=10)
    try:
        drain(ingestor)  # the first commit of an empty topic pins its start
        produce(kafka, topic, 0, 120)
        # A slow machine may make the batch sizing split a backlog: count per batch.
        clean, jobs = _drain_counting_jobs(spark, ingestor)
        assert jobs <= 2 * len(clean)
        assert [sum(getattr(r, f) for r in clean) for f in COUNTS] == [120, 120, 0]
        assert sum(r.bytes_read for r in clean) > 120 * 50

        bad = produce(kafka, topic, 120, 60, bad_every=10)
        dirty, jobs = _drain_counting_jobs(spark, ingestor)
        assert jobs > 2 * len(dirty)  # the dead-letter path's own jobs
        assert len(bad) == 6
        assert [sum(getattr(r, f) for r in dirty) for f in COUNTS] == [60, 54, 6]

        assert ingestor.consumer_group == "icefall-it.onepass-w1"
        options = _read_options(ingestor.spec, (OffsetRange(0, 0, 1),), group_id=ingestor.consumer_group)
        assert options["kafka.group.id"] == "icefall-it.onepass-w1"
    finally:
        ingestor.close()
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    request = ConsumerGroupTopicPartitions("icefall-it.onepass-w1", [TopicPartition(topic, 0)])
    (future,) = admin.list_consumer_group_offsets([request]).values()
    assert [tp.offset for tp in future.result().topic_partitions] == [-1001]  # nothing committed


def test_an_unsorted_table_is_written_without_a_shuffle(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """A clean batch of an unsorted, partitioned table is ONE Spark job: the read tasks write their rows
    (sorted by partition within each task), with no shuffle's map stage before the write; at most one file
    per task and partition; every record once."""
    topic, name = "it-noshuffle", "noshuffle"
    kafka.create_topic(topic, partitions=3)
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    assert st.spec.table.partitioning and not st.spec.table.sort_order
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json", writer_id="w1") as ingestor:
        drain(ingestor)  # the first commit of an empty topic pins its start
        produce(kafka, topic, 0, 300)
        clean, jobs = _drain_counting_jobs(spark, ingestor)
        assert jobs == len(clean)
        assert sum(r.records_written for r in clean) == 300
    tasks = spark.sparkContext.defaultParallelism
    table = catalog_config.pyiceberg().load_table((NAMESPACE, name))
    added = [int(s.summary.get("added-data-files") or 0) for s in table.snapshots() if s.summary]
    partitions = {str(f["partition"]) for f in table.inspect.files().to_pylist()}
    assert 0 < max(added) <= tasks * len(partitions)
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)


def test_a_batch_is_two_catalog_commits_and_an_idle_writer_lets_go_of_a_branch_maintenance_passed(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """Once the writer's staging branch exists, a batch adds two metadata versions (Spark's append to the
    branch, the compare-and-swap of main), not three; the branch waits at main's head between batches.
    When maintenance moves main and nothing arrives, the idle writer drops its branch, which would otherwise
    keep the replaced snapshot (and its files) until the next batch."""
    from icefall.commit import STAGE_PREFIX

    topic = "it-two-commits"
    kafka.create_topic(topic, partitions=2)
    st = streaming_table("two_commits", topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "w"), writer_id="w")
    ingestor.start(lease_timeout=10)
    table = catalog_config.pyiceberg().load_table(("it", "two_commits"))

    def versions() -> int:
        return len(table.refresh().metadata.metadata_log)

    def stage_refs() -> dict[str, int]:
        refs = table.refresh().metadata.refs
        return {name: ref.snapshot_id for name, ref in refs.items() if name.startswith(STAGE_PREFIX)}

    try:
        produce(kafka, topic, 0, 40)
        drain(ingestor)  # the first batch also creates the branch
        for n in range(3):
            produce(kafka, topic, 40 + 10 * n, 10)
            before = versions()
            report = ingestor.run_batch()
            assert report is not None and report.records_read == 10
            assert versions() - before == 2
            assert list(stage_refs().values()) == [report.snapshot_id]  # at main's new head

        head = table.refresh().metadata.current_snapshot_id
        spark.sql(f"CALL {catalog_config.name}.system.rewrite_manifests('it.two_commits')").collect()
        assert table.refresh().metadata.current_snapshot_id != head  # main moved past the branch
        assert ingestor.run_batch() is None  # nothing to read
        assert stage_refs() == {}
    finally:
        ingestor.close()
    assert_exactly_once(
        catalog_config, "two_commits", watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap
    )
