"""The pyiceberg internals the commit protocol relies on, in one place. Pinned: pyiceberg 0.12.x.

The protocol sends its own updates and requirements in ONE catalog commit with no retries, because
pyiceberg's `Transaction.commit_transaction` retries by rebasing (commit/DESIGN.md, "Why not let the
writer commit to `main`"). pyiceberg has no public API for that, so this module relies on:

- `Catalog.commit_table(table, requirements, updates)` returning a `CommitTableResponse` with `metadata`
  and `metadata_location`, and `Table.metadata` / `Table.metadata_location` being plain attributes: after
  a commit they are set by hand, as `Table._do_commit` does (without its old-metadata cleanup);
- `Transaction._updates`: the updates a transaction has staged (a snapshot producer's `AddSnapshotUpdate`
  and `SetSnapshotRefUpdate`), taken to send in the protocol's own commit;
- `Transaction.table_metadata`: the table's metadata with those updates applied (the id a staged schema
  change gets), and a snapshot producer's `snapshot_id`, to find its staged snapshot (`new_snapshot`: in
  the staged `AddSnapshotUpdate`); `new_snapshot` builds it through `ReadOnceTransaction`, which computes
  the metadata once per set of updates (`Transaction(table)` and `_stage` replacing the `_updates` tuple)
  and hands out the table's own while nothing is staged;
- `pyiceberg.io.pyarrow._dataframe_to_data_files(table_metadata, df, io, write_uuid)`: the Parquet files
  `Table.append` writes for Arrow rows, as `DataFile`s, without its commit (`write_data_files`).

Everything else the protocol uses is pyiceberg's public API (the models of `pyiceberg.table.update`,
`ancestors_of`, `ManifestFile.fetch_manifest_entry`). tests/unit/test_pyiceberg_internals.py checks each
item above on the installed pyiceberg, so an upgrade that moves one fails there first, saying what moved;
re-run tests/integration/test_commit_protocol.py on any upgrade.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from pyiceberg.table import Transaction
from pyiceberg.table.update import AddSnapshotUpdate

from icefall.commit.errors import ClockBehindError, CommitError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.table.update import TableRequirement, TableUpdate
    from pyiceberg.table.update.schema import UpdateSchema

#: The pyiceberg release (major, minor) these internals were checked against (pyproject.toml pins it).
PINNED = (0, 12)


def commit_table(
    table: Table, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...]
) -> None:
    """One catalog commit, no retries: the catalog checks `requirements` and swaps the metadata atomically.

    `table` then holds the committed metadata, as after pyiceberg's own commit. Refused before anything is
    written when this host's clock is behind the table's last update (`check_clock`).
    """
    check_clock(table)
    response = table.catalog.commit_table(table, requirements, updates)
    table.metadata = response.metadata
    table.metadata_location = response.metadata_location


#: Iceberg Java refuses metadata whose `last-updated-ms` is more than a minute before the last entry of its
#: metadata log (`TableMetadata`: "Invalid update timestamp"); pyiceberg stamps a commit with this host's
#: clock and checks nothing. Refuse 5 s short of that minute: the catalog's own write comes a moment later.
CLOCK_TOLERANCE_MS = 55_000


def check_clock(table: Table, now_ms: int | None = None) -> None:
    """Raise ClockBehindError if this host's clock (`now_ms`) is behind the last update of `table`'s
    metadata (as loaded) by more than CLOCK_TOLERANCE_MS: a commit now would make the table unreadable for
    Iceberg Java. The writer waits (an outage, `icefall.ingest.outages`) until its clock passes it."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    behind = table.metadata.last_updated_ms - now
    if behind > CLOCK_TOLERANCE_MS:
        raise ClockBehindError(
            f"this host's clock is {behind / 1000:.0f}s behind the last update of the table "
            f"({table.metadata.last_updated_ms} ms): Iceberg Java refuses metadata written over a minute "
            "before its log's last entry; nothing written, waiting for the clock to pass it (check NTP)"
        )


def staged_updates(tx: Transaction) -> tuple[TableUpdate, ...]:
    """The updates `tx` has staged so far, in order (not committed)."""
    return tuple(tx._updates)


class ReadOnceTransaction(Transaction):
    """A `Transaction` whose `table_metadata` is computed once per set of staged updates (and table
    metadata), and is the table's own metadata while nothing is staged. pyiceberg's applies the updates
    and deep-copies the whole metadata at every read (with no updates too), and a snapshot producer reads
    it about fifteen times: a cost per snapshot that grows with the table's snapshots and metadata log.
    Safe to share: the metadata models are frozen."""

    def __init__(self, table: Table) -> None:
        super().__init__(table)
        self._applied: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if not updates:
            return base  # what applying nothing gives, but for the copy
        if self._applied is None or self._applied[0] is not base or self._applied[1] is not updates:
            self._applied = (base, updates, super().table_metadata)
        return self._applied[2]


def new_snapshot(table: Table, summary: Mapping[str, str], files: Iterable[DataFile] = ()) -> Snapshot:
    """A snapshot appending `files` (none: an empty one) on `main`'s head, not committed.

    Its manifest and manifest list are written now; the caller commits `AddSnapshotUpdate(snapshot)` with
    the ref moves it wants (the files become orphans if that commit is refused).
    """
    tx = ReadOnceTransaction(table)
    with tx.update_snapshot(snapshot_properties=dict(summary)).fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    # Taken from the staged update: applying the updates to find it would copy the whole metadata again.
    staged = [u.snapshot for u in staged_updates(tx) if isinstance(u, AddSnapshotUpdate)]
    snapshot = next((s for s in staged if s.snapshot_id == append.snapshot_id), None)
    if snapshot is None:  # pragma: no cover - pyiceberg staged it a line above
        raise CommitError("pyiceberg did not stage the snapshot it was asked for")
    return snapshot


def write_data_files(table: Table, rows: pa.Table) -> list[DataFile]:
    """Write `rows` (in the table's Arrow schema) as the data files `Table.append` would, with the table's
    current schema and partition spec; nothing is committed: the files are referenced by no snapshot."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    if not rows.num_rows:
        return []
    return list(
        _dataframe_to_data_files(table_metadata=table.metadata, df=rows, io=table.io, write_uuid=uuid.uuid4())
    )


def empty_snapshot_updates(table: Table, summary: Mapping[str, str]) -> tuple[TableUpdate, ...]:
    """The updates that add an empty snapshot on `main` (for properties to ride on a commit moving it)."""
    tx = table.transaction()
    with tx.update_snapshot(snapshot_properties=dict(summary)).fast_append():
        pass
    return staged_updates(tx)


def schema_updates(
    table: Table, change: Callable[[UpdateSchema], None]
) -> tuple[tuple[TableUpdate, ...], int]:
    """The updates that make the schema `change` records on an `UpdateSchema` of `table` the current one
    (a new schema and the move to it), not committed; and the id that schema gets."""
    tx = table.transaction()
    with tx.update_schema() as update:
        change(update)
    return staged_updates(tx), tx.table_metadata.current_schema_id
