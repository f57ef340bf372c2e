"""A table's pods can touch only their own table's Leases: the Roles the operator renders, enforced by a
real kube-apiserver (RBAC on), with each pod's ServiceAccount impersonated.

Two StreamingTables in one Kubernetes namespace write tables of the same name, `sales.orders` and
`staging.orders`; their ServiceAccounts, Roles, RoleBindings and Leases are applied as `desired_children`
renders them, the Leases by server-side apply as the operator's field manager (`controller.kube.Kube`).
Proves:
- the two tables' commit, yield and work Leases are all different names;
- sales' driver takes its own commit Lease; sales' compaction pod claims and releases one of its work
  Leases (which stays, for the next item) and takes its yield Lease;
- both are refused (403, a LeaseAPIError naming the Lease) on staging's Leases, on each other's Leases
  (the driver on the work Leases, compaction on the commit Lease) and on the operator's leader Lease;
- neither may create any Lease, by name or not (403 on create), so no pod can squat a Lease of a table
  that does not exist yet;
- a squatter's Lease (held, renewTime years ahead, the largest leaseDurationSeconds) on a table's commit
  Lease name: the operator's apply adopts it and rewrites its duration, keeping the holder's fields, and
  the driver takes it one lease duration after it first saw it;
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
from icefall.commit.lease import LeaseTimeoutError, SuccessorLease
from icefall.controller.kube import Kube
from icefall.devstack.kube import KubeAPIServer
from icefall.plan.children import Children, desired_children
from icefall.plan.leases import COMMIT_LEASE_SECONDS
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


def children_of(st: StreamingTable, uid: str) -> Children:
    return desired_children(
        st, namespace=NAMESPACE, uid=uid, generation=1, image="icefall:test",
        operator_settings=OperatorSettings(spark_master="local[1]"),
    )  # fmt: skip


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
        for manifest in children_of(st, f"uid-{iceberg_namespace}").applied:
            if manifest["kind"] in {"ServiceAccount", "Role", "RoleBinding"}:
                utils.create_from_dict(admin, manifest, namespace=NAMESPACE)
            elif manifest["kind"] == "Lease":
                Kube(admin).apply(manifest)  # as the operator does (no StreamingTable here: no GC either)
        found[iceberg_namespace] = st
    yield found


def impersonating(kube: KubeAPIServer, account: str) -> client.ApiClient:
    """A client that acts as the ServiceAccount `account` of the namespace (what its pod's token is)."""
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{NAMESPACE}:{account}")
    return api


def held_by_someone(admin: client.ApiClient, name: str, duration: int = 600) -> None:
    """A Lease `name` held by another writer, as the admin."""
    KubernetesLease(
        admin, NAMESPACE, name, "someone-else", duration_seconds=duration, create_missing=True
    ).acquire(timeout=0)


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
    work.release()
    released = work.current()
    assert released is not None and released.holder is None  # kept for the next item
    barrier = KubernetesLease(compaction, NAMESPACE, sales.rewrite_yield, "worker")
    barrier.acquire(timeout=0)
    barrier.release()
    for name in (sales.commit, staging.rewrite_yield, staging.work[0], staging.commit, LEADER_LEASE_NAME):
        refused(compaction, name)
    own.release()


def test_an_upgrade_waits_out_the_writer_of_the_old_commit_lease(
    kube: KubeAPIServer, admin: client.ApiClient, tables: dict[str, StreamingTable]
) -> None:
    leases: TableLeases = table_leases(tables["staging"])
    assert leases.legacy_commit == "icefall-orders-commit"
    # An older version's driver: it holds the old name for 3 s more and then stops renewing.
    old = KubernetesLease(
        admin, NAMESPACE, leases.legacy_commit, "old-driver", duration_seconds=3, create_missing=True
    )
    old_epoch = old.acquire(timeout=0, floor=41)
    assert old_epoch == 42

    driver = impersonating(kube, "icefall-orders-staging-driver")
    new = SuccessorLease(
        KubernetesLease(driver, NAMESPACE, leases.commit, "new-driver", poll_seconds=0.2),
        # The old versions wrote 15 s; this test's old writer 3 s, which is what the new one judges by.
        KubernetesLease(
            driver, NAMESPACE, leases.legacy_commit, "new-driver", poll_seconds=0.2, duration_seconds=3
        ),
    )
    started = time.monotonic()
    epoch = new.acquire(timeout=30)
    waited = time.monotonic() - started
    assert epoch > old_epoch
    assert waited >= 1.5, f"took the Lease after {waited:.1f} s, while the old writer still held it"
    assert new.is_held
    assert old.current() is None  # the old name is gone: nobody waits on it again


def test_no_pod_may_create_a_lease(kube: KubeAPIServer, tables: dict[str, StreamingTable]) -> None:
    """RBAC authorizes a create before it looks at names or existence: 403 for any name, even a pod's own
    (existing) commit Lease; so a pod can neither squat a future table's Lease nor recreate one."""
    sales = table_leases(tables["sales"])
    for account in ("icefall-orders-sales-driver", "icefall-orders-sales-compact"):
        api = impersonating(kube, account)
        for name in ("icefall-squatted-commit", LEADER_LEASE_NAME, sales.commit, sales.work[0]):
            body = {"metadata": {"name": name}, "spec": {"holderIdentity": "squatter"}}
            with pytest.raises(client.ApiException) as denied:
                client.CoordinationV1Api(api).create_namespaced_lease(NAMESPACE, body)
            assert denied.value.status == 403, (account, name)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_squatted_commit_lease_is_adopted_and_taken_after_one_duration(
    kube: KubeAPIServer, admin: client.ApiClient
) -> None:
    """Whoever could create Leases in the namespace (before this version: any table's pod) made the
    commit Lease of a table that did not exist yet, held, renewed years ahead, for 2^31-1 seconds."""
    st = streaming_table("squat")
    leases = table_leases(st)
    years_ahead = "2036-01-01T00:00:00.250000Z"
    client.CoordinationV1Api(admin).create_namespaced_lease(
        NAMESPACE,
        {
            "metadata": {"name": leases.commit},
            "spec": {
                "holderIdentity": "squatter",
                "leaseDurationSeconds": 2**31 - 1,
                "acquireTime": years_ahead,
                "renewTime": years_ahead,
                "leaseTransitions": 5,
            },
        },
    )
    children = children_of(st, "uid-squat")
    for manifest in children.applied:
        if manifest["kind"] in {"ServiceAccount", "Role", "RoleBinding"}:
            utils.create_from_dict(admin, manifest, namespace=NAMESPACE)
        elif manifest["kind"] == "Lease":
            Kube(admin).apply(manifest)
    obj = client.CoordinationV1Api(admin).read_namespaced_lease(leases.commit, NAMESPACE)
    assert obj.spec.lease_duration_seconds == COMMIT_LEASE_SECONDS  # rewritten by the operator's apply
    assert (obj.spec.holder_identity, obj.spec.lease_transitions) == ("squatter", 5)  # a holder's fields
    assert [o.uid for o in obj.metadata.owner_references] == ["uid-squat"]

    clock = FakeClock()
    driver = KubernetesLease(
        impersonating(kube, "icefall-orders-squat-driver"), NAMESPACE, leases.commit, "driver",
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    with pytest.raises(LeaseTimeoutError, match="held by 'squatter'"):
        driver.acquire(timeout=COMMIT_LEASE_SECONDS - 1)
    assert driver.acquire(timeout=60) == 6
    assert clock.now == pytest.approx(1_000.0 + COMMIT_LEASE_SECONDS)
