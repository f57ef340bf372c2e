"""Files the writer holds: a batch's data files made a snapshot and landed on `main` in ONE catalog commit.

`commit_staged` lands the snapshot a writer (Spark) appended to its staging branch: two catalog commits per
batch, the append and the swap. A writer that writes the batch's data files itself (the driver's route
tables, `icefall.ingest.arrow_append`) holds them, referenced by no snapshot, and `commit_files` lands
them in one: a new snapshot N appending exactly those files (none: an empty snapshot, which still moves
`main`) on `main`'s head, `main` → N, the staging branch → N (where the writer's next batch starts, as
after `commit_staged`), and the `icefall.*` properties with the batch's offsets, guarded by
`AssertRefSnapshotId(main, head)` and `AssertRefSnapshotId(branch, the stage's base)`.

The checks are `commit_staged`'s, in its order, on freshly loaded metadata (`protocol._check_head`):
FencedError, the table's head (StaleHeadError unless it is the stage's base or only maintenance followed
it: then N goes on top of that maintenance, as a re-stage does), TopicMismatchError, OffsetGapError; then
StageError unless the branch is still at the stage's base (nothing staged there: a batch is committed
either way, never both), and MaintenanceConflictError when the table's schema or partition spec is no
longer the one the files were written with. A refused swap is checked again from fresh metadata (up to
`MAX_ATTEMPTS`): N is derived again each time, never rebased. With `loaded` the first attempt checks on
the metadata the writer's own last commit to the table left instead of loading it: the swap asserts all
those checks read (`main`, which every change of the committed state moves: a batch, an epoch claim, a
reset, maintenance; the branch; the schema and the default partition spec), so a table changed since is
refused by the catalog and checked again on fresh metadata (as is one those checks refuse); offsets found
moved then (a reset: the part of the batch the writer took was decided on the old ones) are a
StaleHeadError, the batch planned again.

Exactly once (commit/DESIGN.md, "Files the writer holds"): `main` moves only from the head the checks saw,
to a snapshot whose parent is that head and whose added files are the batch's, in the same metadata commit
as the offsets; after it `main` is N or a descendant, so the same call again finds `main` moved by an
append (StaleHeadError) and the branch moved (StageError). Not guaranteed: cleanup of the files of a batch
that never lands (orphan removal takes them, as it takes a dropped stage's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
)

from icefall.commit.batch import CommitOutcome, SourceBatch, Stage, WrittenFiles, state_after
from icefall.commit.errors import (
    CommitError,
    MaintenanceConflictError,
    OffsetGapError,
    StageError,
    StaleHeadError,
    TopicMismatchError,
)
from icefall.commit.protocol import (
    MAX_ATTEMPTS,
    _check_alive,
    _check_head,
    _landed,
    _point_branch,
    table_name,
)
from icefall.commit.pyiceberg_internals import commit_table, new_snapshot
from icefall.commit.state import MAIN, CommittedState
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)


def commit_files(
    table: Table,
    stage: Stage,
    batch: SourceBatch,
    epoch: int,
    written: WrittenFiles,
    *,
    loaded: bool = False,
) -> CommitOutcome:
    """Land `written` (the batch's data files, or none) and the batch's offsets on `main` in one commit.

    `stage` is the writer's stage of the table (`prepare_stage`), its branch still at its base. Raises what
    `commit_staged` raises, each meaning nothing was committed; any other exception leaves the outcome to
    be found out by re-reading the table (it returns normally if the commit did land).
    `loaded`: `table` holds the metadata this writer's own last commit to it left and the stage was
    prepared on it: the first attempt checks on it instead of loading it again (module doc: the swap's
    requirements refuse it if the table changed since in anything the checks read).
    """
    failpoint(f"{stage.role}.after-stage")
    if epoch < 0:
        raise ValueError(f"epoch must not be negative, got {epoch}")
    if stage.staged is not None:
        raise ValueError(f"{stage.branch}: a stage with a staged snapshot is landed by commit_staged")
    over: tuple[int, ...] = ()
    for attempt in range(MAX_ATTEMPTS):
        if attempt or not loaded:
            table.refresh()
        meta = table.metadata
        checked = _checked(meta, stage, batch, epoch, written, loaded=loaded, first=not attempt)
        if checked is None:
            continue  # refused on the writer's own last view: the table itself decides
        head, over, committed = checked
        snapshot = new_snapshot(table, {}, written.files)  # on `main`'s head in `meta`: its manifests now
        landed = snapshot.snapshot_id
        properties = state_after(committed, batch, epoch, snapshot_id=landed).to_properties()
        updates = (
            AddSnapshotUpdate(snapshot=snapshot),
            _point_branch(meta, MAIN, landed),
            _point_branch(meta, stage.branch, landed),
            SetPropertiesUpdate(updates=properties),
        )
        requirements = (
            AssertTableUUID(uuid=stage.table_uuid),
            AssertRefSnapshotId(ref=MAIN, snapshot_id=head),
            AssertRefSnapshotId(ref=stage.branch, snapshot_id=stage.base.snapshot_id),
            # The files' layout, checked above on `meta`; a schema change by anyone comes with a new id.
            AssertCurrentSchemaId(current_schema_id=written.schema_id),
            AssertDefaultSpecId(default_spec_id=written.spec_id),
        )
        failpoint(f"{stage.role}.before-commit")
        _check_alive(table, stage, None)
        try:
            commit_table(table, updates, requirements)
        except (CommitFailedException, ValueError) as e:
            # ValueError: the snapshot's sequence number no longer follows the table's (a commit elsewhere
            # in the table since `meta`), refused while the catalog applied the updates, before any swap.
            log.info("commit of %s's files refused (%s); checking again", stage.branch, e)
            continue
        except Exception:
            if not _landed(table, landed):
                raise
            log.warning("commit of %s's files reported an error but landed", stage.branch)
        break
    else:
        if over:
            raise MaintenanceConflictError(
                f"could not land {stage.branch}'s files: maintenance kept committing to main "
                f"({MAX_ATTEMPTS} attempts)"
            )
        raise CommitError(f"could not land {stage.branch}'s files: the table kept changing")
    if over:
        log.info(
            "%s: main had moved by maintenance (%s); files of %s landed on top as %d",
            table_name(table), ", ".join(map(str, over)), stage.branch, landed,
        )  # fmt: skip
    failpoint(f"{stage.role}.after-commit")
    return CommitOutcome(snapshot_id=landed, restaged_over=over)


def _checked(
    meta: TableMetadata,
    stage: Stage,
    batch: SourceBatch,
    epoch: int,
    written: WrittenFiles,
    *,
    loaded: bool,
    first: bool,
) -> tuple[int, tuple[int, ...], CommittedState] | None:
    """`_check_head` and `_check_unstaged` on `meta`; None to load the table and check again (`loaded`:
    the `first` attempt's metadata is the writer's own last view, possibly stale)."""
    try:
        checked = _check_head(meta, stage, batch, epoch)
        _check_unstaged(meta, stage, written)
    except CommitError as refused:
        if not loaded:
            raise
        if first:
            return None
        if isinstance(refused, (OffsetGapError, TopicMismatchError)):
            # The batch's part was decided on that view, and the table's offsets have moved since (a
            # reset): planned again from the table, as after a moved head.
            raise StaleHeadError(f"{stage.branch}: the table's offsets moved ({refused})") from refused
        raise
    return checked


def _check_unstaged(meta: TableMetadata, stage: Stage, written: WrittenFiles) -> None:
    """Refuse unless the branch is still at the stage's base and the files fit the table's layout."""
    ref = meta.refs.get(stage.branch)
    if ref is None:
        raise StageError(f"staging branch {stage.branch} does not exist (abandoned, or already committed)")
    if ref.snapshot_id != stage.base.snapshot_id:
        raise StageError(
            f"{stage.branch} is at {ref.snapshot_id}, not at its base {stage.base.snapshot_id}: something "
            "was staged there, or the files already landed"
        )
    if (written.schema_id, written.spec_id) != (meta.current_schema_id, meta.default_spec_id):
        raise MaintenanceConflictError(
            f"{stage.branch}: the files were written with schema {written.schema_id} and partition spec "
            f"{written.spec_id}, the table now has {meta.current_schema_id} and {meta.default_spec_id}; "
            "writing the batch again"
        )
