"""Fresh reads (`icefall.ingest.union_read`, `icefall read`) against real Kafka, Spark and the embedded
catalog.

Proves, by content (every row's digest: `icefall.audit.content`), that a union read is exactly the topic up
to the cut it reports, decoded as ingestion decodes it: for an append table with records past its last
commit (bad records left out and counted), from an older snapshot (`snapshot_id`, `as_of`: the same rows,
more of them from the tail), while an Ingestor commits batch after batch in the background and a producer
writes (each read equals the topic up to its own cut: no duplicate, no gap), and after a writer process is
killed in the middle of a commit; for an upsert table the tail's updates, inserts and deletes are applied
by key (the same rows ingestion then commits); a topic deleted and created again is refused; `icefall
read` prints the cut and the rows as CSV, JSON lines, Parquet and a table. The first of these also runs on
tables in GCS and Azure storage (`gs://` on fake-gcs-server, `abfss://` on Azurite; JDBC catalog on
PostgreSQL). Not covered here: cdc tables
(the same code path as upsert; the decode tests cover cdc).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual name

from icefall import cli
from icefall.api import StreamingTable, load_manifest
from icefall.audit import GOOD, SparkContent, main_digest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.ingest.union_read import Cut, ReadError, UnionRead, union_read
from icefall.runtime import failpoints
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import (
    drain,
    manifest_text,
    produce,
    recreate_topic,
    shared_catalog,
    streaming_table,
    watermarks,
)

pytestmark = pytest.mark.integration

Rows = Counter[tuple[int, int, int]]  # (partition, offset, digest) → how many rows


def content(frame: DataFrame) -> Rows:
    """Every row of `frame` (a table's columns) as (partition, offset, digest of the rest)."""
    rows = frame.select(
        F.col("_kafka.partition").cast("long").alias("p"),
        F.col("_kafka.offset").cast("long").alias("o"),
        main_digest(frame).alias("d"),
    ).collect()
    return Counter((r.p, r.o, r.d) for r in rows)


def topic_content(spark: SparkSession, st: StreamingTable, catalog: str, cut: Mapping[int, int]) -> Rows:
    """What the table must hold for the topic's records below `cut`: each record decoded as ingestion
    decodes it, its good rows only (the auditor's model)."""
    expected = SparkContent(spark, st.spec, catalog).expected(
        st.spec.source.topic, {p: (0, end) for p, end in cut.items() if end > 0}
    )
    good = expected.filter(pc.equal(expected.column("kind"), GOOD)).to_pylist()
    return Counter((r["partition"], r["offset"], r["digest"]) for r in good)


def assert_exactly_the_topic(
    result: UnionRead, spark: SparkSession, st: StreamingTable, catalog: str
) -> Rows:
    got = content(result.frame)
    want = topic_content(spark, st, catalog, result.cut.offsets)
    duplicates = [k for k, n in got.items() if n > 1]
    assert not duplicates, f"duplicate rows: {duplicates[:5]}"
    extra, missing = got - want, want - got
    assert not extra and not missing, (
        f"cut {result.cut.render()}: {len(extra)} rows not in the topic up to the cut (e.g. "
        f"{sorted(extra)[:5]}), {len(missing)} records missing (e.g. {sorted(missing)[:5]})"
    )
    return got


def ingest_to_end(st: StreamingTable, config: CatalogConfig, spark: SparkSession, lease: Path) -> int:
    ingestor = Ingestor(st, config, spark, FileLease(lease, "writer"))
    ingestor.start(lease_timeout=10)
    try:
        return len(drain(ingestor))
    finally:
        ingestor.close()


def table_on(
    storage: str,
    request: pytest.FixtureRequest,
    spark: SparkSession,
    embedded: CatalogConfig,
    **manifest: Any,
) -> tuple[StreamingTable, CatalogConfig]:
    """The test manifest (`manifest_text(**manifest)`) on `storage`: the embedded catalog, or a shared
    catalog under its own catalog name, added to the tests' one Spark session."""
    if storage == "embedded":
        return load_manifest(manifest_text(**manifest)), embedded
    shared = shared_catalog(request, storage, name=f"union_{storage.replace('-', '_')}")
    st = load_manifest(manifest_text(**manifest, catalog=shared.block))
    config = shared.config(st)
    for key, value in config.spark_conf().items():
        spark.conf.set(key, value)
    return st, config


# On gs:// and abfss:// too (fake-gcs-server, Azurite; a JDBC catalog on PostgreSQL): Spark writes through
# GCSFileIO / ADLSFileIO, pyiceberg reads the table through pyarrow's GcsFileSystem / AzureFileSystem.
@pytest.mark.parametrize("storage", ["embedded", "postgres-gcs", "postgres-azure"])
def test_append_table_plus_tail_is_the_whole_topic(  # noqa: PLR0917 (fixtures)
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    storage: str,
) -> None:
    topic = f"it-union-append-{storage}"
    kafka.create_topic(topic, partitions=3)
    produce(kafka, topic, 0, 300, bad_every=25)
    st, catalog_config = table_on(
        storage, request, spark, catalog_config,
        name="union_append", topic=topic, bootstrap=kafka.bootstrap, batch={"maxRecords": 100},
    )  # fmt: skip
    assert ingest_to_end(st, catalog_config, spark, tmp_path / "lease") >= 3
    table = catalog_config.pyiceberg().load_table(st.table_identifier)
    committed = read_committed(table)
    bad_tail = produce(kafka, topic, 300, 200, bad_every=25)

    with union_read(st, catalog_config, spark=spark) as fresh:
        cut = fresh.cut
        assert cut.snapshot_id == committed.snapshot_id
        assert cut.offsets == watermarks(kafka, topic)
        assert {p: start for p, (start, _) in cut.partitions.items()} == dict(committed.offsets)
        assert cut.tail_records == 200
        assert cut.bad_records == len(bad_tail) == 8
        assert cut.tail_rows == 192 and cut.filtered_records == 0 and cut.lost_records == 0
        rows = assert_exactly_the_topic(fresh, spark, st, catalog_config.name)
        assert sum(rows.values()) == 500 - 20  # 300 + 200 records, every 25th bad
        arrow = fresh.to_arrow()
        assert arrow.num_rows == 480 and arrow.column_names == fresh.frame.columns
        relation = fresh.to_duckdb()
        count = relation.aggregate("count(*) AS n, count(DISTINCT id) AS ids").fetchone()
        assert count == (480, 480)

    # An older snapshot: the table holds fewer rows, the tail more; the result is the same records.
    first = next(
        s for s in table.snapshots() if s.summary is not None and int(s.summary.get("added-records") or 0) > 0
    )
    with union_read(st, catalog_config, spark=spark, snapshot_id=first.snapshot_id) as older:
        assert older.cut.snapshot_id == first.snapshot_id
        assert older.cut.tail_records > 200
        assert older.cut.offsets == cut.offsets
        assert content(older.frame) == rows
    landed = next(e.timestamp_ms for e in table.history() if e.snapshot_id == first.snapshot_id)
    moment = datetime.fromtimestamp(landed / 1000, tz=UTC)  # when main moved to it
    with union_read(st, catalog_config, spark=spark, as_of=moment) as then:
        assert then.cut.snapshot_id == first.snapshot_id
        assert content(then.frame) == rows
    with pytest.raises(ReadError, match="no snapshot 12345"):
        union_read(st, catalog_config, spark=spark, snapshot_id=12345)

    # Ingestion then commits exactly what the union read showed.
    ingest_to_end(st, catalog_config, spark, tmp_path / "lease")
    after = catalog_config.pyiceberg().load_table(st.table_identifier)
    name = f"{catalog_config.name}.it.union_append"
    head = read_committed(after).snapshot_id
    assert content(spark.sql(f"SELECT * FROM {name} VERSION AS OF {head}")) == rows


def test_reads_racing_ingestion_are_exactly_the_topic_up_to_their_cut(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-union-race"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 200, bad_every=40)
    st = streaming_table("union_race", topic, kafka.bootstrap, batch={"maxRecords": 60})
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease", "writer"))
    ingestor.start(lease_timeout=10)
    stop = threading.Event()
    commits: list[int] = []
    errors: list[BaseException] = []

    def ingest() -> None:
        try:
            ingestor.run(stop.is_set, lambda report: commits.append(1) if report is not None else None)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)

    def keep_producing() -> None:
        n = 200
        while not stop.is_set() and n < 1400:
            produce(kafka, topic, n, 50, bad_every=40)
            n += 50
            time.sleep(0.3)

    threads = [threading.Thread(target=ingest), threading.Thread(target=keep_producing)]
    for thread in threads:
        thread.start()
    cuts: list[Cut] = []
    try:
        for _ in range(4):
            with union_read(st, catalog_config, spark=spark) as fresh:
                assert_exactly_the_topic(fresh, spark, st, catalog_config.name)
                cuts.append(fresh.cut)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        ingestor.close()
    assert not errors, errors
    assert commits, "ingestion committed nothing while the reads ran"
    assert len({c.snapshot_id for c in cuts}) > 1, f"every read saw one snapshot: {cuts}"
    for before, after in itertools.pairwise(cuts):
        assert all(after.offsets[p] >= o for p, o in before.offsets.items())


def lake_dir(config: CatalogConfig) -> Path:
    """The state dir of the test stack's embedded catalog: `icefall ... --state-dir` for the same tables."""
    return config.database.parent


def test_read_after_a_writer_is_killed_mid_commit(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """A writer process killed with its second batch staged, just before the compare-and-swap: the staged
    batch is no part of the table, and the union read is still the topic up to its cut, once."""
    topic = "it-union-killed"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 300, bad_every=30)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(
        manifest_text(
            "union_killed", topic, kafka.bootstrap, batch={"maxRecords": 100, "minIntervalSeconds": 0}
        )
    )
    st = load_manifest(manifest)
    lake = lake_dir(catalog_config)
    run = run_until_caught_up(manifest, lake, "main.before-commit=exit@2")
    output = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == failpoints.EXIT_STATUS, f"exit {run.returncode}:\n{output}"
    assert "failpoint main.before-commit triggered" in run.stderr, output
    committed = read_committed(catalog_config.pyiceberg().load_table(st.table_identifier))
    assert sum(committed.offsets.values()) == 100, committed
    with union_read(st, catalog_config, spark=spark) as fresh:
        assert fresh.cut.snapshot_id == committed.snapshot_id
        assert fresh.cut.tail_records == 200
        rows = assert_exactly_the_topic(fresh, spark, st, catalog_config.name)
        assert sum(rows.values()) == 300 - 10


Change = tuple[int, Any, Any]  # (partition, Kafka key, value); None value = tombstone

KEYED = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: union-keyed}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  mode: upsert
  key: [id]
  format:
    schema:
      - {{name: id, type: long, required: true}}
      - {{name: status, type: string}}
  table: {{namespace: it, name: union_keyed}}
  freshness: {{targetSeconds: 2}}
"""


def send(kafka: KafkaBroker, topic: str, changes: Iterable[Change]) -> None:
    from confluent_kafka import Producer

    def encoded(x: Any) -> Any:
        return None if x is None else x if isinstance(x, str | bytes) else json.dumps(x)

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for partition, key, value in changes:
        producer.produce(topic, key=encoded(key), value=encoded(value), partition=partition)
    assert producer.flush(30) == 0


def by_key(frame: DataFrame) -> dict[int, tuple[str | None, int, int]]:
    rows = frame.select("id", "status", "_kafka.partition", "_kafka.offset").collect()
    found = {r.id: (r.status, r.partition, r.offset) for r in rows}
    assert len(found) == len(rows), f"a key appears twice: {sorted(r.id for r in rows)}"
    return found


def test_upsert_table_tail_updates_and_deletes_by_key(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-union-keyed"
    kafka.create_topic(topic, partitions=2)
    st = load_manifest(KEYED.format(bootstrap=kafka.bootstrap, topic=topic))
    send(kafka, topic, [(0, 1, {"id": 1, "status": "a"}), (0, 2, {"id": 2, "status": "a"}),
                        (1, 3, {"id": 3, "status": "a"}), (1, 4, {"id": 4, "status": "a"})])  # fmt: skip
    ingest_to_end(st, catalog_config, spark, tmp_path / "lease")
    send(
        kafka,
        topic,
        [
            (0, 1, {"id": 1, "status": "b"}),
            (0, 1, {"id": 1, "status": "c"}),  # two updates: the last wins
            (0, 2, None),  # deleted
            (1, 5, {"id": 5, "status": "new"}),  # inserted
            (1, 5, None),
            (1, 5, {"id": 5, "status": "again"}),  # inserted, deleted, inserted again
            (1, 6, None),  # deleting a key never there: nothing
            (1, "no key", None),  # a tombstone without a key: a bad record
        ],
    )
    with union_read(st, catalog_config, spark=spark) as fresh:
        assert fresh.cut.tail_records == 8 and fresh.cut.bad_records == 1 and fresh.cut.tail_rows == 7
        fresh_rows = by_key(fresh.frame)
        assert {k: v[0] for k, v in fresh_rows.items()} == {1: "c", 3: "a", 4: "a", 5: "again"}
        assert fresh_rows[1][1:] == (0, 3) and fresh_rows[5][1:] == (1, 4)
        assert fresh.to_arrow().num_rows == 4
    ingest_to_end(st, catalog_config, spark, tmp_path / "lease")
    assert by_key(spark.table(f"{catalog_config.name}.it.union_keyed")) == fresh_rows


def test_cli_read_prints_the_cut_and_the_rows(
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = "it-union-cli"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 40, bad_every=10)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text("union_cli", topic, kafka.bootstrap))
    st = load_manifest(manifest)
    ingest_to_end(st, catalog_config, spark, tmp_path / "lease")
    produce(kafka, topic, 40, 10, bad_every=10)
    base = ["read", "-f", str(manifest), "--state-dir", str(lake_dir(catalog_config))]

    assert cli.main([*base, "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    assert "[read] it.union_cli at snapshot" in err
    assert "tail: 10 records, 9 rows, 1 bad records left out" in err
    ends = watermarks(kafka, topic)
    assert (
        f"0: {read_committed(catalog_config.pyiceberg().load_table(st.table_identifier)).offsets[0]}.." in err
    )
    assert f"..{ends[0]}" in err and f"..{ends[1]}" in err
    lines = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["id"] for r in lines) == [i for i in range(50) if i % 10]
    assert {"partition", "offset", "timestamp"} <= set(lines[0]["_kafka"])

    csv_path = tmp_path / "rows.csv"
    sql = "SELECT id, amount, _kafka FROM t WHERE id >= 40 ORDER BY id"
    assert cli.main([*base, "--format", "csv", "--sql", sql, "--output", str(csv_path)]) == 0
    csv_lines = csv_path.read_text().splitlines()
    assert csv_lines[0] == '"id","amount","_kafka"' and len(csv_lines) == 1 + 9
    assert csv_lines[1].startswith("41,51.25,")

    parquet_path = tmp_path / "rows.parquet"
    assert cli.main([*base, "--format", "parquet", "--output", str(parquet_path), "--limit", "5"]) == 0
    assert pq.read_table(parquet_path).num_rows == 5

    assert cli.main([*base, "--sql", "SELECT count(*) AS n FROM t"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[2].strip() == "45"


def test_a_recreated_topic_is_refused(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """The table's offsets belong to the topic that was deleted: a read from them would skip or repeat
    records of the new one, so it is refused, as ingestion refuses it."""

    topic = "it-union-recreated"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 20, partitions=[0])
    st = streaming_table("union_recreated", topic, kafka.bootstrap)
    ingest_to_end(st, catalog_config, spark, tmp_path / "lease")
    recreate_topic(kafka, topic)
    produce(kafka, topic, 100, 30, partitions=[0])
    with pytest.raises(ReadError, match=r"deleted and created again.*icefall reset-offsets"):
        union_read(st, catalog_config, spark=spark)
