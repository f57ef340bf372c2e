"""One reconciliation pass of a StreamingTable: observe → plan (icefall.plan, pure) → act (controller.kube).

1. Parse the body. A body the models refuse becomes `Ready=False`/`Degraded=True` with reason InvalidSpec
   (the admission schema makes that rare); nothing else is touched.
   A StreamingTable being deleted is left to `controller.deletion` (nothing is created for it here).
2. Contest: when an older StreamingTable names the same catalog table (`plan.claims`), this one runs no
   driver and no compaction and reports TableClaimedByOther (with an Event on the transition).
3. Observe the table and the topic (`controller.observe`, rate-limited per table) → compaction replicas
   from the backlog (`plan.scaling`, scale-down damped by `SCALE_DOWN_COOLDOWN_SECONDS`).
4. `desired_children` → server-side apply `applied` (accounts first), delete `absent`.
5. Observe the `<st>-ingest` Pod, `plan.driver.decide` with the history kept in the
   `icefall.dev/driver-history` annotation, create or delete the Pod as decided, store the new history.
6. `plan.table_status.summarize` + `derive_conditions` → status (conditions, freshness, table figures,
   dataLossRecords), written through the status subresource when `should_write_status` says so.

Guarantees: idempotent (a second pass on the same observations changes nothing and emits no Event); the
driver Pod has a fixed name, so at most one exists whatever runs concurrently or crashes in between;
deleting the Pod carries its uid, so a decision about an old Pod never deletes a new one.

Not guaranteed: that status figures are current to the second (they are as old as the last observation
and the last status write, both rate-limited), and that the history annotation survives a user's edit of it
(a malformed history reads as none: the driver restarts without backoff). When the table or Kafka cannot
be read, the previous freshness and table figures are kept and a condition says why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from icefall.api import (
    ConditionReason,
    ConditionStatus,
    ConditionType,
    ManifestError,
    StreamingTable,
    StreamingTableStatus,
    streaming_table_from_object,
)
from icefall.controller import metrics
from icefall.controller.kube import Kube
from icefall.controller.observe import Observed, TableObserver
from icefall.plan.children import desired_children
from icefall.plan.claims import Claim, claim_from_object, claimed_by_other
from icefall.plan.conditions import (
    Issue,
    Observations,
    degraded_event,
    degraded_reason,
    derive_conditions,
    set_condition,
    should_write_status,
)
from icefall.plan.driver import (
    MAX_BACKOFF_SECONDS,
    Action,
    DriverHistory,
    Event,
    EventReason,
    EventType,
    decide,
    driver_pod_from_object,
)
from icefall.plan.names import driver_pod_name
from icefall.plan.scaling import compaction_replicas, damped_replicas
from icefall.plan.settings import OperatorSettings
from icefall.plan.table_status import acknowledged_loss, summarize

ANNOTATION_DRIVER_HISTORY = "icefall.dev/driver-history"
DEFAULT_IMAGE = "ghcr.io/icefall/icefall:latest"
STATUS_MIN_INTERVAL_SECONDS = float(os.environ.get("ICEFALL_STATUS_SECONDS", "10"))
SCALE_DOWN_COOLDOWN_SECONDS = 300.0


@dataclass(frozen=True)
class Config:
    """What the operator process was started with (environment, not per table)."""

    image: str = DEFAULT_IMAGE
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    #: The cap of a failed driver's restart backoff (plan/driver.py); lowered by the chaos run.
    driver_max_backoff_seconds: float = MAX_BACKOFF_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """`ICEFALL_IMAGE`, `ICEFALL_DRIVER_MAX_BACKOFF_SECONDS` and the settings of
        `icefall.plan.settings.SETTINGS_ENV`; defaults otherwise."""
        env = os.environ if env is None else env
        settings = OperatorSettings.from_environ(env)
        cap = float(env.get("ICEFALL_DRIVER_MAX_BACKOFF_SECONDS", MAX_BACKOFF_SECONDS))
        return cls(
            image=env.get("ICEFALL_IMAGE", DEFAULT_IMAGE), settings=settings, driver_max_backoff_seconds=cap
        )


@dataclass(frozen=True)
class Outcome:
    events: tuple[Event, ...] = ()
    requeue_seconds: float | None = None
    status_written: bool = False


class StatusMemory:
    """Per table (by uid), what this process last did: when it wrote status (for `should_write_status`),
    which compaction replica count it set, since when (for the scale-down cool-down), and which Degraded
    reason it last sent an Event for."""

    def __init__(self) -> None:
        self._last: dict[str, datetime] = {}
        self._replicas: dict[str, tuple[int, datetime]] = {}
        self._degraded: dict[str, ConditionReason | None] = {}

    def degraded(self, uid: str, default: ConditionReason | None) -> ConditionReason | None:
        """The Degraded reason last evented for `uid`; `default` (what status says) before the first."""
        return self._degraded.get(uid, default)

    def evented_degraded(self, uid: str, reason: ConditionReason | None) -> None:
        self._degraded[uid] = reason

    def last_write(self, uid: str) -> datetime | None:
        return self._last.get(uid)

    def wrote(self, uid: str, when: datetime) -> None:
        self._last[uid] = when

    def replicas(self, uid: str) -> tuple[int, datetime] | None:
        return self._replicas.get(uid)

    def scaled(self, uid: str, replicas: int, when: datetime) -> None:
        previous = self._replicas.get(uid)
        if previous is None or previous[0] != replicas:
            self._replicas[uid] = (replicas, when)

    def forget(self, uid: str) -> None:
        self._last.pop(uid, None)
        self._replicas.pop(uid, None)
        self._degraded.pop(uid, None)


def reconcile(
    body: Mapping[str, Any],
    kube: Kube,
    config: Config,
    memory: StatusMemory,
    now: datetime,
    *,
    observer: TableObserver | None = None,
    claims: Sequence[Claim] = (),
    act: bool = True,
) -> Outcome:
    """One pass over the StreamingTable `body` (see the module docstring). `claims`: the other
    StreamingTables naming the same catalog table; `observer`: reads the table and Kafka (None: not).
    `act=False`: a status-only pass (observe and write status; no child, pod or annotation is touched,
    no Event is returned), cheap enough to run often."""
    meta = body.get("metadata") or {}
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    if meta.get("deletionTimestamp"):
        return Outcome()  # controller.deletion owns a StreamingTable being deleted
    try:
        st = streaming_table_from_object(body)
    except ManifestError as error:
        written = _write_invalid(body, kube, str(error), now)
        message = f"the StreamingTable cannot be read: {error}"
        return Outcome((Event(EventReason.SPEC_CHANGED, message, EventType.WARNING),), None, written)

    generation = st.metadata.generation or 0
    owner = _claimed_by(body, st, claims)
    observed = Observed()
    if observer is not None and st.spec.table.catalog is not None:
        observed = observer.observe(uid, st)
    replicas = 0 if owner is not None else _compaction_replicas(st, uid, observed, memory, now)
    children = desired_children(
        st,
        namespace=namespace,
        uid=uid,
        generation=generation,
        image=config.image,
        operator_settings=config.settings,
        compaction_replicas=replicas,
    )
    if act:
        memory.scaled(uid, replicas, now)
        for manifest in children.applied:
            kube.apply(manifest)
        for ref in children.absent:
            kube.delete(ref.kind, namespace, ref.name)

    problems = [str(p) for p in children.problems]
    if st.spec.table.catalog is None:
        problems.append("spec.table.catalog: required in a cluster (the embedded catalog is pod-local)")

    pod_name = _driver_name(children.driver_pod, st)
    pod = kube.get("Pod", namespace, pod_name)
    driver = driver_pod_from_object(pod) if pod is not None else None
    history = _history(st)
    desired_hash = None if st.spec.suspend else children.spec_hash
    decision = decide(
        driver,
        desired_hash=desired_hash,
        history=history,
        now=now,
        hold=bool(problems),
        claimed_by=owner.ref if owner is not None else None,
        max_backoff_seconds=config.driver_max_backoff_seconds,
    )
    if not act:
        pass  # status only: the next full pass acts on the same decision
    elif decision.action is Action.CREATE and children.driver_pod is not None:
        kube.create(children.driver_pod)
    elif decision.action is Action.DELETE and driver is not None:
        kube.delete("Pod", namespace, pod_name, uid=driver.uid)
    if act and decision.history != history:
        text = json.dumps(decision.history.to_dict(), sort_keys=True, separators=(",", ":"))
        kube.patch_annotations(namespace, name, {ANNOTATION_DRIVER_HISTORY: text})

    summary = summarize(
        observed.facts,
        observed.watermarks,
        now,
        acknowledged_loss=acknowledged_loss(st.metadata.annotations),
        topic_id=observed.topic_id,
        oldest_waiting_ms=observed.oldest_waiting_ms,
    )
    issues = [*observed.issues, *summary.issues]
    events = list(decision.events)
    if owner is not None:
        claim_text = (
            f"the catalog table {'.'.join(st.table_identifier)} is claimed by the older StreamingTable "
            f"{owner.ref}; this one stays idle until that one is deleted or names another table"
        )
        issues.append(Issue(ConditionReason.TABLE_CLAIMED, claim_text))
        previous = st.status.condition(ConditionType.READY) if st.status else None
        already = previous is not None and previous.reason is ConditionReason.TABLE_CLAIMED
        if not already and not any(e.reason is EventReason.TABLE_CLAIMED for e in events):
            events.append(Event(EventReason.TABLE_CLAIMED, claim_text, EventType.WARNING))
    observations = Observations(
        driver=decision.state,
        driver_message=decision.state_message,
        freshness_seconds=summary.freshness_seconds,
        lag_records=summary.lag_records,
        last_commit_time=summary.last_commit_time,
        spec_problems=tuple(problems),
        issues=tuple(issues),
        unmeasured=observed.unmeasured,
    )
    conditions = derive_conditions(observations, st, now)
    if act:  # status-only passes leave the transition to the next full pass, which returns the Event
        stored = degraded_reason(st.status.conditions) if st.status else None
        degraded = degraded_event(memory.degraded(uid, stored), conditions)
        memory.evented_degraded(uid, degraded_reason(conditions))
        if degraded is not None:
            events.append(degraded)
    update: dict[str, Any] = {"conditions": conditions, "observed_generation": generation}
    if summary.freshness is not None:
        update["freshness"] = summary.freshness
    if summary.table is not None:
        update["table"] = summary.table
    if summary.data_loss_records is not None:
        update["data_loss_records"] = summary.data_loss_records
    new = (st.status or StreamingTableStatus()).model_copy(update=update)
    metrics.record_table(namespace, name, summary, replicas, st.spec.freshness.target_seconds)
    written = False
    if should_write_status(st.status, new, memory.last_write(uid), now, STATUS_MIN_INTERVAL_SECONDS):
        kube.patch_status(namespace, name, _status_patch(st.status, new))
        memory.wrote(uid, now)
        written = True
    return Outcome(tuple(events) if act else (), decision.requeue_seconds, written)


def _status_patch(previous: StreamingTableStatus | None, new: StreamingTableStatus) -> dict[str, Any]:
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


def _claimed_by(body: Mapping[str, Any], st: StreamingTable, claims: Sequence[Claim]) -> Claim | None:
    me = claim_from_object(body)
    if st.spec.table.catalog is None or me is None:
        return None
    return claimed_by_other(me, [c for c in claims if c.uid != me.uid])


def _compaction_replicas(
    st: StreamingTable, uid: str, observed: Observed, memory: StatusMemory, now: datetime
) -> int:
    """Replicas from the measured backlog; without a measurement, the last count set (or minReplicas)."""
    spec = st.spec.compaction
    last = memory.replicas(uid)
    if not spec.enabled:
        return 0
    if observed.backlog is None:
        wanted = last[0] if last is not None else spec.min_replicas
        return min(max(wanted, spec.min_replicas), spec.max_replicas)
    wanted = compaction_replicas(observed.backlog, spec.min_replicas, spec.max_replicas)
    return damped_replicas(
        wanted,
        last[0] if last is not None else None,
        last[1].timestamp() if last is not None else None,
        now.timestamp(),
        cooldown_seconds=SCALE_DOWN_COOLDOWN_SECONDS,
    )


def _driver_name(pod: Mapping[str, Any] | None, st: StreamingTable) -> str:
    return str(pod["metadata"]["name"]) if pod is not None else driver_pod_name(st.metadata.name)


def _history(st: StreamingTable) -> DriverHistory:
    text = st.metadata.annotations.get(ANNOTATION_DRIVER_HISTORY)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    return DriverHistory.from_dict(data if isinstance(data, dict) else None)


def _write_invalid(body: Mapping[str, Any], kube: Kube, message: str, now: datetime) -> bool:
    """Report a body the models refuse; earlier conditions are kept when they still parse."""
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
        return False
    written = StreamingTableStatus(conditions=conditions, observed_generation=generation)
    kube.patch_status(
        str(meta["namespace"]),
        str(meta["name"]),
        written.model_dump(mode="json", by_alias=True, exclude_none=True),
    )
    return True
