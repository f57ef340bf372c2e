"""The Kubernetes backend of `Lease`: one coordination.k8s.io/v1 Lease object per lease name.

The record is stored in the Lease's spec, which is what `kubectl get lease` and other tools understand:

| LeaseRecord | Lease spec |
|---|---|
| holder | `holderIdentity` ("" or absent: released, nobody holds it) |
| epoch | `leaseTransitions` |
| acquire_time / renew_time | `acquireTime` / `renewTime` (MicroTime, the writer's wall clock) |
| duration_seconds | `leaseDurationSeconds` (whole seconds) |

The loop and the rules are the shared ones (`StoredLease`, `icefall.plan.leases.decide`), so this backend
behaves exactly like `FileLease`. Every write is optimistic: a replace carries the `resourceVersion` that was
read; a 409 Conflict means someone else wrote first, so the loop reads again and decides again. Nothing is
ever written blindly; `release(forget=True)` (the legacy commit Lease of an upgrade) deletes the Lease with
a resourceVersion precondition, so it only removes what it released. Labels (`LEASE_LABELS` where a label
is missing), annotations, owner references and spec fields written by others are kept.

Who creates a Lease: the operator, for every Lease of a table, as a child of its StreamingTable
(`icefall.plan.lease_objects`), so the pods' Roles need no `create` (which RBAC cannot restrict by name).
A `KubernetesLease` therefore never creates its Lease unless told to (`create_missing=True`: the operator's
own leader Lease, tests); a missing one is waited for, with one log line saying who creates it.

Expiry is judged by this process's clock from when it last saw the record change (`icefall.plan.leases`):
a holder's `renewTime` and `leaseDurationSeconds` are never trusted, so a skewed clock or a Lease written
with a huge duration cannot keep it held. As with every lease, a paused holder can outlive its lease: the
epoch in the table is what fences it.

Any other API error is raised as `LeaseAPIError` with what to fix (403: the RBAC rule the identity lacks).
The API server out of reach (no connection, a request timed out, or 429/500/502/503/504: etcd down behind
it) is `KubeAPIUnavailableError`, which names the server: an outage to wait out
(`icefall.ingest.outages.classify`), never a verdict on who holds the lease; the hold is judged again from
the next record read, so nothing is assumed about a write whose answer was lost.

Requests are sent as JSON built here, not through the client's typed models: kubernetes-client 37 serialises
a datetime with `isoformat()`, which drops the fraction at whole seconds, and the API server refuses
MicroTime without exactly six fraction digits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from icefall.commit.lease import LeaseError, StoredLease
from icefall.plan.leases import COMMIT_LEASE_SECONDS, LeaseRecord
from icefall.plan.names import LEASE_LABELS

_API_VERSION = "coordination.k8s.io/v1"
_COLLECTION = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_OBJECT = _COLLECTION + "/{name}"
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # RFC3339 with exactly six fraction digits, as MicroTime requires

_Object = dict[str, Any]
#: Answers that mean "the API server (or the etcd behind it) cannot serve now", not "no".
_UNAVAILABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class LeaseAPIError(LeaseError):
    """The API server refused a lease request for a reason other than a write conflict."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class KubeAPIUnavailableError(LeaseAPIError):
    """The API server did not answer, or answered that it cannot serve now (etcd unreachable behind it)."""


class KubernetesLease(StoredLease[_Object | None]):
    """A lease kept in the Lease `namespace/name`. A record's version is the whole object it was read from."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        holder: str,
        *,
        duration_seconds: int = COMMIT_LEASE_SECONDS,
        create_missing: bool = False,
        request_timeout: float = 10,
        **settings: Any,
    ) -> None:
        """`duration_seconds`: Icefall's duration of this Lease (`icefall.plan.leases`), used to judge it
        whatever the stored Lease says. `settings`: those of `StoredLease` (poll_seconds, clock, wall_clock,
        sleep)."""
        if not float(duration_seconds).is_integer() or duration_seconds < 1:
            raise ValueError(
                f"a Kubernetes Lease lasts a whole number of seconds (>= 1), got {duration_seconds}"
            )
        super().__init__(holder, duration_seconds=int(duration_seconds), **settings)
        self._api = api
        self.namespace = namespace
        self.name = name
        self._create_missing = create_missing
        self._request_timeout = request_timeout

    def _label(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _may_create(self) -> bool:
        return self._create_missing

    def _missing(self) -> str:
        return (
            "the operator creates each table's Leases with the StreamingTable's other children; a pod may "
            "not create Leases. Is the operator running, and does it watch this namespace?"
        )

    def _read(self) -> tuple[LeaseRecord | None, _Object | None]:
        try:
            obj = self._call("GET", _OBJECT)
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise self._error(e, "get") from e
        return self._record(obj), obj

    def _write(self, record: LeaseRecord, version: _Object | None) -> bool:
        spec = {
            "holderIdentity": record.holder or "",
            "leaseDurationSeconds": int(record.duration_seconds),
            "acquireTime": _micro_time(record.acquire_time),
            "renewTime": _micro_time(record.renew_time),
            "leaseTransitions": record.epoch,
        }
        try:
            if version is None:
                metadata: _Object = {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": dict(LEASE_LABELS),
                }
                self._call("POST", _COLLECTION, _lease(metadata, spec))
            else:
                # The read object's metadata carries its resourceVersion: the server applies the replace
                # only if the Lease is still that version. Server-managed bookkeeping is left out.
                metadata = {k: v for k, v in version["metadata"].items() if k != "managedFields"}
                metadata["labels"] = {**LEASE_LABELS, **(metadata.get("labels") or {})}
                self._call("PUT", _OBJECT, _lease(metadata, {**(version.get("spec") or {}), **spec}))
        except ApiException as e:
            # 409: changed (or created) since we read it. 404 on replace: deleted since we read it.
            if e.status == 409 or (e.status == 404 and version is not None):
                return False
            raise self._error(e, "create" if version is None else "update") from e
        return True

    def _delete(self, version: _Object | None) -> None:
        if version is None:
            return
        precondition = {"preconditions": {"resourceVersion": version["metadata"]["resourceVersion"]}}
        try:
            self._call("DELETE", _OBJECT, {"apiVersion": "v1", "kind": "DeleteOptions", **precondition})
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or changed since we read it: someone else's now
                raise self._error(e, "delete") from e

    def _record(self, obj: Mapping[str, Any]) -> LeaseRecord:
        """The record of a Lease as stored. Times and duration are kept as written (a record that changes
        only there still changed) but never used to judge expiry, so any value is accepted."""
        spec = obj.get("spec") or {}
        acquired = _seconds(spec.get("acquireTime"))
        renewed = _seconds(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds")
        return LeaseRecord(
            holder=spec.get("holderIdentity") or None,
            epoch=int(spec.get("leaseTransitions") or 0),
            acquire_time=acquired if acquired is not None else 0.0,
            renew_time=renewed if renewed is not None else 0.0,
            duration_seconds=float(duration) if isinstance(duration, int) else 0.0,
        )

    def _call(self, method: str, path: str, body: _Object | None = None) -> _Object:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            path_params={"namespace": self.namespace, "name": self.name},
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*request, _request_timeout=self._request_timeout)
            response.read()  # type: ignore[no-untyped-call]
        except TransportError as e:
            raise self._unavailable(_reason(e), None) from e
        except ApiException as e:
            # The client's own: status 0 for a TLS handshake cut off, or a Retry-After answer it gave up on.
            if e.status in (0, *_UNAVAILABLE_STATUSES):
                raise self._unavailable(f"{e.status} {e.reason}", e.status or None) from e
            raise
        if response.status in _UNAVAILABLE_STATUSES:
            error = ApiException(http_resp=response)
            raise self._unavailable(f"{error.status} {error.reason}: {_message(error)}", error.status)
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        result: _Object = json.loads(response.data or b"{}")
        return result

    def _unavailable(self, said: str, status: int | None) -> KubeAPIUnavailableError:
        where = self._api.configuration.host
        return KubeAPIUnavailableError(f"{where} (Lease {self._label()}): {said}", status)

    def _error(self, e: ApiException, verb: str) -> LeaseAPIError:
        said = _message(e)
        where = f"Lease {self._label()}"
        if e.status == 403:
            needs = {"delete": "delete", "create": "create"}.get(verb, "get/update")
            message = (
                f"not allowed to {verb} {where}: the service account needs {needs} on "
                f"leases.coordination.k8s.io in namespace {self.namespace} (API server: {said})"
            )
        elif e.status == 401:
            message = f"the API server rejected the credentials while trying to {verb} {where} ({said})"
        elif e.status == 404:
            message = f"cannot {verb} {where}: does namespace {self.namespace} exist? (API server: {said})"
        else:
            message = f"Kubernetes API error {e.status} {e.reason} while trying to {verb} {where}: {said}"
        return LeaseAPIError(message, e.status)


def _lease(metadata: _Object, spec: _Object) -> _Object:
    return {"apiVersion": _API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}


def _micro_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime(_MICRO_TIME)


def _seconds(micro_time: object) -> float | None:
    """A MicroTime as seconds; None when absent or not a time (informative only: never judged by)."""
    if not isinstance(micro_time, str) or not micro_time:
        return None
    try:
        parsed = datetime.fromisoformat(micro_time)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _reason(e: TransportError) -> str:
    """urllib3's words without its retry wrapper: the underlying cause of a MaxRetryError."""
    return str(getattr(e, "reason", None) or e)


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body or e.reason)
