"""The compaction pods' upkeep of a Delta table on S3 (`icefall.compact.delta_pods`), on the test stack's
MinIO, while a real writer (Spark, a real Kafka topic) keeps committing (commit/DESIGN.md, "Compaction pods
for Delta tables on S3").

Proves: merges of small files land between the writer's batches, both ways round — a batch that takes the
version a merge wanted, between the merge's check and its PUT, makes the merge's PUT lose and the merge
re-check and commit after it (checked: with an unconditional PUT the merge overwrote the batch); a batch
planned before a merge commits over it — and with the writer running on a thread of its own; a merge
crashed after writing its file (`main.mid-rewrite`) leaves the table as it was, one crashed after its
commit (`main.after-rewrite`) leaves it merged; afterwards every record is in the table exactly once by
content, read by delta-rs and by Spark's Delta reader (a copy of the table's folder: the image has no
hadoop-aws), with fewer files than before, the offsets at the topic's end and the Metadata's keys the
writer's; VACUUM past the retention deletes the merged-away and crashed merges' files, and no live one;
`icefall compact -f` runs the pods' loop on it with no Spark. The table has a sort order (customer, id):
a merge writes its rows in Z-order over it, and a point lookup on either column must read fewer of the
merged file's row runs than of the files it replaced (their per-file min/max overlap less).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from icefall.api.manifest import parse_manifest
from icefall.commit.delta import DeltaLog, set_properties
from icefall.commit.delta_files import LogFiles
from icefall.commit.delta_storage import S3Settings
from icefall.commit.lease import FileLease
from icefall.compact.delta_pods import DeltaPodRunner
from icefall.compact.worker import Outcome
from icefall.compact.zorder import zorder_values
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.plan.delta_maintenance import DeltaPolicy
from icefall.plan.names import table_leases
from icefall.runtime import failpoints
from icefall.testing.delta import (
    aws_env,
    delta_ids,
    delta_manifest,
    drain,
    read_with_sparks_delta_reader,
    start_writer,
)
from icefall.testing.streams import produce, watermarks

pytestmark = pytest.mark.integration

BUCKET = "delta-lake"
#: Small files merge at once: any two of them (the test's files are a few KiB); rows Z-ordered by SORT.
SORT = ("customer", "id")
POLICY = DeltaPolicy(
    target_file_size_bytes=4 * 2**20, min_files_to_compact=2, retention_ms=3_600_000, zorder_by=SORT
)
FAR_FUTURE_MS = 10**13


@pytest.fixture
def s3_env(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for key, value in aws_env(object_store).items():
        monkeypatch.setenv(key, value)
    object_store.filesystem().create_dir(BUCKET)
    return object_store


def operation(log: DeltaLog, version: int) -> str:
    [info] = [a["commitInfo"] for a in log.actions(version) if "commitInfo" in a]
    return str(info["operation"])


def live_files(location: str) -> int:
    return len(LogFiles.read(DeltaLog(location)).live)


def sort_rows(location: str, path: str) -> list[tuple[Any, ...]]:
    """The SORT columns of the data file `path` (as the log names it), row by row in the file's order."""
    filesystem, root = DeltaLog(location).storage.arrow()
    table = pq.read_table(f"{root}/{unquote(path)}", filesystem=filesystem, columns=list(SORT))
    return list(zip(*(table.column(c).to_pylist() for c in SORT), strict=True))


def lookup_shares(runs: list[list[tuple[Any, ...]]]) -> list[float]:
    """Per sort column, the mean share of `runs` (files, or stretches of one file) whose min/max range a
    point lookup of one of the column's values falls in: what a reader skipping by min/max must read."""
    shares = []
    for column in range(len(SORT)):
        values = {row[column] for run in runs for row in run}
        spans = [(min(r[column] for r in run), max(r[column] for r in run)) for run in runs]
        hits = sum(lo <= value <= hi for value in values for lo, hi in spans)
        shares.append(hits / (len(values) * len(runs)))
    return shares


def check_zordered_merge(location: str, version: int) -> None:
    """The merge of `version` wrote its rows in Z-order over SORT, clustered better than its inputs."""
    actions = DeltaLog(location).actions(version)
    [info] = [a["commitInfo"] for a in actions if "commitInfo" in a]
    assert info["operationParameters"]["zOrderBy"] == '["customer","id"]'
    [add] = [a["add"] for a in actions if "add" in a]
    added = add["path"]
    inputs = [sort_rows(location, a["remove"]["path"]) for a in actions if "remove" in a]
    rows = sort_rows(location, added)
    assert sorted(rows) == sorted(r for run in inputs for r in run)
    stats = json.loads(add["stats"])  # the merged file's own statistics (commit/delta_stats.py)
    ids = [r[SORT.index("id")] for r in rows]
    assert (stats["numRecords"], stats["minValues"]["id"], stats["maxValues"]["id"]) == (
        len(rows),
        min(ids),
        max(ids),
    )
    values = zorder_values([pa.array([r[i] for r in rows]) for i in range(len(SORT))]).to_pylist()
    assert values == sorted(values), "the merged file's rows are not in Z-order"
    count = len(inputs)  # cut the merged file into as many stretches as it had inputs
    runs = [rows[i * len(rows) // count : (i + 1) * len(rows) // count] for i in range(count)]
    before, after = lookup_shares(inputs), lookup_shares(runs)
    assert sum(after) < sum(before) and max(after) < max(before), (before, after)


def test_merges_on_s3_beside_a_committing_writer_keep_every_record_once(
    kafka: KafkaBroker, s3_env: ObjectStore, spark: Any, tmp_path: Path
) -> None:
    topic = "it-delta-compact-s3"
    kafka.create_topic(topic, partitions=2)
    location = f"s3://{BUCKET}/{tmp_path.name}/orders"
    manifest = tmp_path / "table.yaml"
    sort = ", ".join(f"{{field: {c}}}" for c in SORT)
    manifest.write_text(
        delta_manifest(
            "orders", kafka.bootstrap, topic, location, max_records=10, table=f", sortOrder: [{sort}]"
        )
    )
    st = parse_manifest(manifest.read_text())
    options = S3Settings.from_env().delta_rs_options()

    def leases(name: str) -> FileLease:
        return FileLease.in_dir(tmp_path / "work-leases", name, "pod-0", duration_seconds=60)

    pods = DeltaPodRunner(location, POLICY, leases, table_leases=table_leases(st), label="orders")
    produce(kafka, topic, 0, 60)
    writer = start_writer(st, spark, location, tmp_path / "leases", "writer")
    try:
        drain(writer)
        small = live_files(location)
        assert small >= 6
        log = DeltaLog(location)
        set_properties(log, {"delta.checkpointInterval": "1000"})  # merges only (checkpoints: their own test)
        configuration = dict(log.snapshot().configuration)
        assert pods.step().result.kind == "SetRetention"  # type: ignore[union-attr]

        # A batch takes the version the merge wanted, between the merge's check and its PUT: the PUT loses
        # (If-None-Match), the merge re-checks its files and commits after the batch.
        produce(kafka, topic, 60, 20)
        wanted = log.latest_version() + 1
        with failpoints.armed("main.before-rewrite-commit", lambda _: drain(writer), hit=1):
            merged = pods.step().result
        assert merged is not None and merged.outcome is Outcome.DONE, merged
        assert merged.snapshot_id is not None and merged.snapshot_id > wanted  # the batches took `wanted`
        assert (
            operation(log, wanted) == "STREAMING UPDATE" and operation(log, merged.snapshot_id) == "OPTIMIZE"
        )
        assert log.snapshot().committed.offsets == watermarks(kafka, topic)
        assert delta_ids(location, options) == Counter(range(80))
        check_zordered_merge(location, merged.snapshot_id)

        # A batch planned before a merge commits over it, with its offsets.
        produce(kafka, topic, 80, 20)
        ran: list[Any] = []
        with failpoints.armed("main.before-commit", lambda _: ran.append(pods.step().result), hit=1):
            drain(writer)
        assert ran and ran[0] is not None and ran[0].outcome is Outcome.DONE, ran
        assert operation(log, ran[0].snapshot_id + 1) == "STREAMING UPDATE"  # the batch, right after it
        assert delta_ids(location, options) == Counter(range(100))

        # A merge crashed after writing its file leaves the table as it was; one crashed after its commit
        # leaves it merged. Neither loses or doubles a row.
        produce(kafka, topic, 100, 20)
        drain(writer)
        before = live_files(location)
        with failpoints.armed("main.mid-rewrite", "raise"):
            assert "FailpointError" in (pods.step().error or "")
        assert live_files(location) == before and delta_ids(location, options) == Counter(range(120))
        with failpoints.armed("main.after-rewrite", "raise"):
            assert "FailpointError" in (pods.step().error or "")
        assert live_files(location) < before and delta_ids(location, options) == Counter(range(120))

        # The writer on a thread of its own, the pods stepping meanwhile.
        stop = threading.Event()
        failures: list[BaseException] = []

        def keep_writing() -> None:
            try:
                for start in range(120, 400, 20):
                    if stop.is_set():
                        return
                    produce(kafka, topic, start, 20)
                    drain(writer)
            except BaseException as error:  # reported by the main thread
                failures.append(error)

        thread = threading.Thread(target=keep_writing, name="writer")
        thread.start()
        outcomes: Counter[str] = Counter()
        try:
            while thread.is_alive():
                step = pods.step()
                if step.result is not None:
                    outcomes[f"{step.result.kind} {step.result.outcome.value}"] += 1
                else:
                    stop.wait(0.2)  # nothing due: the writer adds files meanwhile
        finally:
            stop.set()
            thread.join()
        assert not failures, failures
        assert outcomes["CompactFiles done"] >= 1, outcomes
        drain(writer)
    finally:
        writer.close()

    while (step := pods.step()).result is not None and step.result.kind == "CompactFiles":
        pass
    assert live_files(location) < small
    assert delta_ids(location, options) == Counter(range(400))
    snapshot = DeltaLog(location).snapshot()
    assert snapshot.committed.offsets == watermarks(kafka, topic)
    assert {k: v for k, v in snapshot.configuration.items() if not k.startswith(("icefall.", "delta."))} == {
        k: v for k, v in configuration.items() if not k.startswith(("icefall.", "delta."))
    }

    # VACUUM past the retention: the merged-away and crashed merges' files go, no live one.
    files = LogFiles.read(DeltaLog(location))
    result = pods.run_item(pods.plan(FAR_FUTURE_MS)[-1], FAR_FUTURE_MS)
    assert result.kind == "Vacuum" and len(result.deleted_paths) >= len(files.removed), result
    assert not set(result.deleted_paths) & set(files.live)
    assert delta_ids(location, options) == Counter(range(400))

    # Spark's Delta reader reads the same rows (from a copy: Spark here has no S3 file system).
    copy = tmp_path / "copy"
    pafs.copy_files(
        f"{BUCKET}/{tmp_path.name}/orders",
        str(copy),
        source_filesystem=DeltaLog(location).storage.arrow()[0],
        destination_filesystem=pafs.LocalFileSystem(),
    )
    rows = read_with_sparks_delta_reader(str(copy), tmp_path / "spark-rows")
    assert Counter(r["id"] for r in rows) == Counter(range(400))

    # The pods' entry point: no Spark, no catalog, one round.
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "compact", "-f", str(manifest), "--state-dir",
         str(tmp_path / "pod-state"), "--once", "--metrics-port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[compact] orders:" in done.stdout, done.stdout
