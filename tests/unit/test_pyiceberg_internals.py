"""The pyiceberg internals the commits rely on are where `icefall.commit.pyiceberg_internals` expects them.

Proves, on the installed pyiceberg, with a table in a temporary folder and no catalog: it is the release
the adapter was checked against; `Catalog.commit_table` still takes `(table, requirements, updates)` and
returns a `CommitTableResponse` with `metadata` and `metadata_location`, which the adapter sets on the
table; a `Transaction` still keeps what it staged in `_updates` (a tuple of table updates) and applies it
in `table_metadata`; a snapshot producer still has `snapshot_id` and `append_data_file`, and stages an
`AddSnapshotUpdate` and a `SetSnapshotRefUpdate` of `main`; a delete that matches nothing still moves
`main` (the adapter adds an empty append); `ManifestFile.fetch_manifest_entry` still takes
`discard_deleted`; `_dataframe_to_data_files` still writes Arrow rows as data files without a commit. Each
failure says what moved. Not proved here: that a real catalog accepts the commits
(tests/integration/test_commit_protocol.py, which any pyiceberg upgrade must also pass).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io import load_file_io
from pyiceberg.io import pyarrow as pyiceberg_pyarrow
from pyiceberg.manifest import ManifestFile
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table, Transaction
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSnapshotUpdate, SetPropertiesUpdate, SetSnapshotRefUpdate
from pyiceberg.types import LongType, NestedField, StringType

from icefall.commit import pyiceberg_internals
from icefall.commit.pyiceberg_internals import (
    PINNED,
    ReadOnceTransaction,
    commit_table,
    empty_snapshot_updates,
    new_snapshot,
    schema_updates,
    staged_updates,
    write_data_files,
)

pytestmark = pytest.mark.unit

MOVED = "pyiceberg {} moved an internal icefall.commit.pyiceberg_internals relies on: {}"
SCHEMA = Schema(
    NestedField(1, "partition", LongType(), required=False),
    NestedField(2, "offset", LongType(), required=False),
)


def moved(what: str) -> str:
    return MOVED.format(version("pyiceberg"), what)


class RecordingCatalog:
    """Answers `commit_table` as a catalog does, with metadata it was given; remembers the call."""

    def __init__(self, answer: CommitTableResponse) -> None:
        self.answer = answer
        self.calls: list[tuple[Any, ...]] = []

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        self.calls.append((table, requirements, updates))
        return self.answer


def metadata(location: Path, **properties: str) -> TableMetadata:
    return new_table_metadata(
        SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location.as_uri(), properties
    )


def make_table(tmp_path: Path, catalog: Any = None) -> Table:
    location = tmp_path / "table"
    return Table(
        ("lake", "t"), metadata(location), f"{location.as_uri()}/metadata/0.json", load_file_io(), catalog
    )


def test_the_installed_pyiceberg_is_the_release_the_adapter_was_checked_against() -> None:
    installed = version("pyiceberg")
    major, minor = (int(part) for part in installed.split(".")[:2])
    assert (major, minor) == PINNED, (
        f"pyiceberg {installed} is installed, icefall.commit.pyiceberg_internals was checked against "
        f"{'.'.join(map(str, PINNED))}: check each internal its docstring names (this module's other tests, "
        "tests/integration/test_commit_protocol.py), then update PINNED"
    )


def test_the_catalog_commit_and_the_table_attributes_the_adapter_sets(tmp_path: Path) -> None:
    parameters = list(inspect.signature(Catalog.commit_table).parameters)
    assert parameters == ["self", "table", "requirements", "updates"], moved(
        f"Catalog.commit_table takes {parameters}, not (table, requirements, updates)"
    )
    fields = set(CommitTableResponse.model_fields)
    assert {"metadata", "metadata_location"} <= fields, moved(f"CommitTableResponse has fields {fields}")
    committed = metadata(tmp_path / "table", committed="yes")
    answer = CommitTableResponse(metadata=committed, **{"metadata-location": "file:///somewhere/1.json"})
    catalog = RecordingCatalog(answer)
    table = make_table(tmp_path, catalog)
    updates = (SetPropertiesUpdate(updates={"committed": "yes"}),)
    commit_table(table, updates, ())
    assert catalog.calls == [(table, (), updates)]
    assert table.metadata is committed, moved("Table.metadata is no longer a plain attribute")
    assert table.metadata_location == "file:///somewhere/1.json", moved(
        "Table.metadata_location is no longer a plain attribute"
    )
    assert table.properties == {"committed": "yes"}, moved("Table reads its metadata from elsewhere")


def test_a_transaction_keeps_its_staged_updates_in_updates(tmp_path: Path) -> None:
    tx = make_table(tmp_path).transaction()
    assert isinstance(tx, Transaction)
    assert isinstance(getattr(tx, "_updates", None), tuple), moved("Transaction._updates is not a tuple")
    tx.set_properties(staged="yes")
    staged = staged_updates(tx)
    assert staged == (SetPropertiesUpdate(updates={"staged": "yes"}),), moved(
        f"Transaction._updates holds {staged!r} after set_properties"
    )
    assert isinstance(type(tx).__dict__.get("table_metadata"), property), moved(
        "Transaction.table_metadata is not a property"
    )
    assert tx.table_metadata.properties["staged"] == "yes", moved(
        "Transaction.table_metadata does not apply the staged updates"
    )


def test_a_snapshot_producer_stages_a_snapshot_on_main(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    producer = table.transaction().update_snapshot().fast_append()
    assert isinstance(producer.snapshot_id, int), moved("a snapshot producer has no snapshot_id")
    assert callable(getattr(producer, "append_data_file", None)), moved("no fast_append().append_data_file")

    snapshot = new_snapshot(table, {"icefall.genesis": "true"})
    assert snapshot.parent_snapshot_id is None
    assert snapshot.summary is not None
    assert snapshot.summary["icefall.genesis"] == "true"

    updates = empty_snapshot_updates(table, {"icefall.epoch-claim": "3"})
    kinds = [type(update) for update in updates]
    assert kinds == [AddSnapshotUpdate, SetSnapshotRefUpdate], moved(f"an empty fast append stages {kinds}")
    ref = updates[1]
    assert isinstance(ref, SetSnapshotRefUpdate)
    assert ref.ref_name == "main", moved(f"a fast append moves {ref.ref_name!r}, not main")


def test_a_read_once_transaction_applies_its_updates_once_per_set(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    tx = ReadOnceTransaction(table)
    first = tx.table_metadata
    assert first is table.metadata  # nothing staged: pyiceberg's own deep-copies the metadata even then
    tx.set_properties(first="yes")
    first = tx.table_metadata
    assert tx.table_metadata is first  # pyiceberg's own deep-copies the whole metadata at every read
    tx.set_properties(staged="yes")
    assert tx.table_metadata is not first, moved("Transaction._stage no longer replaces _updates")
    assert tx.table_metadata.properties["staged"] == "yes"
    assert tx.table_metadata is tx.table_metadata
    # What a snapshot producer stages through it is what it stages through pyiceberg's own transaction.
    rows = pa.table({"partition": pa.array([0], pa.int64()), "offset": pa.array([1], pa.int64())})
    snapshot = new_snapshot(table, {"note": "x"}, write_data_files(table, rows))
    assert snapshot.parent_snapshot_id is None and snapshot.sequence_number == 1
    assert snapshot.summary is not None and snapshot.summary["added-records"] == "1"


def test_a_schema_change_stages_the_new_schema_and_names_its_id(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    updates, schema_id = schema_updates(table, lambda update: update.add_column("note", StringType()))
    assert [type(u).__name__ for u in updates] == ["AddSchemaUpdate", "SetCurrentSchemaUpdate"], moved(
        f"a schema change stages {updates!r}"
    )
    assert schema_id == 1 and table.schema().schema_id == 0, moved("the new schema's id is not the next one")


def test_reading_manifest_entries_keeps_the_deleted_ones_on_request() -> None:
    parameters = inspect.signature(ManifestFile.fetch_manifest_entry).parameters
    assert "discard_deleted" in parameters, moved(
        f"ManifestFile.fetch_manifest_entry takes {list(parameters)}, no discard_deleted"
    )


def test_arrow_rows_are_written_as_data_files_without_a_commit(tmp_path: Path) -> None:
    writer = getattr(pyiceberg_pyarrow, "_dataframe_to_data_files", None)
    assert writer is not None, moved("pyiceberg.io.pyarrow._dataframe_to_data_files is gone")
    parameters = set(inspect.signature(writer).parameters)
    assert {"table_metadata", "df", "io", "write_uuid"} <= parameters, moved(
        f"_dataframe_to_data_files takes {sorted(parameters)}"
    )
    table = make_table(tmp_path)
    rows = pa.table({"partition": pa.array([0, 0], pa.int64()), "offset": pa.array([5, 6], pa.int64())})
    files = write_data_files(table, rows)
    assert [f.record_count for f in files] == [2]
    assert Path(files[0].file_path.removeprefix("file://")).exists()
    assert table.metadata.snapshots == [], "nothing committed"
    assert write_data_files(table, rows.slice(0, 0)) == []


def test_the_adapter_names_every_internal_it_relies_on() -> None:
    doc = pyiceberg_internals.__doc__ or ""
    internals = ("Transaction._updates", "Transaction.table_metadata", "Catalog.commit_table", "0.12")
    for internal in (*internals, "_dataframe_to_data_files"):
        assert internal in doc, internal
