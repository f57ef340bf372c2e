"""Delta Lake tables (`spec.table.format: delta`) filled from a real Kafka topic by real Spark, exactly once.

Proves: the table holds each produced record once, by content, read by Spark's Delta reader (in a Delta
table's own session: this process's is an Iceberg table's, without Delta) and by delta-rs alike, and both
skip files by the min/max in the batches' `add` stats (a point filter reads fewer files than the table
has, each filter's rows exactly those the whole table holds for it); a new writer
resumes from the offsets in the table (no duplicates, nothing lost); a writer that fails at each commit point
(after writing its files, just before, and just after its log entry) leaves a table the next writer completes
exactly once; a writer whose epoch a newer one claimed cannot commit; a bad record stops the batch
uncommitted. `icefall verify` audits a Delta table (and its dead-letter table) by content, read with delta-rs:
clean after ingestion, and a changed copy of a row appended by another writer is a duplicate and a wrong row.
`icefall run` killed (status 137) right after a commit, then run again, fills the table exactly once, and its
in-process upkeep writes the spec's retention into the table, and `icefall read` gives its newest version plus
the records produced after it, each once; `icefall read --snapshot N` / `--as-of T` give an older version
(rows a later DELETE removed included) plus the topic from its offsets, and refuse one VACUUM emptied. A
field added to the spec becomes a new column with the next
batch (old rows null in it, by delta-rs, Spark and `icefall verify`); a changed type is refused at start.
A keyed (upsert) table's `icefall run` killed after staging its
MERGE and after its commit, then run again, holds the latest row per key, and its `icefall read` applies the
later changes. The upkeep (OPTIMIZE Z-ordered by the spec's sort column, a checkpoint, VACUUM past the
retention) leaves a table Spark and delta-rs read equal, one data file on disk, the offsets in the checkpoint,
and a new writer resuming exactly once. A table partitioned by a column keeps each batch's files in Delta's
column=value folders with their partition values, is read by content by both readers, and OPTIMIZE leaves
one file per partition.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefall.api.manifest import parse_manifest
from icefall.audit.delta import delta_rows
from icefall.commands.delta import verify_delta_table
from icefall.commit import FencedError
from icefall.commit.delta import DeltaLog, set_properties
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.delta_sink import BadRecordsHaltedError, DeltaIngestor
from icefall.runtime import failpoints, metrics
from icefall.testing.delta import (
    delta_ids,
    delta_manifest,
    drain,
    in_delta_session,
    plain,
    read_with_sparks_delta_reader,
    start_writer,
)
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import produce, watermarks

pytestmark = pytest.mark.integration


class Table:
    """One Delta table on a new topic, and its writers (each with the same commit lease file)."""

    def __init__(
        self, kafka: KafkaBroker, tmp_path: Path, name: str, *, table: str = "", spec: str = ""
    ) -> None:
        self.kafka, self.topic = kafka, f"it-delta-{name}"
        tmp_path.mkdir(parents=True, exist_ok=True)
        kafka.create_topic(self.topic, partitions=2)
        self.location = str(tmp_path / "table")
        self.manifest = tmp_path / "table.yaml"
        self.manifest.write_text(
            delta_manifest(
                name, kafka.bootstrap, self.topic, self.location, max_records=40, table=table, spec=spec
            )
        )
        self.st = parse_manifest(self.manifest.read_text())
        self.leases = tmp_path / "leases"
        self.writers = 0

    def writer(self, spark: Any) -> DeltaIngestor:
        self.writers += 1
        return start_writer(self.st, spark, self.location, self.leases, f"writer-{self.writers}")

    def ingest(self, spark: Any) -> int:
        """A new writer's batches until caught up; how many landed."""
        writer = self.writer(spark)
        try:
            return len(drain(writer))
        finally:
            writer.close()

    def ids(self) -> Counter[int]:
        return delta_ids(self.location)

    def assert_exactly_once(self, count: int) -> None:
        assert self.ids() == Counter(range(count))
        assert DeltaLog(self.location).snapshot().committed.offsets == watermarks(self.kafka, self.topic)


def test_rows_equal_the_topic_read_by_spark_and_delta_rs_and_a_new_writer_resumes(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    table = Table(kafka, tmp_path, "resume")
    produce(kafka, table.topic, 0, 100)
    assert table.ingest(spark) >= 3  # batches of at most 40
    produce(kafka, table.topic, 100, 30)
    second = table.writer(spark)
    try:
        drain(second)
    finally:
        second.close()
    table.assert_exactly_once(130)
    from deltalake import DeltaTable

    by_rs = [plain(row) for row in DeltaTable(table.location).to_pyarrow_table().to_pylist()]
    skipping = in_delta_session(
        SKIPPING, table.location, str(tmp_path / "by-spark"), json.dumps(list(FILTERS))
    )
    assert skipping.returncode == 0, skipping.stderr[-3000:]
    by_spark = [plain(row) for row in pq.read_table(tmp_path / "by-spark").to_pylist()]
    key = lambda row: row["id"]  # noqa: E731
    assert sorted(by_spark, key=key) == sorted(by_rs, key=key)
    assert_readers_skip_files_by_the_stats(
        table.location, json.loads(skipping.stdout.splitlines()[-1]), by_rs
    )
    assert {r["customer"] for r in by_rs} == {f"c{i % 7}" for i in range(7)}
    # The offsets are table properties other readers see too (kept by checkpoints: the Metadata action).
    properties = DeltaTable(table.location).metadata().configuration
    assert properties["icefall.epoch"] == str(second.epoch)


#: Spark's Delta reader: the table's rows into a Parquet folder, and for each filter the files it reads
#: (`inputFiles`: after Delta's data skipping by the log's stats) and the ids it returns.
SKIPPING = """
import json, sys
from icefall.api import TableFormat
from icefall.spark.session import build_spark_session

spark = build_spark_session(
    [], master="local[1]", app_name="delta-skipping", table_format=TableFormat.DELTA,
    extra_conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
)
table = spark.read.format("delta").load(sys.argv[1])
table.write.parquet(sys.argv[2])
found = {"files": len(table.inputFiles())}
for where in json.loads(sys.argv[3]):
    query = table.where(where)
    ids = sorted(r.id for r in query.select("id").collect())
    found[where] = {"files": len(query.inputFiles()), "ids": ids}
spark.stop()
print(json.dumps(found))
"""

#: Point and range filters on a long, a decimal, a nested long, a string and a timestamp column, each
#: with the rows it must return (checked in Python on the rows read whole: skipping must not lose any).
FILTERS: dict[str, Any] = {
    "id = 125": lambda r: r["id"] == 125,
    "amount = 156.25": lambda r: r["amount"] == Decimal("156.25"),
    "_kafka.offset >= 60": lambda r: r["_kafka"]["offset"] >= 60,
    "customer = 'zz'": lambda r: r["customer"] == "zz",
    # every ts is 10:00:00 (Delta Spark widens a timestamp max by 1 ms, as it keeps milliseconds)
    "ts > TIMESTAMP'2026-11-22 10:00:01 UTC'": lambda r: r["ts"] > datetime(2026, 11, 22, 10, 0, 1),
}


def assert_readers_skip_files_by_the_stats(location: str, spark_saw: dict[str, Any], rows: list[Any]) -> None:
    """Spark's Delta reader (`spark_saw`, from SKIPPING) and delta-rs read fewer files than the table has for
    a point filter, by the min/max in the log, and every filter returns exactly its rows of `rows`."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    for where, wanted in FILTERS.items():
        assert spark_saw[where]["ids"] == sorted(r["id"] for r in rows if wanted(r)), where
    total, files = spark_saw["files"], {w: spark_saw[w]["files"] for w in FILTERS}
    assert total >= 3 and all(n < total for n in files.values()), (total, files)
    assert files["customer = 'zz'"] == 0 and files["id = 125"] <= 2, (total, files)
    delta_rs = DeltaTable(location)
    adds = pa.table(delta_rs.get_add_actions(flatten=True))
    assert None not in adds.column("min.id").to_pylist() + adds.column("max._kafka.offset").to_pylist()
    dataset = delta_rs.to_pyarrow_dataset()
    assert len(list(dataset.get_fragments(filter=ds.field("id") == 125))) < len(list(dataset.get_fragments()))
    amount = pa.scalar(Decimal("156.25"), pa.decimal128(10, 2))
    for filters in ([("id", "=", 125)], [("amount", "=", amount)]):
        assert delta_rs.to_pyarrow_table(filters=filters).column("id").to_pylist() == [125]


@pytest.mark.parametrize("point", ["main.after-stage", "main.before-commit", "main.after-commit"])
def test_a_writer_failing_at_a_commit_point_leaves_exactly_once(
    kafka: KafkaBroker, spark: Any, tmp_path: Path, point: str
) -> None:
    table = Table(kafka, tmp_path, point.replace(".", "-"))
    produce(kafka, table.topic, 0, 60)
    failing = table.writer(spark)
    try:
        with failpoints.armed(point, "raise", hit=2), pytest.raises(failpoints.FailpointError):
            drain(failing)
    finally:
        failing.close()
    table.ingest(spark)
    table.assert_exactly_once(60)


def test_a_fenced_writer_cannot_commit(kafka: KafkaBroker, spark: Any, tmp_path: Path) -> None:
    table = Table(kafka, tmp_path, "fenced")
    produce(kafka, table.topic, 0, 20)
    old = table.writer(spark)
    old.keeper.stop()  # type: ignore[union-attr]  # a paused writer: only the table's epoch stops it
    old.keeper = None
    old.lease.release()
    new = table.writer(spark)  # takes the lease over and claims a higher epoch in the table
    try:
        assert new.epoch > old.epoch
        with pytest.raises(FencedError):
            old.run_batch()
        drain(new)
    finally:
        new.close()
        old.topic.close()
    table.assert_exactly_once(20)


def test_without_a_dead_letter_table_a_bad_record_stops_the_batch_uncommitted(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    table = Table(kafka, tmp_path, "bad", spec="  deadLetter: {table: {enabled: false}}")
    produce(kafka, table.topic, 0, 10, bad_every=7)
    writer = table.writer(spark)
    try:
        with pytest.raises(BadRecordsHaltedError, match=r"spec\.deadLetter\.table is disabled"):
            writer.run_batch()
    finally:
        writer.close()
    assert DeltaLog(table.location).snapshot().committed.offsets == {}
    assert table.ids() == Counter()
    assert not (tmp_path / "bad_dlq").exists()


def test_bad_records_go_to_the_delta_dead_letter_table_once_through_a_failure_between_its_commits(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable, write_deltalake

    table = Table(kafka, tmp_path, "dlq")
    bad = produce(kafka, table.topic, 0, 60, bad_every=7)
    failing = table.writer(spark)
    try:  # the dead letters of the second batch land, its table commit does not
        with failpoints.armed("main.before-commit", "raise", hit=2), pytest.raises(failpoints.FailpointError):
            drain(failing)
    finally:
        failing.close()
    dlq = str(tmp_path / "dlq_dlq")  # beside the table, named as the dead-letter table (<table>_dlq)
    ahead = DeltaLog(dlq).snapshot().committed.offsets
    assert ahead != DeltaLog(table.location).snapshot().committed.offsets
    table.ingest(spark)
    good = [i for i in range(60) if i % 7]
    assert table.ids() == Counter(good)
    assert DeltaLog(table.location).snapshot().committed.offsets == watermarks(kafka, table.topic)
    # The same metrics as an Iceberg table's (dashboards, alerts): dead letters by kind of reason, lag.
    label = ".".join(table.st.table_identifier)
    sample = metrics.REGISTRY.get_sample_value
    kinds = {
        s.labels["reason"]: s.value
        for m in metrics.REGISTRY.collect()
        for s in m.samples
        if s.name == "icefall_records_dead_lettered_total" and s.labels["table"] == label
    }
    assert sum(kinds.values()) >= len(bad) and set(kinds) == {"malformed_json"}, (
        kinds
    )  # the failed batch's too
    assert sample("icefall_records_read_total", {"table": label}) >= 60
    assert [sample("icefall_lag_records", {"table": label, "partition": p}) for p in "01"] == [0, 0]
    rows = DeltaTable(dlq).to_pyarrow_table()
    held = Counter(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True))
    assert held == Counter(bad)  # each bad record once, with its error text
    assert all(rows.column("error").to_pylist())

    # `icefall verify` audits the dead-letter table too, by content: clean, then a bad record held twice.
    clean = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert clean.ok, clean.render()
    assert sum(p.in_dlq for p in clean.partitions) == len(bad) and clean.dlq_table == dlq
    write_deltalake(dlq, rows.slice(0, 1), mode="append")
    twice = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert not twice.ok
    partition, offset = rows.column("partition")[0].as_py(), rows.column("offset")[0].as_py()
    [audit] = [p for p in twice.partitions if p.partition == partition]
    assert audit.duplicates == 1 and audit.duplicate_examples == (offset,), twice.render()


def test_verify_audits_a_delta_table_by_content_read_with_delta_rs(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable, write_deltalake

    table = Table(kafka, tmp_path, "verify")
    produce(kafka, table.topic, 0, 60)
    table.ingest(spark)
    clean = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert clean.ok, clean.render()
    assert clean.content_checked and sum(p.expected for p in clean.partitions) == 60
    assert sum(p.in_table for p in clean.partitions) == 60

    # Another writer (delta-rs) appends a changed copy of one row: its offset is held twice, once wrongly.
    rows = DeltaTable(table.location).to_pyarrow_table()
    one = rows.slice(0, 1)
    changed = one.set_column(one.schema.get_field_index("customer"), "customer", pa.array(["tampered"]))
    write_deltalake(table.location, changed, mode="append")
    kafka_of = one.column("_kafka")[0].as_py()
    tampered = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert not tampered.ok
    [audit] = [p for p in tampered.partitions if p.partition == kafka_of["partition"]]
    assert (audit.duplicates, audit.wrong) == (1, 1)
    assert audit.duplicate_examples == audit.wrong_examples == (kafka_of["offset"],)
    assert [p for p in tampered.partitions if p is not audit] == [
        p for p in clean.partitions if p.partition != audit.partition
    ]


def test_icefall_run_killed_after_a_commit_then_run_again(kafka: KafkaBroker, tmp_path: Path) -> None:
    table = Table(kafka, tmp_path, "cli")
    produce(kafka, table.topic, 0, 90)

    state = tmp_path / "state"
    killed = run_until_caught_up(table.manifest, state, "main.after-commit=exit@2", maintenance=True)
    assert killed.returncode == failpoints.EXIT_STATUS, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "failpoint main.after-commit triggered" in killed.stderr
    assert DeltaLog(table.location).snapshot().committed.offsets  # the batches before the kill landed
    done = run_until_caught_up(table.manifest, state, maintenance=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table.assert_exactly_once(90)
    # Its upkeep beside the batches wrote the spec's retention (maxSnapshotAgeSeconds: 5 days) into the table.
    retention = {
        k: v for k, v in DeltaLog(table.location).snapshot().configuration.items() if "Retention" in k
    }
    assert retention == dict.fromkeys(
        ["delta.deletedFileRetentionDuration", "delta.logRetentionDuration"], "interval 432000 seconds"
    )

    # `icefall read`: the table's newest version plus the 30 records produced after its last commit.
    produce(kafka, table.topic, 90, 30)
    read = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "read", "-f", str(table.manifest),
         "--state-dir", str(tmp_path / "state"), "--format", "jsonl"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-3000:]
    rows = [json.loads(line) for line in read.stdout.splitlines()]
    assert Counter(r["id"] for r in rows) == Counter(range(120))
    assert all(r["customer"] == f"c{r['id'] % 7}" for r in rows), rows[:3]
    version = DeltaLog(table.location).snapshot().version
    assert f"at version {version}" in read.stderr and "tail: 30 records, 30 rows" in read.stderr, read.stderr


def schema_change_entry(location: str) -> set[str]:
    """The kinds of action in the log entry that first holds the column `region`: the schema change lands
    with the rows of the batch that needs it."""
    log = DeltaLog(location)
    for version in range(log.latest_version() + 1):
        actions = log.actions(version)
        if any('"region"' in a.get("metaData", {}).get("schemaString", "") for a in actions):
            return {next(iter(a)) for a in actions}
    raise AssertionError("no log entry holds the new column")


def test_a_field_added_to_the_spec_is_a_new_column_and_a_changed_type_is_refused(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """The spec gains an optional field: the next batch's commit adds the column (old rows read null, new
    rows hold their values, in delta-rs and Spark's Delta reader; `icefall verify` clean), the table's
    partitioning kept. Then a type change in the spec is refused at start, naming the field, with nothing
    written."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from icefall.catalog.delta_schema import DeltaSchemaRefusedError
    from icefall.testing.streams import send_changes

    table = Table(kafka, tmp_path, "evolve", table=", partitioning: [{field: customer}]")
    produce(kafka, table.topic, 0, 20)
    table.ingest(spark)
    # A new optional field, and a narrower decimal (every value fits: the files keep the table's type).
    last = "      - {name: ts, type: timestamptz, required: true}\n"
    wider = table.manifest.read_text().replace(last, last + "      - {name: region, type: string}\n")
    table.manifest.write_text(wider.replace('type: "decimal(10,2)"', 'type: "decimal(8,2)"'))
    table.st = parse_manifest(table.manifest.read_text())
    record = {"customer": "c", "amount": 1.5, "ts": "2026-11-22T10:00:00Z"}
    send_changes(
        kafka, table.topic, [(i % 2, None, {**record, "id": i, "region": f"r{i}"}) for i in range(20, 30)]
    )
    table.ingest(spark)
    table.assert_exactly_once(30)
    schema = json.loads(DeltaLog(table.location).snapshot().schema_string or "{}")
    assert [f["name"] for f in schema["fields"]] == ["id", "customer", "amount", "ts", "region", "_kafka"]
    assert schema_change_entry(table.location) == {"commitInfo", "metaData", "add"}
    assert DeltaLog(table.location).snapshot().partition_columns == ["customer"]
    files = list(Path(table.location).glob("customer=*/*.parquet"))
    assert {f.parent.name for f in files} == {"customer=c", *(f"customer=c{i}" for i in range(7))}
    assert {str(pq.read_schema(f).field("amount").type) for f in files} == {"decimal128(10, 2)"}
    by_rs = {r["id"]: r["region"] for r in DeltaTable(table.location).to_pyarrow_table().to_pylist()}
    assert by_rs == {i: None if i < 20 else f"r{i}" for i in range(30)}
    by_spark = read_with_sparks_delta_reader(table.location, tmp_path / "by-spark")
    assert {r["id"]: r["region"] for r in by_spark} == by_rs
    report = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert report.ok, report.render()

    # A type the table cannot follow: refused when the writer starts, before anything is written.
    changed = table.manifest.read_text().replace('type: "decimal(8,2)"', "type: string")
    table.st = parse_manifest(changed)
    version = DeltaLog(table.location).latest_version()
    with pytest.raises(DeltaSchemaRefusedError) as refused:
        table.writer(spark)
    assert "field 'amount': the table has decimal(10,2), spec.format.schema has string" in str(refused.value)
    assert "write the new values to a new field" in str(refused.value)
    assert DeltaLog(table.location).latest_version() == version


def test_icefall_read_of_an_older_version_by_number_and_by_time(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """`icefall read --snapshot N` / `--as-of T` of a Delta table: version N's rows (with those a later
    DELETE removed) plus the topic from N's offsets up to now; a time between two commits means the older
    one. An older version whose files VACUUM would have deleted is refused in one line."""
    import time

    from deltalake import DeltaTable

    table = Table(kafka, tmp_path, "travel")
    produce(kafka, table.topic, 0, 10)
    writer = table.writer(spark)
    try:
        drain(writer)
        first = DeltaLog(table.location).snapshot().version
        time.sleep(0.2)
        between = datetime.now(UTC)
        time.sleep(0.2)
        produce(kafka, table.topic, 10, 10)
        drain(writer)
    finally:
        writer.close()
    second = DeltaLog(table.location).snapshot().version
    assert second > first
    kept_before = {p.name for p in Path(table.location).glob("*.parquet")}
    DeltaTable(table.location).delete("id < 3")  # a user's DELETE, a version after `second`
    assert table.ids() == Counter(range(3, 20))
    produce(kafka, table.topic, 20, 5)

    def read(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "icefall.cli", "read", "-f", str(table.manifest),
             "--state-dir", str(tmp_path / "state"), "--format", "jsonl", *flags],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip

    for flags, version, tail in (
        (("--snapshot", str(second)), second, 5),
        (("--as-of", between.isoformat()), first, 15),
    ):
        done = read(*flags)
        assert done.returncode == 0, done.stderr[-3000:]
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert Counter(r["id"] for r in rows) == Counter(range(25)), flags  # ids 0..2 are back
        assert all(r["customer"] == f"c{r['id'] % 7}" for r in rows), rows[:3]
        assert f"at version {version} " in done.stderr, done.stderr
        assert f"tail: {tail} records, {tail} rows" in done.stderr, done.stderr

    # VACUUM with no retention: the files the DELETE replaced are gone, so `second` cannot be read.
    newest = {Path(uri).name for uri in DeltaTable(table.location).file_uris()}
    for name in kept_before - newest:
        (Path(table.location) / name).unlink()
    gone = read("--snapshot", str(second))
    assert gone.returncode == 1, gone.stderr[-3000:]
    said = gone.stderr.strip().splitlines()[-1]
    assert said.startswith(f"icefall: {table.location}: version {second} cannot be read: "), said
    assert "deleted by VACUUM" in said, said


#: The upkeep of `icefall run` (`DeltaMaintenance`, the spec's policy) in a Delta table's own Spark session,
#: its clock past the retention (VACUUM then deletes what OPTIMIZE replaced), step after step until nothing
#: is due; then the table as Spark's Delta reader reads it, copied into Parquet files. Prints the steps.
UPKEEP = """
import dataclasses, json, sys, time
from icefall.api import TableFormat
from icefall.api.manifest import parse_manifest
from icefall.compact.delta import DeltaMaintenance
from icefall.plan.delta_maintenance import delta_policy_from_spec
from icefall.spark.session import build_spark_session

st = parse_manifest(open(sys.argv[1]).read())
spark = build_spark_session(
    [], master="local[1]", app_name="delta-upkeep", table_format=TableFormat.DELTA,
    extra_conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
)
policy = delta_policy_from_spec(st.spec)
upkeep = DeltaMaintenance(spark, sys.argv[2], policy, label="t")
later = int(time.time() * 1000) + policy.retention_ms + 60_000
steps = []
while (outcome := upkeep.step(now_ms=later)).planned and len(steps) < 8:
    assert outcome.result is not None, outcome.error
    steps.append([outcome.result.kind, outcome.result.outcome.value, len(outcome.result.deleted_paths)])
spark.read.format("delta").load(sys.argv[2]).write.parquet(sys.argv[3])
spark.stop()
print(json.dumps(steps))
"""


def test_upkeep_optimizes_checkpoints_and_vacuums_and_a_writer_resumes_exactly_once(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    table = Table(kafka, tmp_path, "upkeep", table=", sortOrder: [{field: customer}]")
    produce(kafka, table.topic, 0, 120)
    assert table.ingest(spark) == 3  # 2 files each: 6 small files
    # A checkpoint every 4 versions (a Delta property any Delta tool may set): due after OPTIMIZE (6).
    set_properties(DeltaLog(table.location), {"delta.checkpointInterval": "4"})
    written = {p.name for p in Path(table.location).glob("*.parquet")}
    done = in_delta_session(UPKEEP, str(table.manifest), table.location, str(tmp_path / "by-spark"))
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(done.stdout.strip().splitlines()[-1])
    assert steps == [
        ["SetRetention", "done", 0],
        ["Optimize", "done", 0],
        ["Checkpoint", "done", 0],
        ["Vacuum", "done", len(written)],
    ]
    log = DeltaLog(table.location)
    assert log.latest_checkpoint() is not None
    on_disk = {p.name for p in Path(table.location).glob("*.parquet")}
    assert on_disk == {Path(uri).name for uri in DeltaTable(table.location).file_uris()} and len(on_disk) == 1
    assert not on_disk & written
    by_rs = [plain(row) for row in DeltaTable(table.location).to_pyarrow_table().to_pylist()]
    by_spark = [plain(row) for row in pq.read_table(tmp_path / "by-spark").to_pylist()]
    key = lambda row: row["id"]  # noqa: E731
    assert sorted(by_spark, key=key) == sorted(by_rs, key=key)
    table.assert_exactly_once(120)  # the offsets survived OPTIMIZE and the checkpoint

    produce(kafka, table.topic, 120, 30)
    assert table.ingest(spark) == 1
    table.assert_exactly_once(150)


def test_a_table_partitioned_by_a_column_holds_the_topic_by_content_through_optimize(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """`partitioning: [{field: customer}]`: each batch's files land in Delta's customer=<value> folders
    with their partitionValues; delta-rs and Spark's Delta reader give every record once with its customer;
    OPTIMIZE leaves one file per partition, and a new writer resumes exactly once."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    table = Table(kafka, tmp_path, "parts", table=", partitioning: [{field: customer}]")
    produce(kafka, table.topic, 0, 120)
    assert table.ingest(spark) == 3
    table.assert_exactly_once(120)
    log = DeltaLog(table.location)
    assert log.snapshot().partition_columns == ["customer"]
    adds = [a["add"] for v in range(log.latest_version() + 1) for a in log.actions(v) if "add" in a]
    assert adds and all(
        a["path"].startswith(f"customer={a['partitionValues']['customer']}/") for a in adds
    ), adds[:2]
    stats = [json.loads(a["stats"]) for a in adds]  # of the file's columns: the partition column is not one
    assert all(
        "customer" not in s["nullCount"]
        and s["minValues"]["id"] % 7 == int(a["partitionValues"]["customer"][1:])
        for s, a in zip(stats, adds, strict=True)
    ), stats[:2]
    folders = {p.parent.name for p in Path(table.location).glob("*/*.parquet")}
    assert folders == {f"customer=c{i}" for i in range(7)}
    assert not list(Path(table.location).glob("*.parquet"))  # no file outside a partition
    by_rs = [plain(row) for row in DeltaTable(table.location).to_pyarrow_table().to_pylist()]
    assert all(r["customer"] == f"c{r['id'] % 7}" for r in by_rs) and len(by_rs) == 120

    done = in_delta_session(UPKEEP, str(table.manifest), table.location, str(tmp_path / "by-spark"))
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(done.stdout.strip().splitlines()[-1])
    assert ["Optimize", "done", 0] in steps and len(steps) < 8, steps  # then nothing left to optimize
    live = [Path(uri) for uri in DeltaTable(table.location).file_uris()]
    assert sorted(p.parent.name for p in live) == sorted(folders)  # one file per partition
    by_spark = [plain(row) for row in pq.read_table(tmp_path / "by-spark").to_pylist()]
    by_rs = [plain(row) for row in DeltaTable(table.location).to_pyarrow_table().to_pylist()]
    key = lambda row: row["id"]  # noqa: E731
    assert sorted(by_spark, key=key) == sorted(by_rs, key=key)
    assert all(r["customer"] == f"c{r['id'] % 7}" for r in by_spark) and len(by_spark) == 120

    produce(kafka, table.topic, 120, 30)
    assert table.ingest(spark) == 1
    table.assert_exactly_once(150)


#: In a Delta table's own Spark session: a query on `ts` alone (its plan's partition filters, derived by Delta
#: from the generated column), then a row appended by Delta Spark without the generated columns (Delta
#: computes them from their expressions in the log). Prints the plan's partition filters and the count.
PRUNED = """
import json, sys
from datetime import datetime, timezone
from icefall.api import TableFormat
from icefall.spark.session import build_spark_session

spark = build_spark_session([], master="local[1]", app_name="delta-pruned", table_format=TableFormat.DELTA)
location = sys.argv[1]
query = spark.read.format("delta").load(location).where("ts >= TIMESTAMP'2026-11-23 00:00:00 UTC'")
plan = query._jdf.queryExecution().executedPlan().toString()
filters = [line for line in plan.splitlines() if "PartitionFilters" in line]
count = query.count()
late = datetime(2026, 11, 30, 5, tzinfo=timezone.utc)
kafka = "struct<partition: int, offset: long, timestamp: timestamp>"
row = spark.createDataFrame(
    [(999, "zz-appended", late, (9, 999, late))], f"id long, customer string, ts timestamp, _kafka {kafka}"
)
row.write.format("delta").mode("append").option("mergeSchema", "false").save(location)
spark.stop()
print(json.dumps({"filters": filters, "count": count}))
"""


def test_partition_transforms_are_generated_columns_any_delta_reader_prunes_by(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """`day(ts)` and `truncate[2](customer)`: generated columns ts_day and customer_trunc (their
    expressions in the log, writer feature generatedColumns), each file in its folders; `icefall verify`
    and `icefall read` (its tail with the columns computed) agree; Spark's Delta reader prunes a query on
    `ts` by ts_day, and a row Delta Spark appends gets both columns from their expressions."""
    from icefall.testing.streams import send_changes

    table = Table(
        kafka,
        tmp_path,
        "transforms",
        table=", partitioning: [{field: ts, transform: day}, {field: customer, transform: 'truncate[2]'}]",
    )
    days = ("2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24")
    records = [{**order(i, f"c{i % 3}-shop"), "ts": f"{days[i % 4]}T{i % 24:02d}:30:00Z"} for i in range(60)]
    send_changes(kafka, table.topic, [(i % 2, None, record) for i, record in enumerate(records)])
    assert table.ingest(spark) >= 2
    table.assert_exactly_once(60)
    log = DeltaLog(table.location)
    snapshot = log.snapshot()
    assert snapshot.partition_columns == ["ts_day", "customer_trunc"]
    fields = {f["name"]: f for f in json.loads(snapshot.schema_string or "{}")["fields"]}
    assert fields["ts_day"]["type"] == "date" and fields["customer_trunc"]["type"] == "string"
    assert fields["ts_day"]["metadata"] == {"delta.generationExpression": "CAST(`ts` AS DATE)"}
    protocol = next(a["protocol"] for a in log.actions(0) if "protocol" in a)
    assert protocol == {"minReaderVersion": 1, "minWriterVersion": 4}
    folders = {
        p.parent.relative_to(table.location).as_posix() for p in Path(table.location).rglob("*.parquet")
    }
    assert folders == {f"ts_day={d}/customer_trunc=c{n}" for d in days for n in range(3)}
    rows = delta_rows(table.location).to_pylist()
    assert all(str(r["ts_day"]) == r["ts"].date().isoformat() for r in rows)
    assert all(r["customer_trunc"] == r["customer"][:2] for r in rows)
    report = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert report.ok and report.content_checked, report.render()

    send_changes(kafka, table.topic, [(0, None, {**order(60, "c9-late"), "ts": "2026-11-25T01:00:00Z"})])
    read = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "read", "-f", str(table.manifest), "--state-dir",
         str(tmp_path / "state"), "--format", "jsonl"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-3000:]
    read_rows = {r["id"]: r for r in (json.loads(line) for line in read.stdout.splitlines())}
    assert set(read_rows) == set(range(61)) and "tail: 1 records, 1 rows" in read.stderr, read.stderr
    assert (read_rows[60]["ts_day"], read_rows[60]["customer_trunc"]) == ("2026-11-25", "c9")

    done = in_delta_session(PRUNED, table.location)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["count"] == 30, seen  # the records of 2026-11-23 and 2026-11-24
    assert any("ts_day" in line for line in seen["filters"]), seen
    appended = [r for r in delta_rows(table.location).to_pylist() if r["id"] == 999]
    assert [(str(r["ts_day"]), r["customer_trunc"]) for r in appended] == [("2026-11-30", "zz")]


#: Keyed Delta tables in a Delta table's own Spark session (the MERGE needs Delta's extension): an upsert
#: table's writers failing in turn at each commit point, then one draining it; a cdc table with sequenceBy
#: fed in two batches, the second's changes out of order. Then both as Spark's Delta reader reads them.
KEYED = """
import json, pathlib, sys, time, types
from icefall.api import TableFormat
from icefall.api.manifest import parse_manifest
from icefall.runtime import failpoints
from icefall.spark.session import build_spark_session
from icefall.testing.delta import drain, start_writer
from icefall.testing.streams import send_changes

job = json.loads(sys.argv[1])
spark = build_spark_session(
    [], master="local[1]", app_name="delta-keyed", table_format=TableFormat.DELTA,
    extra_conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
)
writers = 0

def run(table, point=None):
    global writers
    writers += 1
    st = parse_manifest(open(table["manifest"]).read())
    leases = pathlib.Path(table["leases"])
    ingestor = start_writer(st, spark, table["location"], leases, f"writer-{writers}")
    try:
        if point is None:
            drain(ingestor)
        else:
            with failpoints.armed(point, "raise", hit=1):
                try:
                    ingestor.run_batch()
                except failpoints.FailpointError:
                    return
            raise AssertionError(f"{point} did not fire")
    finally:
        ingestor.close()
        print(f"{point or 'drain'}: {time.monotonic() - started:.1f} s", file=sys.stderr)

upsert, cdc = job["upsert"], job["cdc"]
started = time.monotonic()
for point in ("main.after-stage", "main.before-commit", "main.after-commit"):
    run(upsert, point)
run(upsert)
run(cdc)
send_changes(types.SimpleNamespace(bootstrap=job["bootstrap"]), cdc["topic"], job["later"])
run(cdc)
for table in (upsert, cdc):
    spark.read.format("delta").load(table["location"]).write.parquet(table["by_spark"])
spark.stop()
"""


def order(i: int, customer: str) -> dict[str, Any]:
    return {"id": i, "customer": customer, "amount": 1.5, "ts": "2026-11-22T10:00:00Z"}


def cdc_event(op: str, i: int, customer: str, pos: int | None) -> dict[str, Any]:
    image = order(i, customer)
    before, after = (image, None) if op == "d" else (None, image)
    return {"op": op, "before": before, "after": after, "source": {"pos": pos} if pos else {}}


def latest_rows(location: str) -> dict[int, str]:
    """id -> customer of the Delta table's rows, read by delta-rs; each id once."""
    rows = delta_rows(location).select(["id", "customer"]).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key held twice"
    return {r["id"]: r["customer"] for r in rows}


def test_keyed_delta_tables_hold_the_latest_row_per_key_through_failing_commits(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """Upserts and tombstones over 2 partitions (keys partition-stable), three writers failing in turn at
    each commit point: the table holds the latest row per key, in Spark, delta-rs and `icefall verify`."""
    import pyarrow.parquet as pq

    from icefall.testing.streams import send_changes

    upsert = Table(kafka, tmp_path / "upsert", "keyed-upsert", spec="  mode: upsert\n  key: [id]")
    changes: list[Any] = [(None, {"id": i}, order(i, "v1")) for i in range(60)]
    changes += [(None, {"id": i}, order(i, "v2")) for i in range(0, 60, 3)]
    changes += [(None, {"id": i}, None) for i in range(40, 50)] + [(None, {"id": 45}, order(45, "back"))]
    send_changes(kafka, upsert.topic, changes)
    expected = {i: "v2" if i % 3 == 0 else "v1" for i in range(60) if not 40 <= i < 50} | {45: "back"}

    cdc = Table(
        kafka, tmp_path / "cdc", "keyed-cdc", spec='  mode: cdc\n  key: [id]\n  sequenceBy: ["source.pos"]'
    )
    send_changes(
        kafka,
        cdc.topic,
        [
            (0, {"id": 1}, cdc_event("c", 1, "created", 10)),
            (1, {"id": 1}, cdc_event("u", 1, "older, another partition", 9)),
            (1, {"id": 2}, cdc_event("c", 2, "two", 20)),
            (0, {"id": 3}, cdc_event("c", 3, "three", 30)),
            (0, {"id": 4}, cdc_event("c", 4, "four", 40)),
            (1, {"id": 4}, cdc_event("d", 4, "four", 41)),
        ],
    )
    later = [
        (1, {"id": 1}, cdc_event("u", 1, "stale", 8)),  # older than the row: skipped
        (0, {"id": 2}, cdc_event("d", 2, "two", 15)),  # an older delete: the row stays
        (1, {"id": 3}, cdc_event("u", 3, "newer", 31)),
        (0, {"id": 4}, cdc_event("c", 4, "before its delete", 39)),  # the remembered delete wins
    ]
    tables = {}
    for name, table in (("upsert", upsert), ("cdc", cdc)):
        tables[name] = {
            "manifest": str(table.manifest),
            "location": table.location,
            "leases": str(table.leases),
            "topic": table.topic,
            "by_spark": str(tmp_path / f"{name}-by-spark"),
        }
    job = json.dumps({**tables, "bootstrap": kafka.bootstrap, "later": later})
    done = in_delta_session(KEYED, job)
    assert done.returncode == 0, "\n".join(
        line for line in done.stderr.splitlines() if not line.startswith(("\t", " "))
    )[-3000:]

    assert latest_rows(upsert.location) == expected
    assert latest_rows(cdc.location) == {1: "created", 2: "two", 3: "newer"}
    for name, table in (("upsert", upsert), ("cdc", cdc)):
        by_rs = [plain(row) for row in delta_rows(table.location).to_pylist()]
        by_spark = [plain(row) for row in pq.read_table(tables[name]["by_spark"]).to_pylist()]
        key = lambda row: row["id"]  # noqa: E731
        assert sorted(by_spark, key=key) == sorted(by_rs, key=key)
        assert DeltaLog(table.location).snapshot().committed.offsets == watermarks(kafka, table.topic)
        report = verify_delta_table(table.st, tmp_path / "state", spark=spark)
        assert report.ok, report.render()
    # Replaced rows are marked in deletion vectors, not rewritten.
    log = DeltaLog(upsert.location)
    adds = [a["add"] for v in range(log.latest_version() + 1) for a in log.actions(v) if "add" in a]
    assert any(a.get("deletionVector") for a in adds)


def test_icefall_run_of_a_keyed_delta_table_killed_at_each_commit_point_then_read_fresh(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """`icefall run` of an upsert Delta table killed (status 137) after staging its MERGE and after its
    commit, then run again: the latest row per key, by `icefall verify`; then `icefall read` applies the
    changes produced after the last commit (an update, a tombstone, a new key) to the table's rows."""
    from icefall.testing.streams import send_changes

    table = Table(kafka, tmp_path, "keyed-cli", spec="  mode: upsert\n  key: [id]")
    changes: list[Any] = [(None, {"id": i}, order(i, "v1")) for i in range(60)]
    changes += [(None, {"id": i}, order(i, "v2")) for i in range(0, 60, 4)]
    changes += [(None, {"id": i}, None) for i in range(50, 55)]
    send_changes(kafka, table.topic, changes)
    expected = {i: "v2" if i % 4 == 0 else "v1" for i in range(60) if not 50 <= i < 55}

    state = tmp_path / "state"
    for point in ("main.after-stage=exit@2", "main.after-commit=exit@1"):
        killed = run_until_caught_up(table.manifest, state, point, maintenance=True)
        assert killed.returncode == failpoints.EXIT_STATUS, killed.stdout[-3000:] + killed.stderr[-3000:]
    done = run_until_caught_up(table.manifest, state, maintenance=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert latest_rows(table.location) == expected
    assert DeltaLog(table.location).snapshot().committed.offsets == watermarks(kafka, table.topic)
    report = verify_delta_table(table.st, tmp_path / "state", spark=spark)
    assert report.ok, report.render()

    send_changes(kafka, table.topic, [(None, {"id": 1}, order(1, "fresh")), (None, {"id": 2}, None)])
    send_changes(kafka, table.topic, [(None, {"id": 70}, order(70, "new"))])
    read = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "read", "-f", str(table.manifest), "--state-dir", str(state),
         "--format", "jsonl"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-3000:]
    rows = [json.loads(line) for line in read.stdout.splitlines()]
    assert len({r["id"] for r in rows}) == len(rows), "a key read twice"
    del expected[2]
    assert {r["id"]: r["customer"] for r in rows} == expected | {1: "fresh", 70: "new"}
    assert "tail: 3 records, 3 rows" in read.stderr, read.stderr


#: An upsert Delta table's writers in a Delta table's own Spark session (the MERGE needs Delta's extension),
#: one per manifest, each draining the topic; the changes `later` are produced before the second.
KEYED_EVOLVE = """
import json, pathlib, sys, types
from icefall.api import TableFormat
from icefall.api.manifest import parse_manifest
from icefall.spark.session import build_spark_session
from icefall.testing.delta import drain, start_writer
from icefall.testing.streams import send_changes

job = json.loads(sys.argv[1])
spark = build_spark_session(
    [], master="local[1]", app_name="delta-keyed-evolve", table_format=TableFormat.DELTA,
    extra_conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
)
for n, manifest in enumerate(job["manifests"]):
    if n:
        send_changes(types.SimpleNamespace(bootstrap=job["bootstrap"]), job["topic"], job["later"])
    st = parse_manifest(open(manifest).read())
    ingestor = start_writer(st, spark, job["location"], pathlib.Path(job["leases"]), f"writer-{n}")
    try:
        drain(ingestor)
    finally:
        ingestor.close()
spark.stop()
"""


def test_a_keyed_delta_table_follows_a_field_added_to_the_spec(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """An upsert table whose spec gains an optional field: the MERGE of the next batch writes it (its
    schema change in the same log entry); keys it does not touch read null in it; `icefall verify` clean."""
    from icefall.testing.streams import send_changes

    table = Table(kafka, tmp_path, "keyed-evolve", spec="  mode: upsert\n  key: [id]")
    send_changes(kafka, table.topic, [(None, {"id": i}, order(i, "v1")) for i in range(10)])
    last = "      - {name: ts, type: timestamptz, required: true}\n"
    wider = tmp_path / "wider.yaml"
    wider.write_text(
        table.manifest.read_text().replace(last, last + "      - {name: region, type: string}\n")
    )
    later = [(None, {"id": i}, {**order(i, "v2"), "region": f"r{i}"}) for i in (2, 11)]
    job = {
        "manifests": [str(table.manifest), str(wider)],
        "location": table.location,
        "leases": str(table.leases),
        "topic": table.topic,
        "bootstrap": kafka.bootstrap,
        "later": later,
    }
    done = in_delta_session(KEYED_EVOLVE, json.dumps(job))
    assert done.returncode == 0, "\n".join(
        line for line in done.stderr.splitlines() if not line.startswith(("\t", " "))
    )[-3000:]
    rows = {r["id"]: (r["customer"], r["region"]) for r in delta_rows(table.location).to_pylist()}
    expected = {i: ("v1", None) for i in range(10)} | {2: ("v2", "r2"), 11: ("v2", "r11")}
    assert rows == expected
    assert schema_change_entry(table.location) == {"commitInfo", "metaData", "add", "remove"}
    assert DeltaLog(table.location).snapshot().committed.offsets == watermarks(kafka, table.topic)
    report = verify_delta_table(parse_manifest(wider.read_text()), tmp_path / "state", spark=spark)
    assert report.ok, report.render()
