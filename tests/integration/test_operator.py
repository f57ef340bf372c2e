"""The operator (`icefall operator`, a real kopf process) against a real kube-apiserver + etcd.

Proves, with the operator running in a subprocess and nothing but the API server around it (no scheduler,
no kubelet, no garbage collector: pods stay Pending forever, so nothing here waits for a pod to run):
- a StreamingTable (examples/orders.yaml with a sqlite catalog) is reconciled into its children: the
  driver and compaction ServiceAccounts, Roles and RoleBindings, the executor pod template ConfigMap, the
  driver Pod `<name>-ingest` and the compaction Deployment with 0 replicas, each with a controller owner
  reference to the StreamingTable and written by the single field manager `icefall-operator`;
- status carries Ready/Ingesting/FreshnessMet/Degraded with `observedGeneration`; a pending driver reads
  as Ingesting=False, reason Starting;
- a deleted driver Pod comes back (a new uid); a deleted child (a Role) comes back;
- `spec.suspend: true` deletes the driver Pod and sets Ready=False, reason Suspended; resuming brings it back;
- the operator killed with SIGKILL right after a new StreamingTable is created, then restarted, leaves
  exactly one driver Pod per table, and the untouched table's Pod is the same one (same uid).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config

from icefall.api.crd import CRD_NAME
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "operator-test"
GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
Obj = dict[str, Any]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


class Operator:
    """`python -m icefall.cli operator` in a subprocess, logging to a file."""

    def __init__(self, kube: KubeAPIServer, log: Path) -> None:
        self.kube = kube
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kube.kubeconfig),
            "ICEFALL_RESYNC_SECONDS": "1",
            "ICEFALL_IMAGE": "icefall:test",
            "PYTHONPATH": str(REPO / "operator" / "src"),
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "icefall.cli", "operator", "--namespace", NAMESPACE],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.log.parent,
            )  # fmt: skip

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> client.ApiClient:
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(kube.workdir)}
    for args in (
        ["apply", "--server-side", "-f", str(REPO / "crds")],
        ["wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s"],
        ["create", "namespace", NAMESPACE],
    ):
        done = subprocess.run(
            [kubectl, *args], capture_output=True, text=True, env=env, timeout=90, check=False
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
    return config.new_client_from_config(config_file=str(kube.kubeconfig))


@pytest.fixture(scope="module")
def operator(
    kube: KubeAPIServer, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    running = Operator(kube, tmp_path_factory.mktemp("operator") / "operator.log")
    running.start()
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def show_operator_log(operator: Operator) -> Iterator[None]:
    yield
    print(operator.tail())  # pytest shows it only when the test fails
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def streaming_table(name: str, lake: Path) -> Obj:
    obj: Obj = yaml.safe_load((REPO / "examples" / "orders.yaml").read_text(encoding="utf-8"))
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    obj["spec"]["table"]["name"] = name
    obj["spec"]["table"]["catalog"] = {
        "name": "lake",
        "type": "sql",
        "uri": f"sqlite:///{lake / 'catalog.db'}",
        "warehouse": f"file://{lake / 'warehouse'}",
    }
    return obj


class Cluster:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def create_st(self, obj: Obj) -> Obj:
        created: Obj = self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, obj)
        return created

    def st(self, name: str) -> Obj:
        found: Obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        return found

    def patch_spec(self, name: str, spec: Obj) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name, {"spec": spec})

    def pod(self, name: str) -> client.V1Pod | None:
        try:
            return self.core.read_namespaced_pod(name, NAMESPACE)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def driver_pods(self, table: str) -> list[client.V1Pod]:
        selector = f"icefall.dev/streamingtable={table},app.kubernetes.io/component=ingest"
        pods: list[client.V1Pod] = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return pods


def condition(st: Obj, kind: str) -> Obj | None:
    found: Obj | None = next(
        (c for c in (st.get("status") or {}).get("conditions", []) if c["type"] == kind), None
    )
    return found


@pytest.fixture(scope="module")
def cluster(api: client.ApiClient) -> Cluster:
    return Cluster(api)


@pytest.fixture(scope="module")
def orders(cluster: Cluster, operator: Operator, tmp_path_factory: pytest.TempPathFactory) -> Obj:
    return cluster.create_st(streaming_table("orders", tmp_path_factory.mktemp("lake")))


def test_children_are_created_with_owner_references(cluster: Cluster, orders: Obj) -> None:
    uid = orders["metadata"]["uid"]
    pod = wait_for("the driver pod orders-ingest", lambda: cluster.pod("orders-ingest"))
    children = [
        pod,
        cluster.core.read_namespaced_service_account("icefall-orders-driver", NAMESPACE),
        cluster.core.read_namespaced_service_account("icefall-orders-compact", NAMESPACE),
        cluster.rbac.read_namespaced_role("icefall-orders-driver", NAMESPACE),
        cluster.rbac.read_namespaced_role_binding("icefall-orders-driver", NAMESPACE),
        cluster.rbac.read_namespaced_role("icefall-orders-compact", NAMESPACE),
        cluster.rbac.read_namespaced_role_binding("icefall-orders-compact", NAMESPACE),
        cluster.core.read_namespaced_config_map("orders-ingest-executor", NAMESPACE),
        cluster.apps.read_namespaced_deployment("orders-compact", NAMESPACE),
    ]
    for child in children:
        (owner,) = child.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "StreamingTable",
            "orders",
            uid,
            True,
        )
        assert child.metadata.labels["icefall.dev/streamingtable"] == "orders"
        managers = {entry.manager for entry in child.metadata.managed_fields or []}
        assert "icefall-operator" in managers
    assert children[-1].spec.replicas == 0
    container = pod.spec.containers[0]
    assert container.image == "icefall:test"
    assert container.command == ["icefall", "ingest", "--namespace", NAMESPACE, "--name", "orders"]
    assert pod.status.phase == "Pending"  # no scheduler here: it never runs


def test_status_has_conditions_with_observed_generation(cluster: Cluster, orders: Obj) -> None:
    st = wait_for("status conditions", lambda: (s := cluster.st("orders")).get("status") and s)
    generation = st["metadata"]["generation"]
    assert st["status"]["observedGeneration"] == generation
    kinds = {c["type"]: c for c in st["status"]["conditions"]}
    assert set(kinds) >= {"Ready", "Ingesting", "FreshnessMet", "Degraded"}
    assert all(c["observedGeneration"] == generation for c in kinds.values())
    assert (kinds["Ingesting"]["status"], kinds["Ingesting"]["reason"]) == ("False", "Starting")
    assert (kinds["Ready"]["status"], kinds["Degraded"]["status"]) == ("False", "False")


def test_a_deleted_driver_pod_and_a_deleted_role_come_back(cluster: Cluster, orders: Obj) -> None:
    old = wait_for("the driver pod", lambda: cluster.pod("orders-ingest"))
    cluster.core.delete_namespaced_pod("orders-ingest", NAMESPACE)
    cluster.rbac.delete_namespaced_role("icefall-orders-compact", NAMESPACE)
    new = wait_for(
        "a new driver pod",
        lambda: (p := cluster.pod("orders-ingest")) and p.metadata.uid != old.metadata.uid and p,
    )
    assert new.metadata.labels["icefall.dev/spec-hash"] == old.metadata.labels["icefall.dev/spec-hash"]
    roles = cluster.rbac.list_namespaced_role
    wait_for(
        "the compaction Role",
        lambda: any(r.metadata.name == "icefall-orders-compact" for r in roles(NAMESPACE).items),
    )


def test_suspend_deletes_the_driver_and_says_suspended(cluster: Cluster, orders: Obj) -> None:
    wait_for("the driver pod", lambda: cluster.pod("orders-ingest"))
    cluster.patch_spec("orders", {"suspend": True})
    wait_for("the driver pod to be deleted", lambda: cluster.pod("orders-ingest") is None)

    def suspended() -> Obj | None:
        ready = condition(cluster.st("orders"), "Ready")
        return ready if ready and ready["reason"] == "Suspended" else None

    ready = wait_for("Ready reason Suspended", suspended)
    assert ready["status"] == "False"
    assert ready["observedGeneration"] == cluster.st("orders")["metadata"]["generation"]
    assert cluster.apps.read_namespaced_deployment("orders-compact", NAMESPACE).spec.replicas == 0
    time.sleep(2)  # two resync periods: a suspended table stays without a driver
    assert cluster.pod("orders-ingest") is None
    cluster.patch_spec("orders", {"suspend": False})
    wait_for("the driver pod after resuming", lambda: cluster.pod("orders-ingest"))


def test_sigkill_and_restart_leave_exactly_one_driver_pod(
    cluster: Cluster, orders: Obj, operator: Operator, tmp_path_factory: pytest.TempPathFactory
) -> None:
    before = wait_for("the orders driver pod", lambda: cluster.pod("orders-ingest"))
    cluster.create_st(streaming_table("payments", tmp_path_factory.mktemp("lake")))
    time.sleep(0.3)  # somewhere in the middle of reconciling payments (or not yet started)
    operator.kill()
    operator.start()
    wait_for("the payments driver pod", lambda: cluster.pod("payments-ingest"))
    wait_for("payments status", lambda: condition(cluster.st("payments"), "Ready"))
    time.sleep(2)  # further resync passes of the restarted operator must not add or replace pods
    for table in ("orders", "payments"):
        assert len(cluster.driver_pods(table)) == 1, table
    after = cluster.pod("orders-ingest")
    assert after is not None and after.metadata.uid == before.metadata.uid
