"""The operator's passes without any table credential (`controller.reconcile`, `controller.deletion`),
against a recording stand-in for the API (no cluster).

Proves: a table referencing a Secret without the grant label gets no driver and 0 compaction replicas and
a status saying SecretNotAllowed with the field and the fix, while a granted one runs (a Secret the operator
may not read is refused, naming the missing rule); the labels are read
by `apply` only (as metadata), `observe` reuses them; compaction is scaled from the driver's report of the
backlog when the operator does not read the table; `deletionPolicy: Delete` creates the purge Job with the
recorded table-uuids and ends when it completes (TableDropped), keeps the table (Warning, with what to do)
without a recorded uuid, when another StreamingTable recorded the same uuid, when its pod would break the
pod policy (no Job), when the Job fails (with the pod's last words) and after the deadline (the Job
deleted).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from icefall.controller import reconcile
from icefall.controller.deletion import finalize
from icefall.controller.kube import Kube
from icefall.controller.reconcile import Config, Context
from icefall.controller.status import StatusMemory
from icefall.plan.claims import Claim
from icefall.plan.driver import EventReason, EventType
from icefall.plan.names import COMPONENT_COMPACT, selector_labels
from icefall.plan.purge import JOB_NAME_LABEL

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ALLOW = {"icefall.dev/streamingtables": "allow"}


class Api:
    """Records what a pass does; `secrets` are the labels of the namespace's Secrets."""

    def __init__(self, secrets: Mapping[str, dict[str, str]] | None = None) -> None:
        self.secrets = dict(secrets or {})
        self.applied: dict[str, dict[str, Any]] = {}
        self.created: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.status: dict[str, Any] = {}
        self.secret_reads = 0
        self.forbidden: set[str] = set()
        self.pods: list[dict[str, Any]] = []

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.applied[f"{manifest['kind']}/{manifest['metadata']['name']}"] = dict(manifest)

    def create(self, manifest: Mapping[str, Any]) -> bool:
        key = (str(manifest["kind"]), str(manifest["metadata"]["name"]))
        self.created[f"{key[0]}/{key[1]}"] = copy.deepcopy(dict(manifest))
        self.objects[key] = {**copy.deepcopy(dict(manifest)), "status": {}}
        return True

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def list_objects(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in label_selector.split(","))
        return [p for p in self.pods if wanted.items() <= (p["metadata"].get("labels") or {}).items()]

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.deleted.append(f"{kind}/{name}")
        self.objects.pop((kind, name), None)
        return True

    def secret_labels(self, namespace: str, name: str) -> dict[str, str] | None:
        self.secret_reads += 1
        if name in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return self.secrets.get(name)

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status = {**self.status, **status}

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        pass


def body(*, writer: dict[str, Any] | None = None, deleting: bool = False, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "orders", "namespace": "shop", "uid": "st-1", "generation": 1,
        "creationTimestamp": "2025-12-31T00:00:00Z",
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    catalog = {
        "name": "lake", "type": "rest", "uri": "https://catalog:8181",
        "secretProperties": {"credential": {"secretKeyRef": {"name": "lake", "key": "credential"}}},
    }  # fmt: skip
    obj: dict[str, Any] = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": meta,
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {"namespace": "shop", "catalog": catalog},
            "compaction": {"maxReplicas": 4},
            **spec,
        },
    }
    if writer is not None:
        obj["status"] = {"writer": {"freshnessSeconds": 1.0, "lagRecords": 0, **writer}}
    return obj


def context(api: Api, now: datetime = NOW) -> Context:
    return Context(cast(Kube, api), Config(image="icefall:t"), StatusMemory(), now)


def conditions(api: Api) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in api.status["conditions"]}


def test_a_table_referencing_a_secret_not_granted_runs_no_pod_and_says_how_to_grant_it() -> None:
    api = Api({"lake": {"team": "a"}})
    ctx = context(api)
    reconcile.apply(body(), ctx)
    assert "Pod/orders-ingest" not in api.created
    assert api.applied["Deployment/orders-compact"]["spec"]["replicas"] == 0
    status, reason, message = conditions(api)["Ready"]
    assert (status, reason) == ("False", "SecretNotAllowed")
    assert "spec.table.catalog.secretProperties[credential]" in message and "'lake'" in message
    assert "icefall.dev/streamingtables=allow" in message
    reads = api.secret_reads
    reconcile.observe(body(), ctx)  # the status pass reuses what apply read
    assert api.secret_reads == reads

    api.secrets["lake"] = ALLOW  # granted: the next apply runs the driver
    reconcile.apply(body(), ctx)
    assert "Pod/orders-ingest" in api.created


def test_a_secret_the_operator_may_not_read_is_refused_and_says_which_rule_is_missing() -> None:
    api = Api({"lake": ALLOW})
    api.forbidden.add("lake")
    reconcile.apply(body(), context(api))
    status, reason, message = conditions(api)["Ready"]
    assert (status, reason) == ("False", "SecretNotAllowed") and "403" in message and "`get` on" in message
    assert "Pod/orders-ingest" not in api.created


def test_compaction_is_scaled_from_the_drivers_report_when_the_operator_does_not_read_the_table() -> None:
    api = Api({"lake": ALLOW})
    reported = {"reportedAt": NOW.isoformat(), "table": {"files": 9, "compactionBacklog": 3}}
    reconcile.apply(body(writer=reported), context(api))
    assert api.applied["Deployment/orders-compact"]["spec"]["replicas"] == 3
    assert api.status["table"]["files"] == 9  # the Files column, from the driver


def test_delete_runs_the_purge_job_and_ends_when_it_completed() -> None:
    api = Api({"lake": ALLOW})
    obj = body(
        writer={"reportedAt": NOW.isoformat(), "tableUuid": "u-1"}, deleting=True, deletionPolicy="Delete"
    )
    first = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=1), config=Config(image="icefall:t"))
    assert not first.done and [e.reason for e in first.events] == [EventReason.TABLE_PURGE_STARTED]
    job = api.created["Job/orders-purge"]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--table-uuid", "u-1"]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "icefall:t"
    assert not finalize(obj, cast(Kube, api), NOW + timedelta(seconds=2)).done  # running
    api.objects[("Job", "orders-purge")]["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    done = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=3))
    (event,) = done.events
    assert done.done and event.reason is EventReason.TABLE_DROPPED and "u-1" in event.message


DELTA = {"namespace": "shop", "format": "delta", "location": "s3://lake/tables/orders"}


def test_delete_of_a_delta_table_purges_the_folder_its_driver_reported_by_its_log_id() -> None:
    api = Api({"lake": ALLOW})
    writer = {"reportedAt": NOW.isoformat(), "tableUuid": "delta-id-1"}
    obj = body(writer=writer, deleting=True, deletionPolicy="Delete", table=DELTA)
    first = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=1), config=Config(image="icefall:t"))
    (started,) = first.events
    assert not first.done and started.reason is EventReason.TABLE_PURGE_STARTED
    assert "the Delta table at s3://lake/tables/orders" in started.message
    command = api.created["Job/orders-purge"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--table-uuid", "delta-id-1"]
    api.objects[("Job", "orders-purge")]["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    done = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=3))
    (event,) = done.events
    assert done.done and event.reason is EventReason.TABLE_DROPPED
    assert "dropped the Delta table at s3://lake/tables/orders" in event.message


def test_delete_stops_the_compaction_pods_before_the_purge_job_runs() -> None:
    # A compaction pod that commits (a merge, a Delta checkpoint) after the purge leaves a table behind.
    api = Api({"lake": ALLOW})
    api.objects[("Deployment", "orders-compact")] = {"metadata": {"name": "orders-compact", "uid": "d-1"}}
    labels = selector_labels("orders", COMPONENT_COMPACT)
    api.pods = [
        {"metadata": {"name": "orders-compact-1", "labels": labels, "deletionTimestamp": NOW.isoformat()}}
    ]
    writer = {"reportedAt": NOW.isoformat(), "tableUuid": "delta-id-1"}
    obj = body(writer=writer, deleting=True, deletionPolicy="Delete", table=DELTA)
    first = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=1), config=Config(image="icefall:t"))
    assert not first.done and "compaction pods" in first.message
    assert api.deleted == ["Deployment/orders-compact"] and not api.created
    assert not finalize(obj, cast(Kube, api), NOW + timedelta(seconds=2)).done and not api.created
    api.pods = []  # gone
    started = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=3), config=Config(image="icefall:t"))
    assert [e.reason for e in started.events] == [EventReason.TABLE_PURGE_STARTED]
    assert "Job/orders-purge" in api.created


def test_delete_of_a_delta_table_kept_or_never_measured_says_so() -> None:
    retained = finalize(body(deleting=True, table=DELTA), cast(Kube, Api({})), NOW + timedelta(seconds=1))
    (event,) = retained.events
    assert retained.done and event.reason is EventReason.TABLE_RETAINED
    assert event.message == "deletionPolicy Retain: kept the Delta table at s3://lake/tables/orders"
    unmeasured = body(
        writer={"reportedAt": NOW.isoformat()}, deleting=True, deletionPolicy="Delete", table=DELTA
    )
    (kept,) = finalize(unmeasured, cast(Kube, Api({"lake": ALLOW})), NOW + timedelta(seconds=1)).events
    assert kept.reason is EventReason.TABLE_DROP_FAILED and "delete its folder" in kept.message


def deleted(api: Api, obj: dict[str, Any], *, at: float = 1, uuid_claims: list[Claim] | None = None) -> Any:
    result = finalize(obj, cast(Kube, api), NOW + timedelta(seconds=at), uuid_claims=uuid_claims or [])
    assert result.done, result
    (event,) = result.events
    assert event.type is EventType.WARNING
    return event


def test_delete_keeps_the_table_it_cannot_prove_is_its_own_and_says_what_to_do() -> None:
    delete = {"deleting": True, "deletionPolicy": "Delete"}
    unrecorded = deleted(Api({"lake": ALLOW}), body(writer={"reportedAt": NOW.isoformat()}, **delete))
    assert unrecorded.reason is EventReason.TABLE_DROP_FAILED and "tableUuid" in unrecorded.message
    assert "icefall purge" in unrecorded.message

    recorded = body(writer={"reportedAt": NOW.isoformat(), "tableUuid": "u-1"}, **delete)
    other = Claim(NOW, "st-2", "staging", "orders-alias")
    shared = deleted(Api({"lake": ALLOW}), recorded, uuid_claims=[other])
    assert shared.reason is EventReason.TABLE_KEPT_FOR_OWNER and "staging/orders-alias" in shared.message

    refused = deleted(Api({}), recorded)
    assert "not granted" in refused.message or "does not exist" in refused.message

    # The Job's pod takes spec.pods.driver: a spec.pods the pod policy refuses creates no Job either.
    host = {"driver": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}
    api = Api({"lake": ALLOW})
    hostile = body(writer={"reportedAt": NOW.isoformat(), "tableUuid": "u-1"}, pods=host, **delete)
    kept = finalize(hostile, cast(Kube, api), NOW + timedelta(seconds=1))
    assert kept.done and not api.created, api.created
    (event,) = kept.events
    assert "purge Job's pod may not be created" in event.message and "hostPath" in event.message

    api = Api({"lake": ALLOW})
    finalize(recorded, cast(Kube, api), NOW + timedelta(seconds=1))
    api.objects[("Job", "orders-purge")]["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    api.pods = [
        {
            "metadata": {"labels": {JOB_NAME_LABEL: "orders-purge"}},
            "status": {"containerStatuses": [{"state": {"terminated": {"message": "PurgeRefused: x"}}}]},
        }
    ]
    failed = deleted(api, recorded, at=2)
    assert "PurgeRefused: x" in failed.message and "kept the Iceberg table" in failed.message

    api = Api({"lake": ALLOW})
    finalize(recorded, cast(Kube, api), NOW + timedelta(seconds=1))
    late = deleted(api, recorded, at=Config().purge_deadline_seconds + 1)
    assert "did not finish in time" in late.message and "Job/orders-purge" in api.deleted
