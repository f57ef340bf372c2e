"""Upkeep of a Delta Lake table (`spec.table.format: delta`): OPTIMIZE, checkpoints, VACUUM, in `icefall run`.

`DeltaMaintenance` is a `Rounds` (`icefall.compact.runner`): `step()` reads the table (its log with
`icefall.commit.delta.DeltaLog`, its live files with Spark's Delta reader), plans with
`icefall.plan.delta_maintenance` and runs the first item due, with Delta Lake's own commands in the table's
Delta Spark session: OPTIMIZE (bin-packing to `spec.compaction.targetFileSizeBytes`; ZORDER BY
`spec.table.sortOrder` when one is given), a checkpoint with Delta's log cleanup
(`delta.logRetentionDuration`), VACUUM with RETAIN the spec's retention. The retention itself is written
into the table's properties by a metadata-only commit of ours (`icefall.commit.delta.set_properties`).
`EmbeddedMaintenance` runs the steps on a thread beside the batches, as for an Iceberg table.

Exactly once: the committed offsets are the `icefall.*` keys of the table's Metadata action, and none of
these commands writes one (OPTIMIZE's commit holds `remove`/`add` with dataChange false; a checkpoint keeps
the Metadata in force; VACUUM touches files only): the writer reads the same offsets after them, and a batch
planned before them is committed over them (`commit_batch`). The other way round, Delta refuses an OPTIMIZE
whose version a batch commit took (that commit changed the Metadata: MetadataChangedException); the step
fails, is counted and runs again next round — compaction waits, rows are never lost nor doubled. VACUUM
deletes only files no version within the retention names and older than it (at least 1 h: a batch's files,
in the folder before its commit names them, are touched when they move there).

`step(now_ms)` takes the clock for planning and for VACUUM's cut-off (files older than now_ms - retention),
so tests move time forward instead of waiting out the retention. Local tables only: a table on S3 gets the
compaction pods' own merge, checkpoints and VACUUM (`icefall.compact.delta_pods`), in the pods and in
`icefall run`. Not
done: work Leases (one `icefall run` per table holds its commit lease), the yield Lease against an OPTIMIZE
starved by back-to-back batches.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from icefall.commit.delta import DeltaLog, set_properties
from icefall.compact.runner import Rounds, StepResult, wall_clock_ms
from icefall.compact.worker import ItemResult, Outcome
from icefall.ingest.outages import log_failure
from icefall.plan.delta_maintenance import (
    Checkpoint,
    DeltaItem,
    DeltaPolicy,
    DeltaTableView,
    Optimize,
    SetRetention,
    Vacuum,
    plan_delta_maintenance,
)
from icefall.runtime import metrics
from icefall.spark.session import jvm_stopped

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000


def sql_path(location: str) -> str:
    """`location` as Delta's SQL names a table by its path: delta.`<path>` (backticks doubled)."""
    return "delta.`" + location.replace("`", "``") + "`"


class DeltaMaintenance(Rounds):
    """Plan and run the upkeep of one Delta table (module doc). `StepResult.item` stays None (the Iceberg
    items' type); what ran is `result.kind`."""

    def __init__(
        self,
        spark: SparkSession,
        location: str,
        policy: DeltaPolicy,
        *,
        label: str,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        # A session of its own (same SparkContext, its own SQL conf): Delta's OPTIMIZE and VACUUM name the
        # table by its path, SQL on paths the batches' session refuses (runSQLOnFiles, docs/security.md).
        # Only the statements of this module run in it, on the spec's location; Delta's Scala API
        # (io.delta.tables.DeltaTable) does not load against this Spark (Delta 4.1.0 needs a class 4.1.3
        # dropped).
        self.spark = spark.newSession()
        self.location, self.policy, self.label = location, policy, label
        self.log = DeltaLog(location)
        self.clock_ms = clock_ms
        self.last_vacuum_ms: int | None = None
        conf = self.spark.conf
        conf.set("spark.sql.runSQLOnFiles", "true")
        # Delta refuses a RETAIN below the table's own retention unless told; ours is the spec's (>= 1 h).
        conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        conf.set("spark.databricks.delta.optimize.maxFileSize", str(policy.target_file_size_bytes))
        small = int(policy.small_file_ratio * policy.target_file_size_bytes)
        conf.set("spark.databricks.delta.optimize.minFileSize", str(small))

    def view(self) -> DeltaTableView:
        self._forget_snapshots()
        snapshot = self.log.snapshot()
        sizes: tuple[int, ...] = ()
        partitions: tuple[str, ...] = ()
        if snapshot.exists:
            files = [
                unquote(urlparse(f).path)
                for f in self.spark.read.format("delta").load(self.location).inputFiles()
            ]
            sizes = tuple(os.stat(f).st_size for f in files)
            if snapshot.partition_columns:  # a file's partition is its folder
                partitions = tuple(os.path.dirname(f) for f in files)
        return DeltaTableView(
            snapshot.version, self.log.latest_checkpoint(), sizes, dict(snapshot.configuration), partitions
        )

    def plan(self, now_ms: int | None = None) -> tuple[DeltaItem, ...]:
        now = self.clock_ms() if now_ms is None else now_ms
        work = plan_delta_maintenance(
            self.view(), self.policy, now_ms=now, last_vacuum_ms=self.last_vacuum_ms
        )
        metrics.MAINTENANCE_BACKLOG.labels(self.label).set(len(work))
        return work

    def step(self, now_ms: int | None = None) -> StepResult:
        """One round: the first item due run. Errors of the item are returned, not raised."""
        now = self.clock_ms() if now_ms is None else now_ms
        work = self.plan(now)
        if not work:
            return StepResult(0, table=self.label)
        item = work[0]
        kind = type(item).__name__
        started = time.monotonic()
        try:
            result = self.run_item(item, now)
        except Exception as error:  # counted and logged; planned again next round
            metrics.MAINTENANCE_ITEMS.labels(self.label, kind, Outcome.FAILED.value).inc()
            if jvm_stopped(self.spark, error):
                return StepResult(len(work), error="Spark's JVM stopped", table=self.label)
            log_failure(log, error, "%s: %s failed", self.label, kind)
            return StepResult(len(work), error=f"{type(error).__name__}: {error}", table=self.label)
        result = replace(result, seconds=time.monotonic() - started)
        metrics.MAINTENANCE_ITEMS.labels(self.label, kind, result.outcome.value).inc()
        metrics.MAINTENANCE_ITEM_DURATION.labels(self.label, kind).observe(result.seconds)
        return StepResult(len(work), result=result, table=self.label)

    def run_item(self, item: DeltaItem, now_ms: int) -> ItemResult:
        kind = type(item).__name__
        if isinstance(item, SetRetention):
            version = set_properties(self.log, item.properties)
            detail = ", ".join(f"{k}={v}" for k, v in item.properties.items())
            return ItemResult(
                kind, Outcome.DONE if version is not None else Outcome.SKIPPED, detail, 0, version
            )
        if isinstance(item, Optimize):
            return self._optimize(item)
        if isinstance(item, Checkpoint):
            delta_log, none = self._jvm_log()
            delta_log.checkpointAndCleanUpDeltaLog(delta_log.update(False, none, none), none)
            return ItemResult(kind, Outcome.DONE, f"checkpoint at version {item.version}", 0, item.version)
        return self._vacuum(item, now_ms)

    def _optimize(self, item: Optimize) -> ItemResult:
        zorder = ", ".join("`" + c.replace("`", "``") + "`" for c in item.zorder_by)
        statement = f"OPTIMIZE {sql_path(self.location)}" + (f" ZORDER BY ({zorder})" if zorder else "")
        rows = self.spark.sql(statement).collect()
        found = rows[0]["metrics"] if rows else None
        removed = int(found["numFilesRemoved"]) if found is not None else 0
        added = int(found["numFilesAdded"]) if found is not None else 0
        detail = f"{removed} files into {added}" + (
            f", z-ordered by {', '.join(item.zorder_by)}" if item.zorder_by else ""
        )
        if removed:
            metrics.COMPACTION_FILES_REWRITTEN.labels(self.label).inc(removed)
            metrics.COMPACTION_FILES_ADDED.labels(self.label).inc(added)
            metrics.LAST_COMPACTION.labels(self.label).set(time.time())
        outcome = Outcome.DONE if removed else Outcome.SKIPPED
        return ItemResult("Optimize", outcome, detail, 0, self.log.latest_version(), removed, added)

    def _vacuum(self, item: Vacuum, now_ms: int) -> ItemResult:
        """VACUUM deleting what is older than `now_ms - retention` (Delta counts from its own clock: the
        RETAIN is shortened by how far `now_ms` is ahead of it)."""
        retain_ms = max(item.retention_ms - (now_ms - wall_clock_ms()), 0)
        before = _data_files(self.log.root)
        self.spark.sql(f"VACUUM {sql_path(self.location)} RETAIN {retain_ms / HOUR_MS:.6f} HOURS").collect()
        self.last_vacuum_ms = now_ms
        deleted = tuple(sorted(before - _data_files(self.log.root)))
        detail = f"{len(deleted)} files deleted (retention {item.retention_ms // 1000}s)"
        return ItemResult("Vacuum", Outcome.DONE, detail, 0, deleted_paths=deleted)

    def _forget_snapshots(self) -> None:
        """Drop Delta's cached table states: after a checkpoint this process wrote (ours, or the one Delta
        writes after each tenth commit) Delta 4.1.0 on Spark 4.1.3 cannot read the table from its cached
        state (NoSuchMethodError); a fresh state takes the checkpoint's schema from `_last_checkpoint`
        (`icefall.spark.session.DELTA_CHECKPOINT_SCHEMA`). The batches' session holds none to lose."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()

    def _jvm_log(self) -> tuple[Any, Any]:
        jvm = self.spark.sparkContext._jvm  # Delta has no SQL or Python API for a checkpoint
        assert jvm is not None
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            self.spark._jsparkSession,
            self.location,
        )
        return delta_log, jvm.scala.Option.empty()


def _data_files(root: os.PathLike[str] | str) -> set[str]:
    """The Parquet files under `root`, relative to it, outside hidden folders (`_delta_log`, staging)."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        found.update(os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".parquet"))
    return found
