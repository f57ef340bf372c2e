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
  it runs when small files gather, like bin-packing, not every step. The pods' merges (below) Z-order only
  the small files each one merges (`CompactFiles.zorder_by`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


def checkpoint_due(version: int, checkpoint_version: int | None, configuration: Mapping[str, str]) -> bool:
    """At least `delta.checkpointInterval` versions since the newest checkpoint (or since version 0)."""
    since = version - (checkpoint_version if checkpoint_version is not None else 0)
    return since >= checkpoint_interval(configuration)


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
    if checkpoint_due(view.version, view.checkpoint_version, view.configuration):
        items.append(Checkpoint(view.version))
    if last_vacuum_ms is None or now_ms - last_vacuum_ms >= policy.vacuum_interval_ms:
        items.append(Vacuum(policy.retention_ms))
    return tuple(items)


# --- the compaction pods' upkeep of a Delta table on S3 (`icefall.compact.delta_pods`) --------------------
#
# Delta Spark's OPTIMIZE and VACUUM cannot run there (its S3 log store commits unconditionally), so the pods
# run Icefall's own: `CompactFiles` merges small files of one partition into one file and commits the
# swap through Icefall's log writer (put-if-absent); `Vacuum` deletes what `vacuum_deletions` selects;
# `Checkpoint` writes a checkpoint without Spark and cleans up the log (`icefall.commit.delta_checkpoint`).

#: At most this many files in one merge: the commit names each, and a pod reads them one after the other.
MAX_FILES_PER_MERGE = 500


@dataclass(frozen=True)
class DeltaFile:
    """A live data file as the log names it: its `add` path (relative, URI-encoded), size, and its
    partition (a key of its partition values; "" unpartitioned)."""

    path: str
    size: int
    partition: str = ""


@dataclass(frozen=True)
class CompactFiles:
    """Merge `paths` (live small files of one partition) into one file, in one commit of ours; its rows in
    Z-order over `zorder_by` (`spec.table.sortOrder`) when given, else the files' rows one after another."""

    partition: str
    paths: tuple[str, ...]
    bytes: int
    zorder_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeltaFilesView:
    """What the pods' planning reads of a table: its latest version, live files (deletion-vector files
    left out by the reader: merging their Parquet would bring deleted rows back) and configuration."""

    version: int
    files: tuple[DeltaFile, ...]
    configuration: Mapping[str, str]
    checkpoint_version: int | None = None  # the newest checkpoint's (None: none)


DeltaPodItem = SetRetention | Checkpoint | CompactFiles | Vacuum


def partition_key(values: Mapping[str, str | None]) -> str:
    """A partition's key in plans and work Leases: its values as `column=value`, columns sorted."""
    return "/".join(f"{k}={'' if v is None else v}" for k, v in sorted(values.items()))


def merge_bins(files: Sequence[DeltaFile], policy: DeltaPolicy) -> tuple[CompactFiles, ...]:
    """The merges that turn the small files into files of about the target size: per partition, its small
    files smallest first, packed greedily into bins whose sum stays within the target (a merged file is
    about the sum of its inputs); a bin of one file is no merge. Nothing while the table holds fewer than
    `min_files_to_compact` small files that could merge (as `small_files` counts them). A merge's file,
    Z-ordered or not, is merged again only while it is small, with newer small files (each merge makes
    one file of two or more, so merging ends): a file at size is never rewritten to re-sort it."""
    limit = policy.small_file_ratio * policy.target_file_size_bytes
    small = [f for f in files if f.size < limit]
    counted = small_files([f.size for f in small], policy, [f.partition for f in small] if small else ())
    if counted < policy.min_files_to_compact:
        return ()
    by_partition: dict[str, list[DeltaFile]] = {}
    for each in small:
        by_partition.setdefault(each.partition, []).append(each)
    bins: list[CompactFiles] = []
    for partition in sorted(by_partition):
        current: list[DeltaFile] = []
        for each in sorted(by_partition[partition], key=lambda f: (f.size, f.path)):
            full = len(current) >= MAX_FILES_PER_MERGE
            if current and (full or sum(f.size for f in current) + each.size > policy.target_file_size_bytes):
                bins.append(_bin(partition, current, policy))
                current = []
            current.append(each)
        bins.append(_bin(partition, current, policy))
    return tuple(b for b in bins if len(b.paths) >= 2)


def _bin(partition: str, files: Sequence[DeltaFile], policy: DeltaPolicy) -> CompactFiles:
    paths = tuple(f.path for f in files)
    return CompactFiles(partition, paths, sum(f.size for f in files), policy.zorder_by)


def plan_delta_pod_work(
    view: DeltaFilesView, policy: DeltaPolicy, *, now_ms: int, last_vacuum_ms: int | None
) -> tuple[DeltaPodItem, ...]:
    """The items due now, in order: `SetRetention` when the table's retention properties differ from the
    spec's, `Checkpoint` when `delta.checkpointInterval` versions passed since the newest checkpoint (before
    the merges: a busy table always has merges due, and reads get slower with every version), then the
    merges (`merge_bins`), then `Vacuum` when this process has not run one for `vacuum_interval_ms`; ()
    when the table does not exist."""
    if view.version < 0:
        return ()
    items: list[DeltaPodItem] = []
    wanted = retention_properties(policy)
    if any(view.configuration.get(k) != v for k, v in wanted.items()):
        items.append(SetRetention(wanted))
    if checkpoint_due(view.version, view.checkpoint_version, view.configuration):
        items.append(Checkpoint(view.version))
    items += merge_bins(view.files, policy)
    if last_vacuum_ms is None or now_ms - last_vacuum_ms >= policy.vacuum_interval_ms:
        items.append(Vacuum(policy.retention_ms))
    return tuple(items)


def delta_backlog(files: Sequence[DeltaFile], policy: DeltaPolicy) -> int:
    """The compaction backlog the driver reports for a Delta table on S3: its merges due (each one a pod can
    claim), which the operator scales the compaction pods by (`plan.scaling`)."""
    return len(merge_bins(files, policy))


def delta_work_key(item: DeltaPodItem) -> str:
    """The work Lease key of an item (`TableLeases.work_for`): merges one partition at a time (two pods
    planning bins of one partition a moment apart could pick overlapping files; the commit would refuse
    the second, but its work would be wasted), VACUUM and the properties once per table."""
    if isinstance(item, CompactFiles):
        return f"delta-merge/{item.partition}"
    if isinstance(item, Checkpoint):
        return "delta-checkpoint"
    return "delta-vacuum" if isinstance(item, Vacuum) else "delta-properties"


def vacuum_deletions(
    listed: Mapping[str, int],
    live: Iterable[str],
    removed: Mapping[str, int],
    *,
    cutoff_ms: int,
    partition_columns: Sequence[str] = (),
) -> tuple[str, ...]:
    """What VACUUM deletes of the files `listed` under the table's folder (decoded relative path →
    modification time, ms): those no version within the retention names and older than it — not `live`
    now, not removed at or after `cutoff_ms` (`removed`: path → the remove's deletionTimestamp), and last
    modified before `cutoff_ms` (a batch's files are in the folder, in no log entry, until its commit; so
    are a merge's between its write and its commit). Hidden folders and files (a name starting with `_`
    or `.`: `_delta_log`, `_icefall_staging`) are never touched, but for a partition folder `_col=value`
    of a partition column. Paths of `live` and `removed` are decoded alike by the caller. A listed file
    whose name (its last segment) is that of a kept file is kept too, whatever its folder: data file names
    are unique, so this only ever spares a file — a path the log encodes in a way the decoding missed
    would otherwise look unnamed, and deleting a live file loses rows."""
    kept = set(live) | {path for path, deleted_ms in removed.items() if deleted_ms >= cutoff_ms}
    kept_names = {path.rpartition("/")[2] for path in kept}
    doomed = [
        path
        for path, modified_ms in listed.items()
        if path not in kept
        and path.rpartition("/")[2] not in kept_names
        and modified_ms < cutoff_ms
        and not _hidden(path, partition_columns)
    ]
    return tuple(sorted(doomed))


def _hidden(path: str, partition_columns: Sequence[str]) -> bool:
    for part in path.split("/"):
        if part.startswith(("_", ".")) and part.partition("=")[0] not in partition_columns:
            return True
    return False
