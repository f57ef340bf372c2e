"""The Delta driver's reading of its table for the status report (`icefall.ingest.delta_meter`), from a real
`_delta_log` in a folder (the commit protocol's own functions write it; no Spark).

Proves: before the table exists there is no reading; after batches, the reading holds the committed offsets
by topic, the topic id, the newest produce time, the last batch's version and its commit file's time (an
epoch claim after it is not a commit of records), the live files, bytes and records (a removed file is no
longer counted), and the table's id; the replay reads each commit file once; a log whose first commits are
gone gives no file figures but the rest; a table on S3 reports the merges due as its compaction backlog
(a local one none); and `WriterStatusReporter` sends it unchanged: the table's figures, the per-table lag
and last commit, and the log's table id as `tableUuid` (what `deletionPolicy: Delete`'s purge checks), the
dead-letter table's once it exists (looked for at the first reading and when the writer reports dead
letters).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from icefall.api import StreamingTable
from icefall.commit.batch import Batch
from icefall.commit.delta import LOG_DIR, AddFile, DeltaLog, claim_epoch, commit_batch, create_table
from icefall.controller.kube import Kube
from icefall.ingest.delta_dead_letters import dead_letter_location
from icefall.ingest.delta_meter import DeltaMeter, LogReplay, read_delta, replay
from icefall.ingest.report import BatchReport
from icefall.ingest.writer_status import WriterStatusReporter

pytestmark = pytest.mark.unit

SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
T0 = datetime(2026, 11, 29, tzinfo=UTC)


def table(location: str) -> StreamingTable:
    return StreamingTable.model_validate(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "t"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"format": "delta", "namespace": "shop", "name": "orders", "location": location},
            },
        }
    )


def batch(start: int, end: int) -> Batch:
    return Batch(topic="t", start={0: start}, end={0: end}, topic_id="tid", max_produce_time_ms=1000 + end)


def filled(tmp_path: Path) -> DeltaLog:
    """Version 0 (create), 1 and 2 (batches of 10 and 5 records), 3 (an epoch claim)."""
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=1)
    commit_batch(log, planned, batch(0, 10), 1, [AddFile("a.parquet", 100, 10)])
    commit_batch(log, log.snapshot(), batch(10, 15), 1, [AddFile("b.parquet", 50, 5)])
    claim_epoch(log, 2)
    return log


def test_no_reading_before_the_table_exists(tmp_path: Path) -> None:
    assert DeltaMeter(table(str(tmp_path)), str(tmp_path)).read_once() is None


def test_the_reading_is_the_logs_offsets_last_batch_and_live_files(tmp_path: Path) -> None:
    log = filled(tmp_path)
    os.utime(tmp_path / LOG_DIR / f"{2:020d}.json", (1_800_000_000, 1_800_000_000))
    meter = DeltaMeter(table(str(tmp_path)), str(tmp_path))
    reading = meter.read_once()
    assert reading is not None and meter.latest == reading
    facts = reading.facts
    assert facts.offsets_by_topic == {"t": {0: 15}} and facts.topic_id == "tid"
    assert facts.max_produce_time_ms == 1015 and facts.lost_records == 0
    assert facts.last_commit_snapshot_id == 2  # the batch, not the epoch claim (version 3)
    assert facts.last_commit_ms == 1_800_000_000_000
    assert (facts.data_files, facts.total_file_bytes, facts.records, facts.snapshots) == (2, 150, 15, 4)
    assert (
        reading.table.files == 2 and reading.table.records == 15 and reading.table.avg_file_size_bytes == 75
    )
    assert reading.table_uuid == log.snapshot().metadata["id"] and reading.dead_letter_table_uuid is None
    assert reading.identifier == "shop.orders"
    # A later commit that removes a file (an OPTIMIZE's, say): only the new version is read.
    assert log.try_commit(4, [{"remove": {"path": "a.parquet"}}, {"commitInfo": {"operation": "OPTIMIZE"}}])
    read: list[int] = []
    actions = log.actions
    log.actions = lambda version: read.append(version) or actions(version)  # type: ignore[method-assign]
    meter.log = log
    later = meter.read_once()
    assert read == [4]
    assert later is not None and later.facts.data_files == 1 and later.facts.records == 5
    assert later.facts.last_commit_snapshot_id == 2


def test_a_log_without_its_first_commits_gives_no_file_figures(tmp_path: Path) -> None:
    log = filled(tmp_path)
    # As after log cleanup: version 0's commit is gone (a checkpoint would stand for it).
    state = replay(log, 3, {1, 2, 3}, LogReplay())
    assert not state.complete and state.through == 3 and state.last_batch == 2
    assert len(state.files) == 2  # what was replayed; read_delta reports no file figures for it
    reading = read_delta(log, table(str(tmp_path)), state)
    assert reading is not None
    assert (reading.facts.data_files, reading.facts.records) == (0, 0)
    assert reading.facts.offsets_by_topic == {"t": {0: 15}} and reading.facts.last_commit_snapshot_id == 2


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[Mapping[str, Any]] = []

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.patches.append(status)


def test_the_reporter_sends_the_delta_reading_with_the_logs_table_id(tmp_path: Path) -> None:
    log = filled(tmp_path / "orders")
    st = table(str(tmp_path / "orders"))
    meter = DeltaMeter(st, str(tmp_path / "orders"))
    kube = RecordingKube()
    report = WriterStatusReporter(cast(Kube, kube), "shop", "orders", meter=meter, wall=lambda: T0)
    assert meter.read_once() is not None
    report(BatchReport(5, 5, 0, 1.0, 0.1, 2, {0: 15}, 3, 1.5, partition_lag={0: 3}))
    writer = kube.patches[-1]["writer"]
    assert writer["tableUuid"] == log.snapshot().metadata["id"] and "deadLetterTableUuid" not in writer
    assert writer["snapshotId"] == 2 and writer["lagRecords"] == 3 and writer["freshnessSeconds"] == 1.5
    assert writer["table"]["files"] == 2 and writer["table"]["records"] == 15
    (main,) = writer["tables"]
    assert main["table"] == "shop.orders" and main["lagRecords"] == 3 and main["snapshotId"] == 2
    # The dead-letter table, once its first bad record made it: its id too (what a purge checks). Its log
    # is looked for again only once the writer reports dead letters, not at every reading.
    dead = DeltaLog(str(dead_letter_location(st, str(tmp_path / "orders"))))
    create_table(dead, SCHEMA, epoch=1)
    reading = meter.read_once()
    assert reading is not None and reading.dead_letter_table_uuid is None
    report(BatchReport(5, 4, 1, 1.0, 0.1, 3, {0: 20}, 0, 1.5, partition_lag={0: 0}))
    reading = meter.read_once()
    assert reading is not None and reading.dead_letter_table_uuid == dead.snapshot().metadata["id"]


def test_a_table_on_s3_reports_the_merges_due_as_its_compaction_backlog(tmp_path: Path) -> None:
    log = filled(tmp_path)
    for i in range(5):  # five more small files: one merge of all seven is due (Delta's default policy)
        commit_batch(log, log.snapshot(), batch(15 + i, 16 + i), 2, [AddFile(f"c{i}.parquet", 10, 1)])
    on_s3 = read_delta(log, table("s3://lake/orders"), LogReplay())  # the log read here, the spec's S3
    assert on_s3 is not None and on_s3.facts.compaction_backlog == 1
    assert on_s3.table.compaction_backlog == 1
    local = read_delta(log, table(str(tmp_path)), LogReplay())
    assert local is not None and local.facts.compaction_backlog is None  # `icefall run` tidies it
