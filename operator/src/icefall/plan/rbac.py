"""The ServiceAccounts, Roles and RoleBindings of a StreamingTable's pods. Pure: no client, no I/O.

| account | used by | may |
|---|---|---|
| `icefall-<st>-driver` | the driver pod and its Spark executors | `driver_rules` |
| `icefall-<st>-compact` | the compaction pods | `compaction_rules` |

Guarantees: namespaced and minimal: nothing cluster-scoped, no Secrets (credentials arrive as env vars), no
wildcards; every Lease rule names its Leases, and no pod may create a Lease (the operator creates each
table's Leases, `icefall.plan.lease_objects`: `create` is the one verb RBAC cannot restrict by name).
A ServiceAccount never mounts its token by default: the pods that call the API opt in. Not guaranteed:
that the cluster enforces RBAC.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from icefall.api import API_VERSION, StreamingTable
from icefall.plan.metadata import ChildMeta
from icefall.plan.names import maintained_leases, table_leases

Manifest = dict[str, Any]


_LEASES = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
#: The driver reports the outcome of an offset reset request on its StreamingTable (`create` cannot be
#: restricted by name; an Event carries no credential and changes nothing).
_EVENTS = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
#: What Spark's scheduler backend does to its executor pods (`driver_rules`).
EXECUTOR_POD_VERBS = ["create", "get", "list", "watch", "delete", "deletecollection"]


def _lease_rules(names: list[str], verbs: list[str]) -> list[Manifest]:
    # Never `create`: it is checked before the object (and so its name) exists, so RBAC cannot restrict it
    # by name. The operator creates the Leases instead.
    return [{**_LEASES, "resourceNames": names, "verbs": verbs}]


def _read_self_rule(name: str) -> Manifest:
    group = API_VERSION.split("/")[0]
    return {"apiGroups": [group], "resources": ["streamingtables"], "resourceNames": [name], "verbs": ["get"]}


def _report_status_rule(name: str) -> Manifest:
    group = API_VERSION.split("/")[0]
    return {
        "apiGroups": [group],
        "resources": ["streamingtables/status"],
        "resourceNames": [name],
        "verbs": ["patch"],
    }


def driver_rules(st: StreamingTable, *, executors: bool) -> list[Manifest]:
    """What the ingestion driver may do in its namespace.

    - read its own StreamingTable (the entry point reads the spec from the API), and patch its status
      (`status.writer`: the lag and freshness it measured, `icefall.ingest.writer_status`);
    - create Events (the outcome of an offset reset request, `icefall.plan.offset_reset`);
    - get/update its commit Lease by name (the operator creates it); during an upgrade, get/update/delete
      the commit Lease of versions before identity-keyed names (`SuccessorLease`);
    - a keyed table's driver: get the table's yield Lease by name (it waits while a rewrite holds it);
    - with executors (Kubernetes master): what Spark 4.1's scheduler backend does to executor pods, and
      nothing else of the namespace: get its own pod (the executors' owner), create executor pods, list
      and watch them, delete one or by label (`deletecollection`). Not `patch`: Spark labels pods only
      for decommissioning (`spark.kubernetes.executor.decommissionLabel`) or a non-default allocator, and
      marks them inactive only without `deleteOnTermination`; not ConfigMaps, PVCs or Services:
      `spark_conf.driver_conf` turns off the executor ConfigMap and Spark's PVC and Service handling.
      RBAC cannot say *which* pods: the chart's admission policy (`<release>-executors`) confines a
      driver's account to its own table's executors, from the allowed image, without host access.
    Nothing cluster-scoped, no Secrets (credentials arrive as env vars), no wildcards.
    """
    leases = table_leases(st)
    rules = [
        _read_self_rule(st.metadata.name),
        _report_status_rule(st.metadata.name),
        *_lease_rules([leases.commit], ["get", "update"]),
        _EVENTS,
    ]
    if leases.legacy_commit is not None:
        legacy = [leases.legacy_commit]
        rules.append({**_LEASES, "resourceNames": legacy, "verbs": ["get", "update", "delete"]})
    if st.spec.key:  # a keyed table's batches wait while a rewrite holds the yield Lease (only read)
        rules.append({**_LEASES, "resourceNames": [leases.rewrite_yield], "verbs": ["get"]})
    if executors:
        rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": EXECUTOR_POD_VERBS})
    return rules


def compaction_rules(st: StreamingTable) -> list[Manifest]:
    """Compaction reads its StreamingTable and claims work items with the Leases of each table it writes
    (spec.table and its routes' tables, and the one set all its dynamic route's tables share:
    `maintained_leases`), by name: the
    fixed pool of work Leases and the yield Lease (get/update; the operator creates them, and a released
    one is kept for the next item). Nothing else: not the commit Lease, another table's Leases or the
    operator's leader Lease.
    """
    names = [name for leases in maintained_leases(st) for name in (*leases.work, leases.rewrite_yield)]
    return [_read_self_rule(st.metadata.name), *_lease_rules(names, ["get", "update"])]


def account(
    meta: ChildMeta,
    name: str,
    component: str,
    rules: list[Manifest],
    annotations: Mapping[str, str],
) -> list[Manifest]:
    """The ServiceAccount `name` (with the pod template's `serviceAccountAnnotations`), its Role with
    `rules`, and the RoleBinding between them."""
    service_account = meta.metadata(name, component)
    service_account["annotations"] = {**annotations, **service_account["annotations"]}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": service_account,
            # Pods opt in (the driver needs the API; compaction needs the Lease).
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta.metadata(name, component),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta.metadata(name, component),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": meta.namespace}],
        },
    ]
