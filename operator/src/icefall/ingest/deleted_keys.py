"""Deleted keys a cdc table with `spec.sequenceBy` remembers, so that a late older change stays deleted.

A row keeps its change's position (`_sequence`), so a stale update or delete of a row that is there is
skipped by the MERGE. A deleted key has no row to keep it: a change older than the delete, arriving in a
later batch (sent again after a connector restart, or from a partition read behind), would insert it
again. So each batch remembers the keys whose last change was a delete, with the delete's position, for
`spec.rememberDeletesSeconds` after it was ingested, and drops every change older than a remembered delete.

The keys live in one small Parquet file (`KEY`: the key as Spark's `to_json` of the key columns,
`_sequence`, `deleted_at_ms`) in the table's metadata folder, written through the table's FileIO before the
commit; the commit names it in the `icefall.deleted-keys` property in the same compare-and-swap as the
offsets, so it is exactly the set the committed offsets left, and a batch that fails leaves only an
unreferenced file (removed as an orphan; maintenance keeps the named one, `icefall.compact.view`). What
the batch changes is gathered by an observation on the MERGE's own input (`Remembering`): no second pass
over the batch. Each batch with deletes, or with remembered keys, writes the whole set again: its size is
the deletes of the window (tens of bytes per key).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from icefall.decode.columns import DELETE_COLUMN, SEQUENCE_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, Observation, SparkSession

KEY = "key"  # the key columns as JSON text (Spark's to_json of their struct): one type for any key
DELETED_AT = "deleted_at_ms"
_KEY = "__icefall_deleted_key"
_REMEMBERED = "__icefall_deleted_sequence"


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


class Remembering:
    """One batch: `filter` its last changes per key against the remembered deletes (the MERGE's input),
    then, once the MERGE ran, `kept` tells the deleted keys to remember after it (None: as they were)."""

    def __init__(self, remembered: pa.Table | None, *, now_ms: int, keep_ms: int) -> None:
        import pyarrow.compute as pc

        self.now_ms = now_ms
        self.remembered = remembered
        self.known = None
        if remembered is not None:
            self.known = remembered.filter(pc.greater_equal(remembered[DELETED_AT], now_ms - keep_ms))
        self._observation: Observation | None = None

    def filter(self, spark: SparkSession, last: DataFrame, key: Sequence[str]) -> DataFrame:
        """`last` (the batch's last change per key, with `SEQUENCE_COLUMN`) without the changes older than a
        remembered delete of their key (a change without a position, a tombstone, is never newer). The
        result carries an observation: run the MERGE on it (once), then call `kept`."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        sequence, delete = F.col(SEQUENCE_COLUMN), F.col(DELETE_COLUMN)
        changes = last.select("*", F.to_json(F.struct(*key)).alias(_KEY))
        remembered = F.lit(None).cast("array<string>")
        if self.known is not None and self.known.num_rows:
            known = spark.createDataFrame(self.known.select([KEY, SEQUENCE_COLUMN]))
            changes = changes.join(
                known.select(F.col(KEY).alias(_KEY), F.col(SEQUENCE_COLUMN).alias(_REMEMBERED)), _KEY, "left"
            )
            remembered = F.col(_REMEMBERED)
            older = remembered.isNotNull() & F.coalesce(sequence < remembered, F.lit(True))
            changes = changes.where(~older)
        self._observation = Observation()
        observed = changes.observe(
            self._observation,
            F.collect_list(F.when(remembered.isNotNull(), F.col(_KEY))).alias("changed"),
            F.collect_list(
                F.when(delete & sequence.isNotNull(), F.struct(F.col(_KEY).alias(KEY), sequence))
            ).alias("deleted"),
        )
        return observed.drop(_KEY, _REMEMBERED)

    def kept(self) -> pa.Table | None:
        """The deleted keys to remember after the batch: the remembered ones, still inside the window, that
        the batch did not change, and the keys whose last change now is a delete (remembered from now). A
        key the batch wrote again is forgotten: its row's `_sequence` guards it from then on. None when
        that is the set remembered before (nothing to write)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        assert self._observation is not None, "filter first, then run the MERGE"
        seen = self._observation.get
        deleted = [(row[KEY], list(row[SEQUENCE_COLUMN])) for row in seen["deleted"]]
        fresh = pa.table(
            {
                KEY: pa.array([k for k, _ in deleted], pa.string()),
                SEQUENCE_COLUMN: pa.array([s for _, s in deleted], pa.list_(pa.string())),
                DELETED_AT: pa.array([self.now_ms] * len(deleted), pa.int64()),
            }
        )
        if self.known is None or self.remembered is None:
            return fresh if fresh.num_rows else None
        changed = pa.array(seen["changed"], pa.string())
        unchanged = self.known.filter(pc.invert(pc.is_in(self.known[KEY], value_set=changed)))
        if not fresh.num_rows and unchanged.num_rows == self.remembered.num_rows:
            return None
        return pa.concat_tables([unchanged.select(fresh.column_names).cast(fresh.schema), fresh])
