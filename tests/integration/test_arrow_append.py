"""A route table's rows appended from the driver (`icefall.ingest.arrow_append.append_rows`) keep the commit
protocol whole: the destination's offsets travel with its rows in one metadata commit.

Proves, on a real SQLite `SqlCatalog` with its files in a local folder (the embedded default): rows
written by `append_rows` are one snapshot on the stage's branch (parent the stage's base), invisible on
`main` and with the table's offsets unchanged until `commit_staged` moves `main` and sets the offsets in
the same metadata file; a second append to a branch already past its base is refused (StaleHeadError),
so a batch is never staged twice; and an unrelated commit to the table after the stage (a property set
through another handle) neither breaks the append nor the exactly-once result.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from icefall.commit import (
    Batch,
    StaleHeadError,
    commit_staged,
    prepare_stage,
    read_committed,
    stage_branch_name,
)
from icefall.commit.state import committed_at
from icefall.ingest.arrow_append import append_rows

pytestmark = pytest.mark.integration

TOPIC = "events"
#: The table's schema: the partition and offset are required, as an Icefall table's Kafka columns are.
SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("value", pa.string()),
    ]
)


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    (tmp_path / "warehouse").mkdir()
    props = {"uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": (tmp_path / "warehouse").as_uri()}
    catalog = load_catalog("icefall", type="sql", **props)
    catalog.create_namespace("lake")
    yield catalog
    catalog.purge_table("lake.route")


@pytest.fixture
def table(catalog: Catalog) -> Table:
    return catalog.create_table("lake.route", SCHEMA)


def collected(batch: Batch) -> pa.Table:
    """The batch's rows as Spark's `toArrow` hands them over: every field nullable, another column order,
    and the union's destination tag."""
    keys = [(p, o) for p in sorted(batch.start) for o in range(batch.start[p], batch.end[p])]
    return pa.table(
        {
            "value": [f"p{p}-o{o}" for p, o in keys],
            "__icefall_destination": pa.array([0] * len(keys), pa.int32()),
            "offset": pa.array([o for _, o in keys], pa.int64()),
            "partition": pa.array([p for p, _ in keys], pa.int32()),
        }
    )


def keys(table: Table) -> list[tuple[int, int]]:
    table.refresh()
    rows = table.scan().to_arrow().select(["partition", "offset"]).to_pylist()
    return sorted((r["partition"], r["offset"]) for r in rows)


def test_driver_appended_rows_land_with_their_offsets_in_one_commit(table: Table) -> None:
    landed: list[tuple[int, int]] = []
    for n, ends in enumerate(({0: 3, 1: 2}, {0: 5, 1: 4})):
        stage = prepare_stage(table, stage_branch_name("w", "stage"), role="route")
        start = {p: stage.base.offsets.get(p, 0) for p in ends}
        batch = Batch(TOPIC, start=start, end=ends, topic_id="id-events")
        append_rows(table, stage.branch, stage.base.snapshot_id, collected(batch))

        table.refresh()
        staged = table.metadata.snapshot_by_name(stage.branch)
        assert staged is not None and staged.parent_snapshot_id == stage.base.snapshot_id
        assert staged.summary is not None and staged.summary.operation.value == "append"
        # Staged, not committed: main and the offsets are where they were.
        assert keys(table) == landed
        assert read_committed(table).offsets == stage.base.offsets

        snapshot_id = commit_staged(table, stage, batch, epoch=1)
        assert snapshot_id == staged.snapshot_id
        landed += [(p, o) for p in ends for o in range(start[p], ends[p])]
        assert keys(table) == sorted(landed), f"batch {n}"
        # The metadata file that put the rows on main is the one that holds their offsets.
        assert committed_at(table, snapshot_id).offsets == ends
    assert len(landed) == len(set(landed)) == 9


def test_a_branch_already_past_its_base_is_not_appended_to_again(table: Table) -> None:
    stage = prepare_stage(table, stage_branch_name("w", "stage"), role="route")
    batch = Batch(TOPIC, start={0: 0}, end={0: 4}, topic_id="id-events")
    append_rows(table, stage.branch, stage.base.snapshot_id, collected(batch))
    with pytest.raises(StaleHeadError, match="no longer at"):
        append_rows(table, stage.branch, stage.base.snapshot_id, collected(batch))
    commit_staged(table, stage, batch, epoch=1)
    assert keys(table) == [(0, o) for o in range(4)]  # each record once


def test_an_unrelated_commit_after_the_stage_changes_nothing(catalog: Catalog, table: Table) -> None:
    stage = prepare_stage(table, stage_branch_name("w", "stage"), role="route")
    with catalog.load_table("lake.route").transaction() as tx:  # another handle: `table` is now stale
        tx.set_properties({"owner": "someone"})
    batch = Batch(TOPIC, start={0: 0, 1: 0}, end={0: 2, 1: 3}, topic_id="id-events")
    append_rows(table, stage.branch, stage.base.snapshot_id, collected(batch))
    commit_staged(table, stage, batch, epoch=1)
    assert keys(table) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert read_committed(table).offsets == {0: 2, 1: 3}
    assert table.properties["owner"] == "someone"
