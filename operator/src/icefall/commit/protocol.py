"""Stage, then fast-forward: how a batch gets into the table exactly once.

1. `prepare_stage` makes sure the writer's staging branch is at `main`'s head H (first giving an empty
   table an empty "genesis" snapshot, so there always is a head to branch from) and returns a `Stage`
   holding H and the committed state as of H. The branch is the writer's own and follows `main`: a commit
   leaves it at `main`'s new head, so the next batch finds it there and needs no catalog commit to stage;
   a missing branch, or one left behind by maintenance or holding a failed attempt, is (re)pointed at H.
2. The writer (Spark in production) appends the batch to that branch: exactly one snapshot S, parent H.
   Writers may retry or rebase there freely; nobody else writes to the branch.
3. `commit_staged` checks, on freshly loaded metadata, that the writer is not fenced (epoch), that `main` is
   still H, that the batch starts at the committed offsets, and that the branch holds exactly S with parent
   H. Then ONE catalog commit points `main` at S and sets the `icefall.*` properties, guarded by
   `AssertRefSnapshotId(main, H)` and `AssertRefSnapshotId(branch, S)`. Two catalog commits per batch in
   all: the writer's append and this one.
4. If `main` moved from H to H' only through maintenance (every snapshot after H up to H' is not an
   append, and the `icefall.*` properties are still those the stage read, so nobody ingested), the batch is
   re-staged instead of refused: ONE catalog commit appends exactly S's data files onto H' as N, sets the
   properties and points the branch at N (S is dropped), guarded by `AssertRefSnapshotId(main, H')`.
   Compaction, retention and manifest rewrites therefore never make an ingestion commit fail (DESIGN.md,
   "Maintenance in between").

5. Pipelining: `staged_on` records the appended snapshot S in the stage, and `next_stage` gives the stage
   of the writer's next batch on top of S, with the state S's commit will give the table. The next batch
   is appended to the branch (S', parent S) while S's commit runs; that commit lands S itself, guarded
   by the branch's head (S or S'), and S' lands in its own commit afterwards, only while `main` is S.

A batch that skips records Kafka's retention deleted names the gap (`Batch.retention_gaps`); its commit adds
the gap's width to `icefall.lost-records` in the same metadata commit. The commits that set `icefall.*`
without a batch (an epoch claim, an offset reset) are `icefall.commit.direct`'s.

Guarantees: `main` only ever moves forward by one staged snapshot whose parent it was pointing at, or by
one snapshot appending exactly the staged files onto maintenance commits that changed no `icefall.*`
property, so a batch can land at most once, and only on top of the state it was planned from (or that
state with its files compacted or its expired rows dropped); its offsets land in the same metadata commit.
Nothing is rebased by a client's retry: a re-stage is re-derived from freshly loaded metadata and guarded
by a compare-and-swap on the head it was derived from. A refused commit changes nothing.

Not guaranteed: progress under contention (a writer that keeps losing keeps re-planning; leases make that
rare), and any cleanup of files written for refused batches (orphan-file removal does that).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntryStatus
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, ancestors_of
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from icefall.commit.batch import STAGE_PREFIX, CommitOutcome, SourceBatch, Stage, check_source, state_after
from icefall.commit.errors import (
    CommitError,
    FencedError,
    MaintenanceConflictError,
    StageError,
    StageExpiredError,
    StaleHeadError,
)
from icefall.commit.pyiceberg_internals import (
    check_clock,
    commit_table,
    new_snapshot,
)
from icefall.commit.state import DELETED_KEYS, MAIN, CommittedState, state_of
from icefall.plan.maintenance_items import MIN_ORPHAN_AGE_MS
from icefall.runtime.failpoints import TableRole, failpoint

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

GENESIS_PROPERTY = "icefall.genesis"
RESTAGED_FROM_PROPERTY = "icefall.restaged-from"  # snapshot summary of a re-staged batch: the staged id
RESET_PROPERTY = "icefall.offset-reset"  # snapshot summary of an offset reset: its reason
#: A table of several topics: the topic an offset reset's snapshot resets (beside `RESET_PROPERTY`).
RESET_TOPIC_PROPERTY = "icefall.offset-reset-topic"
EPOCH_CLAIM_PROPERTY = "icefall.epoch-claim"  # snapshot summary of a writer's epoch claim: the epoch
# Attempts of one catalog commit while its own conditions still hold (the table changed elsewhere, e.g. a
# property or another branch). Each attempt re-checks everything from fresh metadata: this is not a rebase.
MAX_ATTEMPTS = 5
# A batch staged longer ago than this is refused and written again: its files are referenced by nothing
# until it lands (inside Spark's write, or the deleted keys file until the swap), and orphan removal takes
# unreferenced files older than its window, never below MIN_ORPHAN_AGE_MS. Half of that leaves the other
# half for the clocks of the store and of the maintenance pod to differ (commit/DESIGN.md, "Orphan removal").
MAX_STAGE_SECONDS = MIN_ORPHAN_AGE_MS / 1000 / 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Plan:
    """A commit `_check` allows: assert `main` is `head`, land the batch staged as `staged`."""

    head: int
    staged: int
    properties: dict[str, str]
    restage_over: tuple[int, ...] = ()  # maintenance snapshots after the stage's base; () = fast-forward
    branch_head: int | None = None  # the branch's head: `staged`, or the writer's next batch on top of it

    @property
    def stacked(self) -> bool:
        """The writer's next batch is already on the branch, on top of the staged snapshot."""
        return self.branch_head is not None and self.branch_head != self.staged


def prepare_stage(table: Table, branch: str, *, role: TableRole = "main", refresh: bool = True) -> Stage:
    """Make sure staging branch `branch` is at `main`'s head; return it with the state it saw.

    A branch already there (the writer's previous commit left it at `main`'s new head) costs no catalog
    commit. A missing one is created; one elsewhere (maintenance moved `main` since, or it holds the
    snapshot of an attempt that never landed) is pointed at the head, dropping what only it reached, in
    the same one commit.
    The table is refreshed in place first, unless `refresh` is False (the caller has just read it: a stale
    base only makes the commit re-stage or refuse, never land wrongly). `role` names the table in
    failpoints (`dlq.after-prepare`, ...).
    """
    if not branch.startswith(STAGE_PREFIX) or branch == MAIN:
        raise ValueError(f"staging branches are named {STAGE_PREFIX}…; use stage_branch_name()")
    for attempt in range(MAX_ATTEMPTS):
        if refresh or attempt:  # every retry looks at the table again
            table.refresh()
        if MAIN not in table.metadata.refs:
            commit_genesis(table, role)
            continue
        check_clock(table)  # before the writer appends: its metadata would carry the same clock
        meta = table.metadata
        head = meta.refs[MAIN].snapshot_id
        ref = meta.refs.get(branch)
        if ref is None or ref.snapshot_id != head:
            # What only the branch reached (a failed attempt's snapshot) goes with the move.
            orphaned = _reached_only_by(meta, {branch})
            try:
                commit_table(
                    table,
                    updates=(
                        _point_branch(meta, branch, head),
                        *((RemoveSnapshotsUpdate(snapshot_ids=orphaned),) if orphaned else ()),
                    ),
                    requirements=(
                        AssertTableUUID(uuid=meta.table_uuid),
                        AssertRefSnapshotId(ref=MAIN, snapshot_id=head),
                        AssertRefSnapshotId(ref=branch, snapshot_id=ref.snapshot_id if ref else None),
                    ),
                )
            except CommitFailedException:
                continue  # main or the branch moved meanwhile: look again
        failpoint(f"{role}.after-prepare")
        return Stage(branch=branch, base=state_of(meta), table_uuid=meta.table_uuid, role=role)
    raise CommitError(f"could not prepare staging branch {branch}: the table kept changing")


def commit_staged(
    table: Table, stage: Stage, batch: SourceBatch, epoch: int, *, keep_branch: bool = True
) -> int:
    """Land the batch staged on `stage.branch` on `main`; return the new head's snapshot id.

    The branch is left at `main`'s new head for the writer's next batch, or dropped in the same commit
    when `keep_branch` is False (a table written to only now and then, whose branch would otherwise pin
    old snapshots once maintenance moves `main`).

    Raises FencedError, StaleHeadError (MaintenanceConflictError among them), TopicMismatchError,
    OffsetGapError or StageError, each meaning nothing was committed. Any other exception leaves the
    outcome to be found out by re-reading the table (`read_committed`): if the commit did land, this
    function returns normally instead. `commit_staged_outcome` also tells whether the batch was re-staged.
    """
    return commit_staged_outcome(table, stage, batch, epoch, keep_branch=keep_branch).snapshot_id


def commit_staged_outcome(
    table: Table, stage: Stage, batch: SourceBatch, epoch: int, *, keep_branch: bool = True
) -> CommitOutcome:
    """`commit_staged`, telling whether `main` was fast-forwarded or the batch re-staged over maintenance.

    Fast-forward: `main` is still the stage's base H; `main` → S. Re-stage: `main` moved from H to H' by
    maintenance only (module doc, step 4); one new snapshot appending S's data files goes on top of H'.
    Every attempt starts from freshly loaded metadata; a compare-and-swap the catalog refuses (a rewrite
    landed in between, say) is looked at again, up to MAX_ATTEMPTS times.
    """
    failpoint(f"{stage.role}.after-stage")
    if epoch < 0:
        raise ValueError(f"epoch must not be negative, got {epoch}")
    plan: _Plan | None = None
    for _ in range(MAX_ATTEMPTS):
        table.refresh()
        meta = table.metadata
        plan = _check(meta, stage, batch, epoch)
        new_head, updates = _landing(table, meta, stage, plan, keep_branch=keep_branch)
        if _swap(table, stage, plan, new_head, updates):
            break
    else:
        if plan is not None and plan.restage_over:
            raise MaintenanceConflictError(
                f"could not re-stage {stage.branch}: maintenance kept committing to main "
                f"({MAX_ATTEMPTS} attempts)"
            )
        raise CommitError(f"could not commit {stage.branch}: the table kept changing")
    if plan.restage_over:
        log.info(
            "%s: main had moved by maintenance (%s); batch of %s re-staged as %d",
            table_name(table), ", ".join(map(str, plan.restage_over)), stage.branch, new_head,
        )  # fmt: skip
    failpoint(f"{stage.role}.after-commit")
    return CommitOutcome(snapshot_id=new_head, restaged_over=plan.restage_over)


def _landing(
    table: Table, meta: TableMetadata, stage: Stage, plan: _Plan, *, keep_branch: bool
) -> tuple[int, tuple[TableUpdate, ...]]:
    """The new head of `main` and the updates landing the batch as `plan` says (fast-forward or re-stage)."""
    updates: tuple[TableUpdate, ...]
    if plan.restage_over:
        new_head, updates = _restage(table, meta, stage, plan)
    else:
        new_head, updates = plan.staged, (_point_branch(meta, MAIN, plan.staged),)
    if not keep_branch:
        updates += (RemoveSnapshotRefUpdate(ref_name=stage.branch),)
    elif plan.restage_over and not plan.stacked:
        updates += (_point_branch(meta, stage.branch, new_head),)
    # else the branch is already at the new head, where the writer's next batch is staged without a
    # commit; or that next batch is on it already (and was planned on the staged snapshot: after a
    # re-stage it cannot land, and the writer drops it)
    updates += (SetPropertiesUpdate(updates=plan.properties),)
    if plan.restage_over and not plan.stacked:
        # Only the branch reached the staged snapshot; its data files now belong to new_head.
        updates += (RemoveSnapshotsUpdate(snapshot_ids=[plan.staged]),)
    return new_head, updates


def _swap(table: Table, stage: Stage, plan: _Plan, new_head: int, updates: tuple[TableUpdate, ...]) -> bool:
    """The batch's compare-and-swap: True once it landed, False to check everything again."""
    requirements: tuple[TableRequirement, ...] = (
        AssertTableUUID(uuid=stage.table_uuid),
        AssertRefSnapshotId(ref=MAIN, snapshot_id=plan.head),
        AssertRefSnapshotId(ref=stage.branch, snapshot_id=plan.branch_head),
    )
    failpoint(f"{stage.role}.before-commit")
    _check_alive(table, stage, plan.properties.get(DELETED_KEYS))
    try:
        commit_table(table, updates, requirements)
    except CommitFailedException as e:
        log.info("commit of %s refused by the catalog (%s); checking again", stage.branch, e)
        return False
    except Exception as e:
        if _landed(table, new_head):
            log.warning("commit of %s reported an error but landed", stage.branch)
            return True
        if plan.restage_over and isinstance(e, ValueError):
            # A re-stage adds a snapshot numbered from the metadata it was built on; if the table gained
            # a snapshot elsewhere (another branch), the catalog refuses it while applying the updates,
            # before any swap.
            log.info("re-stage of %s no longer applies (%s); checking again", stage.branch, e)
            return False
        raise
    return True


def _check_alive(table: Table, stage: Stage, named: str | None) -> None:
    """Refuse a batch whose files orphan removal may have taken: staged too long ago, or its deleted keys
    file (`named`: the one file the swap itself makes referenced) gone. Checked after the last pause point."""
    age = time.monotonic() - stage.prepared_at
    if age > MAX_STAGE_SECONDS:
        raise StageExpiredError(
            f"{stage.branch} was staged {age:.0f}s ago, over {MAX_STAGE_SECONDS:.0f}s (half the orphan "
            "window): its files may have been removed before it committed; writing the batch again"
        )
    if named and named != stage.base.deleted_keys and not _readable(table, named):
        raise StageExpiredError(
            f"{stage.branch}: its deleted keys file {named} was removed before it committed (orphan removal: "
            "a writer held past the orphan window, or clocks apart); writing the batch again"
        )


def _readable(table: Table, path: str) -> bool:
    """False if `path` is gone. Opened, not `InputFile.exists()`: pyiceberg 0.12's fsspec FileIO says a
    `file:///` path that is there does not exist. Other errors (an outage) are raised."""
    try:
        with table.io.new_input(path).open():
            return True
    except FileNotFoundError:
        return False


def staged_on(table: Table, stage: Stage) -> Stage:
    """`stage` with the snapshot its writer has just appended recorded as `Stage.staged` (refreshes `table`).

    Pipelining: the commit of a stage recorded so lands that snapshot, while the writer already appends
    its next batch on top of it (`next_stage`). Raises StageError if the branch holds no one snapshot on
    top of the stage's base.
    """
    table.refresh()
    meta = table.metadata
    ref = meta.refs.get(stage.branch)
    snapshot = meta.snapshot_by_id(ref.snapshot_id) if ref is not None else None
    if snapshot is None or snapshot.parent_snapshot_id != stage.base.snapshot_id:
        raise StageError(f"{stage.branch} holds no snapshot on top of {stage.base.snapshot_id}")
    return replace(stage, staged=snapshot.snapshot_id)


def abandon_stage(table: Table, branch: str, *, role: TableRole = "main") -> bool:
    """Drop a staging branch and the snapshots only it references. False if it was already gone."""
    return bool(_drop_stages(table, lambda name: name == branch, f"{role}.before-abandon"))


def sweep_stages(table: Table, keep: Collection[str] = (), *, role: TableRole = "main") -> list[str]:
    """Drop every staging branch except `keep` (leftovers of crashed attempts); return their names.

    Meant for the lease holder on start: a branch it drops under a still-running stale writer only makes
    that writer's commit fail, which it would anyway.
    """
    return _drop_stages(
        table, lambda name: name.startswith(STAGE_PREFIX) and name not in keep, f"{role}.before-sweep"
    )


def _check(meta: TableMetadata, stage: Stage, batch: SourceBatch, epoch: int) -> _Plan:
    """The commit to make (fast-forward or re-stage, and the properties to set), or the reason to refuse."""
    head, restage_over, committed = _check_head(meta, stage, batch, epoch)
    ref = meta.refs.get(stage.branch)
    if ref is None or ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise StageError(f"staging branch {stage.branch} does not exist (abandoned, or already committed)")
    staged = ref.snapshot_id if stage.staged is None else stage.staged
    _check_staged(meta, stage, staged, ref.snapshot_id)
    new = state_after(committed, batch, epoch, snapshot_id=staged)
    return _Plan(
        head=head,
        staged=staged,
        properties=new.to_properties(),
        restage_over=restage_over,
        branch_head=ref.snapshot_id,
    )


def _check_head(
    meta: TableMetadata, stage: Stage, batch: SourceBatch, epoch: int
) -> tuple[int, tuple[int, ...], CommittedState]:
    """The refusals before the staging branch is looked at, in their order (the table, the epoch, `main`,
    the source): `main`'s head, the maintenance snapshots since the stage's base (none: fast-forward), and
    the committed state."""
    main = meta.refs.get(MAIN)
    head = main.snapshot_id if main else None
    committed = state_of(meta)
    if meta.table_uuid != stage.table_uuid:
        raise StaleHeadError("the table was dropped and created again since the stage was prepared")
    if epoch < committed.epoch:
        raise FencedError(
            f"epoch {epoch} is below the table's epoch {committed.epoch}: a newer writer took over"
        )
    base = stage.base.snapshot_id
    if head is None:
        raise StaleHeadError(f"main was removed since the batch was planned on {base}")
    restage_over = () if head == base else _maintenance_since(meta, stage, head)
    check_source(committed, batch)
    return head, restage_over, committed


def _check_staged(meta: TableMetadata, stage: Stage, staged: int, branch_head: int) -> None:
    """Refuse unless `staged` is one snapshot on top of the stage's base, held by the branch."""
    base = stage.base.snapshot_id
    if staged == base:
        raise StageError(f"nothing staged on {stage.branch}: write the batch first (an empty batch too)")
    snapshot = meta.snapshot_by_id(staged)
    if snapshot is None or snapshot.parent_snapshot_id != base:
        parent = snapshot.parent_snapshot_id if snapshot else None
        raise StageError(
            f"{stage.branch} must hold exactly one snapshot on top of {base}; its head's parent is {parent}"
        )
    if staged != branch_head and staged not in _ancestor_ids(meta, branch_head):
        raise StageError(f"{stage.branch} no longer holds the staged snapshot {staged}")


def _ancestor_ids(meta: TableMetadata, snapshot_id: int) -> set[int]:
    return {s.snapshot_id for s in ancestors_of(meta.snapshot_by_id(snapshot_id), meta)}


def _maintenance_since(meta: TableMetadata, stage: Stage, head: int) -> tuple[int, ...]:
    """The snapshots after the stage's base up to `head`, oldest first, if all of them are maintenance.

    Maintenance: `head` descends from the base, no snapshot in between is an append (every ingestion
    commit is one), and the `icefall.*` properties are still exactly those the stage read (every ingestion
    commit changes `icefall.offsets`). Otherwise StaleHeadError: someone else
    committed, and the batch must be planned again.
    """
    base = stage.base.snapshot_id
    moved = f"main moved from {base} to {head} since the batch was planned"
    between: list[Snapshot] = []
    current: int | None = head
    while current != base:
        snapshot = meta.snapshot_by_id(current) if current is not None else None
        if snapshot is None or len(between) > len(meta.snapshots):
            raise StaleHeadError(
                f"{moved}, and {head} does not descend from {base} (rolled back or replaced)"
            )
        between.append(snapshot)
        current = snapshot.parent_snapshot_id
    for snapshot in between:
        operation = snapshot.summary.operation if snapshot.summary is not None else None
        if operation is None or operation == Operation.APPEND:
            raise StaleHeadError(f"{moved}: snapshot {snapshot.snapshot_id} appended rows (another writer)")
    if replace(state_of(meta), snapshot_id=base) != stage.base:
        raise StaleHeadError(f"{moved}, and its icefall.* properties changed: another writer committed")
    return tuple(s.snapshot_id for s in reversed(between))


def _restage(
    table: Table, meta: TableMetadata, stage: Stage, plan: _Plan
) -> tuple[int, tuple[TableUpdate, ...]]:
    """A new snapshot on `plan.head` that appends exactly the data files of the staged snapshot.

    Its manifest and manifest list are written now (they become orphans if the commit is refused).
    """
    files = _staged_data_files(table, meta, stage, plan.staged)
    snapshot = new_snapshot(table, {RESTAGED_FROM_PROPERTY: str(plan.staged)}, files)
    return snapshot.snapshot_id, (
        AddSnapshotUpdate(snapshot=snapshot),
        _point_branch(meta, MAIN, snapshot.snapshot_id),
    )


def _staged_data_files(table: Table, meta: TableMetadata, stage: Stage, staged_id: int) -> list[DataFile]:
    """The data files the staged snapshot added, if it is one plain append that fits the current table."""
    staged = meta.snapshot_by_id(staged_id)
    if staged is None:  # pragma: no cover - _check found it in the same metadata
        raise StageError(f"the snapshot staged on {stage.branch} is gone")
    cannot = f"main moved by maintenance since {stage.branch} was staged, but the batch cannot be re-staged"
    operation = staged.summary.operation if staged.summary is not None else None
    if operation != Operation.APPEND:
        raise MaintenanceConflictError(f"{cannot}: the staged snapshot is a {operation}, not an append")
    if staged.schema_id is not None and staged.schema_id != meta.current_schema_id:
        raise MaintenanceConflictError(
            f"{cannot}: the schema changed (id {staged.schema_id} → {meta.current_schema_id})"
        )
    files: list[DataFile] = []
    for manifest in staged.manifests(table.io):
        if manifest.added_snapshot_id != staged_id:
            continue  # inherited from the base: already on main (or compacted there)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.snapshot_id != staged_id or entry.status == ManifestEntryStatus.EXISTING:
                continue  # carried over by a merging writer
            if (
                entry.status != ManifestEntryStatus.ADDED
                or manifest.content != ManifestContent.DATA
                or entry.data_file.content != DataFileContent.DATA
            ):
                raise MaintenanceConflictError(f"{cannot}: the staged snapshot deletes or holds delete files")
            if entry.data_file.spec_id != meta.default_spec_id:
                spec_change = f"{entry.data_file.spec_id} → {meta.default_spec_id}"
                raise MaintenanceConflictError(f"{cannot}: the partition spec changed (id {spec_change})")
            files.append(entry.data_file)
    return files


def _point_branch(meta: TableMetadata, name: str, snapshot_id: int) -> SetSnapshotRefUpdate:
    """Point branch `name` at `snapshot_id`, keeping the retention settings it already has."""
    ref = meta.refs.get(name)
    return SetSnapshotRefUpdate(
        ref_name=name,
        type=SnapshotRefType.BRANCH,
        snapshot_id=snapshot_id,
        max_ref_age_ms=ref.max_ref_age_ms if ref else None,
        max_snapshot_age_ms=ref.max_snapshot_age_ms if ref else None,
        min_snapshots_to_keep=ref.min_snapshots_to_keep if ref else None,
    )


def table_name(table: Table) -> str:
    """`namespace.table`, as logs and errors name a table."""
    return ".".join(table.name())


def commit_genesis(table: Table, role: TableRole) -> None:
    """Give a table without snapshots an empty one on `main`, so a staging branch has a head to start at."""
    meta = table.metadata
    genesis = new_snapshot(table, {GENESIS_PROPERTY: "true"})  # empty: only its manifest list is written
    try:
        commit_table(
            table,
            updates=(AddSnapshotUpdate(snapshot=genesis), _point_branch(meta, MAIN, genesis.snapshot_id)),
            requirements=(
                AssertTableUUID(uuid=meta.table_uuid),
                AssertRefSnapshotId(ref=MAIN, snapshot_id=None),
            ),
        )
    except CommitFailedException:
        return  # someone else gave the table a head first: that one serves as well
    failpoint(f"{role}.after-genesis")


def _landed(table: Table, snapshot_id: int) -> bool:
    """Whether `snapshot_id` is on `main` (at its head or below it), after an error of unknown outcome."""
    try:
        table.refresh()
    except Exception:
        return False
    meta = table.metadata
    return any(s.snapshot_id == snapshot_id for s in ancestors_of(meta.current_snapshot(), meta))


def _reached_only_by(meta: TableMetadata, branches: Collection[str]) -> list[int]:
    """The snapshots only `branches` reach: none reachable from any other ref (main first of all)."""
    kept: set[int] = set()
    heads: list[int] = []
    for name, ref in meta.refs.items():
        if name in branches:
            heads.append(ref.snapshot_id)
        else:
            kept.update(s.snapshot_id for s in ancestors_of(meta.snapshot_by_id(ref.snapshot_id), meta))
    only: set[int] = set()
    for head in heads:
        for s in ancestors_of(meta.snapshot_by_id(head), meta):
            if s.snapshot_id in kept:
                break
            only.add(s.snapshot_id)
    return sorted(only)


def _drop_stages(table: Table, doomed_name: Callable[[str], bool], point: str) -> list[str]:
    """Drop the branches `doomed_name` selects, in one guarded commit; `point` is the failpoint before it."""
    for _ in range(MAX_ATTEMPTS):
        table.refresh()
        meta = table.metadata
        doomed = {
            name: ref.snapshot_id
            for name, ref in meta.refs.items()
            if name != MAIN and ref.snapshot_ref_type == SnapshotRefType.BRANCH and doomed_name(name)
        }
        if not doomed:
            return []
        # What only the dropped branches reach was never on main and goes with them.
        unreferenced = _reached_only_by(meta, set(doomed))
        updates: tuple[TableUpdate, ...] = tuple(
            RemoveSnapshotRefUpdate(ref_name=name) for name in sorted(doomed)
        )
        if unreferenced:
            updates += (RemoveSnapshotsUpdate(snapshot_ids=unreferenced),)
        main = meta.refs.get(MAIN)
        requirements: tuple[TableRequirement, ...] = (
            AssertTableUUID(uuid=meta.table_uuid),
            AssertRefSnapshotId(ref=MAIN, snapshot_id=main.snapshot_id if main else None),
            *(AssertRefSnapshotId(ref=name, snapshot_id=sid) for name, sid in doomed.items()),
        )
        failpoint(point)
        try:
            commit_table(table, updates, requirements)
        except CommitFailedException:
            continue
        return sorted(doomed)
    raise CommitError("could not drop staging branches: the table kept changing")
