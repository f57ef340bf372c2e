"""The operator's few Kubernetes calls, as plain JSON over the client's `ApiClient`. No decisions here.

- `apply`: server-side apply with the single field manager `icefall-operator`, forcing conflicts (the
  operator owns its children's fields; a user's `kubectl edit` of them is reverted on the next pass).
- `create` / `delete` / `get` / `list_objects`: the driver Pod and the purge Job are created (never
  applied over: pods are immutable); the Pod is deleted with a uid precondition, so a stale decision
  never deletes a newer pod of the same name.
- `patch_status` / `patch_annotations`: merge patches of one StreamingTable, status through the status
  subresource.
- `create_event`: an Event about a StreamingTable (the driver's, on an offset reset request).
- `secret_labels`: a Secret's labels, asked for as metadata only (PartialObjectMetadata): its data never
  reaches the operator.

Guarantees: idempotent where Kubernetes allows it — a create that finds the object (409 AlreadyExists) and
a delete that finds nothing (404) or another object (409 uid precondition) are no-ops and return False.
Every other API error propagates as `ApiException` for the caller to map.

Not guaranteed: ordering between calls; nothing here waits for an object to appear or disappear.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from icefall.api import GROUP, PLURAL, VERSION
from icefall.plan.children import Manifest
from icefall.plan.names import MANAGED_BY

FIELD_MANAGER = MANAGED_BY
REQUEST_TIMEOUT_SECONDS = 30

#: kind → (API path prefix, plural) for the kinds the operator manages.
_RESOURCES: Mapping[str, tuple[str, str]] = {
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Pod": ("/api/v1", "pods"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Job": ("/apis/batch/v1", "jobs"),
    # Created (the Spark RPC secret) and read as metadata only (`secret_labels`); never their data.
    "Secret": ("/api/v1", "secrets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    # Sent by the driver about its own StreamingTable (an offset reset request's outcome).
    "Event": ("/api/v1", "events"),
}
#: Ask for an object's metadata only (the API server leaves out a Secret's data).
_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
_ST = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}"


def collection_path(kind: str, namespace: str) -> str:
    if kind not in _RESOURCES:
        raise ValueError(f"the operator does not manage {kind} objects")
    prefix, plural = _RESOURCES[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(kind, namespace)}/{name}"


class Kube:
    """Thin JSON calls on one `ApiClient`."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return json.loads(response.data or b"{}")

    def apply(self, manifest: Manifest) -> Any:
        """Server-side apply `manifest` (which names its namespace) as `icefall-operator`, forced."""
        meta = manifest["metadata"]
        return self._call(
            "PATCH",
            object_path(manifest["kind"], meta["namespace"], meta["name"]),
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    def create(self, manifest: Manifest) -> bool:
        """Create `manifest`; False if an object of that name exists already."""
        meta = manifest["metadata"]
        try:
            self._call(
                "POST",
                collection_path(manifest["kind"], meta["namespace"]),
                body=manifest,
                query=[("fieldManager", FIELD_MANAGER)],
            )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("GET", object_path(kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def list_objects(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The objects of `kind` in `namespace` whose labels match `label_selector`."""
        found = self._call("GET", collection_path(kind, namespace), query=[("labelSelector", label_selector)])
        return list(found.get("items") or [])

    def secret_labels(self, namespace: str, name: str) -> dict[str, str] | None:
        """The labels of Secret `namespace/name` (None: it does not exist). Only its metadata is asked for
        and received: the operator never sees a Secret's values."""
        try:
            found = self._call("GET", object_path("Secret", namespace, name), accept=_METADATA_ONLY)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        if found.get("kind") != "PartialObjectMetadata":  # never hold a Secret's data, even by mistake
            raise ValueError(f"the API server answered {found.get('kind')!r} for Secret metadata")
        return dict((found.get("metadata") or {}).get("labels") or {})

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete (gracefully, background propagation); with `uid`, only that very object."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", object_path(kind, namespace, name), body=body)
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def get_streaming_table(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", _ST.format(namespace=namespace, name=name))
        return found

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._call(
            "PATCH",
            _ST.format(namespace=namespace, name=name) + "/status",
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
        )

    def create_event(
        self, namespace: str, name: str, uid: str, *, reason: str, message: str, warning: bool = False
    ) -> None:
        """A core/v1 Event about the StreamingTable `namespace/name` (uid `uid`), as `kubectl describe`
        shows them (source component `icefall-driver`)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "StreamingTable",
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "icefall-driver"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", collection_path("Event", namespace), body=event)

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self._call(
            "PATCH",
            _ST.format(namespace=namespace, name=name),
            body={"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )
