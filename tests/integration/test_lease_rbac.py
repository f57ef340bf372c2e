"""A table's pods can touch only their own table's Leases: the Roles the operator renders, enforced by a
real kube-apiserver (RBAC on), with each pod's ServiceAccount impersonated.

Two StreamingTables in one Kubernetes namespace write tables of the same name, `sales.orders` and
`staging.orders`; their ServiceAccounts, Roles and RoleBindings are applied as `desired_children` renders
them. Proves:
- the two tables' commit, yield and work Leases are all different names;
- sales' driver takes its own commit Lease; sales' compaction pod claims, releases and removes one of its
  work Leases and takes its yield Lease;
- both are refused (403, a LeaseAPIError naming the Lease) on staging's Leases, on each other's Leases
  (the driver on the work Leases, compaction on the commit Lease) and on the operator's leader Lease;
- an upgrade: while a writer of the old bare-name commit Lease (`icefall-orders-commit`) still holds it,
  the new driver waits; once that hold runs out, the driver takes its own Lease at a higher epoch and
  removes the old one, with nothing but its own Role's grants.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, utils

from icefall.api import StreamingTable, streaming_table_from_object
from icefall.commit.kube_lease import KubernetesLease, LeaseAPIError
from icefall.commit.lease import SuccessorLease
from icefall.devstack.kube import KubeAPIServer
from icefall.plan.children import desired_children
from icefall.plan.names import LEADER_LEASE_NAME, TableLeases, table_leases
from icefall.plan.settings import OperatorSettings

pytestmark = pytest.mark.integration

NAMESPACE = "lease-rbac"
BASE: dict[str, Any] = {
    "apiVersion": "icefall.dev/v1alpha1",
    "kind": "StreamingTable",
    "metadata": {"name": "orders"},
    "spec": {
        "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
        "format": {"schema": [{"name": "id", "type": "long"}]},
        "table": {"name": "orders"},
    },
}


def streaming_table(iceberg_namespace: str) -> StreamingTable:
    body = copy.deepcopy(BASE)
    body["metadata"]["name"] = f"orders-{iceberg_namespace}"
    body["spec"]["table"]["namespace"] = iceberg_namespace
    return streaming_table_from_object(body)


@pytest.fixture(scope="module")
def admin(kube: KubeAPIServer) -> client.ApiClient:
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    return api


@pytest.fixture(scope="module")
def tables(admin: client.ApiClient) -> Iterator[dict[str, StreamingTable]]:
    """sales and staging, with their accounts and Roles applied as the operator renders them."""
    found = {}
    for iceberg_namespace in ("sales", "staging"):
        st = streaming_table(iceberg_namespace)
        children = desired_children(
            st, namespace=NAMESPACE, uid=f"uid-{iceberg_namespace}", generation=1, image="icefall:test",
            operator_settings=OperatorSettings(spark_master="local[1]"),
        )  # fmt: skip
        for manifest in children.applied:
            if manifest["kind"] in {"ServiceAccount", "Role", "RoleBinding"}:
                utils.create_from_dict(admin, manifest, namespace=NAMESPACE)
        found[iceberg_namespace] = st
    yield found


def impersonating(kube: KubeAPIServer, account: str) -> client.ApiClient:
    """A client that acts as the ServiceAccount `account` of the namespace (what its pod's token is)."""
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{NAMESPACE}:{account}")
    return api


def held_by_someone(admin: client.ApiClient, name: str, duration: int = 600) -> None:
    """A Lease `name` held by another writer, as the admin."""
    KubernetesLease(admin, NAMESPACE, name, "someone-else", duration_seconds=duration).acquire(timeout=0)


def refused(api: client.ApiClient, name: str) -> None:
    with pytest.raises(LeaseAPIError) as denied:
        KubernetesLease(api, NAMESPACE, name, "intruder").acquire(timeout=0)
    assert denied.value.status == 403, denied.value
    assert name in str(denied.value)


def test_each_tables_pods_are_refused_on_every_lease_but_their_own(
    kube: KubeAPIServer, admin: client.ApiClient, tables: dict[str, StreamingTable]
) -> None:
    sales, staging = table_leases(tables["sales"]), table_leases(tables["staging"])
    assert not {sales.commit, sales.rewrite_yield, *sales.work} & {
        staging.commit,
        staging.rewrite_yield,
        *staging.work,
    }
    for name in (staging.rewrite_yield, staging.work[0], sales.work[1], LEADER_LEASE_NAME):
        held_by_someone(admin, name)  # refused whether it exists or not: RBAC is checked first

    driver = impersonating(kube, "icefall-orders-sales-driver")
    own = KubernetesLease(driver, NAMESPACE, sales.commit, "driver")
    assert own.acquire(timeout=0) >= 1
    own.renew()
    for name in (staging.commit, staging.work[0], sales.work[1], LEADER_LEASE_NAME):
        refused(driver, name)

    compaction = impersonating(kube, "icefall-orders-sales-compact")
    work = KubernetesLease(compaction, NAMESPACE, sales.work_for('{"kind": "ExpireSnapshots"}'), "worker")
    assert work.acquire(timeout=0) >= 1
    work.release(forget=True)
    assert work.current() is None  # removed
    barrier = KubernetesLease(compaction, NAMESPACE, sales.rewrite_yield, "worker")
    barrier.acquire(timeout=0)
    barrier.release(forget=True)
    for name in (sales.commit, staging.rewrite_yield, staging.work[0], staging.commit, LEADER_LEASE_NAME):
        refused(compaction, name)
    own.release()


def test_an_upgrade_waits_out_the_writer_of_the_old_commit_lease(
    kube: KubeAPIServer, admin: client.ApiClient, tables: dict[str, StreamingTable]
) -> None:
    leases: TableLeases = table_leases(tables["staging"])
    assert leases.legacy_commit == "icefall-orders-commit"
    # An older version's driver: it holds the old name for 3 s more and then stops renewing.
    old = KubernetesLease(admin, NAMESPACE, leases.legacy_commit, "old-driver", duration_seconds=3)
    old_epoch = old.acquire(timeout=0, floor=41)
    assert old_epoch == 42

    driver = impersonating(kube, "icefall-orders-staging-driver")
    new = SuccessorLease(
        KubernetesLease(driver, NAMESPACE, leases.commit, "new-driver", poll_seconds=0.2),
        KubernetesLease(driver, NAMESPACE, leases.legacy_commit, "new-driver", poll_seconds=0.2),
    )
    started = time.monotonic()
    epoch = new.acquire(timeout=30)
    waited = time.monotonic() - started
    assert epoch > old_epoch
    assert waited >= 1.5, f"took the Lease after {waited:.1f} s, while the old writer still held it"
    assert new.is_held
    assert old.current() is None  # the old name is gone: nobody waits on it again
