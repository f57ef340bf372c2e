"""Deleting a StreamingTable: stop the driver, then keep or drop the Iceberg table (`spec.deletionPolicy`).

Runs from the operator's one finalizer (`icefall.dev/finalizer`), once per pass until it returns `done`:

1. Status says Deleting (best effort; the object is going away).
2. The driver Pod is deleted and waited for: nothing may write while the table is dropped. (The other
   children go with the garbage collector through their owner references; before a purge the compaction
   Deployment is deleted and its pods waited for too: they commit merges, checkpoints and expiry, and one
   that committed after the purge left a table behind, a Delta log of one checkpoint.)
3. `Retain` (the default): the table and its dead-letter table stay; an Event names them. The catalog is
   never contacted, so an unreachable catalog cannot hold the deletion up.
4. `Delete`: the operator holds no table credential, so it never drops a table itself. Unless another
   StreamingTable names the same catalog table (`plan.claims`) or recorded the same Iceberg table-uuid,
   it runs the purge Job (`plan.purge`: `icefall purge` with the table's own credentials, under the
   driver's ServiceAccount) and waits for it; the Job drops the table and its dead-letter table only if
   their table-uuids are the ones this StreamingTable's driver recorded (`status.writer`). Whatever
   happens (no uuid recorded, a Secret not granted or a `spec.pods` the pod policy refuses, the Job
   failed, `Config.purge_deadline_seconds` passed) the deletion ends with an Event that says what was
   dropped, or why the table was kept and what to do.

Guarantees: idempotent (every step checks before it acts; the Job has a fixed name); the table is never
dropped while this StreamingTable's driver Pod exists, nor by the operator's own credentials (it has none).
Not guaranteed: that a driver of an older operator generation or a user's `icefall run` is not writing to
the table elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from icefall.api import (
    ConditionReason,
    ConditionStatus,
    ConditionType,
    DeletionPolicy,
    ManifestError,
    StreamingTable,
    StreamingTableStatus,
    streaming_table_from_object,
)
from icefall.controller.kube import Kube
from icefall.controller.reconcile import Config, secret_refusals_of
from icefall.plan.claims import Claim, claim_from_object
from icefall.plan.conditions import set_condition
from icefall.plan.driver import Event, EventReason, EventType
from icefall.plan.names import (
    COMPONENT_COMPACT,
    compaction_name,
    driver_pod_name,
    purge_job_name,
    selector_labels,
)
from icefall.plan.pod_policy import policy_issue, violations
from icefall.plan.purge import (
    JOB_NAME_LABEL,
    PurgeStep,
    job_state,
    last_words,
    purge_job,
    purge_step,
    route_table_uuids,
)

log = logging.getLogger(__name__)
RETRY_SECONDS = 2.0
DO_IT_YOURSELF = (
    "drop it with your catalog's tools, or run `icefall purge -f <manifest> --table-uuid <its table-uuid>` "
    "with the table's credentials"
)
DELETE_IT_YOURSELF = (
    "delete its folder, or run `icefall purge -f <manifest> --table-uuid <the id of its log's metaData>` "
    "with the table's credentials"
)


@dataclass(frozen=True)
class Finalized:
    done: bool  # True: the finalizer may go
    events: tuple[Event, ...] = ()
    retry_seconds: float = RETRY_SECONDS
    message: str = ""  # why not done


def finalize(
    body: Mapping[str, Any],
    kube: Kube,
    now: datetime,
    *,
    claims: Sequence[Claim] = (),
    uuid_claims: Sequence[Claim] = (),
    config: Config | None = None,
) -> Finalized:
    """One deletion pass (see the module doc). `claims`: the StreamingTables naming the same catalog
    table; `uuid_claims`: those that recorded the same table-uuid."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta["namespace"]), str(meta["name"])
    try:
        st = streaming_table_from_object(body)
    except ManifestError:
        # Unreadable: nothing is known about a table to drop; the children go by owner references.
        return Finalized(True)
    _say_deleting(body, st, kube, now)

    pod = kube.get("Pod", namespace, driver_pod_name(name))
    if pod is not None:
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            kube.delete("Pod", namespace, driver_pod_name(name), uid=pod["metadata"]["uid"])
        return Finalized(False, message="waiting for the driver pod to stop")

    identifier = _table_text(st)
    delta = st.spec.table.format.value == "delta"
    if delta and (st.spec.deletion_policy is DeletionPolicy.RETAIN or st.spec.table.location is None):
        kept = f"deletionPolicy {st.spec.deletion_policy.value}: kept {identifier}"
        return Finalized(True, (Event(EventReason.TABLE_RETAINED, kept),))
    if not delta and (st.spec.deletion_policy is DeletionPolicy.RETAIN or st.spec.table.catalog is None):
        kept = f"deletionPolicy {st.spec.deletion_policy.value}: kept {identifier}"
        if st.dead_letter_identifier is not None:
            kept += f" and its dead-letter table {'.'.join(st.dead_letter_identifier)}"
        kept += _routes_text(st) + _dynamic_text(st)
        return Finalized(True, (Event(EventReason.TABLE_RETAINED, kept),))

    me = claim_from_object(body)
    others = [c for c in claims if me is None or c.uid != me.uid]
    if others:
        owner = min(others, key=lambda c: (c.created, c.uid))
        text = f"deletionPolicy Delete: kept {identifier}: StreamingTable {owner.ref} uses it"
        return Finalized(True, (Event(EventReason.TABLE_KEPT_FOR_OWNER, text, EventType.WARNING),))
    owners = [c for c in uuid_claims if me is None or c.uid != me.uid]
    return _purge(body, st, kube, now, owners=owners, config=config)


def _stop_compaction(kube: Kube, namespace: str, name: str) -> Finalized | None:
    """Delete the compaction Deployment and wait until its pods are gone (step 2); None: none runs."""
    deployment = kube.get("Deployment", namespace, compaction_name(name))
    if deployment is not None and not deployment["metadata"].get("deletionTimestamp"):
        kube.delete("Deployment", namespace, compaction_name(name), uid=deployment["metadata"].get("uid"))
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(name, COMPONENT_COMPACT).items())
    if deployment is None and not kube.list_objects("Pod", namespace, selector):
        return None
    return Finalized(False, message="waiting for the compaction pods to stop")


def _table_text(st: StreamingTable) -> str:
    """How Events name the table: "the Iceberg table <namespace>.<name>", "the Delta table at <location>"."""
    if st.spec.table.format.value == "delta":
        return f"the Delta table at {st.spec.table.location}"
    return f"the Iceberg table {'.'.join(st.table_identifier)}"


def _routes_text(st: StreamingTable, names: Sequence[str] | None = None) -> str:
    """ " and its route tables a, b" of `names` (default: every route table of `st`), or ""."""
    found = [".".join(i) for i in st.route_identifiers] if names is None else list(names)
    return f" and its route tables {', '.join(found)}" if found else ""


def _dynamic_text(st: StreamingTable) -> str:
    """ " and the tables its dynamic route made (...)" when `st` has one, or ""."""
    if st.spec.dynamic_route is None:
        return ""
    return " and the tables its dynamic route made (those with its owner property icefall.dynamic-route-of)"


def _purge(
    body: Mapping[str, Any],
    st: StreamingTable,
    kube: Kube,
    now: datetime,
    *,
    owners: Sequence[Claim],
    config: Config | None,
) -> Finalized:
    """Step 4 of the module doc: the purge Job, as `plan.purge.purge_step` decides."""
    config = config or Config()
    meta = body.get("metadata") or {}
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    report = st.status.writer if st.status else None
    table_uuid = report.table_uuid if report is not None else None
    refusals = _pod_refusals(kube, st, namespace, config) if table_uuid and not owners else []
    job_name = purge_job_name(name)
    job = job_state(kube.get("Job", namespace, job_name))
    started = meta.get("deletionTimestamp")
    begun = datetime.fromisoformat(str(started).replace("Z", "+00:00")) if started else now
    elapsed = (now - begun).total_seconds()
    deadline = config.purge_deadline_seconds
    step = purge_step(
        table_uuid=table_uuid,
        uuid_owners=[c.ref for c in owners],
        refusals=refusals,
        job=job,
        elapsed_seconds=elapsed,
        deadline_seconds=deadline,
    )
    identifier = _table_text(st)
    kept = f"deletionPolicy Delete: kept {identifier}"
    if step is PurgeStep.CREATE:
        if (waiting := _stop_compaction(kube, namespace, name)) is not None:
            return waiting
        dead_letters = report.dead_letter_table_uuid if report is not None else None
        assert table_uuid is not None  # purge_step creates nothing without it
        kube.create(
            purge_job(
                st, namespace=namespace, uid=uid, image=config.image, settings=config.settings,
                table_uuid=table_uuid, dead_letter_table_uuid=dead_letters, active_seconds=deadline - elapsed,
            )
        )  # fmt: skip
        text = f"deletionPolicy Delete: the Job {job_name} drops {identifier} (table-uuid {table_uuid})"
        return Finalized(False, (Event(EventReason.TABLE_PURGE_STARTED, text),), message="purging")
    if step is PurgeStep.WAIT:
        return Finalized(False, message=f"waiting for the purge Job {job_name}")
    if step is PurgeStep.DROPPED:
        text = f"deletionPolicy Delete: the Job {job_name} dropped {identifier}"
        text += f" (table-uuid {table_uuid})"
        if st.dead_letter_identifier is not None:
            text += f" and its dead-letter table {'.'.join(st.dead_letter_identifier)}"
        dropped, routes = route_table_uuids(st), [".".join(i) for i in st.route_identifiers]
        text += _routes_text(st, [r for r in routes if r in dropped]) + _dynamic_text(st)
        if len(dropped) < len(routes):
            kept_routes = ", ".join(r for r in routes if r not in dropped)
            text += f"; kept the route tables {kept_routes} (their driver never reported their table-uuid)"
        return Finalized(True, (Event(EventReason.TABLE_DROPPED, text),))
    if step is PurgeStep.KEEP_FOR_OWNER:
        text = f"{kept} (table-uuid {table_uuid}): StreamingTable {owners[0].ref} writes it too"
        return Finalized(True, (Event(EventReason.TABLE_KEPT_FOR_OWNER, text, EventType.WARNING),))
    failure = job.message if job is not None else ""
    how = DELETE_IT_YOURSELF if st.spec.table.format.value == "delta" else DO_IT_YOURSELF
    event = _kept(step, kept, job_name, refusals, kube, namespace, failure, how=how)
    return Finalized(True, (event,))


def _pod_refusals(kube: Kube, st: StreamingTable, namespace: str, config: Config) -> list[str]:
    """Why the purge Job's pod may not be created, as for any pod of the table: a referenced Secret not
    granted (`plan.grants`), or a `spec.pods` the pod policy refuses (the pod takes spec.pods.driver and
    common; `plan.pod_policy`: the admission policy may have come after the table)."""
    refusals = secret_refusals_of(kube, st, namespace)
    broken = violations(config.pod_policy, st)
    if broken:
        refusals.append(policy_issue(broken).message)
    return refusals


def _kept(  # noqa: PLR0917 (private: the why of each way to keep)
    step: PurgeStep,
    kept: str,
    job_name: str,
    refusals: Sequence[str],
    kube: Kube,
    namespace: str,
    job_failure: str,
    *,
    how: str,
) -> Event:
    """The Warning Event of a Delete that keeps the table (KEEP, FAILED, TIMED_OUT)."""
    if step is PurgeStep.FAILED:
        words = last_words(kube.list_objects("Pod", namespace, f"{JOB_NAME_LABEL}={job_name}"))
        why = f"the purge Job {job_name} failed ({words or job_failure or 'no message'})"
    elif step is PurgeStep.TIMED_OUT:
        kube.delete("Job", namespace, job_name)  # stops a pod that still runs: nothing drops it later
        why = (
            f"the purge Job {job_name} did not finish in time (its pod could not start or run: image, "
            "quota, scheduling?); it was stopped"
        )
    elif refusals:
        why = "the purge Job's pod may not be created: " + "; ".join(refusals)
    else:
        why = (
            "its driver never reported which table it writes (status.writer.tableUuid), so nothing proves "
            "the table under that name is this StreamingTable's"
        )
    message = f"{kept}: {why}. To remove it, {how}"
    log.warning("%s/%s", namespace, message)
    return Event(EventReason.TABLE_DROP_FAILED, message, EventType.WARNING)


def _say_deleting(body: Mapping[str, Any], st: StreamingTable, kube: Kube, now: datetime) -> None:
    current = st.status or StreamingTableStatus()
    ready = current.condition(ConditionType.READY)
    if ready is not None and ready.reason is ConditionReason.DELETING:
        return
    message = "the StreamingTable is being deleted: stopping the driver"
    generation = st.metadata.generation
    conditions = list(current.conditions)
    for kind, status in (
        (ConditionType.READY, ConditionStatus.FALSE),
        (ConditionType.INGESTING, ConditionStatus.FALSE),
        (ConditionType.FRESHNESS_MET, ConditionStatus.UNKNOWN),
        (ConditionType.DEGRADED, ConditionStatus.FALSE),
    ):
        conditions = set_condition(
            conditions, kind, status, ConditionReason.DELETING, message, generation=generation, now=now
        )
    written = current.model_copy(update={"conditions": conditions})
    meta = body.get("metadata") or {}
    try:
        kube.patch_status(
            str(meta["namespace"]),
            str(meta["name"]),
            {"conditions": written.model_dump(mode="json", by_alias=True, exclude_none=True)["conditions"]},
        )
    except Exception as error:  # best effort: the object may be gone already
        log.info("could not write Deleting status of %s: %s", meta.get("name"), error)
