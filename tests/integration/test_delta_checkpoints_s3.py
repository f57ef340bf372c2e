"""Checkpoints and log cleanup of a Delta table on S3 without Spark (`icefall.commit.delta_checkpoint`, run
by the compaction pods' `Checkpoint` item), on the test stack's MinIO, while a real writer (Spark, a real
Kafka topic) commits (commit/DESIGN.md, "Checkpoints and log cleanup").

Proves: a table past several `delta.checkpointInterval`s with merges in between gets a checkpoint each
interval, and each checkpoint holds exactly the state a replay of the commits up to it gives (Metadata with
the offsets, live files); a checkpoint written while a batch sits between its checks and its PUT, one whose
`_last_checkpoint` a batch overtakes, and checkpoints written while the writer commits on a thread of its
own all stay consistent; with a short `delta.logRetentionDuration` the commits below the checkpoint are
deleted (the log keeps the checkpoint and what follows); a writer started again then resumes from the
checkpoint exactly once (every record once by content; `icefall verify` passes); and Delta Spark 4.1 (a
copy of the folder: the image has no hadoop-aws) and delta-rs read exactly the rows Icefall's own reader
does.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from icefall.api.manifest import parse_manifest
from icefall.commands.delta import verify_delta_table
from icefall.commit.delta import DeltaLog, set_properties
from icefall.commit.delta_files import LogFiles
from icefall.commit.delta_storage import S3Settings
from icefall.commit.delta_tail import complete_checkpoints
from icefall.commit.lease import FileLease
from icefall.compact.delta_pods import DeltaPodRunner
from icefall.compact.worker import Outcome
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.plan.delta_maintenance import Checkpoint, DeltaPolicy
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
POLICY = DeltaPolicy(target_file_size_bytes=4 * 2**20, min_files_to_compact=2, retention_ms=3_600_000)


@pytest.fixture
def s3_env(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for key, value in aws_env(object_store).items():
        monkeypatch.setenv(key, value)
    object_store.filesystem().create_dir(BUCKET)
    return object_store


def icefall_ids(location: str) -> Counter[int]:
    """The ids of the table's live files as Icefall's own replay names them, read with pyarrow."""
    log = DeltaLog(location)
    filesystem, root = log.storage.arrow()
    found: Counter[int] = Counter()
    for path in LogFiles.read(log).live:
        found.update(pq.read_table(f"{root}/{path}", columns=["id"], filesystem=filesystem)["id"].to_pylist())
    return found


def checkpoints(log: DeltaLog) -> dict[int, tuple[str, ...]]:
    return complete_checkpoints(log.storage.list("_delta_log"))


def assert_checkpoints_match_the_commits(log: DeltaLog) -> int:
    """Each checkpoint whose commits are all still there holds what replaying them gives; how many."""
    kept = set(log.history().commit_file_ms)
    checked = 0
    for version, names in sorted(checkpoints(log).items()):
        if not set(range(version + 1)) <= kept:
            continue
        from_commits = LogFiles().advance(log, version)
        stored = LogFiles.at_checkpoint(log, version, names)
        assert set(stored.live) == set(from_commits.live), version
        assert stored.metadata == from_commits.metadata and stored.protocol == from_commits.protocol
        checked += 1
    return checked


def stepped(pods: DeltaPodRunner, outcomes: Counter[str], rounds: int) -> None:
    for _ in range(rounds):
        result = pods.step().result
        if result is None:
            return
        outcomes[f"{result.kind} {result.outcome.value}"] += 1


def test_checkpoints_and_log_cleanup_on_s3_keep_every_record_once_for_every_reader(
    kafka: KafkaBroker, s3_env: ObjectStore, spark: Any, tmp_path: Path
) -> None:
    topic = "it-delta-checkpoints-s3"
    kafka.create_topic(topic, partitions=2)
    location = f"s3://{BUCKET}/{tmp_path.name}/orders"
    st = parse_manifest(delta_manifest("orders", kafka.bootstrap, topic, location, max_records=10))
    options = S3Settings.from_env().delta_rs_options()

    def leases(name: str) -> FileLease:
        return FileLease.in_dir(tmp_path / "work-leases", name, "pod-0", duration_seconds=60)

    pods = DeltaPodRunner(location, POLICY, leases, table_leases=table_leases(st), label="orders")
    log = DeltaLog(location)
    produce(kafka, topic, 0, 20)
    writer = start_writer(st, spark, location, tmp_path / "leases", "writer")
    total = 20
    outcomes: Counter[str] = Counter()
    try:
        drain(writer)
        set_properties(log, {"delta.checkpointInterval": "4"})
        # Several checkpoint intervals, the pods' merges in between.
        for _ in range(5):
            produce(kafka, topic, total, 20)
            total += 20
            drain(writer)
            stepped(pods, outcomes, 4)
        assert outcomes["Checkpoint done"] >= 3 and outcomes["CompactFiles done"] >= 2, outcomes
        assert assert_checkpoints_match_the_commits(log) >= 3

        # A checkpoint written while a batch sits between its checks and its PUT (the batch before it landed,
        # so the version is new): the batch commits after it.
        produce(kafka, topic, total, 30)
        total += 30
        made: list[Any] = []

        def checkpoint_now(_: str) -> None:
            pods.plan()  # the replay the checkpoint is of: the version the batch was planned on
            made.append(pods.run_item(Checkpoint(0), pods.clock_ms()))

        with failpoints.armed("main.before-commit", checkpoint_now, hit=2):
            drain(writer)
        assert made and made[0].outcome is Outcome.DONE and made[0].snapshot_id < log.latest_version()
        # A batch that lands between a checkpoint's PUT and its `_last_checkpoint`.
        produce(kafka, topic, total, 20)
        total += 20
        pods.plan()
        with failpoints.armed("main.after-checkpoint", lambda _: drain(writer), hit=1):
            pods.run_item(Checkpoint(0), pods.clock_ms())
        assert log.snapshot().committed.offsets == watermarks(kafka, topic)

        # The writer on a thread of its own, the pods checkpointing and merging meanwhile.
        stop, failures = threading.Event(), []

        def keep_writing(start: int) -> None:
            try:
                for first in range(start, start + 100, 20):
                    if stop.is_set():
                        return
                    produce(kafka, topic, first, 20)
                    drain(writer)
            except BaseException as error:  # reported by the main thread
                failures.append(error)

        thread = threading.Thread(target=keep_writing, args=(total,), name="writer")
        total += 100
        thread.start()
        try:
            while thread.is_alive():
                before = sum(outcomes.values())
                stepped(pods, outcomes, 1)
                if sum(outcomes.values()) == before:
                    stop.wait(0.1)
        finally:
            stop.set()
            thread.join()
        assert not failures, failures
        drain(writer)
        assert assert_checkpoints_match_the_commits(log) >= 5, outcomes
        assert icefall_ids(location) == Counter(range(total)) == delta_ids(location, options)

        # A short log retention: the pods set it, and the next checkpoint's cleanup drops the older log.
        short = DeltaPodRunner(
            location, replace(POLICY, retention_ms=2000), leases, table_leases=table_leases(st), label="o"
        )
        assert short.step().result.kind == "SetRetention"  # type: ignore[union-attr]
        time.sleep(2.5)
        cleaned: list[str] = []
        for _ in range(3):
            produce(kafka, topic, total, 20)
            total += 20
            drain(writer)
            for _ in range(4):
                step = short.step()
                if step.result is not None and step.result.kind == "Checkpoint":
                    cleaned.append(step.result.detail)
        assert any(not done.endswith(" 0 log files cleaned up") for done in cleaned), cleaned
    finally:
        writer.close()
    history = log.history()
    newest = max(checkpoints(log))
    assert 0 not in history.commit_file_ms and history.earliest is not None and history.earliest > 0
    assert min(history.commit_file_ms) >= min(checkpoints(log)) and newest in checkpoints(log)

    # A writer started again resumes from the checkpoint: every record once.
    produce(kafka, topic, total, 30)
    total += 30
    again = start_writer(st, spark, location, tmp_path / "leases", "writer-2")
    try:
        drain(again)
    finally:
        again.close()
    assert DeltaLog(location).snapshot().committed.offsets == watermarks(kafka, topic)
    assert icefall_ids(location) == Counter(range(total)) == delta_ids(location, options)
    audit = verify_delta_table(st, tmp_path / "state", spark=spark)
    assert audit.ok, audit.render()
    assert sum(p.in_table for p in audit.partitions) == total

    # Delta Spark 4.1 reads the same rows through the checkpoint (the commits before it are gone).
    copy = tmp_path / "copy"
    pafs.copy_files(
        f"{BUCKET}/{tmp_path.name}/orders",
        str(copy),
        source_filesystem=log.storage.arrow()[0],
        destination_filesystem=pafs.LocalFileSystem(),
    )
    rows = read_with_sparks_delta_reader(str(copy), tmp_path / "spark-rows")
    assert Counter(r["id"] for r in rows) == Counter(range(total))
