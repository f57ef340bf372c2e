"""A StreamingTable's status: derived from one pass's observations, written at a bounded rate.

`derive` turns what a pass knows (the driver decision, the driver's report in `status.writer`, the spec's
problems, a claim by another StreamingTable) into conditions, freshness, table figures, dataLossRecords and
the per-destination list with its count (`tables`, `tableCount`: `plan.table_status.summarize`,
`status_tables` + `plan.conditions.derive_conditions`); the operator reads no table and no topic itself.
`write` sends them through the status subresource when `plan.conditions.should_write_status` says so, as
a merge patch (`status_patch`).
`write_invalid` reports a body the models refuse.

Guarantees: a figure that went away is sent as null, so status never shows a figure that is gone; status is
written at most every `STATUS_MIN_INTERVAL_SECONDS` per table unless a condition changes. Not guaranteed:
that status figures are current to the second (they are as old as the driver's last report and the last
write, both rate-limited). Without a recent report (no driver running), the previous freshness and table
figures are kept and FreshnessMet says why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from icefall.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    StreamingTable,
    StreamingTableStatus,
)
from icefall.controller.kube import Kube
from icefall.plan.applying import Applied, ChildKey
from icefall.plan.claims import Claim
from icefall.plan.conditions import (
    MAX_MESSAGE,
    Issue,
    Observations,
    degraded_event,
    degraded_reason,
    derive_conditions,
    driver_refusal,
    set_condition,
    should_write_status,
)
from icefall.plan.driver import DriverDecision, Event, EventReason, EventType
from icefall.plan.table_status import (
    Summary,
    acknowledged_loss,
    reported_backlog,
    status_tables,
    summarize,
    table_count,
    writer_issues,
)
from icefall.runtime.bounded import LRU

STATUS_MIN_INTERVAL_SECONDS = float(os.environ.get("ICEFALL_STATUS_SECONDS", "10"))
#: Tables whose memory one operator process keeps (least recently used forgotten first).
MAX_TABLES = 10_000


class StatusMemory:
    """Per table (by uid), what this process last did: when it wrote status (for `should_write_status`),
    which compaction replica count it set, since when (for the scale-down cool-down), which Degraded
    reason it last sent an Event for, what it applied to each child (`icefall.plan.applying`), and which
    referenced Secrets it found not granted (`icefall.plan.grants`)."""

    def __init__(self, max_tables: int = MAX_TABLES) -> None:
        # Bounded (`runtime.bounded.LRU`) as well as forgotten when a table goes: losing a live table's
        # memory costs a status write, an Event, an apply or a read of Secret labels again, never a wrong
        # decision.
        self._last: LRU[str, datetime] = LRU(max_tables)
        self._replicas: LRU[str, tuple[int, datetime]] = LRU(max_tables)
        self._degraded: LRU[str, ConditionReason | None] = LRU(max_tables)
        self._applied: LRU[str, dict[ChildKey, Applied]] = LRU(max_tables)
        self._refusals: LRU[str, tuple[str, ...]] = LRU(max_tables)

    def applied(self, uid: str, child: ChildKey) -> Applied | None:
        return (self._applied.get(uid) or {}).get(child)

    def did_apply(self, uid: str, child: ChildKey, applied: Applied) -> None:
        children = self._applied.get(uid)
        if children is None:
            children = {}
            self._applied.put(uid, children)
        children[child] = applied

    def forget_child(self, uid: str, child: ChildKey) -> None:
        """The child is gone (deleted behind the operator's back): the next pass applies it again."""
        (self._applied.get(uid) or {}).pop(child, None)

    def degraded(self, uid: str, default: ConditionReason | None) -> ConditionReason | None:
        """The Degraded reason last evented for `uid`; `default` (what status says) before the first."""
        return self._degraded.get(uid) if uid in self._degraded else default

    def evented_degraded(self, uid: str, reason: ConditionReason | None) -> None:
        self._degraded.put(uid, reason)

    def last_write(self, uid: str) -> datetime | None:
        return self._last.get(uid)

    def wrote(self, uid: str, when: datetime) -> None:
        self._last.put(uid, when)

    def replicas(self, uid: str) -> tuple[int, datetime] | None:
        return self._replicas.get(uid)

    def scaled(self, uid: str, replicas: int, when: datetime) -> None:
        previous = self._replicas.get(uid)
        if previous is None or previous[0] != replicas:
            self._replicas.put(uid, (replicas, when))

    def refusals(self, uid: str) -> tuple[str, ...] | None:
        """The Secret refusals the last `apply` pass found (`icefall.plan.grants`); None before the first."""
        return self._refusals.get(uid)

    def refused(self, uid: str, refusals: tuple[str, ...]) -> None:
        self._refusals.put(uid, refusals)

    def forget(self, uid: str) -> None:
        self._refusals.pop(uid)
        self._last.pop(uid)
        self._replicas.pop(uid)
        self._degraded.pop(uid)
        self._applied.pop(uid)


@dataclass(frozen=True)
class Derived:
    """The status one pass derived: the new status, the summary it came from, and the Event of a claim by
    another StreamingTable that just began (for the applier to send)."""

    status: StreamingTableStatus
    summary: Summary
    events: tuple[Event, ...]

    @property
    def conditions(self) -> list[Condition]:
        return self.status.conditions


def derive(
    st: StreamingTable,
    decision: DriverDecision,
    *,
    problems: Sequence[str],
    owner: Claim | None,
    now: datetime,
    refusals: Sequence[str] = (),
    issues: Sequence[Issue] = (),
) -> Derived:
    """The status of `st` from this pass's observations (see the module docstring): its driver's report
    (`status.writer`), the driver decision, `owner` (the older StreamingTable that claims the same catalog
    table, if any), `refusals` (the Secrets it may not use, `icefall.plan.grants`) and the pass's own
    `issues` (e.g. a pod policy violation)."""
    writer = st.status.writer if st.status else None
    summary = summarize(writer, now, acknowledged_loss=acknowledged_loss(st.metadata.annotations))
    found = [*issues, *summary.issues, *writer_issues(writer, now)]
    if refusals:
        found.append(Issue(ConditionReason.SECRET_NOT_ALLOWED, "; ".join(refusals)[:MAX_MESSAGE]))
    refused = driver_refusal(decision.state, decision.history)
    if refused is not None and refused.reason not in {issue.reason for issue in found}:
        found.append(refused)
    events: list[Event] = []
    if owner is not None:
        issue, event = _claimed(st, owner, decision)
        found.append(issue)
        events += [event] if event is not None else []
    observations = Observations(
        driver=decision.state,
        driver_message=decision.state_message,
        freshness_seconds=summary.freshness_seconds,
        lag_records=summary.lag_records,
        last_commit_time=summary.last_commit_time,
        spec_problems=tuple(problems),
        issues=tuple(found),
        unmeasured=summary.unmeasured,
        compaction_backlog=reported_backlog(writer, now),
    )
    previous = st.status.tables if st.status else []
    update: dict[str, Any] = {
        "conditions": derive_conditions(observations, st, now),
        "observed_generation": st.metadata.generation or 0,
        "tables": status_tables(st, writer, previous, now),
        "table_count": table_count(st, writer),
    }
    if summary.freshness is not None:
        update["freshness"] = summary.freshness
    if summary.table is not None:
        update["table"] = summary.table
    if summary.data_loss_records is not None:
        update["data_loss_records"] = summary.data_loss_records
    status = (st.status or StreamingTableStatus()).model_copy(update=update)
    return Derived(status, summary, tuple(events))


def _claimed(st: StreamingTable, owner: Claim, decision: DriverDecision) -> tuple[Issue, Event | None]:
    """The issue of a table claimed by `owner`, and its Event when the claim is new (not in status yet,
    and not already an Event of the driver decision)."""
    text = (
        f"the catalog table {'.'.join(st.table_identifier)} is claimed by the older StreamingTable "
        f"{owner.ref}; this one stays idle until that one is deleted or names another table"
    )
    previous = st.status.condition(ConditionType.READY) if st.status else None
    already = previous is not None and previous.reason is ConditionReason.TABLE_CLAIMED
    if already or any(e.reason is EventReason.TABLE_CLAIMED for e in decision.events):
        return Issue(ConditionReason.TABLE_CLAIMED, text), None
    return Issue(ConditionReason.TABLE_CLAIMED, text), Event(
        EventReason.TABLE_CLAIMED, text, EventType.WARNING
    )


def degraded_transition(
    st: StreamingTable, uid: str, conditions: Sequence[Condition], memory: StatusMemory
) -> Event | None:
    """The Event of a Degraded transition since the last one this process sent (remembered)."""
    stored = degraded_reason(st.status.conditions) if st.status else None
    event = degraded_event(memory.degraded(uid, stored), conditions)
    memory.evented_degraded(uid, degraded_reason(conditions))
    return event


@dataclass(frozen=True)
class Ref:
    """The StreamingTable a pass is about, as its body names it."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Ref:
        meta = body.get("metadata") or {}
        return cls(str(meta["namespace"]), str(meta["name"]), str(meta["uid"]))


def write(
    kube: Kube,
    memory: StatusMemory,
    ref: Ref,
    *,
    previous: StreamingTableStatus | None,
    new: StreamingTableStatus,
    now: datetime,
) -> bool:
    """Patch the status of `ref` from `previous` to `new` if `should_write_status` says so; True when
    written."""
    if not should_write_status(previous, new, memory.last_write(ref.uid), now, STATUS_MIN_INTERVAL_SECONDS):
        return False
    kube.patch_status(ref.namespace, ref.name, status_patch(previous, new))
    memory.wrote(ref.uid, now)
    return True


def status_patch(previous: StreamingTableStatus | None, new: StreamingTableStatus) -> dict[str, Any]:
    """`new` as a merge patch. Unset figures of the freshness and table blocks, and partitions no longer
    listed in the lag map, are sent as null (removed), so the status never shows a figure that is gone."""
    patch: dict[str, Any] = new.model_dump(mode="json", by_alias=True, exclude_none=True)
    for block, model in (("freshness", new.freshness), ("table", new.table)):
        if model is not None:
            patch[block] = model.model_dump(mode="json", by_alias=True)
    old_lag = previous.freshness.partition_lag if previous and previous.freshness else {}
    new_lag = new.freshness.partition_lag if new.freshness else {}
    dropped = {str(p): None for p in old_lag if p not in new_lag}
    if dropped and "freshness" in patch:
        patch["freshness"]["partitionLag"] = {**patch["freshness"].get("partitionLag", {}), **dropped}
    return patch


def write_invalid(
    body: Mapping[str, Any], kube: Kube, message: str, now: datetime
) -> tuple[bool, list[Condition]]:
    """Report a body the models refuse (Ready=False, Degraded=True, reason InvalidSpec); earlier conditions
    are kept when they still parse. Whether it was written (not when nothing changed), and the conditions."""
    meta = body.get("metadata") or {}
    try:
        current = StreamingTableStatus.model_validate(body.get("status") or {}).conditions
    except ValueError:
        current = []
    generation = meta.get("generation")
    conditions = current
    for kind, flag in (
        (ConditionType.READY, ConditionStatus.FALSE),
        (ConditionType.DEGRADED, ConditionStatus.TRUE),
    ):
        conditions = set_condition(
            conditions, kind, flag, ConditionReason.INVALID_SPEC, message, generation=generation, now=now
        )
    if conditions == current:
        return False, conditions
    written = StreamingTableStatus(conditions=conditions, observed_generation=generation)
    kube.patch_status(
        str(meta["namespace"]),
        str(meta["name"]),
        written.model_dump(mode="json", by_alias=True, exclude_none=True),
    )
    return True, conditions
