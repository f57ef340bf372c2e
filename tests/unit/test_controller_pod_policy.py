"""A pass over a table whose spec.pods breaks the operator's pod policy (`controller.reconcile`,
`Config.pod_policy`), against a recording stand-in for the API.

Proves: no child is applied and no driver Pod created, and status says why (Ready False and Degraded True
with reason PodPolicyViolation, the field and the fix in the message) with one Warning Event; a driver
already running an earlier, allowed spec is kept as it is (not deleted, nothing re-applied); once the
spec is fixed the children are applied again and the driver rolls to the new spec; a policy that allows
it renders the table as usual.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from icefall.api.pod_policy import PodPolicy
from icefall.controller import reconcile
from icefall.controller.kube import Kube
from icefall.controller.reconcile import Config, Context
from icefall.controller.status import StatusMemory
from icefall.plan.driver import EventReason, EventType

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOST_NETWORK = {"driver": {"hostNetwork": True}}


class RecordingKube:
    """The calls a pass makes, the Pods it created (running, as a kubelet reports) and the last status."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.status: dict[str, Any] = {}

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.calls.append(("apply", f"{manifest['kind']}/{manifest['metadata']['name']}"))

    def create(self, manifest: Mapping[str, Any]) -> bool:
        self.calls.append(("create", f"{manifest['kind']}/{manifest['metadata']['name']}"))
        pod = copy.deepcopy(dict(manifest))
        pod["metadata"]["uid"] = f"pod-{len(self.pods) + 1}"
        pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
        self.pods[pod["metadata"]["name"]] = pod
        return True

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get(name) if kind == "Pod" else None

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", f"{kind}/{name}"))
        self.pods.pop(name, None)
        return True

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status = dict(status)

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.calls.append(("patch_annotations", name))

    def acted(self) -> set[str]:
        return {verb for verb, _ in self.calls if verb in {"apply", "create", "delete"}}

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)


def body(pods: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
        "format": {"schema": [{"name": "id", "type": "long"}]},
        "table": {
            "namespace": "shop",
            "catalog": {"name": "lake", "type": "sql", "uri": "sqlite:///c.db", "warehouse": "/w"},
        },
    }
    if pods is not None:
        spec["pods"] = pods
    metadata = {"name": "orders", "namespace": "shop", "uid": "st-1", "generation": generation}
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": metadata,
        "spec": spec,
    }


def context(kube: RecordingKube, memory: StatusMemory, seconds: float = 0, **config: Any) -> Context:
    return Context(cast(Kube, kube), Config(**config), memory, NOW + timedelta(seconds=seconds))


def test_a_table_that_breaks_the_policy_gets_no_pod_and_says_why() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    outcome = reconcile.apply(body(HOST_NETWORK), context(kube, memory))
    assert kube.acted() == set(), kube.calls
    for kind in ("Ready", "Degraded"):
        condition = kube.condition(kind)
        assert condition["reason"] == "PodPolicyViolation", condition
        assert (
            "spec.pods.driver.hostNetwork: host networking is not allowed by the pod policy"
            in (condition["message"])
        )
    assert (kube.condition("Ready")["status"], kube.condition("Degraded")["status"]) == ("False", "True")
    warnings = [e for e in outcome.events if e.type is EventType.WARNING]
    assert [e.reason for e in warnings] == [EventReason.DEGRADED]
    assert reconcile.apply(body(HOST_NETWORK), context(kube, memory, 1)).events == ()
    assert kube.acted() == set()


def test_a_running_driver_is_kept_until_the_spec_is_fixed() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    reconcile.apply(body(), context(kube, memory))
    assert ("create", "Pod/orders-ingest") in kube.calls
    kube.calls.clear()
    reconcile.apply(body(HOST_NETWORK, generation=2), context(kube, memory, 10))
    assert kube.acted() == set(), "the driver of the allowed spec keeps running; nothing is re-rendered"
    assert "orders-ingest" in kube.pods
    assert kube.condition("Degraded")["reason"] == "PodPolicyViolation"
    fixed = body({"driver": {"resources": {"requests": {"cpu": "2"}}}}, generation=3)
    reconcile.apply(fixed, context(kube, memory, 20))
    assert ("apply", "Deployment/orders-compact") in kube.calls
    assert ("delete", "Pod/orders-ingest") in kube.calls, "the driver rolls to the fixed spec"
    assert kube.condition("Degraded")["reason"] != "PodPolicyViolation"


def test_a_policy_that_allows_it_renders_the_table() -> None:
    kube, memory = RecordingKube(), StatusMemory()
    reconcile.apply(body(HOST_NETWORK), context(kube, memory, pod_policy=PodPolicy(host_network=True)))
    assert ("create", "Pod/orders-ingest") in kube.calls
    assert kube.pods["orders-ingest"]["spec"]["hostNetwork"] is True
