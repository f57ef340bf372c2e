"""kopf handlers for `icefall.dev/v1alpha1` StreamingTables. Thin: each one calls one pass of
`controller.reconcile`: `apply` or `observe` (docs/controller-flow.md).

`apply` runs on create, update, resume (the operator's start) and a timer (`ICEFALL_RESYNC_SECONDS`, 30 s by
default) that re-observes the driver Pod and the driver's report: backoff waits end, a suspended table
loses its driver; children are applied only when their rendering changed (`plan.applying`). `observe` runs
on a lighter timer (`ICEFALL_STATUS_REFRESH_SECONDS`, 10 s) and refreshes only the status (freshness, lag,
files, conditions) between those passes. Driver Pods (labelled `app.kubernetes.io/managed-by=
icefall-operator`, component `ingest`) are watched and indexed: passes read them from the index (no GET),
and any change of one reconciles its owner at once, so a deleted or failed driver comes back in seconds.
The other children are watched for their deletion: one deleted behind the operator's back comes back at
once.

An in-memory index (`claims`) maps each catalog table to the StreamingTables naming it, for the
"older one wins" rule of a contested table (`plan.claims`); kopf fills it before any handler runs. Only
the StreamingTables this operator watches are compared (with `--namespace`, those namespaces).

Deletion: the finalizer's handler is `controller.deletion.finalize` (stop the driver, then keep the table,
or drop it with the purge Job, as `spec.deletionPolicy` says); it is retried every few seconds until done.
A second index (`table_uuids`) maps the Iceberg table-uuid each driver recorded to its StreamingTable: a
table another StreamingTable writes is never purged, whatever name or catalog URI reaches it.

Passes over one StreamingTable never overlap in this process (a lock per uid): the resource handlers and
the pod watch run in different kopf workers.

kopf's own state lives in annotations with the `icefall.dev/` prefix (the status schema is strict and
would prune it), its finalizer is `icefall.dev/finalizer` (for the timers and the deletion policy; owner
references let the garbage collector remove the children), and the driver history annotation is left out
of kopf's diff so writing it does not trigger an update. kopf peering is off (standalone): across
replicas, only the holder of the leader Lease runs kopf at all (`controller.leader`).

Errors: 409 Conflict from the API → `kopf.TemporaryError(delay=2)`; anything else is retried by kopf
with its backoff. A spec that cannot be honoured is a condition written by the pass, never an error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes import config as kube_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from icefall.api import GROUP, PLURAL, VERSION, ManifestError, streaming_table_from_object
from icefall.controller import metrics, reconcile
from icefall.controller.deletion import finalize
from icefall.controller.kube import Kube
from icefall.controller.reconcile import Config, Context, Outcome
from icefall.controller.status import StatusMemory
from icefall.plan.claims import Claim, claim_from_object, table_identity
from icefall.plan.names import (
    ANNOTATION_DRIVER_HISTORY,
    ANNOTATION_PREFIX,
    COMPONENT_INGEST,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)

PREFIX = ANNOTATION_PREFIX
RESYNC_SECONDS = float(os.environ.get("ICEFALL_RESYNC_SECONDS", "30"))
STATUS_REFRESH_SECONDS = float(os.environ.get("ICEFALL_STATUS_REFRESH_SECONDS", "10"))
RESOURCE = (GROUP, VERSION, PLURAL)
DRIVER_LABELS = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: COMPONENT_INGEST}
#: The children besides the driver Pod (`icefall.plan.children`), watched for their deletion.
CHILD_RESOURCES = (
    ("", "v1", "serviceaccounts"),
    ("", "v1", "configmaps"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("apps", "v1", "deployments"),
    ("networking.k8s.io", "v1", "networkpolicies"),
)
CHILD_LABELS = {LABEL_MANAGED_BY: MANAGED_BY}


class Locks:
    """One lock per StreamingTable uid, so passes over one table never overlap in this process."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(uid, threading.Lock())
        with lock:
            yield

    def forget(self, uid: str) -> None:
        with self._guard:
            self._locks.pop(uid, None)


def api_client() -> ApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG (or ~/.kube/config)."""
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]
    return ApiClient()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX,
        key="last-handled-configuration",
        ignored_fields=[("metadata", "annotations", ANNOTATION_DRIVER_HISTORY)],
    )
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    # The chart grants no access to CRDs or namespaces: watch exactly the namespaces given.
    settings.scanning.disabled = True
    memo.kube = Kube(api_client())
    memo.config = Config.from_env()
    memo.status = StatusMemory()
    memo.locks = Locks()


@kopf.index(*RESOURCE, id="claims")
def claims(body: kopf.Body, **_: Any) -> dict[str, Claim]:
    """catalog table identity → the claim of this StreamingTable (nothing for one that does not parse)."""
    claim = claim_from_object(body)
    try:
        st = streaming_table_from_object(body)
    except ManifestError:
        return {}
    if claim is None or st.spec.table.catalog is None:
        return {}
    return {table_identity(st): claim}


@kopf.index(*RESOURCE, id="table_uuids")
def table_uuids(body: kopf.Body, **_: Any) -> dict[str, Claim]:
    """Iceberg table-uuid its driver recorded (`status.writer.tableUuid`) → the claim of this StreamingTable:
    who else writes the very table `deletionPolicy: Delete` would drop (whatever name or URI reaches it)."""
    claim = claim_from_object(body)
    writer = (body.get("status") or {}).get("writer") or {}
    table_uuid = writer.get("tableUuid") if isinstance(writer, Mapping) else None
    if claim is None or not isinstance(table_uuid, str) or not table_uuid:
        return {}
    return {table_uuid: claim}


PodKey = tuple[str, str]


@kopf.index("pods", labels=DRIVER_LABELS, id="driver_pods")
def driver_pods(body: kopf.Body, **_: Any) -> dict[PodKey, dict[str, Any]]:
    """(namespace, name) → the driver Pod as last seen by the watch: passes read Pods here, not with a GET."""
    meta = body.get("metadata") or {}
    return {(str(meta.get("namespace")), str(meta.get("name"))): dict(body)}


def _pod_lookup(index: kopf.Index[PodKey, dict[str, Any]]) -> Callable[[str, str], dict[str, Any] | None]:
    def pod(namespace: str, name: str) -> dict[str, Any] | None:
        return next(iter(index.get((namespace, name), [])), None)

    return pod


def _claims_for(body: Mapping[str, Any], index: kopf.Index[str, Claim]) -> list[Claim]:
    try:
        st = streaming_table_from_object(body)
    except ManifestError:
        return []
    return list(index.get(table_identity(st), []))


Pass = Callable[[Mapping[str, Any], Context, Sequence[Claim]], Outcome]


def _run(run: Pass, body: Mapping[str, Any], memo: kopf.Memo, indexes: Mapping[str, Any]) -> None:
    """One pass (`reconcile.apply` or `reconcile.observe`) under the table's lock, counted and timed; its
    Events sent; a 409 retried soon. `indexes`: the handler's keyword arguments (kopf's indexes)."""
    uid = str(body["metadata"]["uid"])
    started = time.monotonic()
    try:
        with memo.locks.hold(uid):
            ctx = Context(
                memo.kube, memo.config, memo.status, datetime.now(UTC),
                pods=_pod_lookup(indexes["driver_pods"]),
            )  # fmt: skip
            outcome = run(body, ctx, _claims_for(body, indexes["claims"]))
    except ApiException as error:
        metrics.RECONCILES.labels(result="error").inc()
        if error.status == 409:
            raise kopf.TemporaryError(f"conflict: {error.reason}", delay=2) from error
        raise
    except Exception:
        metrics.RECONCILES.labels(result="error").inc()
        raise
    finally:
        metrics.RECONCILE_DURATION.observe(time.monotonic() - started)
    metrics.RECONCILES.labels(result="ok").inc()
    for event in outcome.events:
        kopf.event(
            cast(kopf.Body, body), type=event.type.value, reason=event.reason.value, message=event.message
        )


@kopf.on.resume(*RESOURCE, id="resume")
@kopf.on.create(*RESOURCE, id="create")
@kopf.on.update(*RESOURCE, id="update")
def on_change(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _run(reconcile.apply, body, memo, kwargs)


@kopf.timer(*RESOURCE, id="resync", interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    _run(reconcile.apply, body, memo, kwargs)


@kopf.timer(*RESOURCE, id="status", interval=STATUS_REFRESH_SECONDS, initial_delay=STATUS_REFRESH_SECONDS)
def refresh_status(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Freshness and lag move while nothing else happens: a status-only pass (at most one write)."""
    _run(reconcile.observe, body, memo, kwargs)


@kopf.on.event("pods", labels=DRIVER_LABELS)
def on_driver_pod(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A driver Pod changed (created, failed, deleted): reconcile its StreamingTable now."""
    _reconcile_owner(body, memo, kwargs)


def on_child_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A child was deleted behind the operator's back: apply its StreamingTable now, the child included."""
    owner = _owner(body)
    if event.get("type") != "DELETED" or owner is None:
        return
    memo.status.forget_child(str(owner.get("uid")), (str(body.get("kind")), str(body.metadata.name)))
    _reconcile_owner(body, memo, kwargs)


for _group, _version, _plural in CHILD_RESOURCES:
    kopf.on.event(_group, _version, _plural, labels=CHILD_LABELS)(on_child_event)


def _owner(body: kopf.Body) -> Mapping[str, Any] | None:
    owners = [o for o in body.metadata.get("ownerReferences", []) if o.get("kind") == "StreamingTable"]
    return owners[0] if owners else None


def _reconcile_owner(body: kopf.Body, memo: kopf.Memo, indexes: Mapping[str, Any]) -> None:
    """Run `apply` on the StreamingTable that owns `body` (a driver Pod or another child), if it is still
    the one that made it."""
    owner, namespace = _owner(body), body.metadata.namespace
    if owner is None or not namespace:
        return
    try:
        st = memo.kube.get_streaming_table(namespace, owner["name"])
    except ApiException as error:
        if error.status == 404:
            return  # the owner is gone; the garbage collector takes its children
        raise
    if st["metadata"].get("uid") != owner.get("uid"):
        return  # a child of an earlier StreamingTable of the same name
    _run(reconcile.apply, st, memo, indexes)


@kopf.on.delete(*RESOURCE, id="delete")
def on_delete(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    uid = str(body.metadata.uid)
    claims = _claims_for(body, kwargs["claims"])
    table_uuid = ((body.get("status") or {}).get("writer") or {}).get("tableUuid")
    uuid_claims = list(kwargs["table_uuids"].get(table_uuid, [])) if table_uuid else []
    with memo.locks.hold(uid):
        result = finalize(
            body, memo.kube, datetime.now(UTC), claims=claims, uuid_claims=uuid_claims, config=memo.config
        )
    for event in result.events:  # each once: a pass that waits says nothing new
        kopf.event(body, type=event.type.value, reason=event.reason.value, message=event.message)
    if not result.done:
        raise kopf.TemporaryError(result.message, delay=result.retry_seconds)
    memo.status.forget(uid)
    memo.locks.forget(uid)
    metrics.forget_table(str(body.metadata.namespace), str(body.metadata.name))
