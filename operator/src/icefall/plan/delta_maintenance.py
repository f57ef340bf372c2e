"""What upkeep a Delta Lake table (`spec.table.format: delta`) needs now: pure planning, no I/O.

`plan_delta_maintenance(view, policy, now_ms=..., last_vacuum_ms=...)` orders the items a step may run (it
runs the first): `SetRetention` (the table's `delta.deletedFileRetentionDuration` and
`delta.logRetentionDuration` differ from the spec's), `Optimize` (at least `min_files_to_compact` files below
`small_file_ratio` of the target size: Delta's OPTIMIZE bin-packs them; Z-ordered by `spec.table.sortOrder`
when one is given), `Checkpoint` (at least the table's `delta.checkpointInterval` versions since the newest
checkpoint) and `Vacuum` (never run by this process, or `vacuum_interval_ms` ago).

How the spec maps to Delta (no setting is silently dropped; what Delta cannot do is refused by the spec):
- one retention `retention_ms` = max(`compaction.maxSnapshotAgeSeconds`, `compaction.orphanMinAgeSeconds`)
  is the table's `delta.deletedFileRetentionDuration` (time travel reaches back this far: VACUUM keeps files
  removed less than this ago) and its `delta.logRetentionDuration` (the log kept as long; Delta's own log
  cleanup drops older entries when it writes a checkpoint), and VACUUM's RETAIN. The orphan floor (at least
  1 h) keeps a batch's files, in the table's folder but in no log entry until its commit, from VACUUM.
- `spec.retention` (dropping rows by age, by whole time partitions) is not this: it needs time partitions,
  which a Delta table has not (identity ones only), so the spec refuses it for format delta.
- A partitioned table's small files count only in partitions holding two or more: OPTIMIZE bins files per
  partition and leaves a lone one as it is.
- `compaction.minSnapshotsToKeep` above 1 has no Delta equivalent (refused by the spec).
- Z-order rewrites every file of the table each time it runs (Delta's OPTIMIZE ZORDER is not incremental), so
  it runs when small files gather, like bin-packing, not every step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from icefall.api import StreamingTableSpec

MIB = 1024 * 1024
HOUR_MS = 3_600_000
DEFAULT_TARGET_FILE_SIZE = 128 * MIB
DEFAULT_CHECKPOINT_INTERVAL = 10  # Delta's default delta.checkpointInterval
CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
FILE_RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"


@dataclass(frozen=True)
class DeltaPolicy:
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE
    small_file_ratio: float = 0.75  # a data file below ratio * target is "small"
    min_files_to_compact: int = 5
    zorder_by: tuple[str, ...] = ()
    retention_ms: int = 5 * 24 * HOUR_MS
    vacuum_interval_ms: int = HOUR_MS

    def __post_init__(self) -> None:
        if self.target_file_size_bytes <= 0 or not 0 < self.small_file_ratio <= 1:
            raise ValueError("need target_file_size_bytes > 0 and small_file_ratio in (0, 1]")
        if self.min_files_to_compact < 2 or self.retention_ms < 0 or self.vacuum_interval_ms < 0:
            raise ValueError("need min_files_to_compact >= 2, retention_ms >= 0 and vacuum_interval_ms >= 0")


@dataclass(frozen=True)
class DeltaTableView:
    """What planning reads of a table: its latest version, the newest checkpoint's version (None: none),
    the sizes of its live data files, the configuration of its Metadata, and for a partitioned table the
    partition (folder) of each file, in the order of `file_sizes`."""

    version: int
    checkpoint_version: int | None
    file_sizes: tuple[int, ...]
    configuration: Mapping[str, str]
    file_partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SetRetention:
    properties: Mapping[str, str]


@dataclass(frozen=True)
class Optimize:
    small_files: int
    zorder_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    version: int


@dataclass(frozen=True)
class Vacuum:
    retention_ms: int


DeltaItem = SetRetention | Optimize | Checkpoint | Vacuum


def delta_policy_from_spec(spec: StreamingTableSpec) -> DeltaPolicy:
    """The `DeltaPolicy` of `spec.compaction` and `spec.table.sortOrder` (module doc)."""
    compaction = spec.compaction
    return DeltaPolicy(
        target_file_size_bytes=compaction.target_file_size_bytes or DEFAULT_TARGET_FILE_SIZE,
        zorder_by=tuple(s.field for s in spec.table.sort_order),
        retention_ms=1000 * max(compaction.max_snapshot_age_seconds, compaction.orphan_min_age_seconds),
    )


def retention_properties(policy: DeltaPolicy) -> dict[str, str]:
    """The Delta table properties that say `policy`'s retention to every Delta tool (Spark's VACUUM without
    RETAIN, log cleanup, delta-rs)."""
    interval = f"interval {policy.retention_ms // 1000} seconds"
    return {FILE_RETENTION_PROPERTY: interval, LOG_RETENTION_PROPERTY: interval}


def checkpoint_interval(configuration: Mapping[str, str]) -> int:
    """The table's `delta.checkpointInterval` (Delta's default 10 when absent or not a positive number)."""
    text = configuration.get(CHECKPOINT_INTERVAL_PROPERTY, "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_CHECKPOINT_INTERVAL


def small_files(sizes: Sequence[int], policy: DeltaPolicy, partitions: Sequence[str] = ()) -> int:
    """The small files OPTIMIZE would rewrite: every one, or in a partitioned table (`partitions`, one per
    file) those of partitions holding two or more (OPTIMIZE bins files per partition: a lone one stays)."""
    limit = policy.small_file_ratio * policy.target_file_size_bytes
    if not partitions:
        return sum(1 for size in sizes if size < limit)
    per_partition: dict[str, int] = {}
    for size, partition in zip(sizes, partitions, strict=True):
        if size < limit:
            per_partition[partition] = per_partition.get(partition, 0) + 1
    return sum(count for count in per_partition.values() if count >= 2)


def plan_delta_maintenance(
    view: DeltaTableView, policy: DeltaPolicy, *, now_ms: int, last_vacuum_ms: int | None
) -> tuple[DeltaItem, ...]:
    """The items due now, in the order to run them (module doc); () when the table is tidy."""
    if view.version < 0:
        return ()
    items: list[DeltaItem] = []
    wanted = retention_properties(policy)
    if any(view.configuration.get(k) != v for k, v in wanted.items()):
        items.append(SetRetention(wanted))
    small = small_files(view.file_sizes, policy, view.file_partitions)
    if small >= policy.min_files_to_compact:
        items.append(Optimize(small, policy.zorder_by))
    since = view.version - (view.checkpoint_version if view.checkpoint_version is not None else 0)
    if since >= checkpoint_interval(view.configuration):
        items.append(Checkpoint(view.version))
    if last_vacuum_ms is None or now_ms - last_vacuum_ms >= policy.vacuum_interval_ms:
        items.append(Vacuum(policy.retention_ms))
    return tuple(items)
