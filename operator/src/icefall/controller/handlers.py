"""kopf handlers for `icefall.dev/v1alpha1` StreamingTables. Thin: each one calls `reconcile.reconcile`.

Registered on create, update, resume (the operator's start) and a timer (`ICEFALL_RESYNC_SECONDS`, 30 s by
default) that re-observes the driver Pod: children deleted behind the operator's back come back, backoff
waits end, a suspended table loses its driver.

kopf's own state lives in annotations with the `icefall.dev/` prefix (the status schema is strict and
would prune it), its finalizer is `icefall.dev/finalizer` (kopf needs one for timers; no cleanup runs in
it: owner references let the garbage collector remove the children and the table is retained), and the
driver history annotation is left out of kopf's diff so writing it does not trigger an update. Peering is
off (standalone): run one replica until leader election lands.

Errors: 409 Conflict from the API → `kopf.TemporaryError(delay=2)`; anything else is retried by kopf
with its backoff. A spec that cannot be honoured is a condition written by `reconcile`, never an error.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import config as kube_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from icefall.api import GROUP, PLURAL, VERSION
from icefall.controller.kube import Kube
from icefall.controller.reconcile import ANNOTATION_DRIVER_HISTORY, Config, StatusMemory, reconcile

PREFIX = "icefall.dev"
RESYNC_SECONDS = float(os.environ.get("ICEFALL_RESYNC_SECONDS", "30"))
RESOURCE = (GROUP, VERSION, PLURAL)


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


def _reconcile(body: kopf.Body, memo: kopf.Memo) -> None:
    try:
        outcome = reconcile(body, memo.kube, memo.config, memo.status, datetime.now(UTC))
    except ApiException as error:
        if error.status == 409:
            raise kopf.TemporaryError(f"conflict: {error.reason}", delay=2) from error
        raise
    for event in outcome.events:
        kopf.event(body, type=event.type.value, reason=event.reason.value, message=event.message)


@kopf.on.resume(*RESOURCE, id="resume")
@kopf.on.create(*RESOURCE, id="create")
@kopf.on.update(*RESOURCE, id="update")
def on_change(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(body, memo)


@kopf.timer(*RESOURCE, id="resync", interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(body, memo)
