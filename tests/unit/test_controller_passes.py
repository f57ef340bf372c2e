"""The two passes over a StreamingTable (`controller.reconcile`): `apply` acts, `observe` only writes status.

Proves, against a recording stand-in for the API (no cluster): `apply` server-side applies the children
(ServiceAccounts before the pods that use them), creates the table's Spark RPC Secret once (32 random bytes,
never applied over, not again on a spec change) and the driver Pod once, and a second pass on the
same observations creates nothing and returns no Event; a resync applies only the children whose rendering
changed or that were deleted, and all of them again after the repair interval; passes read the driver Pod
from the watch's index when given one (no GET); `observe` plans the same way but reads and writes
status only (no child, Pod, annotation or Event), even when the driver is missing; a StreamingTable being
deleted is left alone by both; a body the models refuse becomes an InvalidSpec status and one Warning Event
from either pass. Metrics: every pass exports the table's conditions (an invalid body's too), and a driver
Pod created again after a failure counts one restart, a first start none, a create that found the Pod there
none.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from icefall.controller import reconcile
from icefall.controller.kube import Kube
from icefall.controller.reconcile import Config, Context
from icefall.controller.status import StatusMemory
from icefall.plan.driver import EventReason
from icefall.plan.names import ANNOTATION_DRIVER_HISTORY
from icefall.runtime.metrics import REGISTRY

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class RecordingKube:
    """The calls a pass makes, and the Pods it created (read back by `get`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.pods: dict[str, dict[str, Any]] = {}

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.calls.append(("apply", f"{manifest['kind']}/{manifest['metadata']['name']}"))

    def create(self, manifest: Mapping[str, Any]) -> bool:
        self.calls.append(("create", f"{manifest['kind']}/{manifest['metadata']['name']}"))
        pod = copy.deepcopy(dict(manifest))
        pod["metadata"]["uid"] = "pod-1"
        self.pods[pod["metadata"]["name"]] = pod
        return True

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", f"{kind}/{name}"))
        return self.pods.get(name) if kind == "Pod" else None

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", f"{kind}/{name}"))
        return True

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append(("patch_status", name))

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.calls.append(("patch_annotations", name))

    def verbs(self) -> set[str]:
        return {verb for verb, _ in self.calls}


def body(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "st-1", "generation": 1, **metadata},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {
                "namespace": "shop",
                "catalog": {"name": "lake", "type": "sql", "uri": "sqlite:///c.db", "warehouse": "/w"},
            },
        },
    }


def context(kube: RecordingKube, memory: StatusMemory, now: datetime = NOW) -> Context:
    return Context(cast(Kube, kube), Config(), memory, now)


def test_apply_creates_the_children_and_the_driver_once() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    first = reconcile.apply(body(), context(kube, memory))
    applied = [what for verb, what in kube.calls if verb == "apply"]
    assert applied.index("ServiceAccount/icefall-orders-driver") < applied.index("Deployment/orders-compact")
    assert ("create", "Pod/orders-ingest") in kube.calls
    assert first.status_written
    kube.calls.clear()
    second = reconcile.apply(body(), context(kube, memory, NOW + timedelta(seconds=1)))
    assert "create" not in kube.verbs() and "delete" not in kube.verbs()
    assert second.events == ()


def test_the_spark_rpc_secret_is_created_once_with_random_bytes_and_never_applied() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    reconcile.apply(body(), context(kube, memory))
    assert ("create", "Secret/icefall-orders-spark-auth") in kube.calls
    assert ("apply", "Secret/icefall-orders-spark-auth") not in kube.calls  # never sent over what exists
    value = base64.b64decode(kube.pods["icefall-orders-spark-auth"]["data"]["secret"])
    assert len(value) == 32
    other = reconcile.with_secret_value({"kind": "Secret", "metadata": {"name": "x"}})
    assert base64.b64decode(other["data"]["secret"]) != value
    kube.calls.clear()
    changed = body()
    changed["spec"]["source"]["topic"] = "orders-v2"
    reconcile.apply(changed, context(kube, memory, NOW + timedelta(seconds=30)))
    assert not any(what.startswith("Secret/") for _, what in kube.calls), kube.calls


def test_a_resync_applies_only_what_changed_and_everything_now_and_then() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    reconcile.apply(body(), context(kube, memory))
    every = {what for verb, what in kube.calls if verb in {"apply", "delete"}}
    assert "Role/icefall-orders-driver" in every

    kube.calls.clear()  # a resync on the same spec: not one apply or delete
    reconcile.apply(body(), context(kube, memory, NOW + timedelta(seconds=30)))
    assert not {"apply", "delete"} & kube.verbs(), kube.calls

    changed = body()  # a spec change re-renders the children that depend on it
    changed["spec"]["source"]["topic"] = "orders-v2"
    kube.calls.clear()
    reconcile.apply(changed, context(kube, memory, NOW + timedelta(seconds=60)))
    assert "apply" in kube.verbs()

    memory.forget_child("st-1", ("Role", "icefall-orders-driver"))  # deleted behind the operator's back
    kube.calls.clear()
    reconcile.apply(changed, context(kube, memory, NOW + timedelta(seconds=90)))
    assert [what for verb, what in kube.calls if verb == "apply"] == ["Role/icefall-orders-driver"]

    kube.calls.clear()  # the repair interval: everything again
    later = NOW + timedelta(seconds=90 + Config().repair_seconds)
    reconcile.apply(changed, context(kube, memory, later))
    children = {
        what for verb, what in kube.calls if verb in {"apply", "delete"} and not what.startswith("Pod/")
    }
    assert children == every


def test_passes_read_the_driver_pod_from_the_watch_when_given() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    reconcile.apply(body(), context(kube, memory))
    seen: list[tuple[str, str]] = []

    def pods(namespace: str, name: str) -> dict[str, Any] | None:
        seen.append((namespace, name))
        return kube.pods.get(name)

    kube.calls.clear()
    ctx = Context(cast(Kube, kube), Config(), memory, NOW + timedelta(seconds=10), pods=pods)
    reconcile.observe(body(), ctx)
    reconcile.apply(body(), ctx)
    assert seen == [("shop", "orders-ingest")] * 2
    assert "get" not in kube.verbs() and "create" not in kube.verbs()


def test_observe_writes_status_only() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    outcome = reconcile.observe(body(), context(kube, memory))  # no driver Pod: apply would create one
    assert kube.verbs() == {"get", "patch_status"}
    assert outcome.events == () and outcome.status_written


def test_a_table_being_deleted_is_left_to_the_finalizer() -> None:
    for run in (reconcile.apply, reconcile.observe):
        kube = RecordingKube()
        outcome = run(body(deletionTimestamp="2026-01-01T00:00:00Z"), context(kube, StatusMemory()))
        assert outcome == reconcile.Outcome() and kube.calls == []


def test_an_unreadable_body_is_an_invalid_spec_status_and_a_warning() -> None:
    broken = body()
    broken["spec"]["source"]["topic"] = ""
    for run in (reconcile.apply, reconcile.observe):
        kube = RecordingKube()
        outcome = run(broken, context(kube, StatusMemory()))
        assert kube.calls == [("patch_status", "orders")]
        assert [e.reason for e in outcome.events] == [EventReason.SPEC_CHANGED]


def condition_sample(name: str, kind: str, status: str, reason: str) -> float | None:
    labels = {"table": f"shop.{name}", "type": kind, "status": status, "reason": reason}
    return REGISTRY.get_sample_value("icefall_table_condition", labels)


def test_passes_export_the_conditions_an_invalid_body_included() -> None:
    reconcile.observe(body(name="exported"), context(RecordingKube(), StatusMemory()))
    assert condition_sample("exported", "Degraded", "False", "Healthy") == 1
    broken = body(name="exported")
    broken["spec"]["source"]["topic"] = ""
    reconcile.observe(broken, context(RecordingKube(), StatusMemory()))
    assert condition_sample("exported", "Degraded", "True", "InvalidSpec") == 1
    assert condition_sample("exported", "Degraded", "False", "Healthy") is None


def restarts(name: str) -> float | None:
    return REGISTRY.get_sample_value("icefall_driver_restarts_total", {"table": f"shop.{name}"})


def test_a_driver_created_again_after_a_failure_counts_one_restart() -> None:
    failed = {"failures": 2, "lastFailureTime": (NOW - timedelta(hours=1)).isoformat()}
    history = {ANNOTATION_DRIVER_HISTORY: json.dumps(failed)}
    kube = RecordingKube()
    reconcile.apply(body(name="crashing", annotations=history), context(kube, StatusMemory()))
    assert ("create", "Pod/crashing-ingest") in kube.calls
    assert restarts("crashing") == 1
    # The create found the Pod there already (another pass made it): not counted again.
    raced = RecordingKube()
    raced.create = lambda manifest: False  # type: ignore[method-assign]
    reconcile.apply(body(name="crashing", annotations=history), context(raced, StatusMemory()))
    assert restarts("crashing") == 1
    # A first start is no restart.
    reconcile.apply(body(name="fresh"), context(RecordingKube(), StatusMemory()))
    assert restarts("fresh") == 0
