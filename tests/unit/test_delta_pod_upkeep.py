"""The compaction pods' upkeep of a Delta table (`icefall.plan.delta_maintenance` pods' part,
`icefall.commit.delta_files`, `icefall.compact.delta_pods`) on a local folder, without Spark.

Proves: the plan packs each partition's small files, smallest first, into merges within the target size
(a lone file, a big file, a table with too few small files: no merge), asks for the retention first and
VACUUM once an interval, and keys merges by partition; VACUUM's selection keeps live files, files removed
within the retention, young unnamed files, hidden folders and any file named as a kept one, and takes the
rest; the log replay gives the live files and tombstones, also across a checkpoint; a merge keeps every
row once and the Metadata (with the offsets) as it was, commits on top of a batch that took its version
(re-checked), gives up when its input was removed meanwhile, and a batch planned before it commits over
it; a table whose protocol uses a writer feature the merge does not maintain is refused; the runner runs
one item per round under its work Lease and skips one another pod holds; a log path outside the table's
folder (`..`, encoded or not, a URI) is never merged.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table
from icefall.commit.delta_files import LogFiles, RewriteConflictError, commit_rewrite, merge_refusal
from icefall.commit.lease import FileLease
from icefall.compact.delta_pods import DeltaPodRunner, merge, vacuum
from icefall.compact.worker import Outcome
from icefall.plan.delta_maintenance import (
    CompactFiles,
    DeltaFile,
    DeltaFilesView,
    DeltaPolicy,
    SetRetention,
    Vacuum,
    delta_backlog,
    delta_work_key,
    merge_bins,
    partition_key,
    plan_delta_pod_work,
    retention_properties,
    vacuum_deletions,
)
from icefall.plan.names import TableIdentity, TableLeases
from icefall.runtime import failpoints

pytestmark = pytest.mark.unit

POLICY = DeltaPolicy(target_file_size_bytes=1000, min_files_to_compact=3, retention_ms=7_200_000)
TIDY = retention_properties(POLICY)
HOUR_MS = 3_600_000
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def test_merges_pack_each_partitions_small_files_within_the_target() -> None:
    files = [
        DeltaFile("a/1", 400, "d=a"),
        DeltaFile("a/2", 100, "d=a"),
        DeltaFile("a/3", 300, "d=a"),
        DeltaFile("a/4", 500, "d=a"),
        DeltaFile("a/big", 900, "d=a"),  # not small (>= 0.75 of the target)
        DeltaFile("b/1", 10, "d=b"),  # alone in its partition
    ]
    bins = merge_bins(files, POLICY)
    assert [(b.partition, b.paths, b.bytes) for b in bins] == [("d=a", ("a/2", "a/3", "a/1"), 800)]
    assert delta_backlog(files, POLICY) == 1
    assert merge_bins(files[:2], POLICY) == ()  # two small files: below min_files_to_compact
    assert merge_bins([DeltaFile(f"p{i}", 600, "") for i in range(4)], POLICY) == ()  # no two fit in one


def test_the_pods_plan_retention_then_merges_then_vacuum_keyed_by_partition() -> None:
    files = tuple(DeltaFile(f"d=a/{i}", 10, "d=a") for i in range(3))
    view = DeltaFilesView(4, files, {})
    work = plan_delta_pod_work(view, POLICY, now_ms=10 * HOUR_MS, last_vacuum_ms=None)
    assert [type(i) for i in work] == [SetRetention, CompactFiles, Vacuum]
    assert [delta_work_key(i) for i in work] == ["delta-properties", "delta-merge/d=a", "delta-vacuum"]
    tidy = DeltaFilesView(4, (), TIDY)
    assert plan_delta_pod_work(tidy, POLICY, now_ms=10 * HOUR_MS, last_vacuum_ms=10 * HOUR_MS - 1) == ()
    assert plan_delta_pod_work(tidy, POLICY, now_ms=10 * HOUR_MS, last_vacuum_ms=8 * HOUR_MS) == (
        Vacuum(POLICY.retention_ms),
    )
    assert plan_delta_pod_work(DeltaFilesView(-1, (), {}), POLICY, now_ms=0, last_vacuum_ms=None) == ()
    assert partition_key({"b": "2", "a": None}) == "a=/b=2"


def test_vacuum_takes_only_files_no_version_within_the_retention_names_and_older_than_it() -> None:
    cutoff = 10 * HOUR_MS
    old, young = cutoff - 1, cutoff + 1
    listed = {
        "live.parquet": old,
        "removed-long-ago.parquet": old,
        "removed-lately.parquet": old,
        "unnamed-old.parquet": old,  # a crashed batch's or merge's file
        "unnamed-young.parquet": young,  # a batch's file before its commit
        "_delta_log/00000000000000000000.json": old,
        "_icefall_staging/x/part-0.parquet": old,
        "d=a/.part-1.crc": old,
        "_p=1/old.parquet": old,  # a partition column starting with _
        "d=a%3Ab/live.parquet": old,  # the live file's name under a folder the log spells otherwise
    }
    removed = {"removed-long-ago.parquet": cutoff - 5, "removed-lately.parquet": cutoff}
    doomed = vacuum_deletions(listed, ["live.parquet"], removed, cutoff_ms=cutoff, partition_columns=["_p"])
    assert doomed == ("_p=1/old.parquet", "removed-long-ago.parquet", "unnamed-old.parquet")


def write_file(root: Path, relative: str, ids: range) -> AddFile:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(list(ids), pa.int64())}), path)
    return AddFile(relative, path.stat().st_size, len(ids))


def batch(start: int, end: int) -> Batch:
    return Batch(topic="t", start={0: start}, end={0: end}, topic_id="tid", max_produce_time_ms=end)


def table_with_small_files(root: Path, count: int = 4) -> DeltaLog:
    log = DeltaLog(str(root))
    create_table(log, SCHEMA, epoch=1)
    for i in range(count):
        commit_batch(
            log,
            log.snapshot(),
            batch(10 * i, 10 * i + 10),
            1,
            [write_file(root, f"f{i}.parquet", range(10 * i, 10 * i + 10))],
        )
    return log


def ids(log: DeltaLog) -> Counter[int]:
    files = LogFiles.read(log)
    found: Counter[int] = Counter()
    for path in files.live:
        found.update(pq.read_table(Path(log.location) / path).column("id").to_pylist())
    return found


def test_a_merge_keeps_every_row_once_and_the_metadata_as_it_was(tmp_path: Path) -> None:
    log = table_with_small_files(tmp_path)
    before = log.snapshot()
    files = LogFiles.read(log)
    item = CompactFiles("", tuple(sorted(files.live)), 0)
    result = merge(log, files, item)
    assert result.outcome is Outcome.DONE and result.files_rewritten == 4
    assert ids(log) == Counter(range(40))
    after = LogFiles.read(log)
    assert len(after.live) == 1 and set(after.removed) == set(item.paths)
    actions = log.actions(after.version)
    assert [next(iter(a)) for a in actions] == ["commitInfo", *["remove"] * 4, "add"]
    assert all(not a[k]["dataChange"] for a in actions[1:] for k in a)
    assert log.snapshot().metadata == before.metadata  # offsets and epoch untouched
    # A batch planned before the merge commits over it, with its offsets.
    assert commit_batch(log, before, batch(40, 50), 1, [write_file(tmp_path, "g.parquet", range(40, 50))])
    assert ids(log) == Counter(range(50))


def test_a_merge_whose_version_a_batch_took_commits_after_it_and_one_whose_input_went_gives_up(
    tmp_path: Path,
) -> None:
    log = table_with_small_files(tmp_path)
    files = LogFiles.read(log)
    paths = tuple(sorted(files.live))

    def batch_lands(_: str) -> None:
        commit_batch(
            log, log.snapshot(), batch(40, 50), 1, [write_file(tmp_path, "g.parquet", range(40, 50))]
        )

    with failpoints.armed("main.mid-rewrite", batch_lands, hit=1):
        result = merge(log, files, CompactFiles("", paths, 0))
    assert result.outcome is Outcome.DONE
    assert ids(log) == Counter(range(50))
    assert log.snapshot().committed.offsets == {0: 50}
    # Another pod's merge of the same files, planned before that one landed: its inputs are gone.
    stale = LogFiles().advance(log, 4)
    assert set(stale.live) == set(paths)
    with pytest.raises(RewriteConflictError):
        commit_rewrite(log, stale, list(paths), [{"path": "other.parquet", "size": 1, "partitionValues": {}}])
    assert ids(log) == Counter(range(50))


def test_a_crash_between_the_write_and_the_commit_leaves_an_unnamed_file_vacuum_takes(tmp_path: Path) -> None:
    log = table_with_small_files(tmp_path)
    files = LogFiles.read(log)
    item = CompactFiles("", tuple(sorted(files.live)), 0)
    with failpoints.armed("main.mid-rewrite", "raise"), pytest.raises(failpoints.FailpointError):
        merge(log, files, item)
    assert ids(log) == Counter(range(40)) and len(LogFiles.read(log).live) == 4
    [unnamed] = [p for p in log.storage.list_tree() if "icefall-merge" in p]
    now = 10**13
    assert unnamed in vacuum(log, POLICY.retention_ms, now)
    assert ids(log) == Counter(range(40))  # the live files stay, however old


def test_the_runner_claims_a_work_lease_per_item_and_tidies_the_table(tmp_path: Path) -> None:
    log = table_with_small_files(tmp_path / "t")
    names = TableLeases(TableIdentity("", "", "shop", "t"))

    def leases(name: str) -> FileLease:
        return FileLease.in_dir(tmp_path / "leases", name, "pod-1", duration_seconds=60)

    policy = DeltaPolicy(target_file_size_bytes=2**20, min_files_to_compact=3, retention_ms=7_200_000)
    runner = DeltaPodRunner(str(tmp_path / "t"), policy, leases, table_leases=names, label="t")
    kinds = [runner.step(10**13).result for _ in range(4)]
    assert [r.kind if r else None for r in kinds] == ["SetRetention", "CompactFiles", "Vacuum", None]
    assert ids(log) == Counter(range(40)) and len(LogFiles.read(log).live) == 1
    assert log.snapshot().configuration["delta.deletedFileRetentionDuration"] == "interval 7200 seconds"
    assert kinds[2] is not None and len(kinds[2].deleted_paths) == 4  # the merged inputs, long removed


def test_a_table_with_writer_features_the_merge_does_not_maintain_is_refused() -> None:
    assert merge_refusal({"minReaderVersion": 1, "minWriterVersion": 4}) is None
    legacy_features = {"minWriterVersion": 7, "writerFeatures": ["appendOnly", "invariants", "timestampNtz"]}
    assert merge_refusal(legacy_features) is None
    refusal = merge_refusal({"minWriterVersion": 7, "writerFeatures": ["rowTracking", "domainMetadata"]})
    assert refusal is not None and "rowTracking" in refusal


def test_the_replay_reads_live_files_and_tombstones_across_a_checkpoint(tmp_path: Path) -> None:
    log = table_with_small_files(tmp_path, count=2)
    metadata = log.actions(2)[1]["metaData"]
    protocol = log.actions(0)[1]["protocol"]
    live, gone = log.actions(2)[2]["add"], log.actions(1)[2]["add"]
    rows = [  # a checkpoint at version 3 as Spark writes one: maps as key-value pairs
        {
            "metaData": {
                **metadata,
                "format": {"provider": "parquet", "options": [("k", "v")]},
                "configuration": list(metadata["configuration"].items()),
            }
        },
        {"protocol": protocol},
        {"add": {**live, "partitionValues": [("x", "y")]}},
        {"remove": {"path": gone["path"], "deletionTimestamp": 123}},
    ]
    filled = [
        {
            "metaData": r.get("metaData"),
            "protocol": r.get("protocol"),
            "add": r.get("add"),
            "remove": r.get("remove"),
        }
        for r in rows
    ]
    log.try_commit(3, [{"commitInfo": {"operation": "OPTIMIZE"}}])
    pq.write_table(pa.Table.from_pylist(filled), log.log_dir / f"{3:020d}.checkpoint.parquet")
    for version in range(4):
        (log.log_dir / f"{version:020d}.json").unlink()
    commit_batch(log, log.snapshot(), batch(20, 30), 1, [write_file(tmp_path, "h.parquet", range(20, 30))])
    files = LogFiles.read(log)
    assert files.version == 4 and set(files.live) == {live["path"], "h.parquet"}
    assert files.live[live["path"]]["partitionValues"] == {"x": "y"}
    assert files.removed == {gone["path"]: 123}
    assert files.configuration["icefall.epoch"] == "1" and files.protocol == protocol


def test_the_runner_skips_an_item_another_pod_holds_and_merges_only_files_inside_the_folder(
    tmp_path: Path,
) -> None:
    log = table_with_small_files(tmp_path / "t")
    names = TableLeases(TableIdentity("", "", "shop", "t"))
    policy = DeltaPolicy(target_file_size_bytes=2**20, min_files_to_compact=3, retention_ms=7_200_000)

    def leases_of(holder: str) -> Any:
        return lambda name: FileLease.in_dir(tmp_path / "leases", name, holder, duration_seconds=60)

    runner = DeltaPodRunner(str(tmp_path / "t"), policy, leases_of("pod-1"), table_leases=names, label="t")
    assert runner.step(10**13).result is not None  # SetRetention
    other = leases_of("pod-2")(names.work_for("delta-merge/"))
    other.acquire(timeout=0)
    try:
        step = runner.step(10**13)
        assert step.busy == 1 and step.result is not None and step.result.kind == "Vacuum"
    finally:
        other.release()
    assert len(LogFiles.read(log).live) == 4  # nothing merged while another pod held the partition
    files = LogFiles.read(log)
    files.live["../other-table/part-0.parquet"] = {"path": "../other-table/part-0.parquet", "size": 1}
    files.live["%2E%2E/other/part-1.parquet"] = {"path": "%2E%2E/other/part-1.parquet", "size": 1}
    files.live["s3://elsewhere/part-0.parquet"] = {"path": "s3://elsewhere/part-0.parquet", "size": 1}
    assert set(files.mergeable()) == set(LogFiles.read(log).live)


def test_the_pods_loop_goes_on_after_an_item_so_a_checkpoint_due_never_starves_merges(tmp_path: Path) -> None:
    """CI's e2e failure: a busy table has a checkpoint due at every round and it comes first; the loop
    took a round that ran it for an idle one (its result named no item) and slept, so no merge ever ran."""
    log = table_with_small_files(tmp_path / "t", count=12)  # 12 versions: a checkpoint due (interval 10)
    names = TableLeases(TableIdentity("", "", "shop", "t"))
    policy = DeltaPolicy(target_file_size_bytes=2**20, min_files_to_compact=3, retention_ms=7_200_000)

    def leases(name: str) -> FileLease:
        return FileLease.in_dir(tmp_path / "leases", name, "pod-1", duration_seconds=60)

    runner = DeltaPodRunner(str(tmp_path / "t"), policy, leases, table_leases=names, label="t")
    steps: list[Any] = []
    pauses: list[float] = []
    runner.run(lambda: len(steps) >= 5, idle_seconds=30, wait=pauses.append, on_step=steps.append)
    ran = [type(step.item).__name__ for step in steps if step.ran]
    assert ran == ["SetRetention", "Checkpoint", "CompactFiles", "Vacuum"]
    assert [step.result.kind for step in steps[:4] if step.result is not None] == ran
    assert not steps[4].ran and pauses == []  # no pause between items (before: 30 s after each)
    assert ids(log) == Counter(range(120)) and len(LogFiles.read(log).live) == 1
