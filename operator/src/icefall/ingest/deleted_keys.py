"""Deleted keys a cdc table with `spec.sequenceBy` remembers, so that a late older change stays deleted.

A row keeps its change's position (`_sequence`), so a stale update or delete of a row that is there is
skipped by the MERGE. A deleted key has no row to keep it: a change older than the delete, arriving in a
later batch (sent again after a connector restart, or from a partition read behind), would insert it
again. So each batch remembers the keys whose last change was a delete, with the delete's position, for
`spec.rememberDeletesSeconds` after it was ingested, and drops every change older than a remembered delete.

The keys live in one small Parquet file (key columns, `_sequence`, `deleted_at_ms`) in the table's
metadata folder, written through the table's FileIO before the commit; the commit names it in the
`icefall.deleted-keys` property in the same compare-and-swap as the offsets, so it is exactly the set the
committed offsets left, and a batch that fails leaves only an unreferenced file (removed as an orphan;
maintenance keeps the named one, `icefall.compact.view`). Each batch with deletes, or with remembered keys,
writes the whole set again: its size is the deletes of the window (about 1 MB per 30,000 keys).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from icefall.ingest.decode import DELETE_COLUMN, SEQUENCE_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

DELETED_AT = "deleted_at_ms"
_REMEMBERED_SEQUENCE = "__icefall_deleted_sequence"


def load(table: Table, path: str | None) -> pa.Table | None:
    """The deleted keys the committed state names (`CommittedState.deleted_keys`); None when it names none."""
    if not path:
        return None
    import pyarrow.parquet as pq

    with table.io.new_input(path).open() as f:
        return pq.read_table(f)


def store(table: Table, keys: pa.Table) -> str:
    """Write `keys` to a new file in the table's metadata folder; its path, for the commit to name."""
    import pyarrow.parquet as pq

    path = f"{table.location().rstrip('/')}/metadata/icefall-deleted-keys-{uuid.uuid4()}.parquet"
    with table.io.new_output(path).create(overwrite=False) as f:
        pq.write_table(keys, f)
    return path


def apply(
    spark: SparkSession,
    last: DataFrame,
    remembered: pa.Table | None,
    key: Sequence[str],
    *,
    now_ms: int,
    keep_ms: int,
) -> tuple[DataFrame, DataFrame]:
    """`(changes, kept)`: the batch's last changes per key (`last`, with `SEQUENCE_COLUMN`) without those
    older than a remembered delete of their key, and the deleted keys to remember after this batch.

    Kept: the remembered keys not yet `keep_ms` old that the batch did not change, and the keys whose last
    change now is a delete (with its position, remembered from `now_ms`). A key the batch changes with a
    newer write is forgotten: its row's `_sequence` guards it from then on.
    """
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    sequence = F.col(SEQUENCE_COLUMN)

    def deletes(changes: DataFrame) -> DataFrame:
        return changes.where(F.col(DELETE_COLUMN) & sequence.isNotNull()).select(
            *key, sequence, F.lit(now_ms).cast("long").alias(DELETED_AT)
        )

    if remembered is None or remembered.num_rows == 0:
        return last, deletes(last)
    known = spark.createDataFrame(remembered).where(F.col(DELETED_AT) >= now_ms - keep_ms)
    deleted_at = F.col(_REMEMBERED_SEQUENCE)
    # A change without a position (a tombstone) is never newer than a remembered delete.
    older = deleted_at.isNotNull() & F.coalesce(sequence < deleted_at, F.lit(True))
    changes = (
        last.join(known.select(*key, sequence.alias(_REMEMBERED_SEQUENCE)), list(key), "left")
        .where(~older)
        .drop(_REMEMBERED_SEQUENCE)
    )
    kept = known.join(changes.select(*key), list(key), "left_anti").unionByName(deletes(changes))
    return changes, kept
