"""The commits that move `main` without a staged batch: an epoch claim, an offset reset.

Each is ONE catalog commit that moves `main` by a snapshot of its own (an empty one, or a delete) and sets
the `icefall.*` properties, guarded by `AssertTableUUID` and `AssertRefSnapshotId(main, head)`: the
invariant of `icefall.commit.protocol` holds for them too (`icefall.*` only change in a commit that moves
`main`), so an epoch check made on the metadata read before the commit is atomic with it, and a batch
planned before one of these commits is refused afterwards (its head moved).

- `claim_epoch`: a writer records its lease epoch before it commits anything (commit/DESIGN.md, "Leases
  and epochs").
- `reset_offsets`: the explicit user action after a topic was recreated or truncated.

One writer commit does not move `main`: `evolve_schema` changes the table's schema before the batch that
needs it is written. It is guarded by `AssertRefSnapshotId(main, head)` all the same, which makes its epoch
check atomic with it: a fenced writer cannot change the schema after a newer writer committed.

Not guaranteed: progress under contention (each gives up after `MAX_ATTEMPTS` refused swaps).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import (
    AssertCurrentSchemaId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
    TableRequirement,
)

from icefall.commit.errors import CommitError, FencedError
from icefall.commit.protocol import (
    EPOCH_CLAIM_PROPERTY,
    MAX_ATTEMPTS,
    RESET_PROPERTY,
    RESET_TOPIC_PROPERTY,
    commit_genesis,
    table_name,
)
from icefall.commit.pyiceberg_internals import (
    commit_table,
    empty_snapshot_updates,
    schema_updates,
)
from icefall.commit.state import (
    MAIN,
    SCHEMA_CHANGES,
    CommittedState,
    OffsetReset,
    planned_reset,
    schema_change_at,
    state_of,
    with_schema_change,
)
from icefall.runtime.failpoints import TableRole, failpoint

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.update import TableUpdate

    from icefall.catalog.evolution import Evolution


log = logging.getLogger(__name__)

T = TypeVar("T")


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
    _until_committed(
        table,
        lambda meta: _claim_once(table, meta, epoch, role),
        failed=f"claim epoch {epoch} on {table_name(table)}",
    )


def _claim_once(table: Table, meta: TableMetadata, epoch: int, role: TableRole) -> bool | None:
    if MAIN not in meta.refs:
        commit_genesis(table, role)
        return None  # a head now (ours or another's): check again
    committed = state_of(meta)
    if committed.epoch >= epoch:
        raise FencedError(f"epoch {epoch} is not above the table's epoch {committed.epoch}: already claimed")
    # an empty snapshot: the properties ride on a commit that moves main
    empty = empty_snapshot_updates(table, {EPOCH_CLAIM_PROPERTY: str(epoch)})
    updates = (*empty, SetPropertiesUpdate(updates=replace(committed, epoch=epoch).to_properties()))
    if not _commit_on_main(
        table, meta, committed.snapshot_id, updates, what=f"epoch claim on {table_name(table)}"
    ):
        return None
    failpoint(f"{role}.after-claim")
    return True


def reset_offsets(
    table: Table,
    *,
    topic_id: str,
    offsets: Mapping[int, int],
    reason: str,
    now_ms: int,
    topic: str | None = None,
    request: str | None = None,
) -> CommittedState:
    """Point the committed offsets at `offsets` of the topic with id `topic_id`; return the new state.

    The explicit user action after a topic was deleted and created again, or its log truncated
    (`icefall reset-offsets`). ONE catalog commit moves `main` by an empty snapshot and sets
    `icefall.topic-id`, `icefall.offsets`, `icefall.start-offsets` (the audit starts there) and appends the
    reset (time, reason, old and new id and offsets) to `icefall.offset-resets`, guarded by
    `AssertRefSnapshotId(main, head)`. The epoch is kept: a writer's batch planned before the reset starts at
    the old offsets and is refused (OffsetGapError, TopicMismatchError); it plans again from here.
    Rows already in the table stay. A table with no committed offsets has nothing to reset (ValueError).
    `topic`: in a table of several topics, the one topic reset (the others keep their offsets; the entry
    in `icefall.offset-resets` names it). `request`: the id of a cluster's reset request
    (`icefall.plan.offset_reset`), recorded with the reset; an attempt that finds it recorded already
    (another driver's commit landed first) commits nothing and returns the state as it is: a request is
    applied once.
    """
    asked = OffsetReset(topic_id, offsets, reason, now_ms, topic, request)
    return _until_committed(
        table,
        lambda meta: _reset_once(table, meta, asked),
        failed=f"reset the offsets of {table_name(table)}",
    )


def _reset_once(table: Table, meta: TableMetadata, asked: OffsetReset) -> CommittedState | None:
    committed = state_of(meta)
    planned = planned_reset(committed, meta.properties, asked, table_name(table))
    if planned is None:
        return committed
    reset, properties = planned
    # an empty snapshot: the properties ride on a commit that moves main
    summary = {RESET_PROPERTY: asked.reason}
    if asked.topic is not None:
        summary[RESET_TOPIC_PROPERTY] = asked.topic
    empty = empty_snapshot_updates(table, summary)
    updates = (*empty, SetPropertiesUpdate(updates=properties))
    if not _commit_on_main(
        table, meta, committed.snapshot_id, updates, what=f"offset reset of {table_name(table)}"
    ):
        return None
    return reset


def evolve_schema(table: Table, plan: Callable[[Schema], Evolution], epoch: int) -> Evolution:
    """Make the table's schema hold what `plan(current schema)` says (`icefall.catalog.evolution`); return
    the evolution committed (no changes: nothing was committed).

    ONE catalog commit adds the new schema and makes it current, guarded by `AssertTableUUID`,
    `AssertCurrentSchemaId` and `AssertRefSnapshotId(main, head)`; `main` does not move, so a batch staged
    before it still fast-forwards. The plan is made again on the metadata each attempt loads (another
    writer's change is never undone). Raises FencedError, changing nothing, when `epoch` is below the
    table's `icefall.epoch`.
    """
    return _until_committed(
        table,
        lambda meta: _evolve_once(table, meta, plan, epoch),
        failed=f"evolve the schema of {table_name(table)}",
    )


def _evolve_once(
    table: Table, meta: TableMetadata, plan: Callable[[Schema], Evolution], epoch: int
) -> Evolution | None:
    committed = state_of(meta)
    if epoch < committed.epoch:
        raise FencedError(
            f"epoch {epoch} is below the table's epoch {committed.epoch}: a newer writer took over"
        )
    evolution = plan(meta.schema())
    if not evolution.changes:
        return evolution
    updates, schema_id = schema_updates(table, evolution.apply)
    # Which rows were written before the change: the audit compares the new fields only after it.
    history = with_schema_change(meta.properties, schema_change_at(schema_id, committed))
    updates = (*updates, SetPropertiesUpdate(updates={SCHEMA_CHANGES: history}))
    current = (AssertCurrentSchemaId(current_schema_id=meta.current_schema_id),)
    what = f"schema change of {table_name(table)} ({evolution.describe()})"
    if not _commit_on_main(table, meta, committed.snapshot_id, updates, what=what, also=current):
        return None
    failpoint("main.after-schema-change")
    return evolution


def _until_committed(table: Table, attempt: Callable[[TableMetadata], T | None], *, failed: str) -> T:
    """Run `attempt` on freshly loaded metadata until it returns a result; None means "the table changed
    under it: check again". Gives up with CommitError after `MAX_ATTEMPTS` (`failed` says what it could
    not do)."""
    for _ in range(MAX_ATTEMPTS):
        table.refresh()
        outcome = attempt(table.metadata)
        if outcome is not None:
            return outcome
    raise CommitError(f"could not {failed}: the table kept changing")


def _commit_on_main(
    table: Table,
    meta: TableMetadata,
    head: int | None,
    updates: tuple[TableUpdate, ...],
    *,
    what: str,
    also: tuple[TableRequirement, ...] = (),
) -> bool:
    """Commit `updates` if `main` is still at `head` in the table `meta` was read from (and the `also`
    requirements hold); False, logged, if the catalog refused (`what` names the change)."""
    try:
        commit_table(
            table,
            updates=updates,
            requirements=(
                AssertTableUUID(uuid=meta.table_uuid),
                AssertRefSnapshotId(ref=MAIN, snapshot_id=head),
                *also,
            ),
        )
    except CommitFailedException as e:
        log.info("%s refused by the catalog (%s); checking again", what, e)
        return False
    return True
