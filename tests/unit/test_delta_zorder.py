"""Z-order values (`icefall.compact.zorder`) and the compaction pods' Z-ordered merge of a Delta table on a
local folder (`icefall.compact.delta_pods.merge` with `CompactFiles.zorder_by`), without Spark.

Proves: one column gives exactly the plain sort (nulls last, ties in input order, for numbers, strings,
timestamps, decimals, floats with NaN); the values are Morton codes of the ranks, and the order has the
Z-curve's locality (each quarter of a shuffled 8 x 8 grid is one quadrant, each sixteenth a 2 x 2 square);
a column with few values still splits its range at the top level; nulls rank last in their column; more
values than bits coarsen without reordering; a point lookup on either column reads fewer row runs than
in arrival order. A merge with a sort order writes the rows in Z-order (every row once), names the
columns in its commit (`zOrderBy`), skips a sort column the files lack, finds a column by its physical
name when the table maps names, and a merge without one keeps arrival order.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table
from icefall.commit.delta_files import LogFiles
from icefall.compact.delta_pods import merge, parquet_names
from icefall.compact.worker import Outcome
from icefall.compact.zorder import default_bits, zorder_indices, zorder_values
from icefall.plan.delta_maintenance import CompactFiles, DeltaFile, DeltaPolicy, merge_bins

pytestmark = pytest.mark.unit


def ordered(columns: list[pa.Array], **kwargs: int) -> list[int]:
    return zorder_indices(columns, **kwargs).to_pylist()


@pytest.mark.parametrize(
    "values",
    [
        [3, None, 1, 3, None, 2, -7, 3],
        ["b", "a", None, "ab", "b", ""],
        [datetime(2026, 1, d, tzinfo=UTC) if d else None for d in (2, 0, 1, 2, 3)],
        [Decimal("1.20"), Decimal("-3.00"), None, Decimal("1.20"), Decimal("0.01")],
        [1.5, float("nan"), None, -0.0, 0.0, -2.5],
        [True, None, False, True],
    ],
)
def test_one_column_is_the_plain_sort_nulls_last_ties_in_input_order(values: list[object]) -> None:
    column = pa.array(values)
    plain = pc.sort_indices(column, sort_keys=[("", "ascending", "at_end")]).to_pylist()  # stable
    assert ordered([column]) == plain


def test_the_values_are_morton_codes_of_the_ranks_first_column_leading() -> None:
    xs, ys = zip(*[(x, y) for x in range(4) for y in range(4)], strict=True)
    values = zorder_values([pa.array(xs), pa.array(ys)], bits=2).to_pylist()

    def morton(x: int, y: int) -> int:
        return sum(((x >> b) & 1) << (2 * b + 1) | ((y >> b) & 1) << (2 * b) for b in range(2))

    assert values == [morton(x, y) for x, y in zip(xs, ys, strict=True)]
    assert [default_bits(n) for n in (1, 2, 3, 100)] == [32, 32, 21, 1]


def test_the_order_keeps_neighbours_together_quadrants_then_squares() -> None:
    grid = [(x, y) for x in range(8) for y in range(8)]
    random.Random(7).shuffle(grid)
    order = ordered([pa.array([x for x, _ in grid]), pa.array([f"y{y}" for _, y in grid])])
    cells = [grid[i] for i in order]
    for size, side in ((16, 4), (4, 2)):
        for start in range(0, 64, size):
            block = cells[start : start + size]
            assert {x // side for x, _ in block} == {block[0][0] // side}
            assert {y // side for _, y in block} == {block[0][1] // side}


def test_a_column_with_few_values_splits_its_range_at_the_top_level() -> None:
    rows = [(a, b) for a in range(2) for b in range(64)]
    random.Random(1).shuffle(rows)
    order = ordered([pa.array([a for a, _ in rows]), pa.array([b for _, b in rows])])
    first_quarter = {rows[i] for i in order[:32]}
    assert first_quarter == {(0, b) for b in range(32)}  # not all of a=0 first: both columns halve


def test_nulls_rank_last_in_their_column_and_equal_rows_keep_input_order() -> None:
    xs = pa.array([None, 1, 0, None, 1, 0])
    ys = pa.array([0, 0, 0, 0, 0, 0])
    assert ordered([xs, ys]) == [2, 5, 1, 4, 0, 3]
    values = zorder_values([xs, ys]).to_pylist()
    assert values[0] == values[3] and values[1] == values[4] and values[2] == values[5]


def test_more_values_than_bits_coarsen_without_reordering() -> None:
    column = pa.array([9, 3, 7, 1, 8, 0, 2, 6, 5, 4])
    order = ordered([column], bits=2)  # 10 values in 4 buckets: neighbours share one
    got = [column[i].as_py() for i in order]
    assert [v // 4 for v in got] == sorted(v // 4 for v in got)
    assert ordered([column]) == pc.sort_indices(column).to_pylist()


def lookup_share(runs: list[list[tuple[int, int]]], column: int) -> float:
    """The mean share of runs a point lookup on `column` must read (its value inside the run's range)."""
    values = {row[column] for run in runs for row in run}
    spans = [(min(r[column] for r in run), max(r[column] for r in run)) for run in runs]
    return sum(sum(lo <= v <= hi for lo, hi in spans) for v in values) / (len(values) * len(runs))


def test_a_point_lookup_on_either_column_reads_fewer_runs_than_in_arrival_order() -> None:
    rows = [(i, i % 7) for i in range(400)]  # (id, customer) in arrival order
    order = ordered([pa.array([r[1] for r in rows]), pa.array([r[0] for r in rows])])
    zordered = [rows[i] for i in order]

    def share(runs: list[list[tuple[int, int]]]) -> float:
        return (lookup_share(runs, 0) + lookup_share(runs, 1)) / 2

    after = share([zordered[i * 25 : (i + 1) * 25] for i in range(16)])
    interleaved = share([rows[i::16] for i in range(16)])  # each file a round-robin share of the stream
    contiguous = share([rows[i * 25 : (i + 1) * 25] for i in range(16)])  # each file a stretch of it
    assert after < 0.5 * interleaved and after < 0.8 * contiguous, (after, interleaved, contiguous)


SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "customer", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
)


def table_of_slices(root: Path, count: int = 8, per_file: int = 25) -> DeltaLog:
    """A local Delta table of `count` files, each a round-robin slice of 200 rows (every file spans the
    whole range of both columns)."""
    log = DeltaLog(str(root))
    create_table(log, SCHEMA, epoch=1)
    total = count * per_file
    for i in range(count):
        ids = list(range(i, total, count))
        path = root / f"f{i}.parquet"
        customers = [None if n % 11 == 0 else f"c{n % 7}" for n in ids]
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "customer": customers}), path)
        add = AddFile(path.name, path.stat().st_size, len(ids))
        commit_batch(
            log,
            log.snapshot(),
            Batch(topic="t", start={0: i}, end={0: i + 1}, topic_id="tid", max_produce_time_ms=i + 1),
            1,
            [add],
        )
    return log


def merged_rows(log: DeltaLog) -> pa.Table:
    [path] = LogFiles.read(log).live
    return pq.read_table(Path(log.location) / path)


def test_a_merge_with_a_sort_order_writes_its_rows_in_z_order(tmp_path: Path) -> None:
    log = table_of_slices(tmp_path)
    files = LogFiles.read(log)
    policy = DeltaPolicy(target_file_size_bytes=2**20, min_files_to_compact=2, zorder_by=("customer", "id"))
    [item] = merge_bins([DeltaFile(p, a["size"]) for p, a in sorted(files.live.items())], policy)
    assert item.zorder_by == ("customer", "id")
    result = merge(log, files, item)
    assert result.outcome is Outcome.DONE and "z-ordered by customer, id" in result.detail
    rows = merged_rows(log)
    assert Counter(rows.column("id").to_pylist()) == Counter(range(200))
    values = zorder_values([rows.column("customer"), rows.column("id")]).to_pylist()
    assert values == sorted(values)  # the file's rows are in Z-order
    assert rows.column("customer").to_pylist()[-1] is None  # nulls last in their column, at the top bit
    [info] = [a["commitInfo"] for a in log.actions(log.latest_version()) if "commitInfo" in a]
    assert info["operation"] == "OPTIMIZE" and info["operationParameters"]["zOrderBy"] == '["customer","id"]'


def test_a_merge_skips_a_sort_column_the_files_lack_and_one_without_keeps_order(tmp_path: Path) -> None:
    log = table_of_slices(tmp_path / "a", count=3)
    files = LogFiles.read(log)
    paths = tuple(sorted(files.live))
    result = merge(log, files, CompactFiles("", paths, 0, zorder_by=("added_later", "id")))
    assert result.outcome is Outcome.DONE
    assert merged_rows(log).column("id").to_pylist() == list(range(75))  # by id alone: the plain sort

    log = table_of_slices(tmp_path / "b", count=3)
    files = LogFiles.read(log)
    result = merge(log, files, CompactFiles("", tuple(sorted(files.live)), 0))
    assert result.outcome is Outcome.DONE and "z-ordered" not in result.detail
    expected = [n for i in range(3) for n in range(i, 75, 3)]
    assert merged_rows(log).column("id").to_pylist() == expected  # bin-packing: the files one after another
    [info] = [a["commitInfo"] for a in log.actions(log.latest_version()) if "commitInfo" in a]
    assert info["operationParameters"]["zOrderBy"] == "[]"


def test_timestamps_order_by_instant() -> None:
    base = datetime(2026, 11, 29, tzinfo=UTC)
    stamps = pa.array([base + timedelta(seconds=s) for s in (5, -1, 3, 0)], pa.timestamp("us", tz="UTC"))
    assert ordered([stamps]) == [1, 3, 2, 0]


def test_sort_columns_are_found_by_their_physical_names_when_the_table_maps_names() -> None:
    field = {"name": "Customer", "type": "string", "nullable": True, "metadata": {}}
    mapped = {**field, "metadata": {"delta.columnMapping.physicalName": "col-1a2b"}}
    schema = {"type": "struct", "fields": [mapped]}
    metadata = {"schemaString": json.dumps(schema), "configuration": {"delta.columnMapping.mode": "name"}}
    assert parquet_names(["customer", "other"], metadata) == {"customer": "col-1a2b", "other": "other"}
    unmapped = {"schemaString": json.dumps(schema), "configuration": {}}
    assert parquet_names(["customer"], unmapped) == {"customer": "Customer"}
    assert parquet_names(["id"], None) == {"id": "id"}
