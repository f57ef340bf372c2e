"""Table maintenance as work items: what to compact, expire, clean up, drop. Pure: the clock is an argument.

Input: a `TableView` (`icefall.plan.table_view`), the table's metadata summarised as plain data (live files of
`main`'s head, every snapshot with the refs that point at it, the head's manifests, every path any metadata
still references, and a listing of the table's storage), plus a `MaintenancePolicy` and `now_ms`. The caller
reads these (pyiceberg inspect tables / Spark metadata tables, an object-store listing); this module does no
I/O. Output of `plan_maintenance`: an ordered tuple of work items (`icefall.plan.maintenance_items`), each
claimable by one worker through a Lease of the table's pool, chosen by `work_key`:

1. `ApplyRetention` — drop whole partitions that lie entirely before `now - max_age` (first, so nothing
   is compacted only to be dropped; partitions it drops are neither compacted nor rewritten for deletes).
2. `CompactPartition` — per partition holding at least `min_files_to_compact` small data files (below
   `small_file_ratio * target`), the small files bin-packed (first-fit decreasing) into output files of at
   most the target size, and the bins cut into groups of at most `max_bytes_per_task` input bytes: a hot
   partition becomes several small steps rather than one long rewrite. Files at or near the target size
   are never touched; a bin that would hold one file alone is dropped (rewriting it gains nothing).
   Size-tiered: a small file at least as large as all smaller ones together is left out (`_tiered`), so a
   file that compaction wrote is merged again only once as much new data has gathered beside it. Without
   this, every compaction of a partition that keeps receiving commits rewrote the whole partition (each
   byte rewritten about once per compaction until the file reaches the target); with it, each byte is
   rewritten about log2(target / commit size) times, and a partition holds at most
   `min_files_to_compact - 1` files below the smallest tier plus one file per tier (tiers at least double).
   Hot partitions (most small files) come first.
3. `ApplyDeletes` — data files of keyed tables carry position delete files (each upsert batch's MERGE
   writes them, one per data file it touches: Iceberg's `write.delete.granularity=file`). Every read opens
   them and skips the deleted rows, so they cost reads until the data file is rewritten without those rows.
   A data file is planned when its deleted fraction (rows its file-scoped position deletes name / its rows)
   is at least `deleted_fraction_threshold`, and every data file a delete may apply to is planned once its
   partition holds `max_delete_files_per_partition` position delete files (a delete file whose rows name
   several data files, `referenced_data_file` None, may apply to each data file of its partition not
   newer than it). Per partition, in steps of at most `max_bytes_per_task` input bytes (a file is never
   split); partitions with most deleted rows first. Files a `CompactPartition` item of the same plan
   rewrites are left out: that rewrite reads through the deletes too and drops the same delete files, so
   ApplyDeletes takes what compaction does not (files at the target size, or left out by the tiers), and
   no file is in two items of one plan. Equality deletes are not planned (Icefall writes none).
4. `RewriteManifests` — when `main`'s head has at least `manifest_count_threshold` small manifests (each
   ingestion commit adds one).
5. `ExpireSnapshots` — snapshots older than `snapshot_max_age_ms` beyond the newest `snapshot_min_keep` of
   `main`'s history. Never expired: `main`'s head, any snapshot a branch or tag points at (staging branches
   `icefall_stage_*` included: a write in flight, and the base a staged snapshot was planned from), the newest
   `snapshot_min_keep` of `main`, anything newer than the age cut-off. Planned only once it is worth a
   commit: `expire_batch` snapshots may go, or one has waited a tenth of the age past the cut-off (so a
   table committing every few seconds expires in batches, not once per commit; measured in the hour
   benchmark: 609 one-snapshot expiries before this rule). The item names the exact ids to expire
   and the ids kept.
6. `RemoveOrphans` — storage objects no metadata references AND older than `orphan_min_age_ms` (default 3
   days, never below 1 h): a batch being staged writes its data files before any snapshot references them,
   and the window keeps them safe. Reference checks use the metadata before this round's expiry, so a file
   only an expiring snapshot still holds is left for the next round.

Why maintenance cannot lose the resume state: the committed offsets, epoch and watermarks live in the
`icefall.*` table properties (commit/DESIGN.md), not in snapshot summaries. Properties belong to no
snapshot; every later commit (rewrite, manifest rewrite, expiry, retention delete) carries them forward,
and expiry removes snapshots, never properties. No work item here sets or reads a property; workers must
leave `icefall.*` alone, and that is all they need to do.

`backlog(work)` is the number of items (units that can run in parallel, as `plan.scaling` expects);
`bytes_to_rewrite(work)` the input bytes of the items that rewrite data files (compaction and deletes).

Not guaranteed: that groups of one planning round are still valid when a worker runs them (an ingestion or
another rewrite may have committed since). Correctness then rests on Iceberg's rewrite validation (a
rewrite of files no longer live fails and is re-planned), not on this planner. Paths are compared as exact
strings: the caller must spell referenced paths and listed paths the same way (scheme, bucket, prefix).
"""

from __future__ import annotations

import calendar
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icefall.plan.maintenance_items import (
    DAY_MS,
    HOUR_MS,
    MIN_ORPHAN_AGE_MS,
    ApplyDeletes,
    ApplyRetention,
    CompactPartition,
    ExpireSnapshots,
    MaintenancePolicy,
    RemoveOrphans,
    RetentionPolicy,
    RewriteManifests,
    TimeTransform,
    WorkItem,
    time_partition_field_name,
)
from icefall.plan.table_view import (
    STAGE_BRANCH_PREFIX,
    DataFileInfo,
    FileContent,
    PartitionValue,
    SnapshotInfo,
    TableView,
)

if TYPE_CHECKING:
    from icefall.api.spec import StreamingTableSpec


def policy_from_spec(spec: StreamingTableSpec) -> MaintenancePolicy:
    """The `MaintenancePolicy` of `spec.compaction` and `spec.retention` (seconds become milliseconds).

    `spec.retention.field` names a column; its time transform is the one `spec.table.partitioning` applies
    to it (the spec's validation guarantees there is exactly one). Whether maintenance runs at all
    (`spec.compaction.enabled`, `spec.suspend`) is the caller's decision, not part of the policy.
    """
    compaction = spec.compaction
    retention: RetentionPolicy | None = None
    if spec.retention is not None:
        column = spec.retention.field
        transforms = [
            TimeTransform(p.transform)
            for p in spec.table.partitioning
            if p.field == column and p.transform in TimeTransform.__members__.values()
        ]
        if not transforms:
            raise ValueError(
                f"spec.retention.field: {column!r} is not partitioned by hour, day, month or year in "
                "spec.table.partitioning; add such a partition field"
            )
        retention = RetentionPolicy(
            partition_field=time_partition_field_name(column, transforms[0]),
            source_column=column,
            transform=transforms[0],
            max_age_ms=spec.retention.max_age_seconds * 1000,
        )
    return MaintenancePolicy(
        target_file_size_bytes=compaction.target_file_size_bytes,
        snapshot_max_age_ms=compaction.max_snapshot_age_seconds * 1000,
        snapshot_min_keep=compaction.min_snapshots_to_keep,
        orphan_min_age_ms=compaction.orphan_min_age_seconds * 1000,
        deleted_fraction_threshold=compaction.rewrite_deleted_percent / 100,
        retention=retention,
    )


# ---------------------------------------------------------------------------------------------- planning


def plan_maintenance(table: TableView, policy: MaintenancePolicy, now_ms: int) -> tuple[WorkItem, ...]:
    """The maintenance work for `table` at `now_ms`, in the order described in the module doc."""
    work: list[WorkItem] = []
    retention = plan_retention(table, policy, now_ms)
    dropped: set[tuple[int, PartitionValue]] = set()
    if retention is not None:
        work.append(retention)
        spec_ids = {f.spec_id for f in table.files}
        dropped = {(s, p) for s in spec_ids for p in retention.partitions}
    compaction = plan_compaction(table, policy, skip=dropped)
    work.extend(compaction)
    taken = {path for item in compaction for path in item.files}
    work.extend(plan_delete_application(table, policy, skip=dropped, taken=taken))
    manifests = plan_manifests(table, policy)
    if manifests is not None:
        work.append(manifests)
    expiry = plan_expiry(table.snapshots, policy, now_ms)
    if expiry is not None:
        work.append(expiry)
    orphans = plan_orphans(table, policy, now_ms)
    if orphans is not None:
        work.append(orphans)
    return tuple(work)


def plan_compaction(
    table: TableView, policy: MaintenancePolicy, *, skip: Iterable[tuple[int, PartitionValue]] = ()
) -> tuple[CompactPartition, ...]:
    """Bounded rewrite groups of small data files per partition (module doc, step 2)."""
    target = policy.target_size(table.properties)
    small_below = policy.small_file_ratio * target
    capacity = min(target, policy.max_bytes_per_task)
    skipped = set(skip)
    by_partition: dict[tuple[int, PartitionValue], list[DataFileInfo]] = {}
    for f in table.files:
        if (
            f.content is FileContent.DATA
            and f.size_bytes < small_below
            and (f.spec_id, f.partition) not in skipped
        ):
            by_partition.setdefault((f.spec_id, f.partition), []).append(f)
    tiered = {key: _tiered(files) for key, files in by_partition.items()}
    eligible = [(key, files) for key, files in tiered.items() if len(files) >= policy.min_files_to_compact]
    eligible.sort(key=lambda kv: (-len(kv[1]), kv[0][0], repr(kv[0][1])))
    items: list[CompactPartition] = []
    for (spec_id, partition), files in eligible:
        bins = [b for b in _first_fit_decreasing(files, capacity) if len(b) > 1]
        groups = _cut(bins, policy.max_bytes_per_task)
        for n, group in enumerate(groups, start=1):
            paths = tuple(sorted(f.path for b in group for f in b))
            size = sum(f.size_bytes for b in group for f in b)
            reason = (
                f"{len(files)} files below {int(small_below)} bytes in partition {partition!r}; "
                f"step {n}/{len(groups)}: {len(paths)} files, {size} bytes into {len(group)} file(s)"
            )
            items.append(CompactPartition(partition, paths, size, target, reason, spec_id, n))
    return tuple(items)


def plan_delete_application(
    table: TableView,
    policy: MaintenancePolicy,
    *,
    skip: Iterable[tuple[int, PartitionValue]] = (),
    taken: Iterable[str] = (),
) -> tuple[ApplyDeletes, ...]:
    """Bounded groups of data files to rewrite without their deleted rows, per partition (module doc, step
    3). `taken`: data files another item of the plan rewrites already."""
    target = policy.target_size(table.properties)
    due = _partitions_due_for_deletes(table.files, policy, set(skip), set(taken))
    due.sort(key=lambda d: (-d.deleted_rows, d.spec_id, repr(d.partition)))
    items: list[ApplyDeletes] = []
    for d in due:
        groups = _cut([[f] for f in d.files], policy.max_bytes_per_task)
        for n, group in enumerate(groups, start=1):
            files = [f for bin_ in group for f in bin_]
            found = [d.scoped[f.path] for f in files if f.path in d.scoped]
            names = tuple(sorted(name for deletes in found for name in deletes.delete_files))
            rows = sum(deletes.rows for deletes in found)
            size = sum(f.size_bytes for f in files)
            reason = (
                f"{len(d.files)} data files with deletes due in partition {d.partition!r}; step "
                f"{n}/{len(groups)}: {len(files)} files, {size} bytes, {rows} rows deleted by "
                f"{len(names)} file-scoped delete files"
            )
            paths = tuple(f.path for f in files)
            items.append(ApplyDeletes(d.partition, paths, names, size, rows, target, reason, d.spec_id, n))
    return tuple(items)


@dataclass(frozen=True)
class _PartitionDue:
    """One partition's data files due for delete application (by path), and its file-scoped deletes."""

    spec_id: int
    partition: PartitionValue
    files: list[DataFileInfo]
    scoped: dict[str, _FileDeletes]

    @property
    def deleted_rows(self) -> int:
        return sum(self.scoped[f.path].rows for f in self.files if f.path in self.scoped)


def _partitions_due_for_deletes(
    files: Iterable[DataFileInfo],
    policy: MaintenancePolicy,
    skip: set[tuple[int, PartitionValue]],
    taken: set[str],
) -> list[_PartitionDue]:
    data: dict[tuple[int, PartitionValue], list[DataFileInfo]] = {}
    deletes: dict[tuple[int, PartitionValue], list[DataFileInfo]] = {}
    for f in files:
        key = (f.spec_id, f.partition)
        if key in skip:
            continue
        if f.content is FileContent.DATA:
            data.setdefault(key, []).append(f)
        elif f.content is FileContent.POSITION_DELETES:
            deletes.setdefault(key, []).append(f)
    due: list[_PartitionDue] = []
    for (spec_id, partition), delete_files in deletes.items():
        scoped = _file_scoped_deletes(delete_files)
        candidates = data.get((spec_id, partition), [])
        chosen = [
            f for f in _due_for_deletes(candidates, delete_files, scoped, policy) if f.path not in taken
        ]
        if chosen:
            due.append(_PartitionDue(spec_id, partition, sorted(chosen, key=lambda f: f.path), scoped))
    return due


@dataclass(frozen=True)
class _FileDeletes:
    """What the file-scoped position delete files of one data file delete."""

    rows: int
    delete_files: tuple[str, ...]


def _file_scoped_deletes(deletes: Sequence[DataFileInfo]) -> dict[str, _FileDeletes]:
    """By data file: the rows its file-scoped delete files delete (summed: they never name a row twice,
    since a deleted row is not read again to be deleted) and their paths."""
    found: dict[str, _FileDeletes] = {}
    for d in deletes:
        if d.referenced_data_file is not None:
            old = found.get(d.referenced_data_file, _FileDeletes(0, ()))
            found[d.referenced_data_file] = _FileDeletes(
                old.rows + d.record_count, (*old.delete_files, d.path)
            )
    return found


def _due_for_deletes(
    data: Sequence[DataFileInfo],
    deletes: Sequence[DataFileInfo],
    scoped: Mapping[str, _FileDeletes],
    policy: MaintenancePolicy,
) -> list[DataFileInfo]:
    """The data files of one partition whose deletes are due (either trigger of the module doc)."""
    unscoped = [d.sequence_number for d in deletes if d.referenced_data_file is None]
    newest_unscoped = max(unscoped) if unscoped else None
    many = len(deletes) >= policy.max_delete_files_per_partition
    chosen: list[DataFileInfo] = []
    for f in data:
        rows = scoped[f.path].rows if f.path in scoped else 0
        enough_deleted = f.record_count > 0 and rows / f.record_count >= policy.deleted_fraction_threshold
        maybe_deleted = rows > 0 or (newest_unscoped is not None and f.sequence_number <= newest_unscoped)
        if enough_deleted or (many and maybe_deleted):
            chosen.append(f)
    return chosen


def _tiered(files: Sequence[DataFileInfo]) -> list[DataFileInfo]:
    """`files` without the largest ones that are each at least the size of all smaller ones together."""
    by_size = sorted(files, key=lambda f: (f.size_bytes, f.path))
    rest = sum(f.size_bytes for f in by_size)
    while by_size and by_size[-1].size_bytes >= rest - by_size[-1].size_bytes:
        rest -= by_size.pop().size_bytes
    return by_size


def _first_fit_decreasing(files: Sequence[DataFileInfo], capacity: int) -> list[list[DataFileInfo]]:
    bins: list[list[DataFileInfo]] = []
    room: list[int] = []
    for f in sorted(files, key=lambda f: (-f.size_bytes, f.path)):
        for i, free in enumerate(room):
            if f.size_bytes <= free:
                bins[i].append(f)
                room[i] -= f.size_bytes
                break
        else:
            bins.append([f])
            room.append(capacity - f.size_bytes)
    return bins


def _cut(bins: Sequence[list[DataFileInfo]], max_bytes: int) -> list[list[list[DataFileInfo]]]:
    """Consecutive bins into groups of at most `max_bytes` input bytes (a bin is never split)."""
    groups: list[list[list[DataFileInfo]]] = []
    used = 0
    for b in bins:
        size = sum(f.size_bytes for f in b)
        if not groups or used + size > max_bytes:
            groups.append([])
            used = 0
        groups[-1].append(b)
        used += size
    return groups


def plan_manifests(table: TableView, policy: MaintenancePolicy) -> RewriteManifests | None:
    small = sorted(m.path for m in table.manifests if m.size_bytes < policy.manifest_target_size_bytes)
    if len(small) < policy.manifest_count_threshold:
        return None
    return RewriteManifests(
        tuple(small),
        f"{len(small)} manifests below {policy.manifest_target_size_bytes} bytes "
        f"(threshold {policy.manifest_count_threshold})",
    )


def plan_expiry(
    snapshots: Sequence[SnapshotInfo], policy: MaintenancePolicy, now_ms: int
) -> ExpireSnapshots | None:
    """Snapshots to expire, or None when none may go (module doc, step 4)."""
    older_than = now_ms - policy.snapshot_max_age_ms
    main_newest_first = sorted(
        (s for s in snapshots if s.is_on_main), key=lambda s: (s.timestamp_ms, s.snapshot_id), reverse=True
    )
    keep = {s.snapshot_id for s in main_newest_first[: policy.snapshot_min_keep]}
    keep |= {s.snapshot_id for s in snapshots if s.referenced_by_branch_or_tag}
    # A staged write's base too: cheap, and a commit of that stage can still name it.
    keep |= {
        s.parent_id
        for s in snapshots
        if s.parent_id is not None and any(r.startswith(STAGE_BRANCH_PREFIX) for r in s.refs)
    }
    keep |= {s.snapshot_id for s in snapshots if s.timestamp_ms >= older_than}
    expirable = [s for s in snapshots if s.snapshot_id not in keep]
    if not expirable:
        return None
    overdue = min(s.timestamp_ms for s in expirable) < older_than - policy.snapshot_max_age_ms // 10
    if len(expirable) < policy.expire_batch and not overdue:
        return None  # not yet worth a commit of its own
    expire = sorted(s.snapshot_id for s in expirable)
    return ExpireSnapshots(older_than, policy.snapshot_min_keep, tuple(sorted(keep)), tuple(expire))


def plan_orphans(table: TableView, policy: MaintenancePolicy, now_ms: int) -> RemoveOrphans | None:
    """Unreferenced storage objects older than the safety window (module doc, step 5)."""
    if table.snapshots and not table.referenced_paths:
        return None  # metadata that references nothing is a caller's mistake, not a licence to delete all
    referenced = set(table.referenced_paths)
    referenced |= {f.path for f in table.files}
    referenced |= {m.path for m in table.manifests}
    older_than = now_ms - max(policy.orphan_min_age_ms, MIN_ORPHAN_AGE_MS)
    paths = sorted(o.path for o in table.storage if o.path not in referenced and o.modified_ms < older_than)
    if not paths:
        return None
    return RemoveOrphans(older_than, tuple(paths))


def plan_retention(table: TableView, policy: MaintenancePolicy, now_ms: int) -> ApplyRetention | None:
    """Whole partitions of the retention field that end at or before `now - max_age` (module doc, step 1)."""
    rule = policy.retention
    if rule is None:
        return None
    if rule.partition_field not in table.partition_fields:
        raise ValueError(f"retention field {rule.partition_field!r} is not a partition field of {table.name}")
    index = table.partition_fields.index(rule.partition_field)
    cutoff = now_ms - rule.max_age_ms
    boundary = partition_start_ms(rule.transform, partition_ordinal(rule.transform, cutoff))
    partitions: set[PartitionValue] = set()
    files: list[str] = []
    for f in table.files:
        if len(f.partition) <= index:
            continue
        value = f.partition[index]
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and partition_end_ms(rule.transform, value) <= cutoff
        ):
            partitions.add(f.partition)
            files.append(f.path)
    if not partitions:
        return None
    return ApplyRetention(
        rule.partition_field,
        rule.source_column,
        boundary,
        tuple(sorted(partitions, key=repr)),
        tuple(sorted(files)),
        f"{len(partitions)} partition(s) of {rule.partition_field} entirely before {cutoff} ms",
    )


def partition_start_ms(transform: TimeTransform, ordinal: int) -> int:
    """Start (inclusive, ms since epoch) of the partition with Iceberg transform value `ordinal`."""
    if transform is TimeTransform.HOUR:
        return ordinal * HOUR_MS
    if transform is TimeTransform.DAY:
        return ordinal * DAY_MS
    if transform is TimeTransform.MONTH:
        year, month = divmod(ordinal, 12)
        return calendar.timegm((1970 + year, month + 1, 1, 0, 0, 0)) * 1000
    return calendar.timegm((1970 + ordinal, 1, 1, 0, 0, 0)) * 1000


def partition_end_ms(transform: TimeTransform, ordinal: int) -> int:
    """End (exclusive) of that partition: the start of the next."""
    return partition_start_ms(transform, ordinal + 1)


def partition_ordinal(transform: TimeTransform, ms: int) -> int:
    """The Iceberg transform value of the timestamp `ms`."""
    if transform is TimeTransform.HOUR:
        return ms // HOUR_MS
    if transform is TimeTransform.DAY:
        return ms // DAY_MS
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if transform is TimeTransform.MONTH:
        return (moment.year - 1970) * 12 + moment.month - 1
    return moment.year - 1970


# ---------------------------------------------------------------------------------------------- claiming


def backlog(work: Sequence[WorkItem]) -> int:
    """Units of work that can run in parallel: the number of items (input of `plan.scaling`)."""
    return len(work)


def bytes_to_rewrite(work: Sequence[WorkItem]) -> int:
    """Input bytes of the items that rewrite data files (compaction and delete application)."""
    return sum(item.input_bytes for item in work if isinstance(item, CompactPartition | ApplyDeletes))


def work_key(item: WorkItem) -> str:
    """What makes `item` one unit of work: two workers never run items with the same key at once (the
    runner claims `TableLeases.work_for(key)`, a Lease of the table's fixed pool).

    Table-wide items (retention, manifests, expiry, orphans) are keyed by kind only, so two workers can
    never run the same kind at once even if they planned at different times. Compaction is keyed by
    partition and step (a hot partition's groups run in parallel; two plans made at different times
    share keys, so their overlapping groups never run at once), and so is delete application.
    Not by input files: a key names the same work across plans.
    """
    identity: dict[str, object]
    if isinstance(item, CompactPartition | ApplyDeletes):
        identity = {"spec": item.spec_id, "partition": repr(item.partition), "step": item.step}
    else:
        identity = {}
    return json.dumps({**identity, "kind": type(item).__name__}, sort_keys=True)
