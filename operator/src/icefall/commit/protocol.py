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
the gap's width to `icefall.lost-records` in the same metadata commit. `rewind_dead_letters` is the one
other commit that sets `icefall.*`: it takes a dead-letter table left ahead of its main table (a batch whose
dead letters landed but whose main commit did not) back to the main table's offsets, deleting the rows past
them in the same guarded commit.

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

import json
import logging
import re
import uuid
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
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

from icefall.commit.errors import (
    CommitError,
    FencedError,
    MaintenanceConflictError,
    OffsetGapError,
    StageError,
    StaleHeadError,
    TopicMismatchError,
)
from icefall.commit.state import MAIN, OFFSET_RESETS, CommittedState, state_of
from icefall.failpoints import TableRole, failpoint

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

STAGE_PREFIX = "icefall_stage_"
GENESIS_PROPERTY = "icefall.genesis"
RESTAGED_FROM_PROPERTY = "icefall.restaged-from"  # snapshot summary of a re-staged batch: the staged id
RESET_PROPERTY = "icefall.offset-reset"  # snapshot summary of an offset reset: its reason
EPOCH_CLAIM_PROPERTY = "icefall.epoch-claim"  # snapshot summary of a writer's epoch claim: the epoch
MAX_RESETS_KEPT = 20
# Attempts of one catalog commit while its own conditions still hold (the table changed elsewhere, e.g. a
# property or another branch). Each attempt re-checks everything from fresh metadata: this is not a rebase.
MAX_ATTEMPTS = 5

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """One batch of one topic: `start` is the first offset read per partition, `end` the next one to read.

    Partitions with nothing to read may be listed with `start == end` (to pin where they start). For a
    partition the table knows, `start` must equal its committed offset, unless Kafka's retention deleted
    records past it: then `retention_gaps[p]` must name that committed offset, acknowledging that
    `[retention_gaps[p], start)` can never be ingested. An overlap (start below the committed offset) is
    always refused.
    """

    topic: str
    start: Mapping[int, int]
    end: Mapping[int, int]
    max_event_time_ms: int | None = None
    max_produce_time_ms: int | None = None
    retention_gaps: Mapping[int, int] = field(default_factory=dict)
    topic_id: str | None = None  # Kafka's id of the topic read; refused if the table holds another one
    deleted_keys: str | None = None  # the deleted keys file the commit names (cdc, sequenceBy); None: same

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("a batch needs its topic")
        if set(self.start) != set(self.end):
            raise ValueError(
                f"start and end cover different partitions: {sorted(self.start)} vs {sorted(self.end)}"
            )
        for p, s in self.start.items():
            if p < 0 or s < 0 or self.end[p] < s:
                raise ValueError(f"partition {p}: bad offset range [{s}, {self.end[p]})")
        for p, lost_from in self.retention_gaps.items():
            if p not in self.start or not 0 <= lost_from <= self.start[p]:
                raise ValueError(f"partition {p}: retention gap from {lost_from} does not end at the start")


@dataclass(frozen=True)
class Stage:
    """A staging branch and the committed state it was created from (`base.snapshot_id` is never None).

    `staged` is the snapshot the writer appended, once `staged_on` has recorded it: the commit then lands
    that snapshot even if the writer has stacked its next batch on the branch meanwhile (`next_stage`).
    None: the branch's head is the batch.
    """

    branch: str
    base: CommittedState
    table_uuid: uuid.UUID = field(repr=False)
    role: TableRole = "main"  # which table it is, for the failpoints `<role>.after-stage` and on
    staged: int | None = None


@dataclass(frozen=True)
class CommitOutcome:
    """What `commit_staged_outcome` did: `snapshot_id` is `main`'s new head.

    `restaged_over` lists the maintenance snapshots (oldest first) that had moved `main` since the stage was
    prepared and that the batch was re-staged on top of; empty when `main` was fast-forwarded to the staged
    snapshot itself.
    """

    snapshot_id: int
    restaged_over: tuple[int, ...] = ()

    @property
    def restaged(self) -> bool:
        return bool(self.restaged_over)


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


def stage_branch_name(writer_id: str, attempt: int | str) -> str:
    """A branch name unique to a writer and attempt, valid as an unquoted Spark SQL identifier part."""
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", f"{writer_id}_{attempt}").strip("_")
    if not slug:
        raise ValueError("writer id and attempt must not both be empty")
    return STAGE_PREFIX + slug


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
            _commit_genesis(table, role)
            continue
        meta = table.metadata
        head = meta.refs[MAIN].snapshot_id
        ref = meta.refs.get(branch)
        if ref is None or ref.snapshot_id != head:
            # What only the branch reached (a failed attempt's snapshot) goes with the move.
            orphaned = _reached_only_by(meta, {branch})
            try:
                _commit(
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


def commit_staged(table: Table, stage: Stage, batch: Batch, epoch: int, *, keep_branch: bool = True) -> int:
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
    table: Table, stage: Stage, batch: Batch, epoch: int, *, keep_branch: bool = True
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
        requirements: tuple[TableRequirement, ...] = (
            AssertTableUUID(uuid=stage.table_uuid),
            AssertRefSnapshotId(ref=MAIN, snapshot_id=plan.head),
            AssertRefSnapshotId(ref=stage.branch, snapshot_id=plan.branch_head),
        )
        failpoint(f"{stage.role}.before-commit")
        try:
            _commit(table, updates, requirements)
        except CommitFailedException as e:
            log.info("commit of %s refused by the catalog (%s); checking again", stage.branch, e)
            continue
        except Exception as e:
            if _landed(table, new_head):
                log.warning("commit of %s reported an error but landed", stage.branch)
                break
            if plan.restage_over and isinstance(e, ValueError):
                # A re-stage adds a snapshot numbered from the metadata it was built on; if the table gained
                # a snapshot elsewhere (another branch), the catalog refuses it while applying the updates,
                # before any swap.
                log.info("re-stage of %s no longer applies (%s); checking again", stage.branch, e)
                continue
            raise
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
            _name(table), ", ".join(map(str, plan.restage_over)), stage.branch, new_head,
        )  # fmt: skip
    failpoint(f"{stage.role}.after-commit")
    return CommitOutcome(snapshot_id=new_head, restaged_over=plan.restage_over)


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


def next_stage(stage: Stage, batch: Batch, epoch: int) -> Stage:
    """The stage for the batch after `batch`, on top of `stage.staged`, before `batch` has landed.

    Its base is the state `commit_staged` gives the table by fast-forwarding to the staged snapshot, so
    the next batch can be planned, read and appended to the branch while that commit runs (no catalog
    call here). It lands only on top of exactly that state: if `batch`'s commit fails, or re-stages it as
    another snapshot, the next batch's commit finds `main` elsewhere and is refused (StaleHeadError).
    """
    if stage.staged is None:
        raise ValueError("record the staged snapshot first (staged_on)")
    return Stage(
        branch=stage.branch,
        base=state_after(stage.base, batch, epoch, snapshot_id=stage.staged),
        table_uuid=stage.table_uuid,
        role=stage.role,
    )


def rewind_dead_letters(table: Table, to_offsets: Mapping[int, int], epoch: int) -> dict[int, int]:
    """Take a dead-letter table back to `to_offsets` (the main table's committed offsets); return what moved.

    A batch's dead letters are committed before the batch itself; if the main commit then fails, the
    dead-letter table is ahead of the main table. For every partition whose committed offset here is
    beyond `to_offsets[p]`, this deletes the rows with `offset >= to_offsets[p]` and sets the committed
    offset back to `to_offsets[p]`, in ONE catalog commit that moves `main` (the delete's snapshot, or an
    empty one if no row matched) and sets `icefall.offsets` and `icefall.epoch`, guarded by
    `AssertRefSnapshotId(main, head)`: rows and offsets cannot drift apart. Partitions at or behind their
    target are left alone (this never moves forward). Returns `{partition: offset rewound to}`; empty when
    nothing was ahead.

    Raises FencedError, changing nothing, if `epoch` is below the table's `icefall.epoch` (a newer writer
    owns the table and may have committed those rows for real). The epoch check is atomic with the
    commit for the same reason as in `commit_staged`: `icefall.*` only change in commits that move `main`.
    """
    if epoch < 0:
        raise ValueError(f"epoch must not be negative, got {epoch}")
    for _ in range(MAX_ATTEMPTS):
        table.refresh()
        meta = table.metadata
        committed = state_of(meta)
        if epoch < committed.epoch:
            raise FencedError(
                f"epoch {epoch} is below the table's epoch {committed.epoch}: a newer writer took over"
            )
        back = {
            p: offset
            for p, offset in sorted(to_offsets.items())
            if p in committed.offsets and committed.offsets[p] > offset
        }
        if not back:
            return {}
        head = meta.refs[MAIN].snapshot_id  # committed offsets exist, so main does
        condition = " OR ".join(f"(partition = {p} AND offset >= {o})" for p, o in back.items())
        tx = table.transaction()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Delete operation did not match any records")
            tx.delete(condition)  # staged on main, not committed: a delete and/or an overwrite snapshot
        staged: tuple[TableUpdate, ...] = tx._updates
        if not any(isinstance(update, AddSnapshotUpdate) for update in staged):
            # No row matched: still move main, so the property change rides on a commit that moves it.
            with tx.update_snapshot().fast_append():
                pass
            staged = tx._updates
        rewound = replace(committed, offsets={**committed.offsets, **back}, epoch=epoch)
        failpoint("dlq.before-rewind")
        try:
            _commit(
                table,
                updates=(*staged, SetPropertiesUpdate(updates=rewound.to_properties())),
                requirements=(
                    AssertTableUUID(uuid=meta.table_uuid),
                    AssertRefSnapshotId(ref=MAIN, snapshot_id=head),
                ),
            )
        except CommitFailedException as e:
            log.info("rewind of %s refused by the catalog (%s); checking again", _name(table), e)
            continue
        failpoint("dlq.after-rewind")
        return back
    raise CommitError(f"could not rewind {_name(table)}: the table kept changing")


def claim_epoch(table: Table, epoch: int, *, role: TableRole = "main") -> None:
    """Record that a writer holds `epoch` before it commits anything; FencedError if the table's epoch is
    already `epoch` or above (another writer claimed it: take a new epoch above the table's).

    Leases hand out epochs, but two lease stores (a deleted and recreated Lease, a file lease beside a
    Kubernetes one) could hand out the same one; this claim is a compare-and-swap in the table, so no two
    writers ever commit under one epoch. ONE catalog commit moves `main` by an empty snapshot (summary
    `icefall.epoch-claim`) and sets `icefall.epoch`, guarded by `AssertRefSnapshotId(main, head)`: a paused
    writer's commit planned before the claim is refused (its head moved, and its epoch is below).
    """
    if epoch <= 0:
        raise ValueError(f"a claimed epoch is positive, got {epoch}")
    for _ in range(MAX_ATTEMPTS):
        table.refresh()
        meta = table.metadata
        if MAIN not in meta.refs:
            _commit_genesis(table, role)
            continue
        committed = state_of(meta)
        if committed.epoch >= epoch:
            raise FencedError(
                f"epoch {epoch} is not above the table's epoch {committed.epoch}: already claimed"
            )
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties={EPOCH_CLAIM_PROPERTY: str(epoch)}).fast_append():
            pass  # an empty snapshot: the properties ride on a commit that moves main
        try:
            _commit(
                table,
                updates=(
                    *tx._updates,
                    SetPropertiesUpdate(updates=replace(committed, epoch=epoch).to_properties()),
                ),
                requirements=(
                    AssertTableUUID(uuid=meta.table_uuid),
                    AssertRefSnapshotId(ref=MAIN, snapshot_id=committed.snapshot_id),
                ),
            )
        except CommitFailedException as e:
            log.info("epoch claim on %s refused by the catalog (%s); checking again", _name(table), e)
            continue
        failpoint(f"{role}.after-claim")
        return
    raise CommitError(f"could not claim epoch {epoch} on {_name(table)}: the table kept changing")


def reset_offsets(
    table: Table, *, topic_id: str, offsets: Mapping[int, int], reason: str, now_ms: int
) -> CommittedState:
    """Point the committed offsets at `offsets` of the topic with id `topic_id`; return the new state.

    The explicit user action after a topic was deleted and created again, or its log truncated
    (`icefall reset-offsets`). ONE catalog commit moves `main` by an empty snapshot and sets
    `icefall.topic-id`, `icefall.offsets`, `icefall.start-offsets` (the audit starts there) and appends the
    reset (time, reason, old and new id and offsets) to `icefall.offset-resets`, guarded by
    `AssertRefSnapshotId(main, head)`. The epoch is kept: a writer's batch planned before the reset starts at
    the old offsets and is refused (OffsetGapError, TopicMismatchError); it plans again from here.
    Rows already in the table stay. A table with no committed offsets has nothing to reset (ValueError).
    """
    for _ in range(MAX_ATTEMPTS):
        table.refresh()
        meta = table.metadata
        committed = state_of(meta)
        if not committed.offsets:
            raise ValueError(f"{_name(table)} has no committed offsets: there is nothing to reset")
        history = json.loads(meta.properties.get(OFFSET_RESETS, "[]"))
        history.append(
            {
                "time_ms": now_ms,
                "reason": reason,
                "from_topic_id": committed.topic_id,
                "to_topic_id": topic_id,
                "from_offsets": {str(p): o for p, o in sorted(committed.offsets.items())},
                "to_offsets": {str(p): o for p, o in sorted(offsets.items())},
            }
        )
        reset = replace(committed, topic_id=topic_id, offsets=dict(offsets), start_offsets=dict(offsets))
        properties = {
            **reset.to_properties(),
            OFFSET_RESETS: json.dumps(history[-MAX_RESETS_KEPT:], separators=(",", ":")),
        }
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties={RESET_PROPERTY: reason}).fast_append():
            pass  # an empty snapshot: the properties ride on a commit that moves main
        try:
            _commit(
                table,
                updates=(*tx._updates, SetPropertiesUpdate(updates=properties)),
                requirements=(
                    AssertTableUUID(uuid=meta.table_uuid),
                    AssertRefSnapshotId(ref=MAIN, snapshot_id=committed.snapshot_id),
                ),
            )
        except CommitFailedException as e:
            log.info("offset reset of %s refused by the catalog (%s); checking again", _name(table), e)
            continue
        return reset
    raise CommitError(f"could not reset the offsets of {_name(table)}: the table kept changing")


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


def _check(meta: TableMetadata, stage: Stage, batch: Batch, epoch: int) -> _Plan:
    """The commit to make (fast-forward or re-stage, and the properties to set), or the reason to refuse."""
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
    if committed.topic is not None and committed.topic != batch.topic:
        raise TopicMismatchError(
            f"the table holds topic {committed.topic!r}, the batch is from {batch.topic!r}"
        )
    if None not in (committed.topic_id, batch.topic_id) and committed.topic_id != batch.topic_id:
        raise TopicMismatchError(
            f"the table holds offsets of topic id {committed.topic_id}, the batch is from topic id "
            f"{batch.topic_id}: the topic was recreated"
        )
    for partition, start in sorted(batch.start.items()):
        done = committed.offsets.get(partition)
        expected = batch.retention_gaps.get(partition, start)
        if done is None and committed.offsets and expected not in (0, start):
            raise OffsetGapError(
                f"partition {partition} is new to the table: a retention gap before {start} starts at 0, "
                f"not {expected}"
            )
        if done is not None and done != expected:
            raise OffsetGapError(
                f"partition {partition}: the table is committed up to {done}, the batch starts at {start}"
                + (f" after a retention gap from {expected}" if expected != start else "")
            )

    ref = meta.refs.get(stage.branch)
    if ref is None or ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise StageError(f"staging branch {stage.branch} does not exist (abandoned, or already committed)")
    staged = ref.snapshot_id if stage.staged is None else stage.staged
    if staged == base:
        raise StageError(f"nothing staged on {stage.branch}: write the batch first (an empty batch too)")
    snapshot = meta.snapshot_by_id(staged)
    if snapshot is None or snapshot.parent_snapshot_id != base:
        parent = snapshot.parent_snapshot_id if snapshot else None
        raise StageError(
            f"{stage.branch} must hold exactly one snapshot on top of {base}; its head's parent is {parent}"
        )
    if staged != ref.snapshot_id and staged not in _ancestor_ids(meta, ref.snapshot_id):
        raise StageError(f"{stage.branch} no longer holds the staged snapshot {staged}")
    new = state_after(committed, batch, epoch, snapshot_id=staged)
    return _Plan(
        head=head,
        staged=staged,
        properties=new.to_properties(),
        restage_over=restage_over,
        branch_head=ref.snapshot_id,
    )


def state_after(committed: CommittedState, batch: Batch, epoch: int, *, snapshot_id: int) -> CommittedState:
    """The committed state once `batch` lands on top of `committed` as `snapshot_id`."""
    return replace(
        committed,
        snapshot_id=snapshot_id,
        lost_records=committed.lost_records + retention_loss(committed.offsets, batch),
        topic=batch.topic,
        topic_id=batch.topic_id or committed.topic_id,
        offsets={**committed.offsets, **batch.end},
        # The first offset read of each partition new to the table: where the audit starts counting.
        start_offsets={
            **{p: start for p, start in batch.start.items() if p not in committed.offsets},
            **committed.start_offsets,
        },
        epoch=epoch,
        max_event_time_ms=_newest(committed.max_event_time_ms, batch.max_event_time_ms),
        max_produce_time_ms=_newest(committed.max_produce_time_ms, batch.max_produce_time_ms),
        deleted_keys=batch.deleted_keys or committed.deleted_keys,
    )


def _ancestor_ids(meta: TableMetadata, snapshot_id: int) -> set[int]:
    return {s.snapshot_id for s in ancestors_of(meta.snapshot_by_id(snapshot_id), meta)}


def _maintenance_since(meta: TableMetadata, stage: Stage, head: int) -> tuple[int, ...]:
    """The snapshots after the stage's base up to `head`, oldest first, if all of them are maintenance.

    Maintenance: `head` descends from the base, no snapshot in between is an append (every ingestion
    commit is one), and the `icefall.*` properties are still exactly those the stage read (every ingestion
    commit, and a dead-letter rewind, changes `icefall.offsets`). Otherwise StaleHeadError: someone else
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
    tx = table.transaction()
    producer = tx.update_snapshot(snapshot_properties={RESTAGED_FROM_PROPERTY: str(plan.staged)})
    with producer.fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    snapshot = tx.table_metadata.snapshot_by_id(append.snapshot_id)
    if snapshot is None:  # pragma: no cover - pyiceberg staged it a line above
        raise CommitError("pyiceberg did not stage the re-staged snapshot")
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


def retention_loss(committed: Mapping[int, int], batch: Batch) -> int:
    """Records `batch` skips because Kafka's retention deleted them: the width of its acknowledged gaps.

    `_check` has verified that each gap starts at the committed offset, or at 0 for a partition added to
    the topic after the table's first commit. The first commit of a table loses nothing: where it starts is
    the spec's starting position.
    """
    if not committed:
        return 0
    return sum(batch.start[p] - lost_from for p, lost_from in batch.retention_gaps.items())


def _newest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


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


def _name(table: Table) -> str:
    return ".".join(table.name())


def _commit(
    table: Table, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...]
) -> None:
    """One catalog commit, no retries: the catalog checks `requirements` and swaps the metadata atomically."""
    response = table.catalog.commit_table(table, requirements, updates)
    table.metadata = response.metadata
    table.metadata_location = response.metadata_location


def _commit_genesis(table: Table, role: TableRole) -> None:
    """Give a table without snapshots an empty one on `main`, so a staging branch has a head to start at."""
    meta = table.metadata
    tx = table.transaction()
    with tx.update_snapshot(snapshot_properties={GENESIS_PROPERTY: "true"}).fast_append() as append:
        pass  # nothing added: the snapshot is empty; only its manifest list is written
    genesis = tx.table_metadata.snapshot_by_id(append.snapshot_id)
    if genesis is None:  # pragma: no cover - pyiceberg staged it a line above
        raise CommitError("pyiceberg did not stage the genesis snapshot")
    try:
        _commit(
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
            _commit(table, updates, requirements)
        except CommitFailedException:
            continue
        return sorted(doomed)
    raise CommitError("could not drop staging branches: the table kept changing")
