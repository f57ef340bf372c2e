"""One reconciliation pass of a StreamingTable: observe → plan (icefall.plan, pure) → act (controller.kube).

1. Parse the body. A body the models refuse becomes `Ready=False`/`Degraded=True` with reason InvalidSpec
   (the admission schema makes that rare); nothing else is touched.
2. `desired_children` → server-side apply `applied` (accounts first), delete `absent`.
3. Observe the `<st>-ingest` Pod, `plan.driver.decide` with the history kept in the
   `icefall.dev/driver-history` annotation, create or delete the Pod as decided, store the new history.
4. `derive_conditions` → status, written through the status subresource when `should_write_status` says so.

Guarantees: idempotent (a second pass on the same observations changes nothing and emits no Event); the
driver Pod has a fixed name, so at most one exists whatever runs concurrently or crashes in between;
deleting the Pod carries its uid, so a decision about an old Pod never deletes a new one.

Not guaranteed: freshness and lag (the driver does not report them to the operator yet), compaction
scaling from a backlog (replicas stay 0), and that the history annotation survives a user's edit of it
(a malformed history reads as none: the driver restarts without backoff).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
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
from icefall.controller.kube import Kube
from icefall.plan.children import OperatorSettings, desired_children, driver_pod_name
from icefall.plan.conditions import Observations, derive_conditions, set_condition, should_write_status
from icefall.plan.driver import (
    Action,
    DriverHistory,
    Event,
    EventReason,
    EventType,
    decide,
    driver_pod_from_object,
)

ANNOTATION_DRIVER_HISTORY = "icefall.dev/driver-history"
DEFAULT_IMAGE = "ghcr.io/icefall/icefall:latest"
STATUS_MIN_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True)
class Config:
    """What the operator process was started with (environment, not per table)."""

    image: str = DEFAULT_IMAGE
    settings: OperatorSettings = field(default_factory=OperatorSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """`ICEFALL_IMAGE` and `ICEFALL_SPARK_MASTER` (kubernetes, local, local[N]); defaults otherwise."""
        env = os.environ if env is None else env
        settings = OperatorSettings(spark_master=env.get("ICEFALL_SPARK_MASTER", "kubernetes"))
        return cls(image=env.get("ICEFALL_IMAGE", DEFAULT_IMAGE), settings=settings)


@dataclass(frozen=True)
class Outcome:
    events: tuple[Event, ...] = ()
    requeue_seconds: float | None = None
    status_written: bool = False


class StatusMemory:
    """When this process last wrote each table's status (by uid), for `should_write_status`."""

    def __init__(self) -> None:
        self._last: dict[str, datetime] = {}

    def last_write(self, uid: str) -> datetime | None:
        return self._last.get(uid)

    def wrote(self, uid: str, when: datetime) -> None:
        self._last[uid] = when


def reconcile(
    body: Mapping[str, Any], kube: Kube, config: Config, memory: StatusMemory, now: datetime
) -> Outcome:
    """One pass over the StreamingTable `body` (see the module docstring)."""
    meta = body.get("metadata") or {}
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    try:
        st = streaming_table_from_object(body)
    except ManifestError as error:
        written = _write_invalid(body, kube, str(error), now)
        message = f"the StreamingTable cannot be read: {error}"
        return Outcome((Event(EventReason.SPEC_CHANGED, message, EventType.WARNING),), None, written)

    generation = st.metadata.generation or 0
    children = desired_children(
        st,
        namespace=namespace,
        uid=uid,
        generation=generation,
        image=config.image,
        operator_settings=config.settings,
        compaction_replicas=0,  # no backlog measurement yet
    )
    for manifest in children.applied:
        kube.apply(manifest)
    for ref in children.absent:
        kube.delete(ref.kind, namespace, ref.name)

    problems = [str(p) for p in children.problems]
    if st.spec.table.catalog is None:
        problems.append("spec.table.catalog: required in a cluster (the embedded catalog is pod-local)")

    pod_name = _driver_name(children.driver_pod, st)
    pod = kube.get("Pod", namespace, pod_name)
    observed = driver_pod_from_object(pod) if pod is not None else None
    history = _history(st)
    desired_hash = None if st.spec.suspend else children.spec_hash
    decision = decide(observed, desired_hash=desired_hash, history=history, now=now, hold=bool(problems))
    if decision.action is Action.CREATE and children.driver_pod is not None:
        kube.create(children.driver_pod)
    elif decision.action is Action.DELETE and observed is not None:
        kube.delete("Pod", namespace, pod_name, uid=observed.uid)
    if decision.history != history:
        text = json.dumps(decision.history.to_dict(), sort_keys=True, separators=(",", ":"))
        kube.patch_annotations(namespace, name, {ANNOTATION_DRIVER_HISTORY: text})

    observations = Observations(
        driver=decision.state, driver_message=decision.state_message, spec_problems=tuple(problems)
    )
    conditions = derive_conditions(observations, st, now)
    new = (st.status or StreamingTableStatus()).model_copy(
        update={"conditions": conditions, "observed_generation": generation}
    )
    written = False
    if should_write_status(st.status, new, memory.last_write(uid), now, STATUS_MIN_INTERVAL_SECONDS):
        kube.patch_status(namespace, name, new.model_dump(mode="json", by_alias=True, exclude_none=True))
        memory.wrote(uid, now)
        written = True
    return Outcome(decision.events, decision.requeue_seconds, written)


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
