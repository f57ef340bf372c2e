"""Appending a route table's rows of a batch to its staging branch from the driver (pyiceberg), not by a
Spark job of its own.

Why: a Spark append costs about half a CPU-second of driver and JVM work whatever its rows (planning, a
job, Iceberg's Spark commit of the branch): with 20 route tables that was 4x the CPU of one table
(`bench/results/routing.md`). `icefall.ingest.routes.Routing.write` collects every such route's rows of
the cached batch in ONE Spark job (Arrow), and each table's rows are then written here: Parquet files and
one snapshot on the table's staging branch, the same snapshot a Spark append makes there. The commit
protocol is unchanged: the branch is committed (or dropped) afterwards exactly as before.

Guarantees: only tables pyiceberg writes as Spark would (`arrow_writable`: no sort order, every partition
transform one pyiceberg applies) are written here; the others keep the Spark append. A refused snapshot
(maintenance committed meanwhile) is tried again from fresh metadata; the branch must still be at the
stage's base, else `StaleHeadError` (the batch is planned again). Not guaranteed: file sizes as Spark's
(one file per partition value per batch; compaction merges them).

Exactly once: this module writes the staging branch only, as Spark's append would (the writer's step of
`icefall.commit`); it never moves `main` nor sets `icefall.*`. The destination's offsets travel with its rows
in `Routing.commit`'s `commit_staged_outcome`, the one metadata commit that moves `main` to the staged
snapshot and sets the offsets; it refuses a branch holding more than one snapshot past the base.
Driver memory: `Routing` collects only batches `icefall.plan.routing.driver_collects` allows
(`spec.batch.maxCollectBytes`); larger ones keep the Spark append.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from icefall.commit import StaleHeadError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


def arrow_writable(table: Table) -> bool:
    """Whether pyiceberg writes `table`'s files as Spark's append would: unsorted, and every partition
    transform identity, a time transform or void (bucket and truncate stay with Spark)."""
    from pyiceberg.transforms import (
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        VoidTransform,
        YearTransform,
    )

    if not table.sort_order().is_unsorted:
        return False
    simple = (IdentityTransform, YearTransform, MonthTransform, DayTransform, HourTransform, VoidTransform)
    return all(isinstance(field.transform, simple) for field in table.spec().fields)


def append_rows(table: Table, branch: str, base: int | None, rows: pa.Table, attempts: int = 5) -> None:
    """Append `rows` to `branch` of `table` (the stage's branch, at `base`) as one snapshot."""
    from pyiceberg.exceptions import CommitFailedException

    rows = _as_table_rows(table, rows)
    for _ in range(attempts):
        table.refresh()
        ref = table.metadata.refs.get(branch)
        if ref is None or ref.snapshot_id != base:
            raise StaleHeadError(f"staging branch {branch} is no longer at {base}; planning again")
        try:
            table.append(rows, branch=branch)
            return
        except (CommitFailedException, ValueError) as e:
            if isinstance(e, ValueError) and "sequence" not in str(e).lower():
                raise  # not a race with another commit (e.g. rows the table cannot take)
            log.info("appending to %s was refused (%s); trying again", branch, e)
    raise StaleHeadError(f"appending to staging branch {branch} was refused {attempts} times; planning again")


def _as_table_rows(table: Table, rows: pa.Table) -> pa.Table:
    """`rows` in the table's Arrow schema (its column order, types and nullability: Spark's Arrow calls
    every field nullable, nested ones too, that the table may require)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    target = schema_to_pyarrow(table.schema(), include_field_ids=False)
    return rows.select(target.names).cast(target)
