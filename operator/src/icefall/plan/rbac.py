"""The ServiceAccounts, Roles and RoleBindings of a StreamingTable's pods. Pure: no client, no I/O.

| account | used by | may |
|---|---|---|
| `icefall-<st>-driver` | the driver pod and its Spark executors | `driver_rules` |
| `icefall-<st>-compact` | the compaction pods | `compaction_rules` |

Guarantees: namespaced and minimal: nothing cluster-scoped, no Secrets (credentials arrive as env vars), no
wildcards; Leases are named where Kubernetes allows it. A ServiceAccount never mounts its token by default:
the pods that call the API opt in. Not guaranteed: that the cluster enforces RBAC.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from icefall.api import API_VERSION, StreamingTable
from icefall.plan.metadata import ChildMeta
from icefall.plan.names import commit_lease_name, rewrite_yield_name

Manifest = dict[str, Any]


def _lease_rules(lease: str) -> list[Manifest]:
    # `create` is checked before the object (and so its name) exists: RBAC cannot restrict it by name.
    return [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]


def _read_self_rule(name: str) -> Manifest:
    group = API_VERSION.split("/")[0]
    return {"apiGroups": [group], "resources": ["streamingtables"], "resourceNames": [name], "verbs": ["get"]}


def driver_rules(st: StreamingTable, *, executors: bool) -> list[Manifest]:
    """What the ingestion driver may do in its namespace.

    - read its own StreamingTable (the entry point reads the spec from the API);
    - get/update its commit Lease by name, and create Leases (unrestrictable by name);
    - a keyed table's driver: get the table's yield Lease by name (it waits while a rewrite holds it);
    - with executors (Kubernetes master): what Spark's scheduler backend does to executor pods and the
      objects it makes for them: pods (create, watch, label for decommissioning, delete one or by label),
      configmaps (the executor config map), persistentvolumeclaims (on-demand executor volumes) and
      services (Spark's clean-up of services labelled with its app id).
    Nothing cluster-scoped, no Secrets (credentials arrive as env vars), no wildcards.
    """
    rules = [_read_self_rule(st.metadata.name), *_lease_rules(commit_lease_name(st.table_name))]
    if st.spec.key:  # a keyed table's batches wait while a rewrite holds the yield Lease (only read)
        rules.append(
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [rewrite_yield_name(st.table_name)],
                "verbs": ["get"],
            }
        )
    if executors:
        managed = ["create", "get", "list", "delete", "deletecollection"]
        rules += [
            {"apiGroups": [""], "resources": ["pods"], "verbs": [*managed, "watch", "patch"]},
            {
                "apiGroups": [""],
                "resources": ["configmaps", "persistentvolumeclaims", "services"],
                "verbs": managed,
            },
        ]
    return rules


def compaction_rules(st: StreamingTable) -> list[Manifest]:
    """Compaction reads its StreamingTable and claims work items with work Leases.

    Work Leases are named `icefall-<table>-work-<hash of the item>` (`icefall.plan.names.work_lease_name`):
    names not known in advance, so get/update/delete cannot be restricted by resourceNames; they cover the
    Leases of this namespace (delete: a released work Lease is removed, see `Lease.release(forget=True)`).
    The commit Lease rules stay for a worker that must pause ingestion.
    """
    work_leases = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "update", "delete"],
    }
    return [_read_self_rule(st.metadata.name), *_lease_rules(commit_lease_name(st.table_name)), work_leases]


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
