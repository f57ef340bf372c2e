"""A route table's rows written as files from the driver (`icefall.ingest.arrow_append.write_rows`) land
with the table's offsets in ONE catalog commit (`icefall.commit.files.commit_files`), exactly once.

Proves, on a real SQLite `SqlCatalog` with its files in a local folder (the embedded default): the written
files are referenced by nothing until the commit, which adds one snapshot on `main`'s head holding exactly
them, moves `main` and the writer's branch there and sets the offsets, in one new metadata file; a batch
that kept no row still moves `main` and its offsets (an empty snapshot); the same files cannot land twice
(StaleHeadError), nor after another writer's append, below the table's epoch, or from the wrong offset;
a maintenance commit in between (a delete) is landed on top of, once; an unrelated commit (a property)
changes nothing; files written with a schema the table no longer has are refused
(MaintenanceConflictError); a failure before the swap leaves the table as it was; a commit checked on
the metadata the writer's own last commit left (`loaded`) is refused by the catalog, and checked again on
fresh metadata, when the table changed since.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table
from pyiceberg.types import StringType

from icefall.commit import (
    Batch,
    FencedError,
    MaintenanceConflictError,
    OffsetGapError,
    Stage,
    StaleHeadError,
    WrittenFiles,
    claim_epoch,
    commit_files,
    commit_staged,
    prepare_stage,
    read_committed,
    reset_offsets,
    stage_branch_name,
)
from icefall.commit.state import committed_at
from icefall.ingest.arrow_append import write_rows
from icefall.runtime import failpoints

pytestmark = pytest.mark.integration

TOPIC = "events"
IDENTIFIER = "lake.route"
#: The table's schema: the partition and offset are required, as an Icefall table's Kafka columns are.
SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("value", pa.string()),
    ]
)
BRANCH = stage_branch_name("w", "stage")


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    (tmp_path / "warehouse").mkdir()
    props = {"uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": (tmp_path / "warehouse").as_uri()}
    catalog = load_catalog("icefall", type="sql", **props)
    catalog.create_namespace("lake")
    yield catalog
    catalog.purge_table(IDENTIFIER)


@pytest.fixture
def table(catalog: Catalog) -> Table:
    return catalog.create_table(IDENTIFIER, SCHEMA)


def collected(batch: Batch) -> pa.Table:
    """The batch's rows as Spark's `toArrow` hands them over: every field nullable, another column order."""
    keys = [(p, o) for p in sorted(batch.start) for o in range(batch.start[p], batch.end[p])]
    return pa.table(
        {
            "value": [f"p{p}-o{o}" for p, o in keys],
            "offset": pa.array([o for _, o in keys], pa.int64()),
            "partition": pa.array([p for p, _ in keys], pa.int32()),
        }
    )


def staged(table: Table, ends: dict[int, int]) -> tuple[Stage, Batch, WrittenFiles]:
    """The writer's stage, the batch after the table's offsets up to `ends`, and its rows written as files."""
    stage = prepare_stage(table, BRANCH, role="route")
    start = {p: stage.base.offsets.get(p, 0) for p in ends}
    batch = Batch(TOPIC, start=start, end=ends, topic_id="id-events")
    return stage, batch, write_rows(table, collected(batch))


def keys(table: Table) -> list[tuple[int, int]]:
    table.refresh()
    rows = table.scan().to_arrow().select(["partition", "offset"]).to_pylist()
    return sorted((r["partition"], r["offset"]) for r in rows)


def expected(ends: dict[int, int], since: dict[int, int] | None = None) -> list[tuple[int, int]]:
    return sorted((p, o) for p, end in ends.items() for o in range((since or {}).get(p, 0), end))


def test_the_files_land_with_their_offsets_in_one_metadata_commit(table: Table) -> None:
    for n, ends in enumerate(({0: 3, 1: 2}, {0: 5, 1: 4})):
        stage, batch, written = staged(table, ends)
        assert written.files and all(f.file_path.endswith(".parquet") for f in written.files)
        table.refresh()
        # Written, not committed: no snapshot, no ref and no offsets name them yet.
        assert table.metadata.refs[BRANCH].snapshot_id == stage.base.snapshot_id
        assert read_committed(table).offsets == stage.base.offsets
        versions = len(table.metadata.metadata_log)

        outcome = commit_files(table, stage, batch, 1, written)

        assert not outcome.restaged
        meta = table.refresh().metadata
        assert len(meta.metadata_log) == versions + 1, "one catalog commit, not an append and a swap"
        head = meta.snapshot_by_id(outcome.snapshot_id)
        assert head is not None and head.parent_snapshot_id == stage.base.snapshot_id
        assert head.summary is not None and head.summary.operation.value == "append"
        assert meta.refs[BRANCH].snapshot_id == outcome.snapshot_id  # where the next batch starts
        assert keys(table) == expected(ends), f"batch {n}"
        assert committed_at(table, outcome.snapshot_id).offsets == ends


def test_a_batch_that_kept_no_row_still_moves_main_and_its_offsets(table: Table) -> None:
    stage, batch, _ = staged(table, {0: 4})
    written = write_rows(table, collected(batch).slice(0, 0))
    assert written.files == ()
    outcome = commit_files(table, stage, batch, 1, written)
    assert table.refresh().metadata.current_snapshot_id == outcome.snapshot_id != stage.base.snapshot_id
    assert keys(table) == []
    assert read_committed(table).offsets == {0: 4}


def test_the_same_files_never_land_twice(table: Table) -> None:
    stage, batch, written = staged(table, {0: 4})
    commit_files(table, stage, batch, 1, written)
    with pytest.raises(StaleHeadError, match="appended rows"):
        commit_files(table, stage, batch, 1, written)
    assert keys(table) == expected({0: 4})


def test_another_writers_append_a_lower_epoch_or_a_wrong_start_is_refused(table: Table) -> None:
    stage, batch, written = staged(table, {0: 2})
    commit_files(table, stage, batch, 3, written)
    # A writer with an older epoch, even with a batch that starts right.
    stage, batch, written = staged(table, {0: 4})
    with pytest.raises(FencedError):
        commit_files(table, stage, batch, 2, written)
    # A batch that does not start at the committed offset.
    wrong = Batch(TOPIC, start={0: 1}, end={0: 4}, topic_id="id-events")
    with pytest.raises(OffsetGapError):
        commit_files(table, stage, wrong, 3, write_rows(table, collected(wrong)))
    # Another writer lands a batch between this one's stage and its commit.
    other = prepare_stage(table, stage_branch_name("other", "stage"), role="route")
    table.append(collected(batch).select(SCHEMA.names).cast(SCHEMA), branch=other.branch)
    commit_staged(table, other, batch, 3)
    with pytest.raises(StaleHeadError):
        commit_files(table, stage, batch, 3, written)
    assert keys(table) == expected({0: 4})  # the other writer's rows, once
    assert read_committed(table).offsets == {0: 4}


def test_a_maintenance_delete_in_between_is_landed_on_top_of_once(catalog: Catalog, table: Table) -> None:
    stage, batch, written = staged(table, {0: 3, 1: 2})
    commit_files(table, stage, batch, 1, written)
    stage, batch, written = staged(table, {0: 5, 1: 3})

    def maintenance(name: str) -> None:  # another process's retention delete on main
        failpoints.disarm(name)
        catalog.load_table(IDENTIFIER).delete("partition = 1")

    with failpoints.armed("route.after-stage", maintenance):
        outcome = commit_files(table, stage, batch, 1, written)

    assert outcome.restaged
    meta = table.refresh().metadata
    head = meta.snapshot_by_id(outcome.snapshot_id)
    assert head is not None and head.parent_snapshot_id == outcome.restaged_over[-1]
    assert keys(table) == sorted([*expected({0: 5}), (1, 2)])  # partition 1's first rows deleted, once
    assert read_committed(table).offsets == {0: 5, 1: 3}


def test_an_unrelated_commit_after_the_stage_changes_nothing(catalog: Catalog, table: Table) -> None:
    stage, batch, written = staged(table, {0: 2, 1: 3})
    with catalog.load_table(IDENTIFIER).transaction() as tx:  # another handle: `table` is now stale
        tx.set_properties({"owner": "someone"})
    commit_files(table, stage, batch, 1, written)
    assert keys(table) == expected({0: 2, 1: 3})
    assert read_committed(table).offsets == {0: 2, 1: 3}
    assert table.properties["owner"] == "someone"


def test_files_written_with_a_schema_the_table_no_longer_has_are_refused(
    catalog: Catalog, table: Table
) -> None:
    stage, batch, written = staged(table, {0: 2})
    with catalog.load_table(IDENTIFIER).update_schema() as update:
        update.add_column("note", StringType())
    with pytest.raises(MaintenanceConflictError, match="schema"):
        commit_files(table, stage, batch, 1, written)
    assert keys(table) == [] and read_committed(table).offsets == {}


def test_a_failure_before_the_swap_leaves_the_table_as_it_was(table: Table) -> None:
    stage, batch, written = staged(table, {0: 2})
    before = table.refresh().metadata.current_snapshot_id
    with failpoints.armed("route.before-commit", "raise"), pytest.raises(failpoints.FailpointError):
        commit_files(table, stage, batch, 1, written)
    meta = table.refresh().metadata
    assert meta.current_snapshot_id == before and meta.refs[BRANCH].snapshot_id == stage.base.snapshot_id
    assert keys(table) == [] and read_committed(table).offsets == {}
    commit_files(table, stage, batch, 1, written)  # the same files, once the failure is gone
    assert keys(table) == expected({0: 2})


def test_a_loaded_table_changed_since_the_writers_last_commit_is_checked_again(
    catalog: Catalog, table: Table
) -> None:
    """`loaded`: staged and checked on the metadata the writer's own last commit left, not loaded again;
    whatever changed the table since (maintenance, an offset reset, another writer's epoch claim, a schema
    change) makes the swap refused by the catalog and the checks run again on fresh metadata."""

    def loaded(ends: dict[int, int], topic_id: str = "id-events") -> tuple[Stage, Batch, WrittenFiles]:
        stage = prepare_stage(table, BRANCH, role="route", refresh=False)
        start = {p: stage.base.offsets.get(p, 0) for p in ends}
        batch = Batch(TOPIC, start=start, end=ends, topic_id=topic_id)
        return stage, batch, write_rows(table, collected(batch))

    stage, batch, written = staged(table, {0: 2, 1: 2})
    commit_files(table, stage, batch, 3, written)
    # Nothing changed: one catalog commit on the metadata at hand.
    stage, batch, written = loaded({0: 3, 1: 3})
    versions = len(table.metadata.metadata_log)
    outcome = commit_files(table, stage, batch, 3, written, loaded=True)
    assert not outcome.restaged and len(table.metadata.metadata_log) == versions + 1
    # Maintenance on main since: landed on top of it, once.
    stage, batch, written = loaded({0: 4, 1: 4})
    catalog.load_table(IDENTIFIER).delete("partition = 1")
    outcome = commit_files(table, stage, batch, 3, written, loaded=True)
    assert outcome.restaged
    assert keys(table) == sorted([*expected({0: 4}), (1, 3)])
    assert read_committed(table).offsets == {0: 4, 1: 4}
    # An offset reset since (the part the writer took was decided on the old offsets): planned again.
    stage, batch, written = loaded({0: 5})
    reset_offsets(
        catalog.load_table(IDENTIFIER), topic_id="id-events", offsets={0: 4, 1: 3}, reason="t", now_ms=1
    )
    with pytest.raises(StaleHeadError):
        commit_files(table, stage, batch, 3, written, loaded=True)
    # A topic recreated and reset since, at the same offsets: the old view refuses the new topic's batch,
    # the table itself too (its head moved since the stage): planned again, on the table as it is now.
    stage, batch, written = loaded({0: 5}, "id-new")
    reset_offsets(
        catalog.load_table(IDENTIFIER), topic_id="id-new", offsets={0: 4, 1: 3}, reason="t", now_ms=2
    )
    with pytest.raises(StaleHeadError):
        commit_files(table, stage, batch, 3, written, loaded=True)
    stage, batch, written = loaded({0: 5}, "id-new")
    commit_files(table, stage, batch, 3, written, loaded=True)
    # Another writer's epoch claim since: fenced, nothing landed.
    stage, batch, written = loaded({0: 6}, "id-new")
    claim_epoch(catalog.load_table(IDENTIFIER), 4, role="route")
    with pytest.raises(FencedError):
        commit_files(table, stage, batch, 3, written, loaded=True)
    # A schema change since (it does not move main): the files' schema is no longer the table's.
    stage, batch, written = loaded({0: 6}, "id-new")
    with catalog.load_table(IDENTIFIER).update_schema() as update:
        update.add_column("note", StringType())
    with pytest.raises(MaintenanceConflictError, match="schema"):
        commit_files(table, stage, batch, 4, written, loaded=True)
    assert keys(table) == sorted([*expected({0: 5}), (1, 3)])
    assert read_committed(table).offsets == {0: 5, 1: 3}
