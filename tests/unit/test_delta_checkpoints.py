"""Checkpoints and log cleanup of a Delta table without Spark (`icefall.commit.delta_checkpoint`), and the
log read from its tail (`icefall.commit.delta_tail`, `DeltaLog.tail`), on a local folder.

Proves: a listing that starts at a checkpoint stands on its own only while that checkpoint (or a newer
complete one) is in it and the commits after it run without a gap, and a multi-part checkpoint missing a
part is no checkpoint; log cleanup deletes only below the newest checkpoint at or before the newest expired
commit (commit times made increasing), never that checkpoint, its commit or anything after it, and nothing
without such a checkpoint; `_last_checkpoint`'s checksum is PROTOCOL.md's; intervals read as Delta writes
them; a checkpoint holds the protocol, the Metadata with the offsets, the txns, every live add (dataChange
false) and only the tombstones within the retention; written and cleaned up, the table reads the same
through Icefall's replay, its snapshot (offsets) and delta-rs, and a snapshot lists only the tail; two
writers of one checkpoint leave the first one's; a replay keeps a file whose deletion vector a commit
replaces, in either order; the pods plan a checkpoint every interval, before the merges, and not for a
table whose features the writer does not keep; a crash between the checkpoint and `_last_checkpoint`
(failpoint `main.after-checkpoint`) leaves a table readers find the new checkpoint in anyway; the meter
replays from the checkpoint after cleanup.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from icefall.commit.delta import DeltaLog, commit_batch, set_properties
from icefall.commit.delta_checkpoint import (
    checkpoint_actions,
    checkpoint_refusal,
    clean_up_log,
    interval_ms,
    json_checksum,
    log_cleanup_deletions,
    write_checkpoint,
)
from icefall.commit.delta_files import LogFiles
from icefall.commit.delta_tail import tail_of
from icefall.compact.delta_pods import DeltaPodRunner
from icefall.plan.delta_maintenance import (
    Checkpoint,
    CompactFiles,
    DeltaFile,
    DeltaFilesView,
    DeltaPolicy,
    Vacuum,
    delta_work_key,
    plan_delta_pod_work,
    retention_properties,
)
from icefall.plan.names import TableIdentity, TableLeases

from .test_delta_pod_upkeep import batch, ids, table_with_small_files, write_file

pytestmark = pytest.mark.unit

POLICY = DeltaPolicy(target_file_size_bytes=1000, min_files_to_compact=3, retention_ms=7_200_000)
HOUR_MS = 3_600_000


def name(version: int, kind: str = "json") -> str:
    return f"{version:020d}.{kind}"


def test_a_listing_from_a_checkpoint_stands_only_with_that_checkpoint_or_a_newer_one_and_no_gap() -> None:
    listed = {name(5, "checkpoint.parquet"): 1, name(5): 1, name(6): 2, name(7): 3}
    tail = tail_of(listed, 5)
    assert tail is not None and (tail.checkpoint, dict(tail.commits), tail.latest) == (5, {6: 2, 7: 3}, 7)
    newer = {name(5): 1, name(6): 2, name(8, "checkpoint.parquet"): 3, name(8): 3, name(9): 4}
    assert tail_of(newer, 5) == tail_of(newer, None)  # the one at 5 is gone, 8 stands for it
    assert tail_of({name(6): 2, name(7): 3}, 5) is None  # the checkpoint was cleaned up: list further back
    assert tail_of({name(5, "checkpoint.parquet"): 1, name(6): 2, name(8): 3}, 5) is None  # a gap
    parts = {name(4, "checkpoint.0000000001.0000000002.parquet"): 1, name(4): 1, name(5): 2}
    assert tail_of(parts, 4) is None  # one part of two: no checkpoint (still written, or torn)
    whole = tail_of({name(0): 1, name(1): 2, "_last_checkpoint": 3}, None)
    assert whole is not None and whole.checkpoint is None and whole.latest == 1
    assert tail_of({}, None) is not None and tail_of({}, None).latest == -1  # type: ignore[union-attr]


def test_log_cleanup_keeps_every_version_from_the_newest_checkpoint_at_or_before_the_cutoff() -> None:
    listed = {name(v): 100 * v for v in range(13)}
    listed |= {name(5, "checkpoint.parquet"): 500, name(10, "checkpoint.parquet"): 1000, name(3, "crc"): 300}
    listed |= {name(2, "checkpoint.0000000001.0000000002.parquet"): 200, "_last_checkpoint": 1000}
    # Versions up to 8 expired: the newest checkpoint at or below 8 is 5; below it everything goes.
    doomed = log_cleanup_deletions(listed, cutoff_ms=850)
    assert set(doomed) == {name(v) for v in range(5)} | {
        name(3, "crc"),
        name(2, "checkpoint.0000000001.0000000002.parquet"),
    }
    # Everything expired: still never the newest checkpoint, its commit, or anything after it.
    doomed = log_cleanup_deletions(listed, cutoff_ms=10**13)
    assert name(10, "checkpoint.parquet") not in doomed and name(10) not in doomed and name(11) not in doomed
    assert name(5, "checkpoint.parquet") in doomed and "_last_checkpoint" not in doomed
    # No checkpoint at or before the newest expired commit: nothing.
    assert log_cleanup_deletions(listed, cutoff_ms=450) == ()
    assert log_cleanup_deletions({name(0): 1, name(1): 2}, cutoff_ms=10**13) == ()
    # A commit time going back (another writer's clock) counts as just after its predecessor's.
    skewed = {name(0): 100, name(1): 900, name(2): 200, name(2, "checkpoint.parquet"): 200, name(3): 950}
    assert log_cleanup_deletions(skewed, cutoff_ms=899) == ()  # version 2 counts as 901: not expired


def test_the_last_checkpoint_checksum_and_intervals_read_as_delta_writes_them() -> None:
    sample = json.loads(
        """{"k0":"'v 0'", "checksum": "adsaskfljadfkjadfkj", "k1":{"k2": 2, "k3": ["v3", [1, 2],
        {"k4": "v4", "k5": ["v5", "v6", "v7"]}]}}"""
    )
    assert json_checksum(sample) == "6a92d155a59bf2eecbd4b4ec7fd1f875"  # PROTOCOL.md's example
    assert interval_ms("interval 7200 seconds", 0) == 7_200_000
    assert interval_ms("interval 1 week", 0) == 7 * 24 * HOUR_MS
    assert interval_ms("2 days 3 hours", 0) == 51 * HOUR_MS
    assert interval_ms("soon", 5) == 5 and interval_ms(None, 5) == 5


def test_a_checkpoint_holds_state_offsets_live_files_and_only_tombstones_within_the_retention(
    tmp_path: Path,
) -> None:
    log = table_with_small_files(tmp_path, count=3)
    set_properties(log, {"delta.deletedFileRetentionDuration": "interval 1 hours"})
    now = 10 * HOUR_MS
    old = {"path": "old.parquet", "deletionTimestamp": now - 2 * HOUR_MS, "dataChange": True}
    young = {"path": "f0.parquet", "deletionTimestamp": now - 1, "dataChange": True, "size": 1}
    assert log.try_commit(5, [{"remove": old}, {"remove": young}, {"txn": {"appId": "a", "version": 3}}])
    files = LogFiles.read(log)
    actions = checkpoint_actions(files, now)
    kinds = Counter(next(iter(a)) for a in actions)
    assert kinds == Counter({"protocol": 1, "metaData": 1, "txn": 1, "add": 2, "remove": 1})
    assert all(not a[k]["dataChange"] for a in actions for k in a if k in ("add", "remove"))
    [metadata] = [a["metaData"] for a in actions if "metaData" in a]
    assert metadata["configuration"]["icefall.offsets"] == files.configuration["icefall.offsets"]
    [tombstone] = [a["remove"] for a in actions if "remove" in a]
    assert tombstone["path"] == "f0.parquet"
    assert checkpoint_refusal(files.protocol) is None
    assert "domainMetadata" in (
        checkpoint_refusal({"minWriterVersion": 7, "writerFeatures": ["domainMetadata"]}) or ""
    )
    assert "v2Checkpoint" in (
        checkpoint_refusal({"minReaderVersion": 3, "readerFeatures": ["v2Checkpoint"]}) or ""
    )


def table_with_a_cleaned_log(tmp_path: Path) -> DeltaLog:
    """Four batches, a checkpoint at version 5 and a batch after it; the commits before 5 cleaned up."""
    log = table_with_small_files(tmp_path, count=4)
    set_properties(log, {"delta.logRetentionDuration": "interval 1 hours"})  # version 5
    written = write_checkpoint(log, LogFiles.read(log), now_ms=10**13)
    assert written.version == 5 and written.add_files == 4 and written.created
    commit_batch(log, log.snapshot(), batch(40, 50), 1, [write_file(tmp_path, "z.parquet", range(40, 50))])
    for version in range(7):  # older than the retention
        os.utime(log.log_dir / name(version), (1000, 1000))
    deleted = clean_up_log(log, log.snapshot().configuration, now_ms=10**13)
    assert set(deleted) == {name(v) for v in range(5)}
    return log


def test_a_table_checkpointed_and_cleaned_up_reads_the_same_everywhere(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    log = table_with_a_cleaned_log(tmp_path)
    assert sorted(os.listdir(log.log_dir)) == [
        name(5, "checkpoint.parquet"), name(5), name(6), "_last_checkpoint",
    ]  # fmt: skip
    hint = json.loads((log.log_dir / "_last_checkpoint").read_text())
    assert hint["version"] == 5 and hint["numOfAddFiles"] == 4 and hint["checksum"] == json_checksum(hint)
    assert [f["name"] for f in hint["checkpointSchema"]["fields"]] == pq.read_schema(
        log.log_dir / name(5, "checkpoint.parquet")
    ).names
    fresh = DeltaLog(str(tmp_path))
    assert fresh.snapshot().committed.offsets == {0: 50} and fresh.snapshot().version == 6
    assert ids(fresh) == Counter(range(50)) and len(LogFiles.read(fresh).live) == 5
    table = DeltaTable(str(tmp_path))  # delta-rs reads the checkpoint (the commits before it are gone)
    assert table.version() == 6 and Counter(table.to_pyarrow_table().column("id").to_pylist()) == Counter(
        range(50)
    )
    # Two writers of one checkpoint: the second finds it there and leaves it.
    again = write_checkpoint(log, LogFiles.at_checkpoint(log, 5, (name(5, "checkpoint.parquet"),)), 10**13)
    assert not again.created


def test_a_snapshot_lists_only_the_tail_from_the_newest_checkpoint(tmp_path: Path) -> None:
    log = table_with_a_cleaned_log(tmp_path)
    for i in range(5):
        added = write_file(tmp_path, f"y{i}.parquet", range(50 + i, 51 + i))
        commit_batch(log, log.snapshot(), batch(50 + i, 51 + i), 1, [added])
    listed: list[tuple[str, int]] = []
    reader = DeltaLog(str(tmp_path))
    original = reader.storage.list_after

    def counting(relative: str, after: str) -> dict[str, int]:
        found: dict[str, int] = original(relative, after)
        listed.append((after, len(found)))
        return found

    reader.storage.list_after = counting  # type: ignore[method-assign]
    assert reader.snapshot().version == 11 and reader.snapshot().committed.offsets == {0: 55}
    assert listed == [(f"{5:020d}.", 9)] * 2  # from the checkpoint `_last_checkpoint` names, no whole listing


def test_a_replay_keeps_a_file_whose_deletion_vector_a_commit_replaces_in_either_order() -> None:
    files = LogFiles()
    old_dv = {"storageType": "u", "pathOrInlineDv": "a", "offset": 1, "sizeInBytes": 3, "cardinality": 1}
    new_dv = {**old_dv, "pathOrInlineDv": "b", "cardinality": 2}
    files.apply(0, [{"add": {"path": "p", "deletionVector": old_dv}}, {"add": {"path": "q"}}])
    files.apply(
        1,
        [
            {"add": {"path": "p", "deletionVector": new_dv}},
            {"remove": {"path": "p", "deletionVector": old_dv}},
        ],
    )
    files.apply(2, [{"remove": {"path": "q"}}, {"add": {"path": "q", "deletionVector": new_dv}}])
    assert files.live["p"]["deletionVector"] == new_dv and files.live["q"]["deletionVector"] == new_dv
    files.apply(3, [{"remove": {"path": "p", "deletionVector": new_dv}}])
    assert set(files.live) == {"q"}


def runner(root: Path, tmp_path: Path) -> DeltaPodRunner:
    from icefall.commit.lease import FileLease

    def leases(lease: str) -> FileLease:
        return FileLease.in_dir(tmp_path / "leases", lease, "pod-1", duration_seconds=60)

    names = TableLeases(TableIdentity("", "", "shop", "t"))
    policy = DeltaPolicy(target_file_size_bytes=2**20, min_files_to_compact=3, retention_ms=7_200_000)
    return DeltaPodRunner(str(root), policy, leases, table_leases=names, label="t")


def test_the_pods_checkpoint_every_interval_before_the_merges(tmp_path: Path) -> None:
    view = DeltaFilesView(12, tuple(DeltaFile(f"{i}", 10) for i in range(3)), retention_properties(POLICY), 2)
    work = plan_delta_pod_work(view, POLICY, now_ms=HOUR_MS, last_vacuum_ms=None)
    assert [type(i) for i in work] == [Checkpoint, CompactFiles, Vacuum]
    assert delta_work_key(work[0]) == "delta-checkpoint"
    not_yet = DeltaFilesView(11, (), {**retention_properties(POLICY), "delta.checkpointInterval": "10"}, 2)
    assert plan_delta_pod_work(not_yet, POLICY, now_ms=HOUR_MS, last_vacuum_ms=HOUR_MS) == ()
    # A real table: version 11 after 10 batches; the runner checkpoints it, then merges.
    log = table_with_small_files(tmp_path / "t", count=10)
    pods = runner(tmp_path / "t", tmp_path)
    kinds = [step.result.kind for _ in range(3) if (step := pods.step(HOUR_MS)).result is not None]
    assert kinds == ["SetRetention", "Checkpoint", "CompactFiles"]
    assert DeltaLog(str(tmp_path / "t")).latest_checkpoint() == 11
    assert ids(log) == Counter(range(100))


def test_no_checkpoint_is_planned_for_a_table_whose_features_the_writer_does_not_keep(tmp_path: Path) -> None:
    log = table_with_small_files(tmp_path / "t", count=10)
    protocol = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["domainMetadata"]}
    assert log.try_commit(11, [{"protocol": protocol}])
    pods = runner(tmp_path / "t", tmp_path)
    work: Any = pods.plan(HOUR_MS)
    assert not any(isinstance(item, Checkpoint) for item in work)


def test_the_meter_replays_from_the_checkpoint_once_the_commits_before_it_are_gone(tmp_path: Path) -> None:
    from icefall.ingest.delta_meter import LogReplay, read_delta

    from .test_delta_meter import table

    log = table_with_a_cleaned_log(tmp_path)
    reading = read_delta(DeltaLog(str(tmp_path)), table(str(tmp_path)), LogReplay())
    assert reading is not None
    facts = reading.facts
    assert (facts.data_files, facts.records) == (5, 50) and facts.offsets_by_topic == {"t": {0: 50}}
    assert facts.last_commit_snapshot_id == 6 and facts.snapshots == 2  # commit files kept: 5 and 6
    assert reading.table_uuid == log.snapshot().metadata["id"]  # type: ignore[index]


def test_a_crash_before_last_checkpoint_leaves_a_checkpoint_readers_find_anyway(tmp_path: Path) -> None:
    from icefall.runtime import failpoints

    log = table_with_a_cleaned_log(tmp_path)  # a checkpoint at 5, `_last_checkpoint` naming it
    reader = DeltaLog(str(tmp_path))
    assert reader.latest_checkpoint() == 5
    for i in range(3):
        added = write_file(tmp_path, f"x{i}.parquet", range(50 + i, 51 + i))
        commit_batch(log, log.snapshot(), batch(50 + i, 51 + i), 1, [added])
    with failpoints.armed("main.after-checkpoint", "raise"), pytest.raises(failpoints.FailpointError):
        write_checkpoint(log, LogFiles.read(log), now_ms=10**13)
    assert json.loads((log.log_dir / "_last_checkpoint").read_text())["version"] == 5  # stale: a hint
    assert reader.latest_checkpoint() == 9 and DeltaLog(str(tmp_path)).latest_checkpoint() == 9
    assert DeltaLog(str(tmp_path)).snapshot().committed.offsets == {0: 53}
    assert ids(DeltaLog(str(tmp_path))) == Counter(range(53))
