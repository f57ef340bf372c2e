"""The compaction pods' upkeep of a Delta table in an object store (S3, GCS, Azure): Icefall's own OPTIMIZE
(bin-packing) and VACUUM (commit/DESIGN.md, "Compaction pods for Delta tables on S3"; compact/DESIGN.md).

`DeltaPodRunner.step()` replays the table's log (`icefall.commit.delta_files.LogFiles`, only the commits
since its last round), plans with `icefall.plan.delta_maintenance.plan_delta_pod_work` and runs the first
item whose work Lease it can claim (`delta_work_key`; a busy one is skipped), as the Iceberg runner does:

- `CompactFiles` (`merge`): the planned files still live and mergeable, of one Parquet schema (files from
  before and after a schema change are not mixed), are read one record batch at a time with pyarrow over
  the table's storage (S3 or local) and written into ONE local Parquet file, which is uploaded into the
  partition's folder; its row count must equal the inputs' (else nothing is committed). With a sort order
  (`spec.table.sortOrder`, `CompactFiles.zorder_by`) the rows are instead all read, ordered by their
  Z-value over the sort columns (`icefall.compact.zorder`) and written in row groups of
  `ZORDER_ROW_GROUP_ROWS`: memory is then the merge's rows (at most `targetFileSizeBytes` of Parquet,
  decoded), not one record batch. Then — after the
  failpoint `main.mid-rewrite`: written, not committed — `commit_rewrite` swaps the inputs for it with
  put-if-absent (removes and add with dataChange false, no Metadata action), re-checking on every version
  someone else took first that the inputs are still live. Failpoint `main.after-rewrite`: committed, not
  reported.
- `Vacuum`: deletes what `vacuum_deletions` selects of a listing of the table's folder against a fresh
  replay: files no version within the retention names, older than it.
- `SetRetention`: `icefall.commit.delta.set_properties` (a Metadata-only commit of ours that keeps the
  `icefall.*` keys).
- `Checkpoint`: the checkpoint of the round's replay (`icefall.commit.delta_checkpoint.write_checkpoint`,
  every `delta.checkpointInterval` versions), then Delta's log cleanup by `delta.logRetentionDuration`
  (`clean_up_log`). Neither commits: a checkpoint is a copy of a version's state, Metadata and offsets
  included, and cleanup deletes only log files a kept checkpoint stands for.

Exactly once: a merge never changes rows (its file is the inputs' rows, checked by count; the swap is one
log version or none), and it leaves the Metadata alone, so the writer's batch planned before it is
committed over it (`commit_batch`), and a batch that took the merge's version makes the merge re-check and
commit after it. A crash before the commit leaves an unnamed file (VACUUM's, later); after it, a merged
table. No Spark: the pod reads and writes Parquet with pyarrow.
Not done: merging files with deletion vectors (a keyed table's: such a file stays as it is; VACUUM keeps the
vectors' files, `LogFiles.vector_files`); Z-order across files (each
merge orders its own rows; Delta's OPTIMIZE ZORDER rewrites a whole partition into files of disjoint
Z-ranges).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from icefall.commit.delta import DeltaLog, set_properties
from icefall.commit.delta_checkpoint import checkpoint_refusal, clean_up_log, write_checkpoint
from icefall.commit.delta_files import LogFiles, RewriteConflictError, commit_rewrite, records_of
from icefall.commit.delta_stats import StatsColumns, delta_stats
from icefall.commit.lease import LeasePool
from icefall.compact.runner import LeaseFactory, Rounds, StepResult, claimed, wall_clock_ms
from icefall.compact.worker import ItemResult, Outcome
from icefall.ingest.outages import log_failure
from icefall.plan.delta_maintenance import (
    Checkpoint,
    CompactFiles,
    DeltaFile,
    DeltaFilesView,
    DeltaPodItem,
    DeltaPolicy,
    SetRetention,
    Vacuum,
    delta_work_key,
    partition_key,
    plan_delta_pod_work,
    vacuum_deletions,
)
from icefall.plan.leases import WORK_LEASE_SECONDS
from icefall.runtime import metrics
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    import pyarrow as pa

    from icefall.plan.names import TableLeases

log = logging.getLogger(__name__)


def files_view(files: LogFiles, configuration: Mapping[str, str]) -> DeltaFilesView:
    """What planning reads of a replay: the mergeable live files with their partitions."""
    found = tuple(
        DeltaFile(path, int(add.get("size") or 0), partition_key(add.get("partitionValues") or {}))
        for path, add in sorted(files.mergeable().items())
    )
    return DeltaFilesView(files.version, found, dict(configuration), files.newest_checkpoint)


class DeltaPodRunner(Rounds):
    """Plan and run the pods' upkeep of one Delta table (module doc)."""

    def __init__(
        self,
        location: str,
        policy: DeltaPolicy,
        leases: LeaseFactory,
        *,
        table_leases: TableLeases,
        label: str,
        clock_ms: Callable[[], int] = wall_clock_ms,
        lease_seconds: float = WORK_LEASE_SECONDS,
    ) -> None:
        self.spark = None  # type: ignore[assignment]  # no Spark: pyarrow reads and writes
        self.location, self.policy, self.label = location, policy, label
        self.log = DeltaLog(location)
        self.leases = LeasePool(leases)
        self.table_leases = table_leases
        self.clock_ms = clock_ms
        self.lease_seconds = lease_seconds
        self.files = LogFiles()
        self.last_vacuum_ms: int | None = None

    def plan(self, now_ms: int | None = None) -> tuple[DeltaPodItem, ...]:
        now = self.clock_ms() if now_ms is None else now_ms
        self.files = self.files.advance(self.log) if self.files.version >= 0 else LogFiles.read(self.log)
        work = plan_delta_pod_work(
            files_view(self.files, self.files.configuration),
            self.policy,
            now_ms=now,
            last_vacuum_ms=self.last_vacuum_ms,
        )
        if checkpoint_refusal(self.files.protocol) is not None:  # never due: it would fail every round
            work = tuple(item for item in work if not isinstance(item, Checkpoint))
        metrics.MAINTENANCE_BACKLOG.labels(self.label).set(len(work))
        return work

    def step(self, now_ms: int | None = None) -> StepResult:
        """One round: at most one item run (module doc). Errors of the item are returned, not raised."""
        now = self.clock_ms() if now_ms is None else now_ms
        work = self.plan(now)
        busy = 0
        for item in work:
            with claimed(
                self.leases(self.table_leases.work_for(delta_work_key(item))), self.lease_seconds
            ) as held:
                if not held:
                    busy += 1
                    continue
                try:
                    result = self._counted(item, now)
                except Exception as error:  # counted; planned again next round
                    log_failure(log, error, "%s: %s failed", self.label, type(item).__name__)
                    return StepResult(
                        len(work), item, error=f"{type(error).__name__}: {error}", busy=busy, table=self.label
                    )
            return StepResult(len(work), item, result=result, busy=busy, table=self.label)
        return StepResult(len(work), busy=busy, table=self.label)

    def _counted(self, item: DeltaPodItem, now_ms: int) -> ItemResult:
        kind = type(item).__name__
        started = time.monotonic()
        try:
            result = self.run_item(item, now_ms)
        except Exception:
            metrics.MAINTENANCE_ITEMS.labels(self.label, kind, Outcome.FAILED.value).inc()
            raise
        result = replace(result, seconds=time.monotonic() - started)
        metrics.MAINTENANCE_ITEMS.labels(self.label, kind, result.outcome.value).inc()
        metrics.MAINTENANCE_ITEM_DURATION.labels(self.label, kind).observe(result.seconds)
        if result.outcome is Outcome.DONE and isinstance(item, CompactFiles):
            metrics.COMPACTION_FILES_REWRITTEN.labels(self.label).inc(result.files_rewritten)
            metrics.COMPACTION_FILES_ADDED.labels(self.label).inc(result.files_added)
            metrics.LAST_COMPACTION.labels(self.label).set(time.time())
        log.info("%s: %s %s: %s", self.label, kind, result.outcome.value, result.detail)
        return result

    def run_item(self, item: DeltaPodItem, now_ms: int) -> ItemResult:
        if isinstance(item, SetRetention):
            version = set_properties(self.log, item.properties)
            detail = ", ".join(f"{k}={v}" for k, v in item.properties.items())
            outcome = Outcome.DONE if version is not None else Outcome.SKIPPED
            return ItemResult("SetRetention", outcome, detail, 0, version)
        if isinstance(item, CompactFiles):
            return merge(self.log, self.files, item)
        if isinstance(item, Checkpoint):
            return self._checkpoint(now_ms)
        return self._vacuum(item, now_ms)

    def _checkpoint(self, now_ms: int) -> ItemResult:
        """The checkpoint of this round's replay (at or after the planned version), then log cleanup."""
        written = write_checkpoint(self.log, self.files, now_ms)
        self.files.newest_checkpoint = written.version
        deleted = clean_up_log(self.log, self.files.configuration, now_ms)
        detail = (
            f"checkpoint at version {written.version} ({written.add_files} files, {written.size_bytes} bytes"
            f"{'' if written.created else ', written by another'}), {len(deleted)} log files cleaned up"
        )
        outcome = Outcome.DONE if written.created or deleted else Outcome.SKIPPED
        return ItemResult("Checkpoint", outcome, detail, 0, written.version)

    def _vacuum(self, item: Vacuum, now_ms: int) -> ItemResult:
        deleted = vacuum(self.log, item.retention_ms, now_ms)
        self.last_vacuum_ms = now_ms
        detail = f"{len(deleted)} files deleted (retention {item.retention_ms // 1000}s)"
        return ItemResult("Vacuum", Outcome.DONE, detail, 0, deleted_paths=deleted)


def vacuum(log_: DeltaLog, retention_ms: int, now_ms: int) -> tuple[str, ...]:
    """Delete the table's files no version within `retention_ms` of `now_ms` names and older than that
    (`vacuum_deletions`); the paths deleted. The listing comes first, the log after it: a file a commit
    names after the replay is newer than the cut-off (a batch's, a merge's) or was live in the replay."""
    cutoff = now_ms - retention_ms
    listed = log_.storage.list_tree()
    files = LogFiles.read(log_)
    doomed = vacuum_deletions(
        listed,
        [*(unquote(p) for p in files.live), *files.vector_files()],  # a keyed table's deletion vectors too
        {unquote(p): t for p, t in files.removed.items()} | files.removed_vectors,
        cutoff_ms=cutoff,
        partition_columns=files.partition_columns,
    )
    deleted = []
    for path in doomed:
        failpoint("main.before-orphan-delete")
        if log_.storage.delete(path):
            deleted.append(path)
    return tuple(deleted)


def merge(log_: DeltaLog, files: LogFiles, item: CompactFiles) -> ItemResult:
    """Merge the item's files that are still live into one (module doc); SKIPPED when fewer than two are
    left (of one schema), or when a commit in between removed one of them."""
    live = files.mergeable()
    inputs = [path for path in item.paths if path in live]
    filesystem, root = log_.storage.arrow()
    inputs = _one_schema(inputs, filesystem, root)
    if len(inputs) < 2:
        return ItemResult(
            "CompactFiles", Outcome.SKIPPED, f"{len(inputs)} of {len(item.paths)} planned files left", 0
        )
    adds = [live[p] for p in inputs]
    folder = unquote(inputs[0]).rpartition("/")[0]
    relative = f"{folder}/" if folder else ""
    relative += f"part-00000-{uuid.uuid4()}-c000.icefall-merge.snappy.parquet"
    with tempfile.TemporaryDirectory(prefix="icefall-merge-") as scratch:
        staged = Path(scratch) / "merged.parquet"
        if item.zorder_by:
            sort = parquet_names(item.zorder_by, files.metadata)
            records, zordered = _write_zordered(inputs, filesystem, root, staged, sort)
        else:
            records, zordered = _write_merged(inputs, filesystem, root, staged), ()
        expected = [records_of(a) for a in adds]
        if None not in expected and sum(e or 0 for e in expected) != records:
            raise RuntimeError(
                f"merged {records} rows, but the log says the inputs hold {sum(e or 0 for e in expected)}"
            )
        stats = merged_stats(staged, files.metadata)
        size = log_.storage.move_in(staged, relative)
    failpoint("main.mid-rewrite")  # written, not committed: an unnamed file
    added = {
        "path": quote(relative, safe="/="),
        "partitionValues": dict(adds[0].get("partitionValues") or {}),
        "size": size,
        "modificationTime": int(time.time() * 1000),
        "stats": stats,
    }
    try:
        version = commit_rewrite(log_, files, inputs, [added], zorder_by=zordered)
    except RewriteConflictError as conflict:
        return ItemResult("CompactFiles", Outcome.SKIPPED, str(conflict), 0)
    detail = f"{len(inputs)} files ({records} rows) of partition {item.partition!r} into 1, version {version}"
    detail += f", z-ordered by {', '.join(zordered)}" if zordered else ""
    return ItemResult("CompactFiles", Outcome.DONE, detail, 0, version, len(inputs), 1)


def merged_stats(staged: Path, metadata: Mapping[str, Any] | None) -> str:
    """The Delta statistics of the merged file `staged` (still local), for the table's indexed columns
    (`icefall.commit.delta_stats`): its footer, read before the upload."""
    import pyarrow.parquet as pq

    return delta_stats(pq.read_metadata(staged), StatsColumns.of(metadata))


def _one_schema(paths: list[str], filesystem: Any, root: str) -> list[str]:
    """The largest group of `paths` whose files share one Parquet schema (first in plan order on a tie)."""
    import pyarrow.parquet as pq

    groups: dict[str, list[str]] = {}
    for path in paths:
        schema = pq.read_schema(f"{root}/{unquote(path)}", filesystem=filesystem)
        groups.setdefault(schema.to_string(show_schema_metadata=False), []).append(path)
    return max(groups.values(), key=len, default=[])


def _write_merged(paths: list[str], filesystem: Any, root: str, out: Path) -> int:
    """Copy the rows of `paths` (one schema) into the Parquet file `out`, a record batch at a time (memory:
    one row group's worth); the rows written. Decimals as integers and timestamps in microseconds, as Spark
    writes them for Delta."""
    import pyarrow.parquet as pq

    records = 0
    writer: pq.ParquetWriter | None = None
    try:
        for path in paths:
            with (
                filesystem.open_input_file(f"{root}/{unquote(path)}")
                if filesystem
                else open(f"{root}/{unquote(path)}", "rb") as handle
            ):
                source = pq.ParquetFile(handle)
                schema: pa.Schema = source.schema_arrow.remove_metadata()
                if writer is None:
                    writer = pq.ParquetWriter(
                        out, schema, compression="snappy", store_decimal_as_integer=True,
                        coerce_timestamps="us",
                    )  # fmt: skip
                for batch in source.iter_batches():
                    writer.write_batch(batch.replace_schema_metadata(None))
                    records += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return records


#: Rows per row group of a Z-ordered merge: readers skip row groups by their Parquet min/max, so a file
#: cut finer lets a lookup on a sort column skip more of it (a few MB per group for typical rows).
ZORDER_ROW_GROUP_ROWS = 128 * 1024


def parquet_names(columns: Sequence[str], metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """The Parquet column of each of `columns` (top-level, by the table's name; Delta's names are
    case-insensitive): its column-mapping physical name when the table maps names, else the name."""
    found = dict(metadata or {})
    mapped = (found.get("configuration") or {}).get("delta.columnMapping.mode", "none") != "none"
    fields = json.loads(found.get("schemaString") or "{}").get("fields") or []
    physical = {
        str(f["name"]).lower(): (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f["name"])
        if mapped
        else f["name"]
        for f in fields
    }
    return {c: str(physical.get(c.lower(), c)) for c in columns}


def _write_zordered(
    paths: list[str], filesystem: Any, root: str, out: Path, sort: Mapping[str, str]
) -> tuple[int, tuple[str, ...]]:
    """Copy the rows of `paths` (one schema) into `out` in Z-order over the `sort` columns (name -> Parquet
    column; `icefall.compact.zorder`), in row groups of `ZORDER_ROW_GROUP_ROWS`; the rows written and the
    columns ordered by (those the files hold: a column added after them is all null in them). Memory: the
    merge's rows, decoded, plus one row group — the rows must all be in hand to be ordered; a merge reads
    at most `targetFileSizeBytes` of Parquet (`merge_bins`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from icefall.compact.zorder import zorder_indices

    parts = []
    for path in paths:
        with _opened(filesystem, f"{root}/{unquote(path)}") as handle:
            parts.append(pq.ParquetFile(handle).read().replace_schema_metadata(None))
    table = pa.concat_tables(parts)
    del parts
    used = tuple(name for name, column in sort.items() if column in table.column_names)
    order = zorder_indices([table.column(sort[name]) for name in used]) if used else None
    with pq.ParquetWriter(
        out, table.schema, compression="snappy", store_decimal_as_integer=True, coerce_timestamps="us"
    ) as writer:
        for start in range(0, table.num_rows, ZORDER_ROW_GROUP_ROWS):
            rows = (
                table.slice(start, ZORDER_ROW_GROUP_ROWS)
                if order is None
                else table.take(order.slice(start, ZORDER_ROW_GROUP_ROWS))
            )
            writer.write_table(rows)
    return table.num_rows, used


def _opened(filesystem: Any, path: str) -> Any:
    return filesystem.open_input_file(path) if filesystem else open(path, "rb")
