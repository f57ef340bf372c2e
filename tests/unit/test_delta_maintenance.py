"""The upkeep of a Delta table, its pure and log-only parts: the plan (`icefall.plan.delta_maintenance`) asks
for the spec's retention in the table's properties, OPTIMIZE once small files gather (Z-ordered by the
spec's sort columns), a checkpoint every `delta.checkpointInterval` versions, VACUUM once an interval; the
spec maps to it honestly (the retention is max(maxSnapshotAgeSeconds, orphanMinAgeSeconds); a sort order is
a Z-order, so no direction, nulls or struct members; minSnapshotsToKeep and row retention refused);
`set_properties` is a metadata-only commit that a batch planned before it commits over, with its offsets;
the latest version is found when log cleanup left only a checkpoint of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icefall.api import StreamingTable
from icefall.api.manifest import parse_manifest
from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table, set_properties
from icefall.plan.delta_maintenance import (
    MIB,
    Checkpoint,
    DeltaPolicy,
    DeltaTableView,
    Optimize,
    SetRetention,
    Vacuum,
    delta_policy_from_spec,
    plan_delta_maintenance,
    retention_properties,
)

pytestmark = pytest.mark.unit

POLICY = DeltaPolicy(target_file_size_bytes=100 * MIB, retention_ms=7_200_000, zorder_by=("customer",))
TIDY = {**retention_properties(POLICY), "delta.checkpointInterval": "5"}
HOUR_MS = 3_600_000


def plan(view: DeltaTableView, *, last_vacuum_ms: int | None = 0, now_ms: int = HOUR_MS - 1) -> list[object]:
    return list(plan_delta_maintenance(view, POLICY, now_ms=now_ms, last_vacuum_ms=last_vacuum_ms))


def test_a_tidy_table_needs_nothing_until_vacuum_is_due() -> None:
    tidy = DeltaTableView(7, 5, (100 * MIB,) * 9 + (MIB,) * 4, TIDY)
    assert plan(tidy) == []
    assert plan(tidy, now_ms=HOUR_MS) == [Vacuum(7_200_000)]
    assert plan(tidy, last_vacuum_ms=None) == [Vacuum(7_200_000)]
    assert plan(DeltaTableView(-1, None, (), {})) == []


def test_items_come_in_order_retention_optimize_checkpoint_vacuum() -> None:
    messy = DeltaTableView(12, None, (MIB,) * 5 + (80 * MIB,), {})  # 75 MiB and above is not small
    assert plan(messy, last_vacuum_ms=None) == [
        SetRetention(retention_properties(POLICY)),
        Optimize(5, ("customer",)),
        Checkpoint(12),  # Delta's default interval, 10, with no delta.checkpointInterval
        Vacuum(7_200_000),
    ]
    assert retention_properties(POLICY) == {
        "delta.deletedFileRetentionDuration": "interval 7200 seconds",
        "delta.logRetentionDuration": "interval 7200 seconds",
    }
    assert plan(DeltaTableView(9, 4, (MIB,) * 4, TIDY)) == [Checkpoint(9)]  # 4 small files: not yet


def test_a_partitioned_tables_lone_small_files_are_not_optimized() -> None:
    # OPTIMIZE bins per partition: six partitions of one small file each leave nothing to do.
    lone = DeltaTableView(7, 5, (MIB,) * 6, TIDY, tuple(f"c={i}" for i in range(6)))
    assert plan(lone) == []
    paired = DeltaTableView(7, 5, (MIB,) * 6, TIDY, ("c=0", "c=0", "c=1", "c=1", "c=2", "c=3"))
    assert plan(paired) == []  # 4 small files in partitions with two or more: below 5
    gathered = DeltaTableView(7, 5, (MIB,) * 7, TIDY, ("c=0",) * 3 + ("c=1",) * 2 + ("c=2", "c=3"))
    assert plan(gathered) == [Optimize(5, ("customer",))]


MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "127.0.0.1:9092", topic: orders}
  format: {type: json, schema: [{name: id, type: long}, {name: customer, type: string},
                                {name: s, type: struct, fields: [{name: a, type: int}]}]}
  table: {format: delta%s}
%s
"""


def parsed(table_extra: str = "", spec_extra: str = "") -> StreamingTable:
    return parse_manifest(MANIFEST % (table_extra, spec_extra))


def problems_of(table_extra: str = "", spec_extra: str = "") -> str:
    from icefall.api import ManifestError

    try:
        parsed(table_extra, spec_extra)
    except ManifestError as error:
        return str(error)
    return ""


def test_the_policy_maps_the_spec_honestly() -> None:
    st = parse_manifest(
        MANIFEST
        % (
            ", sortOrder: [{field: customer}, {field: id}]",
            "  compaction: {maxSnapshotAgeSeconds: 600, orphanMinAgeSeconds: 7200,"
            " targetFileSizeBytes: 4096}",
        )
    )
    policy = delta_policy_from_spec(st.spec)
    assert policy.zorder_by == ("customer", "id")
    assert policy.retention_ms == 7_200_000  # the orphan floor wins over a shorter time travel
    assert policy.target_file_size_bytes == 4096
    assert delta_policy_from_spec(parse_manifest(MANIFEST % ("", "")).spec).retention_ms == 5 * 24 * HOUR_MS


def test_the_spec_refuses_what_a_z_order_or_delta_retention_cannot_do() -> None:
    assert problems_of(", sortOrder: [{field: customer}]") == ""
    assert "direction and nulls" in problems_of(", sortOrder: [{field: customer, direction: desc}]")
    assert "direction and nulls" in problems_of(", sortOrder: [{field: customer, nulls: last}]")
    assert "struct member" in problems_of(", sortOrder: [{field: s.a}]")
    assert "spec.compaction.minSnapshotsToKeep" in problems_of(
        spec_extra="  compaction: {minSnapshotsToKeep: 3}"
    )
    refused = problems_of(spec_extra="  retention: {field: id, maxAgeSeconds: 7200}")
    assert "spec.retention" in refused and "maxSnapshotAgeSeconds" in refused


SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def batch(start: int, end: int) -> Batch:
    return Batch(topic="t", start={0: start}, end={0: end}, topic_id="tid", max_produce_time_ms=end)


def test_setting_properties_keeps_the_offsets_and_a_batch_commits_over_it(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    commit_batch(log, create_table(log, SCHEMA, epoch=1), batch(0, 5), 1, [])
    planned = log.snapshot()  # a batch planned now, committed after the properties
    assert set_properties(log, {"delta.logRetentionDuration": "interval 7200 seconds"}) == 2
    assert set_properties(log, {"delta.logRetentionDuration": "interval 7200 seconds"}) is None  # has them
    assert log.snapshot().committed.offsets == {0: 5}
    assert commit_batch(log, planned, batch(5, 9), 1, [AddFile("part-1.parquet", 10, 4)]) == 3
    snapshot = log.snapshot()
    assert snapshot.committed.offsets == {0: 9}
    assert snapshot.configuration["delta.logRetentionDuration"] == "interval 7200 seconds"
    with pytest.raises(ValueError, match="icefall"):
        set_properties(log, {"icefall.offsets": "{}"})


def test_the_latest_version_may_be_a_checkpoint_whose_commit_was_cleaned_up(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    create_table(log, SCHEMA, epoch=1)
    (log.log_dir / f"{4:020d}.checkpoint.parquet").write_bytes(b"")
    assert log.latest_version() == 4 and log.latest_checkpoint() == 4


def test_the_dead_letter_table_takes_only_what_it_does_not_hold() -> None:
    from icefall.commit.state import CommittedState
    from icefall.ingest.dead_letters import dead_letter_take  # the Iceberg dead-letter table's too

    batch = Batch(topic="t", start={0: 10, 1: 10, 2: 10}, end={0: 20, 1: 20, 2: 20}, topic_id="tid")
    # Behind on 0 (batches without bad records), ahead on 1 (a crash after its commit), past the end on 2.
    dead = CommittedState(snapshot_id=3, topic="t", topic_id="tid", offsets={0: 4, 1: 15, 2: 25})
    taken = dead_letter_take(batch, dead, name="dlq")
    assert taken is not None
    take, takes = taken
    assert (dict(take.start), dict(take.end)) == ({0: 4, 1: 15}, {0: 20, 1: 20})  # 2: nothing to take
    assert takes["t"].skip_below == {1: 15}
    fresh = dead_letter_take(batch, CommittedState(snapshot_id=0), name="dlq")  # a new dead-letter table
    assert fresh is not None
    assert (dict(fresh[0].start), dict(fresh[0].end)) == (dict(batch.start), dict(batch.end))


def test_the_dead_letter_table_lives_beside_the_table() -> None:
    from icefall.ingest.delta_dead_letters import dead_letter_location

    assert dead_letter_location(parsed(", location: /data/orders"), "/data/orders") == "/data/orders_dlq"
    named = parsed(", location: /data/orders", "  deadLetter: {table: {name: bad_orders}}")
    assert dead_letter_location(named, "file:///data/orders") == "/data/bad_orders"
    off = parsed(", location: /data/orders", "  deadLetter: {table: {enabled: false}}")
    assert dead_letter_location(off, "/data/orders") is None
    assert dead_letter_location(named, "s3://lake/data/orders") == "s3://lake/data/bad_orders"
