"""A route table's rows of a batch written as data files from the driver (pyiceberg), not by a Spark job of
its own; they land with the table's offsets in one catalog commit (`icefall.commit.files.commit_files`).

Why: a Spark append costs about half a CPU-second of driver and JVM work whatever its rows (planning, a
job, Iceberg's Spark commit of the branch): with 20 route tables that was 4x the CPU of one table
(`bench/results/routing.md`). `icefall.ingest.routes.Routing.write` collects every such route's rows of
the cached batch in ONE Spark job (Arrow), and each table's rows are then written here as Parquet files,
referenced by no snapshot until `Routing.commit` lands them: the snapshot, `main`'s move and the offsets
in one metadata commit, instead of an append to the staging branch and a second commit moving `main`.

Guarantees: only tables pyiceberg writes as Spark would (`arrow_writable`: no sort order, every partition
transform one pyiceberg applies) are written here; the others keep the Spark append. The files carry the
schema and partition spec they were written with: the commit refuses them if the table's have changed
since (the batch is written again). Not guaranteed: file sizes as Spark's (one file per partition value
per batch; compaction merges them).

Exactly once: this module writes files only; it never moves a ref nor sets `icefall.*`. Files of a batch
that never lands are referenced by nothing (orphan removal takes them).
Driver memory: `Routing` collects only batches `icefall.plan.routing.driver_collects` allows
(`spec.batch.maxCollectBytes`); larger ones keep the Spark append.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icefall.commit import WrittenFiles
from icefall.commit.pyiceberg_internals import write_data_files

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table


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


def write_rows(table: Table, rows: pa.Table) -> WrittenFiles:
    """`rows` (collected from Spark) written as `table`'s data files, with its current schema and partition
    spec (no files for no rows); nothing committed."""
    meta = table.metadata
    files = write_data_files(table, _as_table_rows(table, rows))
    return WrittenFiles(tuple(files), meta.current_schema_id, meta.default_spec_id)


def _as_table_rows(table: Table, rows: pa.Table) -> pa.Table:
    """`rows` in the table's Arrow schema (its column order, types and nullability: Spark's Arrow calls
    every field nullable, nested ones too, that the table may require)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    target = schema_to_pyarrow(table.schema(), include_field_ids=False)
    return rows.select(target.names).cast(target)
