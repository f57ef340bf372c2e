"""Keyed (upsert, cdc) Delta tables on S3 (`spec.table.location: s3://...`, the test stack's MinIO), both
partitioned, filled from a real Kafka topic by real Spark (Delta's MERGE on a shadow naming the table's
files by `s3a://` URI, `icefall.ingest.delta_keyed`), exactly once.

Proves: `icefall run` of an upsert table partitioned by a column, killed (status 137) after uploading a
MERGE's files and before its commit, then run again with its upkeep on S3 (Icefall's merge and VACUUM),
and a cdc table with sequenceBy partitioned by day(ts) (an update moving a row to another day, a stale
change, an older delete, a remembered delete: its deleted keys file on S3) hold the latest row per key —
deletes applied, rows moved between partitions, rows of files that carry deletion vectors marked again —
by content, alike read by Spark's Delta reader and by delta-rs, and clean by `icefall verify` (the Kafka
records' keyed model); `icefall read` of the S3 table applies the changes produced after its last commit.
Credentials come from the AWS_* environment only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from icefall.api.manifest import parse_manifest
from icefall.audit.delta import delta_rows
from icefall.commands.delta import verify_delta_table
from icefall.commit.delta import DeltaLog
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.ingest.delta_keyed import table_uri
from icefall.runtime import failpoints
from icefall.testing.delta import aws_env, delta_manifest, in_delta_session, plain
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import send_changes, watermarks

pytestmark = pytest.mark.integration

BUCKET = "delta-keyed"

#: The cdc table's writers in a Delta table's own Spark session (the MERGE needs Delta's extension; S3A
#: reads the table's files with the AWS_* environment the child inherits), in two batches; then both
#: tables as Spark's Delta reader reads them (into local Parquet), and the upsert table's fresh read
#: (`icefall read`'s union of the table and the changes produced after its last commit).
KEYED_S3 = """
import json, pathlib, sys, time, types
from icefall.api import TableFormat
from icefall.api.manifest import parse_manifest
from icefall.ingest.delta_read import delta_union_read
from icefall.spark.session import build_spark_session
from icefall.testing.delta import drain, start_writer
from icefall.testing.streams import send_changes

job = json.loads(sys.argv[1])
spark = build_spark_session(
    [], master="local[1]", app_name="delta-keyed-s3", table_format=TableFormat.DELTA,
    extra_conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
)
started, cdc = time.monotonic(), job["cdc"]
for n in range(2):
    if n:
        send_changes(types.SimpleNamespace(bootstrap=job["bootstrap"]), cdc["topic"], job["cdc_later"])
    st = parse_manifest(open(cdc["manifest"]).read())
    ingestor = start_writer(st, spark, cdc["location"], pathlib.Path(cdc["leases"]), f"writer-{n}")
    try:
        drain(ingestor)
    finally:
        ingestor.close()
    print(f"cdc drained: {time.monotonic() - started:.1f} s", file=sys.stderr)
for table in (job["upsert"], cdc):
    spark.read.format("delta").load(table["uri"]).write.parquet(table["by_spark"])
upsert = job["upsert"]
send_changes(types.SimpleNamespace(bootstrap=job["bootstrap"]), upsert["topic"], job["upsert_tail"])
read = delta_union_read(parse_manifest(open(upsert["manifest"]).read()), upsert["location"], spark=spark)
read.frame.select("id", "customer").write.parquet(upsert["by_read"])  # `icefall read`: table + tail
spark.stop()
"""


UPSERT = "  mode: upsert\n  key: [id]"


def order(i: int, customer: str, day: int = 22) -> dict[str, Any]:
    return {"id": i, "customer": customer, "amount": 1.5, "ts": f"2026-11-{day}T10:00:00Z"}


def cdc_event(op: str, i: int, customer: str, pos: int | None, day: int = 22) -> dict[str, Any]:
    image = order(i, customer, day)
    before, after = (image, None) if op == "d" else (None, image)
    return {"op": op, "before": before, "after": after, "source": {"pos": pos} if pos else {}}


def latest_rows(location: str) -> dict[int, str]:
    """id -> customer of the Delta table's rows, read by delta-rs; each id once."""
    rows = delta_rows(location).select(["id", "customer"]).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key held twice"
    return {r["id"]: r["customer"] for r in rows}


class S3KeyedTable:
    def __init__(
        self, kafka: KafkaBroker, store: ObjectStore, tmp_path: Path, name: str, *, table: str, spec: str
    ) -> None:
        """Batches of at most 30 records (over the topic's two partitions)."""
        self.kafka, self.topic = kafka, f"it-delta-keyed-s3-{name}"
        kafka.create_topic(self.topic, partitions=2)
        self.location = f"s3://{BUCKET}/{tmp_path.name}/{name}"
        folder = tmp_path / name
        folder.mkdir()
        self.manifest = folder / "table.yaml"
        self.manifest.write_text(
            delta_manifest(
                name, kafka.bootstrap, self.topic, self.location, max_records=30, table=table, spec=spec
            )
        )
        self.st = parse_manifest(self.manifest.read_text())
        self.state, self.leases, self.by_spark = folder / "state", folder / "leases", folder / "by-spark"

    def job(self) -> dict[str, str]:
        return {
            "manifest": str(self.manifest),
            "location": self.location,
            "uri": table_uri(self.location),  # Spark's S3A reads s3a://
            "leases": str(self.leases),
            "topic": self.topic,
            "by_spark": str(self.by_spark),
            "by_read": str(self.by_spark.with_name("by-read")),
        }

    def assert_caught_up(self) -> None:
        assert DeltaLog(self.location).snapshot().committed.offsets == watermarks(self.kafka, self.topic)

    def assert_read_alike_and_verified(self, spark: Any) -> None:
        by_rs = [plain(row) for row in delta_rows(self.location).to_pylist()]
        read = [plain(row) for row in pq.read_table(self.by_spark).to_pylist()]
        assert sorted(read, key=lambda r: r["id"]) == sorted(by_rs, key=lambda r: r["id"])
        report = verify_delta_table(self.st, self.state, spark=spark)
        assert report.ok, report.render()


@pytest.fixture
def s3_env(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for key, value in aws_env(object_store).items():
        monkeypatch.setenv(key, value)
    object_store.filesystem().create_dir(BUCKET)
    return object_store


def test_keyed_delta_tables_on_s3_hold_the_latest_row_per_key_through_a_killed_writer(
    kafka: KafkaBroker, s3_env: ObjectStore, spark: Any, tmp_path: Path
) -> None:
    upsert = S3KeyedTable(
        kafka, s3_env, tmp_path, "upsert", table=", partitioning: [{field: customer}]", spec=UPSERT
    )
    # Batches of 30: the first 30 keys; half of them moved to another partition (their rows marked
    # deleted in the first batch's files) and 15 new keys; then a third of the first 30 deleted or
    # updated again (rows of files that carry a deletion vector by then).
    changes: list[Any] = [(None, {"id": i}, order(i, f"c{i % 3}")) for i in range(30)]
    changes += [(None, {"id": i}, order(i, "moved")) for i in range(0, 30, 2)]
    changes += [(None, {"id": i}, order(i, "v1")) for i in range(30, 45)]
    changes += [(None, {"id": i}, None if i % 2 else order(i, "again")) for i in range(0, 30, 3)]
    send_changes(kafka, upsert.topic, changes)
    first = {i: "moved" if i % 2 == 0 else f"c{i % 3}" for i in range(30)}
    first = {i: "again" if i % 6 == 0 else c for i, c in first.items() if not (i % 3 == 0 and i % 2)}
    expected = first | {i: "v1" for i in range(30, 45)}
    env = aws_env(s3_env)
    killed = run_until_caught_up(upsert.manifest, upsert.state, "main.after-stage=exit@2", env=env)
    assert killed.returncode == failpoints.EXIT_STATUS, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "failpoint main.after-stage triggered" in killed.stderr  # its MERGE's files uploaded
    assert DeltaLog(upsert.location).snapshot().committed.offsets  # the batch before the kill landed
    done = run_until_caught_up(upsert.manifest, upsert.state, env=env, maintenance=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "upkeep on S3: Icefall's merge" in done.stdout  # not Delta Spark's (not conditional)
    upsert.assert_caught_up()

    cdc = S3KeyedTable(
        kafka,
        s3_env,
        tmp_path,
        "cdc",
        table=", partitioning: [{field: ts, transform: day}]",
        spec='  mode: cdc\n  key: [id]\n  sequenceBy: ["source.pos"]',
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
    cdc_later = [
        (1, {"id": 1}, cdc_event("u", 1, "stale", 8)),  # older than the row: skipped
        (0, {"id": 2}, cdc_event("d", 2, "two", 15)),  # an older delete: the row stays
        (1, {"id": 3}, cdc_event("u", 3, "newer", 31, day=23)),  # to another day's partition
        (0, {"id": 4}, cdc_event("c", 4, "before its delete", 39)),  # the remembered delete wins
    ]
    tail = [
        (None, {"id": 1}, order(1, "fresh")),
        (None, {"id": 2}, None),
        (None, {"id": 70}, order(70, "new")),
    ]
    job = {
        "upsert": upsert.job(),
        "cdc": cdc.job(),
        "bootstrap": kafka.bootstrap,
        "cdc_later": cdc_later,
        "upsert_tail": tail,
    }
    read = in_delta_session(KEYED_S3, json.dumps(job))
    assert read.returncode == 0, "\n".join(
        line for line in read.stderr.splitlines() if not line.startswith(("\t", " "))
    )[-3000:]

    assert latest_rows(upsert.location) == expected
    fresh = {r["id"]: r["customer"] for r in pq.read_table(upsert.by_spark.with_name("by-read")).to_pylist()}
    assert fresh == {k: v for k, v in expected.items() if k != 2} | {1: "fresh", 70: "new"}
    assert latest_rows(cdc.location) == {1: "created", 2: "two", 3: "newer"}
    cdc.assert_caught_up()
    days = {r["id"]: str(r["ts_day"]) for r in delta_rows(cdc.location).to_pylist()}
    assert days == {1: "2026-11-22", 2: "2026-11-22", 3: "2026-11-23"}
    for table in (upsert, cdc):
        table.assert_read_alike_and_verified(spark)
    log = DeltaLog(upsert.location)
    actions = [a for v in range(log.latest_version() + 1) for a in log.actions(v)]
    # Replaced rows marked in deletion vectors (uploaded beside the files), a file's vector replaced; the
    # table's own paths only.
    assert any(a["remove"].get("deletionVector") for a in actions if "remove" in a)
    assert not any("://" in a[k]["path"] for a in actions for k in ("add", "remove") if k in a)
