"""Run one maintenance work item (plan/maintenance.py) with Spark and Iceberg's own commit machinery.

`run_item(spark, catalog, identifier, item)` executes one item and returns an `ItemResult`; the caller
claims the item first (a work Lease named by `work_key`, see `icefall.compact.runner`). In-process callers
(tests, benchmarks, the embedded runner) call it directly with their SparkSession.

What each item does:

- `CompactPartition`: rewrites exactly the planned files (those still live in `main`'s head; fewer than
  two left → skipped) into files of about the target size, the way Iceberg's `rewrite_data_files` does it,
  in two visible steps: the files are staged as a scan task set, read and written by Spark (the new files
  are written but not committed), then — after the failpoint `main.mid-rewrite` — one `RewriteFiles` commit
  replaces them, validated from the snapshot the files were read at and keeping that snapshot's data
  sequence number (so deletes added later still apply). Spark's procedure has no hook between writing and
  committing; using the same Iceberg classes it uses (`ScanTaskSetManager`, `FileRewriteCoordinator`,
  `Table.newRewrite`) gives one, and rewrites the planned files rather than a partition filter's. The
  read applies the files' deletes, so the same commit also drops the position delete files that applied
  to the rewritten files only (dangling afterwards: they would be opened by every scan planning, forever).
- `ApplyDeletes`: the same rewrite of the planned files that still have position deletes (one is enough),
  so keyed tables' delete files go away with the rows they delete. A delete file that still applies to a
  file left out stays.
- `RewriteManifests`: `CALL <catalog>.system.rewrite_manifests`.
- `ExpireSnapshots`: `CALL <catalog>.system.expire_snapshots` with the planned ids, the planned age
  cut-off and `retain_last`. Iceberg itself refuses to expire a branch or tag head (main's, staging
  branches' `icefall_stage_*`), and deletes the files only the expired snapshots reached.
- `RemoveOrphans`: deletes exactly the planned paths, after checking each again against freshly loaded
  metadata (still referenced by nothing) and storage (still older than the planned cut-off).
- `ApplyRetention`: `DELETE FROM <table> WHERE <column> < <partition boundary>`; the boundary is a
  partition boundary, so Iceberg drops whole files (a metadata-only delete, reported in the result).

Guarantees:
- No item reads or writes a table property: `icefall.*` (the resume state) is carried forward by every
  commit, as commit/DESIGN.md requires ("Properties belong to no snapshot").
- A rewrite commit (compaction, deletes applied) changes which files hold the rows, never the rows:
  Iceberg's rewrite validation refuses it if an input file is no longer live (a concurrent rewrite or
  delete), if new deletes for an input file were committed since it was read (a keyed batch: the rewrite
  would bring the deleted rows back), or if a delete file it drops is gone; it never rebases a change of
  rows. A process killed before the commit leaves only unreferenced new files: orphans, removed by
  a later `RemoveOrphans` once they are older than the safety window.
- Errors propagate (Py4J/Spark exceptions included); the caller counts the item as failed and plans again.

Not guaranteed: that an item is still useful when it runs (the plan may be stale; such items are
`skipped`); exactness of expiry beyond the planned ids (Iceberg also expires what its own age and
`retain_last` rules select with the same cut-off — the base of a staging branch the planner keeps may go;
that base is only needed while it is main's head, which is always kept); cleanup of a failed rewrite's
new files (left to orphan removal: deleting them after an unknown commit outcome could delete live data).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from icefall.catalog import CatalogConfig
from icefall.compact.view import canonical_path, filesystem_for, read_table_view, to_local_path
from icefall.plan.maintenance_items import (
    ApplyDeletes,
    ApplyRetention,
    CompactPartition,
    ExpireSnapshots,
    RemoveOrphans,
    RewriteManifests,
    WorkItem,
)
from icefall.plan.table_view import PartitionValue
from icefall.runtime import metrics
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    DONE = "done"
    SKIPPED = "skipped"  # the plan went stale: nothing (useful) left to do
    FAILED = "failed"  # used by callers that catch the error


@dataclass(frozen=True)
class ItemResult:
    kind: str
    outcome: Outcome
    detail: str
    seconds: float
    snapshot_id: int | None = None  # the snapshot this item committed, if it committed one
    files_rewritten: int = 0
    files_added: int = 0
    expired_ids: tuple[int, ...] = ()
    deleted_paths: tuple[str, ...] = ()
    metadata_only: bool | None = None  # retention: no data file was rewritten
    extra: dict[str, Any] = field(default_factory=dict)


def kind_of(item: object) -> str:
    return type(item).__name__


def table_label(identifier: Sequence[str] | str) -> str:
    return identifier if isinstance(identifier, str) else ".".join(identifier)


def spark_table_name(catalog: CatalogConfig, identifier: Sequence[str] | str) -> str:
    parts = identifier.split(".") if isinstance(identifier, str) else list(identifier)
    return ".".join(_quote(p) for p in (catalog.name, *parts))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# Iceberg's RewriteFiles validation when a keyed batch deleted rows of the rewritten files after they were
# read ("Cannot commit, found new position delete for replaced data file: ...").
_DELETE_CONFLICT = re.compile(r"found new (position )?delete(s)? for replaced data file")


def is_delete_conflict(error: BaseException) -> bool:
    """True if `error` is a rewrite refused because rows of its input files were deleted meanwhile."""
    return _DELETE_CONFLICT.search(str(error)) is not None


def run_item(
    spark: SparkSession,
    catalog: CatalogConfig,
    identifier: Sequence[str] | str,
    item: WorkItem,
) -> ItemResult:
    """Run `item` on table `identifier` of `catalog` (module doc). Records metrics; raises on failure."""
    label = table_label(identifier)
    kind = kind_of(item)
    started = time.monotonic()
    try:
        if isinstance(item, CompactPartition):
            result = _compact(spark, catalog, identifier, item, started)
        elif isinstance(item, RewriteManifests):
            result = _rewrite_manifests(spark, catalog, identifier, item, started)
        elif isinstance(item, ExpireSnapshots):
            result = _expire(spark, catalog, identifier, item, started)
        elif isinstance(item, RemoveOrphans):
            result = _remove_orphans(catalog, identifier, item, started)
        elif isinstance(item, ApplyRetention):
            result = _retention(spark, catalog, identifier, item, started)
        elif isinstance(item, ApplyDeletes):
            result = _apply_deletes(spark, catalog, identifier, item, started)
        else:  # pragma: no cover - the union is closed
            raise TypeError(f"unknown work item {item!r}")
    except Exception:
        metrics.MAINTENANCE_ITEMS.labels(label, kind, Outcome.FAILED.value).inc()
        metrics.MAINTENANCE_ITEM_DURATION.labels(label, kind).observe(time.monotonic() - started)
        raise
    metrics.MAINTENANCE_ITEMS.labels(label, kind, result.outcome.value).inc()
    metrics.MAINTENANCE_ITEM_DURATION.labels(label, kind).observe(result.seconds)
    if result.outcome is Outcome.DONE:
        if isinstance(item, CompactPartition | ApplyDeletes):
            metrics.COMPACTION_FILES_REWRITTEN.labels(label).inc(result.files_rewritten)
            metrics.COMPACTION_FILES_ADDED.labels(label).inc(result.files_added)
            metrics.COMPACTION_DELETE_FILES_REMOVED.labels(label).inc(result.extra["delete_files_removed"])
            metrics.LAST_COMPACTION.labels(label).set(time.time())
        elif isinstance(item, ExpireSnapshots):
            metrics.LAST_SNAPSHOT_EXPIRY.labels(label).set(time.time())
    log.info("%s: %s %s: %s (%.1fs)", label, kind, result.outcome.value, result.detail, result.seconds)
    return result


# --------------------------------------------------------------------------------------------- compaction


def _compact(
    spark: SparkSession,
    catalog: CatalogConfig,
    identifier: Sequence[str] | str,
    item: CompactPartition,
    started: float,
) -> ItemResult:
    jvm: Any = spark._jvm  # Py4J: the only door to Iceberg's Java API
    iceberg_spark = jvm.org.apache.iceberg.spark
    jtable = iceberg_spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession,
        spark_table_name(catalog, identifier),
    )
    return _compact_files(spark, jvm, jtable, item, started)


def _singleton(spark: SparkSession, loader: Any, class_name: str) -> Any:
    """`<class_name>.get()`, the class loaded with `loader`. Py4J's `jvm.a.b.C` resolves names with the
    calling Java thread's context class loader, which does not always see the jars Spark added after start
    (seen in tests: `SparkTableCache.get does not exist in the JVM` right after `Spark3Util` resolved);
    `Class.forName` with the Iceberg runtime's own loader does, and says why when it cannot."""
    jvm: Any = spark._jvm
    gateway: Any = spark.sparkContext._gateway
    cls = jvm.java.lang.Class.forName(class_name, True, loader)
    no_types = gateway.new_array(jvm.java.lang.Class, 0)
    return cls.getMethod("get", no_types).invoke(None, gateway.new_array(jvm.java.lang.Object, 0))


@dataclass(frozen=True)
class _Rewrite:
    """One rewrite of data files: which, into files of which size, and when it is worth doing."""

    kind: str  # the work item's, for the result
    files: frozenset[str]
    spec_id: int
    target_size_bytes: int
    partition: PartitionValue
    min_files: int  # fewer of the planned files still live (and due): skipped
    only_with_deletes: bool  # rewrite only the planned files that still have position deletes


def _compact_files(
    spark: SparkSession, jvm: Any, jtable: Any, item: CompactPartition, started: float
) -> ItemResult:
    rewrite = _Rewrite(
        kind_of(item),
        frozenset(item.files),
        item.spec_id,
        item.target_size_bytes,
        item.partition,
        min_files=2,  # one file alone gains nothing from compaction
        only_with_deletes=False,
    )
    return _rewrite_data_files(spark, jvm, jtable, rewrite, started)


def _apply_deletes(
    spark: SparkSession,
    catalog: CatalogConfig,
    identifier: Sequence[str] | str,
    item: ApplyDeletes,
    started: float,
) -> ItemResult:
    jvm: Any = spark._jvm
    jtable = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, spark_table_name(catalog, identifier)
    )
    rewrite = _Rewrite(
        kind_of(item),
        frozenset(item.data_files),
        item.spec_id,
        item.target_size_bytes,
        item.partition,
        min_files=1,  # one file with deletes is worth rewriting without them
        only_with_deletes=True,
    )
    return _rewrite_data_files(spark, jvm, jtable, rewrite, started)


@dataclass
class _Inputs:
    """The scan tasks of `main`'s head a rewrite reads, and the position delete files it makes dangling."""

    tasks: Any  # java.util.ArrayList of the chosen files' FileScanTasks
    files: Any  # java.util.HashSet of their DataFiles
    paths: list[str]
    dangling_deletes: list[Any]  # DeleteFiles that apply to chosen files only


def _choose_inputs(jvm: Any, jtable: Any, snapshot_id: int, rewrite: _Rewrite) -> _Inputs:
    """The planned files still live at `snapshot_id` (with deletes, if `only_with_deletes`), and the position
    delete files that apply to no other live data file: once those files are rewritten, nothing reads them."""
    position_deletes = jvm.org.apache.iceberg.FileContent.POSITION_DELETES
    inputs = _Inputs(jvm.java.util.ArrayList(), jvm.java.util.HashSet(), [], [])
    chosen_deletes: dict[str, Any] = {}
    needed_elsewhere: set[str] = set()
    planned = jtable.newScan().useSnapshot(snapshot_id).planFiles()
    try:
        iterator = planned.iterator()
        while iterator.hasNext():
            task = iterator.next()
            deletes = {str(d.location()): d for d in task.deletes() if d.content().equals(position_deletes)}
            path = canonical_path(str(task.file().location()))
            chosen = (
                path in rewrite.files
                and task.spec().specId() == rewrite.spec_id
                and (bool(deletes) or not rewrite.only_with_deletes)
            )
            if chosen:
                inputs.tasks.add(task)
                inputs.files.add(task.file())
                inputs.paths.append(path)
                chosen_deletes.update(deletes)
            else:
                needed_elsewhere |= deletes.keys()
    finally:
        planned.close()
    inputs.dangling_deletes = [d for p, d in sorted(chosen_deletes.items()) if p not in needed_elsewhere]
    return inputs


def _rewrite_data_files(
    spark: SparkSession, jvm: Any, jtable: Any, rewrite: _Rewrite, started: float
) -> ItemResult:
    """Rewrite the chosen files (module doc) and drop the position delete files left dangling: one commit."""
    start = jtable.currentSnapshot()
    if start is None:
        return ItemResult(
            rewrite.kind, Outcome.SKIPPED, "the table has no snapshot", time.monotonic() - started
        )
    inputs = _choose_inputs(jvm, jtable, start.snapshotId(), rewrite)
    if len(inputs.paths) < rewrite.min_files:
        return _too_few_live(rewrite, inputs, started)
    with _task_set(spark, jtable, inputs.tasks) as (group, coordinator):
        _read_and_write(spark, group, rewrite)
        outputs = coordinator.fetchNewFiles(jtable, group)
        # Written, not committed: a crash here leaves only orphans.
        failpoint("main.mid-rewrite")
        _commit_rewrite(jtable, start, inputs, outputs)
    return _rewritten(rewrite, inputs, outputs, jtable.currentSnapshot(), started)


def _too_few_live(rewrite: _Rewrite, inputs: _Inputs, started: float) -> ItemResult:
    due = " with deletes" if rewrite.only_with_deletes else ""
    return ItemResult(
        rewrite.kind,
        Outcome.SKIPPED,
        f"{len(inputs.paths)} of {len(rewrite.files)} planned files still live{due}: nothing to rewrite",
        time.monotonic() - started,
    )


@contextmanager
def _task_set(spark: SparkSession, jtable: Any, tasks: Any) -> Iterator[tuple[str, Any]]:
    """Stage `tasks` as a scan task set Spark reads and writes by a group id; yield the id and the
    `FileRewriteCoordinator` that collects the files written for it; forget all of it afterwards."""
    group = str(uuid.uuid4())
    loader = jtable.getClass().getClassLoader()
    table_cache = _singleton(spark, loader, "org.apache.iceberg.spark.SparkTableCache")
    task_sets = _singleton(spark, loader, "org.apache.iceberg.spark.ScanTaskSetManager")
    coordinator = _singleton(spark, loader, "org.apache.iceberg.spark.FileRewriteCoordinator")
    try:
        table_cache.add(group, jtable)
        task_sets.stageTasks(jtable, group, tasks)
        yield group, coordinator
    finally:
        table_cache.remove(group)
        task_sets.removeTasks(jtable, group)
        coordinator.clearRewrite(jtable, group)


def _read_and_write(spark: SparkSession, group: str, rewrite: _Rewrite) -> None:
    """Read the task set `group` and write it again in files of the target size (written, not committed)."""
    target = str(rewrite.target_size_bytes)
    frame = (
        spark.read.format("iceberg")
        .option("split-size", target)  # pack the inputs into splits of the target size
        .option("file-open-cost", "0")
        .load(group)
    )
    (
        frame.write.format("iceberg")
        .option("target-file-size-bytes", target)
        .option("distribution-mode", "none")
        .option("output-spec-id", str(rewrite.spec_id))
        .mode("append")
        .save(group)
    )


def _commit_rewrite(jtable: Any, start: Any, inputs: _Inputs, outputs: Any) -> None:
    """One `RewriteFiles` commit: the inputs and the dangling delete files out, `outputs` in, validated from
    `start` (the snapshot the inputs were read at)."""
    commit = (
        jtable.newRewrite()
        .validateFromSnapshot(start.snapshotId())
        .dataSequenceNumber(start.sequenceNumber())  # deletes committed later still apply
    )
    for data_file in inputs.files:
        commit.deleteFile(data_file)
    for data_file in outputs:
        commit.addFile(data_file)
    for delete_file in inputs.dangling_deletes:
        commit.deleteFile(delete_file)
    commit.commit()


def _rewritten(
    rewrite: _Rewrite, inputs: _Inputs, outputs: Any, committed: Any, started: float
) -> ItemResult:
    dropped = len(inputs.dangling_deletes)
    return ItemResult(
        rewrite.kind,
        Outcome.DONE,
        f"{len(inputs.paths)} files of partition {rewrite.partition!r} into {outputs.size()}, "
        f"{dropped} position delete files dropped",
        time.monotonic() - started,
        snapshot_id=int(committed.snapshotId()) if committed is not None else None,
        files_rewritten=len(inputs.paths),
        files_added=int(outputs.size()),
        extra={"delete_files_removed": dropped},
    )


# ------------------------------------------------------------------------------------- procedures and SQL


def _call(spark: SparkSession, catalog: CatalogConfig, procedure: str, arguments: str) -> list[Any]:
    return spark.sql(f"CALL {_quote(catalog.name)}.system.{procedure}({arguments})").collect()


def _procedure_table(catalog: CatalogConfig, identifier: Sequence[str] | str) -> str:
    """The `table => '...'` argument: catalog, namespace and table, as a SQL string literal. (Without the
    catalog, Iceberg first tries the namespace as a catalog name and logs a CatalogNotFoundException.)"""
    return _string(spark_table_name(catalog, identifier))


def _string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _timestamp(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)
    return f"TIMESTAMP '{moment.isoformat(sep=' ', timespec='milliseconds')}'"  # session time zone is UTC


def _rewrite_manifests(
    spark: SparkSession,
    catalog: CatalogConfig,
    identifier: Sequence[str] | str,
    item: RewriteManifests,
    started: float,
) -> ItemResult:
    rows = _call(spark, catalog, "rewrite_manifests", f"table => {_procedure_table(catalog, identifier)}")
    rewritten, added = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
    return ItemResult(
        kind_of(item),
        Outcome.DONE if rewritten else Outcome.SKIPPED,
        f"{rewritten} manifests into {added}",
        time.monotonic() - started,
        extra={"rewritten_manifests": rewritten, "added_manifests": added},
    )


def _expire(
    spark: SparkSession,
    catalog: CatalogConfig,
    identifier: Sequence[str] | str,
    item: ExpireSnapshots,
    started: float,
) -> ItemResult:
    table = catalog.pyiceberg().load_table(_tuple(identifier))
    existing = {s.snapshot_id for s in table.metadata.snapshots}
    ids = [i for i in item.expire_ids if i in existing]
    if not ids:
        return ItemResult(
            kind_of(item), Outcome.SKIPPED, "the planned snapshots are gone", time.monotonic() - started
        )
    arguments = ", ".join(
        (
            f"table => {_procedure_table(catalog, identifier)}",
            f"older_than => {_timestamp(item.older_than_ms)}",
            f"retain_last => {item.retain_last}",
            "snapshot_ids => array(" + ", ".join(f"{i}L" for i in ids) + ")",
        )
    )
    failpoint("main.before-expire")
    rows = _call(spark, catalog, "expire_snapshots", arguments)
    after = {s.snapshot_id for s in catalog.pyiceberg().load_table(_tuple(identifier)).metadata.snapshots}
    expired = tuple(sorted(existing - after))
    deleted_files = sum(int(v) for v in rows[0]) if rows else 0
    return ItemResult(
        kind_of(item),
        Outcome.DONE,
        f"{len(expired)} snapshots expired, {deleted_files} files deleted",
        time.monotonic() - started,
        expired_ids=expired,
        extra={"deleted_files": deleted_files},
    )


def _retention(
    spark: SparkSession,
    catalog: CatalogConfig,
    identifier: Sequence[str] | str,
    item: ApplyRetention,
    started: float,
) -> ItemResult:
    from pyiceberg.types import DateType, TimestampType

    table = catalog.pyiceberg().load_table(_tuple(identifier))
    before = table.metadata.current_snapshot_id
    column_type = table.schema().find_field(item.source_column).field_type
    if isinstance(column_type, DateType):
        day = datetime.fromtimestamp(item.delete_before_ms / 1000, tz=UTC).date()
        bound = f"DATE '{day.isoformat()}'"
    elif isinstance(column_type, TimestampType):  # without zone: Spark's TIMESTAMP_NTZ
        bound = "TIMESTAMP_NTZ" + _timestamp(item.delete_before_ms).removeprefix("TIMESTAMP")
    else:
        bound = _timestamp(item.delete_before_ms)
    column = ".".join(_quote(p) for p in item.source_column.split("."))
    spark.sql(f"DELETE FROM {spark_table_name(catalog, identifier)} WHERE {column} < {bound}")
    snapshot = catalog.pyiceberg().load_table(_tuple(identifier)).current_snapshot()
    if snapshot is None or snapshot.snapshot_id == before:
        return ItemResult(kind_of(item), Outcome.SKIPPED, "nothing to delete", time.monotonic() - started)
    summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    metadata_only = int(summary.get("added-data-files", "0")) == 0 and (
        int(summary.get("added-delete-files", "0")) == 0
    )
    return ItemResult(
        kind_of(item),
        Outcome.DONE,
        f"{summary.get('deleted-data-files', '0')} files ({summary.get('deleted-records', '0')} rows) "
        f"before {bound} dropped",
        time.monotonic() - started,
        snapshot_id=snapshot.snapshot_id,
        metadata_only=metadata_only,
    )


# ------------------------------------------------------------------------------------------------ orphans


def _remove_orphans(
    catalog: CatalogConfig, identifier: Sequence[str] | str, item: RemoveOrphans, started: float
) -> ItemResult:
    table = catalog.pyiceberg().load_table(_tuple(identifier))
    fresh = read_table_view(table, list_storage=False)
    referenced = (
        set(fresh.referenced_paths) | {f.path for f in fresh.files} | {m.path for m in fresh.manifests}
    )
    deleted: list[str] = []
    kept: list[str] = []
    for path in item.paths:
        if path in referenced:
            kept.append(path)
            continue
        failpoint("main.before-orphan-delete")
        if _delete_if_older(path, item.older_than_ms, table.io):
            deleted.append(path)
        else:
            kept.append(path)
    return ItemResult(
        kind_of(item),
        Outcome.DONE if deleted else Outcome.SKIPPED,
        f"{len(deleted)} orphan files deleted, {len(kept)} kept (referenced again, newer or gone)",
        time.monotonic() - started,
        deleted_paths=tuple(deleted),
    )


def _delete_if_older(path: str, older_than_ms: int, io: Any = None) -> bool:
    """Delete `path` if it still exists and was last modified before `older_than_ms`."""
    local = to_local_path(path)
    if local is not None:
        try:
            if os.stat(local).st_mtime_ns // 1_000_000 >= older_than_ms:
                return False
            os.remove(local)
        except FileNotFoundError:
            return False
        return True
    from pyarrow import fs

    filesystem, inner = filesystem_for(path, io)
    info = filesystem.get_file_info(inner)
    if info.type != fs.FileType.File or (info.mtime_ns or 0) // 1_000_000 >= older_than_ms:
        return False
    filesystem.delete_file(inner)
    return True


def _tuple(identifier: Sequence[str] | str) -> tuple[str, ...]:
    return tuple(identifier.split(".")) if isinstance(identifier, str) else tuple(identifier)
