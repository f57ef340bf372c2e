"""Deleting a StreamingTable: stop the driver, then keep or drop the Iceberg table (`spec.deletionPolicy`).

Runs from the operator's one finalizer (`icefall.dev/finalizer`), once per pass until it returns `done`:

1. Status says Deleting (best effort; the object is going away).
2. The driver Pod is deleted and waited for: nothing may write while the table is dropped. (The other
   children go with the garbage collector through their owner references.)
3. `Retain` (the default): the table and its dead-letter table stay; an Event names them. The catalog is
   never contacted, so an unreachable catalog cannot hold the deletion up.
4. `Delete`: the table and the dead-letter table are purged through pyiceberg (`purge_table`: metadata and
   files), unless another StreamingTable names the same catalog table (`plan.claims`): then the table is
   kept for it, with an Event. A table already gone counts as dropped. A catalog that cannot be reached (or
   credentials the operator lacks) is retried with an Event saying why and how to let go (switch
   `deletionPolicy` to Retain).

Guarantees: idempotent (every step checks before it acts); the table is never dropped while this
StreamingTable's driver Pod exists. Not guaranteed: that a driver of an older operator generation or a
user's `icefall run` is not writing to the table elsewhere.
"""

from __future__ import annotations

import logging
import os
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
from icefall.catalog import CatalogConfig
from icefall.controller.kube import Kube
from icefall.plan.claims import Claim, claim_from_object
from icefall.plan.conditions import set_condition
from icefall.plan.driver import Event, EventReason, EventType
from icefall.plan.names import driver_pod_name

log = logging.getLogger(__name__)
RETRY_SECONDS = 2.0
CATALOG_RETRY_SECONDS = 10.0


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
    environ: Mapping[str, str] | None = None,
) -> Finalized:
    """One deletion pass (see the module doc)."""
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

    identifier = ".".join(st.table_identifier)
    if st.spec.deletion_policy is DeletionPolicy.RETAIN or st.spec.table.catalog is None:
        kept = f"deletionPolicy {st.spec.deletion_policy.value}: kept the Iceberg table {identifier}"
        if st.dead_letter_identifier is not None:
            kept += f" and its dead-letter table {'.'.join(st.dead_letter_identifier)}"
        return Finalized(True, (Event(EventReason.TABLE_RETAINED, kept),))

    me = claim_from_object(body)
    others = [c for c in claims if me is None or c.uid != me.uid]
    if others:
        owner = min(others, key=lambda c: (c.created, c.uid))
        text = (
            f"deletionPolicy Delete: kept the Iceberg table {identifier}: StreamingTable {owner.ref} uses it"
        )
        return Finalized(True, (Event(EventReason.TABLE_KEPT_FOR_OWNER, text, EventType.WARNING),))

    config: CatalogConfig | None = None
    try:
        config = CatalogConfig.for_table(st.spec, environ=os.environ if environ is None else environ)
        dropped = _purge(st, config)
    except Exception as error:  # unreachable catalog, missing credential: retry, say why
        text = f"{type(error).__name__}: {error}"
        if config is not None:
            text = config.mask(text)
        message = (
            f"deletionPolicy Delete: cannot drop the Iceberg table {identifier} yet ({text}); retrying. "
            "To delete the StreamingTable and keep the table, set spec.deletionPolicy to Retain"
        )
        log.warning("%s/%s: %s", namespace, name, message)
        event = Event(EventReason.TABLE_DROP_FAILED, message, EventType.WARNING)
        return Finalized(False, (event,), CATALOG_RETRY_SECONDS, message)
    text = f"deletionPolicy Delete: dropped {', '.join(dropped) or 'nothing (the tables did not exist)'}"
    return Finalized(True, (Event(EventReason.TABLE_DROPPED, text),))


def _purge(st: StreamingTable, config: CatalogConfig) -> list[str]:
    from pyiceberg.exceptions import NoSuchTableError

    catalog = config.pyiceberg(make_folders=False)
    dropped = []
    for identifier in (st.table_identifier, st.dead_letter_identifier):
        if identifier is None:
            continue
        try:
            catalog.purge_table(identifier)
        except NoSuchTableError:
            continue
        dropped.append(".".join(identifier))
    return dropped


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
