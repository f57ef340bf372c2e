"""A keyed batch (`spec.mode` upsert or cdc) of a Delta table: Delta's own MERGE, committed by Icefall.

Icefall writes a Delta table's log entries itself (`icefall.commit.delta`), so that the batch's offsets
travel in the same commit as its rows. Spark's Delta MERGE commits on its own, and Delta's Scala API,
which could hand back a MERGE's actions uncommitted, does not load against this Spark. So the MERGE runs
on a shadow of the table: a staging folder whose `_delta_log` links the table's log up to the version
the batch was planned on, and whose other entries link the table's data and deletion-vector files. The
MERGE commits version V+1 in the shadow's log only; its new files (rows, deletion vectors) are real files
in the shadow folder. `ShadowMerge.apply` moves them into the table's folder (invisible until a log entry
names them) and returns the MERGE's `add` and `remove` actions; the batch's commit (`commit_batch`,
`merged=`) puts them in the table's version V+1 beside the offsets, or nothing (any other commit since V,
StaleHeadError: the batch is planned again).

The MERGE is the Iceberg path's (`icefall.ingest.writer.merge` on `icefall.ingest.decode.last_changes`):
the batch's last change per key by (sequence,) partition, offset; a delete (tombstone, cdc op d) removes
the key; with `spec.sequenceBy` a change older than the row's `_sequence` is skipped, and deleted keys are
remembered (`icefall.ingest.deleted_keys.Remembering`) in a Parquet file under `_icefall_deleted_keys`
that the commit names (`icefall.deleted-keys`). Replaced rows are marked in deletion vectors
(`delta.enableDeletionVectors`): no file is rewritten.

A batch that changes the table's schema (`icefall.catalog.delta_schema`: a new optional field) has the
shadow's V+1 change it first (a Metadata action only), the MERGE commits V+2 there, and the table's V+1
holds the new schema, the MERGE's actions and the offsets: one log entry, as for an append.

Not guaranteed / not done: object stores (links of the local file system); the shadow costs a link per
file of the table per batch (compaction keeps the count small).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefall.commit import StaleHeadError
from icefall.commit.delta import LOG_DIR, DeltaLog, DeltaSnapshot, protocol_after

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from icefall.api import StreamingTableSpec

DELETED_KEYS_DIR = "_icefall_deleted_keys"  # under the table's folder; `_` names are not table data
_LAST_CHECKPOINT = "_last_checkpoint"


def load_deleted_keys(root: Path, path: str | None) -> pa.Table | None:
    """The deleted keys file the committed state names (None: none). Only a file this writer stores
    (`store_deleted_keys`) is read: the path comes from the table's log, which is not trusted to name
    another file of the host."""
    if not path:
        return None
    import pyarrow.parquet as pq

    folder = (root / DELETED_KEYS_DIR).resolve()
    if Path(path).resolve().parent != folder:
        raise ValueError(
            f"the table's icefall.deleted-keys names {path}, outside {folder}: not read. Written by hand? "
            "Restore the value the last Icefall commit wrote"
        )
    return pq.read_table(path)


def store_deleted_keys(root: Path, keys: pa.Table) -> str:
    """Write `keys` to a new file under the table's folder; its path, for the commit to name."""
    import pyarrow.parquet as pq

    folder = root / DELETED_KEYS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4()}.parquet"
    pq.write_table(keys, path)
    return str(path)


@dataclass(frozen=True)
class Merged:
    """A MERGE's outcome: the `add` and `remove` actions its commit carries, and the rows it wrote."""

    actions: list[dict[str, Any]]
    written: int


class ShadowMerge:
    """One keyed batch's MERGE on a shadow of version `planned.version` of the table (module doc); with
    `schema_string` (the batch changes the table's schema) the shadow's version V+1 changes it first."""

    def __init__(
        self, log: DeltaLog, staging: Path, planned: DeltaSnapshot, *, schema_string: str | None = None
    ) -> None:
        self.log, self.planned = log, planned
        self.shadow = staging / f"merge-{uuid.uuid4().hex}"
        self.schema_string = schema_string
        self.merged_version = planned.version + (1 if schema_string is None else 2)

    def __enter__(self) -> ShadowMerge:
        self._link()
        if self.schema_string is not None:
            self._evolve(self.schema_string)
        return self

    def _evolve(self, schema_string: str) -> None:
        """The shadow's version V+1: only the new schema (and the protocol it needs), so the MERGE
        (V+2) writes the new columns. Never the table's: its V+1 carries the same Metadata change with
        the MERGE's actions (`commit_batch(schema_string=...)`)."""
        assert self.planned.metadata is not None
        actions: list[dict[str, Any]] = [
            {"metaData": {**self.planned.metadata, "schemaString": schema_string}}
        ]
        upgraded = protocol_after(self.planned.protocol, schema_string)
        actions += [{"protocol": upgraded}] if upgraded is not None else []
        text = "".join(json.dumps(a) + "\n" for a in actions)
        (self.shadow / LOG_DIR / f"{self.planned.version + 1:020d}.json").write_text(text, encoding="utf-8")

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.shadow, ignore_errors=True)  # links, and files not moved: never the table's

    def _link(self) -> None:
        root, version = self.log.root, self.planned.version
        (self.shadow / LOG_DIR).mkdir(parents=True)
        for entry in os.scandir(root):
            if not entry.name.startswith(("_", ".")):
                os.symlink(entry.path, self.shadow / entry.name)
        for entry in os.scandir(self.log.log_dir):
            number = entry.name.split(".", 1)[0]
            if entry.name == _LAST_CHECKPOINT:
                with open(entry.path, encoding="utf-8") as f:
                    if json.load(f).get("version", 0) > version:
                        raise StaleHeadError(f"a checkpoint newer than version {version} was written")
            elif not (number.isdigit() and int(number) <= version) or entry.name.startswith("."):
                continue
            os.symlink(entry.path, self.shadow / LOG_DIR / entry.name)

    def apply(self, spark: SparkSession, changes: DataFrame, key: Sequence[str], *, view: str) -> Merged:
        """MERGE `changes` (the batch's last change per key) into the shadow; its files moved into the
        table's folder; the `add` and `remove` actions to commit and the rows the MERGE wrote."""
        from icefall.ingest.writer import merge

        target = f"{view}_target"
        spark.read.format("delta").load(str(self.shadow)).createOrReplaceTempView(target)
        try:
            merge(changes, target, key, view=view)
        finally:
            spark.catalog.dropTempView(target)
            spark.catalog.dropTempView(view)
            jvm = spark.sparkContext._jvm
            if jvm is not None:  # the shadow's cached DeltaLog: never read again
                jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        made = self.shadow / LOG_DIR / f"{self.merged_version:020d}.json"
        actions = [json.loads(line) for line in made.read_text(encoding="utf-8").splitlines() if line]
        if any("metaData" in a or "protocol" in a for a in actions):
            raise RuntimeError("the MERGE changed the table's schema or protocol: not committed")
        self._move_new_files()
        kept = [a for a in actions if "add" in a or "remove" in a]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        metrics = info.get("operationMetrics") or {}
        return Merged(kept, _written(metrics))

    def _move_new_files(self) -> None:
        """The MERGE's new data and deletion-vector files into the table's folder (not yet named by its
        log), each touched now so VACUUM spares them until a commit names them (as `moved_into`)."""
        for entry in os.scandir(self.shadow):
            if entry.is_symlink() or not entry.is_file() or entry.name.startswith((".", "_")):
                continue
            target = self.log.root / entry.name
            os.rename(entry.path, target)
            os.utime(target)


def _written(metrics: Mapping[str, str]) -> int:
    return int(metrics.get("numTargetRowsInserted", 0)) + int(metrics.get("numTargetRowsUpdated", 0))


def merge_batch(
    spark: SparkSession,
    spec: StreamingTableSpec,
    shadow: ShadowMerge,
    rows: DataFrame,
    *,
    deleted_keys: str | None,
    view: str,
) -> tuple[Merged, str | None]:
    """MERGE the last change per key of a keyed batch's good `rows` on `shadow`: its outcome, and the
    deleted keys file the commit names (None: the committed one stays)."""
    import time

    from icefall.ingest.decode import last_changes
    from icefall.ingest.deleted_keys import Remembering

    key = list(spec.key or [])
    if not spec.sequence_by:
        return shadow.apply(spark, last_changes(rows, key), key, view=view), None
    remembering = Remembering(
        load_deleted_keys(shadow.log.root, deleted_keys),
        now_ms=int(time.time() * 1000),
        keep_ms=1000 * spec.deletes_remembered_seconds,
    )
    changes = remembering.filter(spark, last_changes(rows, key), key)
    merged = shadow.apply(spark, changes, key, view=view)
    kept = remembering.kept()
    return merged, None if kept is None else store_deleted_keys(shadow.log.root, kept)
