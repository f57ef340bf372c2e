"""The maintenance planner (`icefall.plan.maintenance`), with plain-data tables and a fake clock.

Proves: small files of a hot partition are bin-packed into output files no larger than the target and cut into
several bounded steps; files at the target are left alone; partitions with fewer small files than the minimum
are untouched; expiry keeps main's head, staging branches (in-flight writes) and their bases, tags, the newest
N of main and every recent snapshot, and expires the rest; orphan removal never lists a file younger than the
safety window (an in-flight write) nor a referenced file, and the window cannot be set below 1 h; retention
selects exactly the partitions entirely older than the cut-off; delete application picks the data files
whose file-scoped deletes pass the deleted share, or every file a delete may apply to once a partition holds
many delete files, never a file compaction takes in the same plan nor one of a partition retention drops, in
bounded steps, and counts in the backlog and the bytes to rewrite; work keys are deterministic, distinct per
unit of work and valid DNS labels of at most 63 characters; the backlog is zero when there is nothing to do.
"""

from __future__ import annotations

import re

import pytest

from icefall.plan.maintenance import backlog, bytes_to_rewrite, plan_maintenance, work_key
from icefall.plan.maintenance_items import (
    DAY_MS,
    HOUR_MS,
    MIB,
    ApplyDeletes,
    ApplyRetention,
    CompactPartition,
    ExpireSnapshots,
    MaintenancePolicy,
    RemoveOrphans,
    RetentionPolicy,
    RewriteManifests,
    TimeTransform,
)
from icefall.plan.table_view import (
    DataFileInfo,
    FileContent,
    ManifestInfo,
    SnapshotInfo,
    StorageObject,
    TableView,
)

pytestmark = pytest.mark.unit

NOW = 1_750_000_000_000  # fake clock, ms
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def data_file(path: str, size: int, partition: tuple[object, ...] = ("p",)) -> DataFileInfo:
    return DataFileInfo(path, partition, size, record_count=size // 100, added_snapshot_id=1)


def compaction(work: tuple[object, ...]) -> list[CompactPartition]:
    return [w for w in work if isinstance(w, CompactPartition)]


def test_a_hot_partition_is_compacted_in_bounded_steps_and_big_files_are_left_alone() -> None:
    hot = tuple(data_file(f"hot/{i:03}.parquet", 10 * MIB, ("hot",)) for i in range(40))
    big = (
        data_file("hot/big-1.parquet", 128 * MIB, ("hot",)),
        data_file("hot/big-2.parquet", 120 * MIB, ("hot",)),
    )
    deletes = (DataFileInfo("hot/del.parquet", ("hot",), MIB, 10, 1, content=FileContent.POSITION_DELETES),)
    table = TableView("orders", files=hot + big + deletes)
    policy = MaintenancePolicy(target_file_size_bytes=100 * MIB, max_bytes_per_task=200 * MIB)

    items = compaction(plan_maintenance(table, policy, NOW))

    assert len(items) == 2  # 400 MiB of small files, at most 200 MiB per step
    touched = [p for item in items for p in item.files]
    assert sorted(touched) == sorted(f.path for f in hot)  # every small file once, nothing else
    assert len(set(touched)) == len(touched)
    for item in items:
        assert item.partition == ("hot",)
        assert item.input_bytes <= policy.max_bytes_per_task
        assert item.target_size_bytes == 100 * MIB
    assert bytes_to_rewrite(items) == 400 * MIB
    assert [item.step for item in items] == [1, 2]  # distinct work Leases: the steps can run in parallel
    assert len({work_key(item) for item in items}) == 2


def test_a_partition_fed_by_steady_commits_is_compacted_in_tiers() -> None:
    """1,000 commits of 10 KiB each, compacting after every commit as a worker that keeps up would: few
    files at any time, and each byte rewritten about log2(commits) times, not once per compaction."""
    policy = MaintenancePolicy(target_file_size_bytes=128 * MIB)
    files: list[DataFileInfo] = []
    written = rewritten = most_files = 0
    for commit in range(1000):
        files.append(data_file(f"p/c{commit}.parquet", 10 * 1024))
        written += 10 * 1024
        for item in compaction(plan_maintenance(TableView("t", files=tuple(files)), policy, NOW)):
            inputs = set(item.files)
            files = [f for f in files if f.path not in inputs]
            files.append(data_file(f"p/compacted-{commit}.parquet", item.input_bytes))
            rewritten += item.input_bytes
        most_files = max(most_files, len(files))
    tiers = 10  # log2(1000) rounded up: every tier at least doubles the one below
    assert most_files <= policy.min_files_to_compact - 1 + tiers + 1, most_files
    assert rewritten / written <= tiers, rewritten / written
    assert sum(f.size_bytes for f in files) == written  # nothing lost or doubled in the simulation


def test_target_size_comes_from_the_table_property_then_the_default() -> None:
    files = tuple(data_file(f"f{i}", 60 * MIB) for i in range(6))
    policy = MaintenancePolicy()
    assert len(compaction(plan_maintenance(TableView("t", files=files), policy, NOW))) == 1  # default 128 MiB
    props = {"write.target-file-size-bytes": str(64 * MIB)}
    assert compaction(plan_maintenance(TableView("t", files=files, properties=props), policy, NOW)) == []


def test_partitions_below_the_minimum_are_untouched() -> None:
    few = tuple(data_file(f"cold/{i}", MIB, ("cold",)) for i in range(4))
    many = tuple(data_file(f"warm/{i}", MIB, ("warm",)) for i in range(5))
    items = compaction(plan_maintenance(TableView("t", files=few + many), MaintenancePolicy(), NOW))
    assert [i.partition for i in items] == [("warm",)]
    assert set(items[0].files) == {f.path for f in many}


def snapshot(sid: int, age_ms: int, *, on_main: bool = True, refs: tuple[str, ...] = ()) -> SnapshotInfo:
    return SnapshotInfo(sid, sid - 1 if sid > 1 else None, NOW - age_ms, on_main, refs)


def test_expiry_keeps_main_head_staged_branches_tags_last_n_and_recent_ones() -> None:
    old = 30 * DAY_MS
    snapshots = (
        snapshot(1, old + 10),
        snapshot(2, old + 9, refs=("v1-tag",)),
        snapshot(3, old + 8),
        snapshot(4, old + 7),
        snapshot(5, old + 6, refs=("main",)),  # main head, old too (an idle table)
        SnapshotInfo(6, 3, NOW - old - 5, False, ("icefall_stage_w1_3",)),  # a write in flight, base 3
        snapshot(7, old + 4, on_main=False),  # an abandoned stage whose branch is gone
        SnapshotInfo(8, 5, NOW - HOUR_MS, False, ("icefall_stage_w2_1",)),
        snapshot(9, HOUR_MS, on_main=False),  # recent
    )
    policy = MaintenancePolicy(snapshot_max_age_ms=5 * DAY_MS, snapshot_min_keep=2)

    (expiry,) = [
        w
        for w in plan_maintenance(TableView("t", snapshots=snapshots), policy, NOW)
        if isinstance(w, ExpireSnapshots)
    ]

    assert expiry.expire_ids == (1, 7)
    assert set(expiry.keep_ids) == {2, 3, 4, 5, 6, 8, 9}
    assert expiry.retain_last == 2
    assert expiry.older_than_ms == NOW - 5 * DAY_MS


def test_expiry_waits_for_a_batch_or_a_tenth_of_the_age() -> None:
    age = 300_000  # 5 minutes, one snapshot every 5 s
    policy = MaintenancePolicy(snapshot_max_age_ms=age, snapshot_min_keep=1, expire_batch=20)

    def expiry(snapshots: tuple[SnapshotInfo, ...]) -> ExpireSnapshots | None:
        work = plan_maintenance(TableView("t", snapshots=snapshots), policy, NOW)
        return next((w for w in work if isinstance(w, ExpireSnapshots)), None)

    head = snapshot(100, 0, refs=("main",))
    just_past = tuple(snapshot(i, age + 1_000 + i) for i in range(1, 6))  # 5 just past the cut-off
    assert expiry((*just_past, head)) is None  # not worth a commit yet
    late = (snapshot(6, age + age // 10 + 1), *just_past, head)  # one waited a tenth of the age
    assert expiry(late) is not None and len(expiry(late).expire_ids) == 6  # type: ignore[union-attr]
    batch = (*(snapshot(i, age + 1_000 + i) for i in range(1, 21)), head)
    assert expiry(batch) is not None and len(expiry(batch).expire_ids) == 20  # type: ignore[union-attr]


def test_expiry_never_plans_away_a_lone_old_head() -> None:
    head = SnapshotInfo(1, None, NOW - 365 * DAY_MS, True, ("main",))
    assert plan_maintenance(TableView("t", snapshots=(head,)), MaintenancePolicy(), NOW) == ()


def test_orphans_only_unreferenced_and_older_than_the_window() -> None:
    window = 3 * DAY_MS
    live = data_file("data/live.parquet", MIB)
    storage = (
        StorageObject("data/live.parquet", MIB, NOW - 10 * DAY_MS),  # live file
        StorageObject("data/old-snapshot.parquet", MIB, NOW - 10 * DAY_MS),  # an older snapshot holds it
        StorageObject("metadata/m1.avro", MIB, NOW - 10 * DAY_MS),  # manifest of the head
        StorageObject("data/in-flight.parquet", MIB, NOW - window + 1),  # staged, not committed yet
        StorageObject("data/just-old-enough.parquet", MIB, NOW - window - 1),
        StorageObject("data/crashed-long-ago.parquet", MIB, NOW - 10 * DAY_MS),
    )
    table = TableView(
        "t",
        snapshots=(SnapshotInfo(1, None, NOW, True, ("main",)),),
        files=(live,),
        manifests=(ManifestInfo("metadata/m1.avro", MIB, 1),),
        referenced_paths=frozenset({"data/old-snapshot.parquet"}),
        storage=storage,
    )

    (orphans,) = [
        w
        for w in plan_maintenance(table, MaintenancePolicy(orphan_min_age_ms=window), NOW)
        if isinstance(w, RemoveOrphans)
    ]

    assert orphans.paths == ("data/crashed-long-ago.parquet", "data/just-old-enough.parquet")
    assert orphans.older_than_ms == NOW - window


def test_orphan_window_cannot_go_below_an_hour_and_empty_references_delete_nothing() -> None:
    with pytest.raises(ValueError):
        MaintenancePolicy(orphan_min_age_ms=HOUR_MS - 1)
    table = TableView(
        "t",
        snapshots=(SnapshotInfo(1, None, NOW, True, ("main",)),),
        storage=(StorageObject("data/x.parquet", MIB, NOW - 100 * DAY_MS),),
    )
    assert plan_maintenance(table, MaintenancePolicy(), NOW) == ()


def test_retention_selects_exactly_the_partitions_older_than_the_cutoff() -> None:
    today = NOW // DAY_MS
    files = tuple(
        data_file(f"d{day}/{i}", 200 * MIB, ("eu", day))
        for day in range(today - 10, today + 1)
        for i in range(2)
    )
    nulls = (data_file("null/0", 200 * MIB, ("eu", None)),)
    rule = RetentionPolicy("event_day", "event_time", TimeTransform.DAY, max_age_ms=7 * DAY_MS)
    table = TableView("t", files=files + nulls, partition_fields=("region", "event_day"))

    work = plan_maintenance(table, MaintenancePolicy(retention=rule), NOW)

    (retention,) = [w for w in work if isinstance(w, ApplyRetention)]
    cutoff = NOW - 7 * DAY_MS
    expected = {("eu", d) for d in range(today - 10, today + 1) if (d + 1) * DAY_MS <= cutoff}
    assert set(retention.partitions) == expected
    assert len(expected) == 3  # today-10 .. today-8; today-7 straddles the cut-off and stays
    assert retention.delete_before_ms == (cutoff // DAY_MS) * DAY_MS
    assert retention.delete_before_ms <= cutoff
    assert set(retention.files) == {f.path for f in files if f.partition in expected}
    # one day later exactly one more partition ages out
    later = plan_maintenance(table, MaintenancePolicy(retention=rule), NOW + DAY_MS)
    (retention_later,) = [w for w in later if isinstance(w, ApplyRetention)]
    assert len(retention_later.partitions) == 4


def test_retention_by_month_uses_calendar_months() -> None:
    # 2025-03-10T00:00Z, keep 30 days -> cut-off 2025-02-08: only January 2025 (ordinal 660) and older go.
    now = 1_741_564_800_000
    files = (
        data_file("jan", 200 * MIB, (660,)),
        data_file("feb", 200 * MIB, (661,)),
        data_file("dec", 200 * MIB, (659,)),
    )
    rule = RetentionPolicy("m", "ts", TimeTransform.MONTH, max_age_ms=30 * DAY_MS)
    (retention,) = plan_maintenance(
        TableView("t", files=files, partition_fields=("m",)), MaintenancePolicy(retention=rule), now
    )
    assert isinstance(retention, ApplyRetention)
    assert set(retention.partitions) == {(659,), (660,)}
    assert retention.delete_before_ms == 1_738_368_000_000  # 2025-02-01T00:00Z


def test_manifests_are_rewritten_past_the_threshold() -> None:
    manifests = tuple(ManifestInfo(f"metadata/m{i}.avro", 10_000, 1) for i in range(100))
    one_big = (*manifests[:99], ManifestInfo("big", 9 * MIB, 1))  # 99 small ones: below the threshold
    assert plan_maintenance(TableView("t", manifests=one_big), MaintenancePolicy(), NOW) == ()
    (item,) = plan_maintenance(TableView("t", manifests=manifests), MaintenancePolicy(), NOW)
    assert isinstance(item, RewriteManifests)
    assert len(item.manifests) == 100


def test_work_keys_are_deterministic_and_distinct() -> None:
    a = CompactPartition(("hot",), ("a", "b"), 2, 10, "r")
    b = CompactPartition(("hot",), ("c", "d"), 2, 10, "r", step=2)
    # Planned later, with more files: the same partition's first group is the same piece of work.
    same_as_a = CompactPartition(("hot",), ("b", "a", "e"), 3, 10, "other reason")
    expire_now = ExpireSnapshots(NOW, 1, (5,), (1,))
    expire_later = ExpireSnapshots(NOW + 1, 1, (5,), (1, 2))
    keys = {
        work_key(a),
        work_key(b),
        work_key(expire_now),
        work_key(RemoveOrphans(NOW, ("x",))),
        work_key(ApplyDeletes(("hot",), ("a",), ("d",), 1, 1, 10, "r")),
    }
    assert len(keys) == 5
    # Delete application is keyed like compaction (partition and step), never sharing its keys.
    assert work_key(ApplyDeletes(("hot",), ("x",), (), 1, 1, 10, "r")) == work_key(
        ApplyDeletes(("hot",), ("a",), ("d",), 1, 1, 10, "r")
    )
    assert work_key(ApplyDeletes(("hot",), ("a",), (), 1, 1, 10, "r", step=2)) not in keys
    assert work_key(a) == work_key(same_as_a)
    assert work_key(expire_now) == work_key(expire_later)  # one expiry at a time


def test_backlog_is_zero_when_there_is_nothing_to_do() -> None:
    tidy = TableView(
        "t",
        snapshots=(SnapshotInfo(1, None, NOW - DAY_MS, True, ("main",)),),
        files=tuple(data_file(f"f{i}", 128 * MIB) for i in range(10)),
        referenced_paths=frozenset(f"f{i}" for i in range(10)),
        storage=tuple(StorageObject(f"f{i}", 128 * MIB, NOW - 10 * DAY_MS) for i in range(10)),
    )
    work = plan_maintenance(tidy, MaintenancePolicy(), NOW)
    assert work == ()
    assert backlog(work) == 0
    assert bytes_to_rewrite(work) == 0
    assert (
        backlog(
            plan_maintenance(
                TableView("t", files=tuple(data_file(f"s{i}", MIB) for i in range(5))),
                MaintenancePolicy(),
                NOW,
            )
        )
        == 1
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"target_file_size_bytes": 0},
        {"small_file_ratio": 0.0},
        {"min_files_to_compact": 1},
        {"max_bytes_per_task": 0},
        {"snapshot_min_keep": 0},
        {"manifest_count_threshold": 1},
        {"deleted_fraction_threshold": 0.0},
        {"deleted_fraction_threshold": 1.5},
        {"max_delete_files_per_partition": 0},
    ],
)
def test_nonsense_policies_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        MaintenancePolicy(**bad)  # type: ignore[arg-type]


def deletes_for(data: DataFileInfo, rows: int, name: str, *, seq: int = 2) -> DataFileInfo:
    """A file-scoped position delete file deleting `rows` rows of `data`."""
    return DataFileInfo(
        name,
        data.partition,
        1000,
        rows,
        2,
        content=FileContent.POSITION_DELETES,
        referenced_data_file=data.path,
        sequence_number=seq,
    )


def applied(work: tuple[object, ...]) -> list[ApplyDeletes]:
    return [w for w in work if isinstance(w, ApplyDeletes)]


def test_deletes_are_applied_to_files_past_the_deleted_share() -> None:
    big = {n: DataFileInfo(f"p/{n}.parquet", ("p",), 120 * MIB, 1000, 1) for n in "abcd"}
    table = TableView(
        "t",
        files=(
            *big.values(),
            deletes_for(big["a"], 100, "p/a-del.parquet"),  # 10 %: due
            deletes_for(big["b"], 99, "p/b-del.parquet"),  # 9.9 %: not yet
            deletes_for(big["c"], 300, "p/c-del-1.parquet"),  # two delete files, 50 % together
            deletes_for(big["c"], 200, "p/c-del-2.parquet"),
        ),
    )

    (item,) = applied(plan_maintenance(table, MaintenancePolicy(), NOW))

    assert item.data_files == ("p/a.parquet", "p/c.parquet")
    assert item.delete_files == ("p/a-del.parquet", "p/c-del-1.parquet", "p/c-del-2.parquet")
    assert (item.partition, item.deleted_rows, item.input_bytes) == (("p",), 600, 240 * MIB)
    assert item.target_size_bytes == 128 * MIB
    strict = MaintenancePolicy(deleted_fraction_threshold=0.5)
    assert applied(plan_maintenance(table, strict, NOW))[0].data_files == ("p/c.parquet",)


def test_many_delete_files_in_a_partition_make_all_its_deleted_files_due() -> None:
    files = [DataFileInfo(f"p/{i:02}.parquet", ("p",), 120 * MIB, 1000, 1) for i in range(25)]
    few = [deletes_for(f, 1, f"{f.path}-del") for f in files[:19]]  # 0.1 % each
    untouched = DataFileInfo("p/new.parquet", ("p",), 120 * MIB, 1000, 5, sequence_number=9)
    policy = MaintenancePolicy(max_delete_files_per_partition=20, max_bytes_per_task=10_000 * MIB)

    assert applied(plan_maintenance(TableView("t", files=(*files, *few)), policy, NOW)) == []
    many = [*few, deletes_for(files[19], 1, "p/19-del")]
    (item,) = applied(plan_maintenance(TableView("t", files=(*files, *many, untouched)), policy, NOW))
    assert item.data_files == tuple(f.path for f in files[:20])  # those with deletes; never `untouched`

    # A delete file naming several data files may apply to every one not newer than itself.
    unscoped = DataFileInfo(
        "p/wide-del", ("p",), 1000, 5, 3, content=FileContent.POSITION_DELETES, sequence_number=3
    )
    (item,) = applied(
        plan_maintenance(TableView("t", files=(*files, *many, unscoped, untouched)), policy, NOW)
    )
    assert item.data_files == tuple(f.path for f in files)
    assert item.delete_files == tuple(sorted(d.path for d in many))  # the wide one is the worker's to judge


def test_delete_application_leaves_compactions_files_and_dropped_partitions_alone() -> None:
    small = [DataFileInfo(f"hot/{i}.parquet", ("hot",), MIB, 1000, 1) for i in range(5)]
    big = DataFileInfo("hot/big.parquet", ("hot",), 120 * MIB, 1000, 1)
    day = 20_000  # a day partition long past
    old = DataFileInfo("old/0.parquet", (day,), 120 * MIB, 1000, 1)
    deletes = [deletes_for(f, 500, f"{f.path}-del") for f in (*small, big, old)]
    table = TableView("t", files=(*small, big, old, *deletes), partition_fields=("ts_day",))
    retention = RetentionPolicy("ts_day", "ts", TimeTransform.DAY, DAY_MS)

    work = plan_maintenance(table, MaintenancePolicy(retention=retention), NOW)

    (compact,) = compaction(work)
    (apply,) = applied(work)
    assert set(compact.files) == {f.path for f in small}  # compaction reads through their deletes too
    assert apply.data_files == (big.path,)  # not in two items, not in the dropped partition
    assert backlog(work) == 3  # retention, compaction, deletes
    assert bytes_to_rewrite(work) == 5 * MIB + 120 * MIB


def test_delete_application_is_cut_into_bounded_steps_hottest_partition_first() -> None:
    hot = [DataFileInfo(f"hot/{i}.parquet", ("hot",), 100 * MIB, 1000, 1) for i in range(5)]
    cold = DataFileInfo("cold/0.parquet", ("cold",), 100 * MIB, 1000, 1)
    deletes = [deletes_for(f, 200, f"{f.path}-del") for f in (*hot, cold)]
    policy = MaintenancePolicy(max_bytes_per_task=250 * MIB)

    items = applied(plan_maintenance(TableView("t", files=(*hot, cold, *deletes)), policy, NOW))

    assert [(i.partition, i.step, len(i.data_files)) for i in items] == [
        (("hot",), 1, 2),
        (("hot",), 2, 2),
        (("hot",), 3, 1),
        (("cold",), 1, 1),
    ]
    assert sorted(p for i in items[:3] for p in i.data_files) == [f.path for f in hot]
    assert len({work_key(i) for i in items}) == 4
