"""The operator (`icefall operator`, a real kopf process) against a real kube-apiserver + etcd.

Proves, with the operator running in a subprocess and nothing but the API server around it (no scheduler,
no kubelet, no garbage collector: pods stay Pending forever, so nothing here waits for a pod to run):
- a StreamingTable (examples/orders.yaml with a sqlite catalog) is reconciled into its children: the
  driver and compaction ServiceAccounts, Roles and RoleBindings, the executor pod template ConfigMap, the
  NetworkPolicy of its pods, its Spark RPC Secret (random, immutable), the driver Pod `<name>-ingest`, the
  compaction Deployment with 0 replicas and the table's commit, yield and work Leases (free, with Icefall's
  durations), each with a controller owner
  reference to the StreamingTable and written by the single field manager `icefall-operator`;
- status carries Ready/Ingesting/FreshnessMet/Degraded with `observedGeneration`; a pending driver reads
  as Ingesting=False, reason Starting;
- the operator reads no table and no topic: freshness, lag per partition, the table's figures, the
  printer columns (Freshness, Lag, Files), the per-table metrics and the conditions follow what the driver
  (its own ServiceAccount, impersonated) reports into status.writer with its table meter; the records lost
  to retention it reports make Degraded True (DataLoss) and clearing it gives one Warning Event `Degraded`
  and one Normal `DegradationCleared`; a service the driver waits out (the catalog, Kafka) is Ingesting
  and Ready False with its reason;
- a deleted driver Pod comes back (a new uid); a deleted child (a Role) comes back;
- `spec.suspend: true` deletes the driver Pod and sets Ready=False, reason Suspended; resuming brings it back;
- the operator killed with SIGKILL right after a new StreamingTable is created, then restarted, leaves
  exactly one driver Pod per table, and the untouched table's Pod is the same one (same uid);
- a table that references a credential reads NotMeasured until its driver reports lag and freshness into
  status.writer, then measured and fresh; the driver's Role refuses it another table's status;
- a table's compaction Deployment is scaled from the backlog its driver read with its own credentials
  (`TableMeter`) and reported, and the Files column shows the driver's figures.
Credentials, Secret grants and deletionPolicy Delete's purge Job: tests/integration/test_operator_trust.py.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from icefall.api import streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import ensure_tables
from icefall.commit.state import CommittedState
from icefall.controller.kube import Kube
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.devstack.procs import free_port
from icefall.devstack.tools import tool_dir
from icefall.ingest.report import BatchReport
from icefall.ingest.table_meter import TableMeter
from icefall.ingest.writer_status import WriterStatusReporter
from icefall.plan.names import table_leases
from icefall.plan.outages import Service
from icefall.testing.e2e import wait_for as wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "operator-test"
GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
Obj = dict[str, Any]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    """`icefall.testing.e2e.wait_for`, polling every 0.2 s: the operator here reacts within a second."""
    return wait_until(what, probe, timeout, every=0.2)


class Operator:
    """`python -m icefall.cli operator` in a subprocess, logging to a file."""

    def __init__(
        self,
        kube: KubeAPIServer,
        log: Path,
        *,
        namespace: str = NAMESPACE,
        resync_seconds: float = 1,
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.extra_env = dict(env or {})
        self.log = log
        self.namespace = namespace
        self.resync_seconds = resync_seconds
        self.args = args
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kube.kubeconfig),
            "ICEFALL_RESYNC_SECONDS": str(self.resync_seconds),
            "ICEFALL_STATUS_SECONDS": "1",
            "ICEFALL_IMAGE": "icefall:test",
            "PYTHONPATH": str(REPO / "operator" / "src"),
            **self.extra_env,
        }
        command = [
            sys.executable, "-m", "icefall.cli", "operator", "--namespace", self.namespace,
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            "--leader-lease-seconds=3",  # a SIGKILLed leader's successor waits this long
            *self.args,
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.log.parent
            )

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
    install_crds(kube, REPO / "crds", NAMESPACE)
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
        self.coordination = client.CoordinationV1Api(api)

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

    def pod_in(self, name: str, namespace: str) -> client.V1Pod | None:
        try:
            return self.core.read_namespaced_pod(name, namespace)
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
        client.NetworkingV1Api(cluster.core.api_client).read_namespaced_network_policy(
            "icefall-orders-ingress", NAMESPACE
        ),
        cluster.core.read_namespaced_secret("icefall-orders-spark-auth", NAMESPACE),
        cluster.apps.read_namespaced_deployment("orders-compact", NAMESPACE),
    ]
    secret, deployment = children[-2:]  # the Spark RPC secret: created once with 32 random bytes, immutable
    assert secret.immutable is True and len(base64.b64decode(secret.data["secret"])) == 32
    leases = table_leases(streaming_table_from_object(orders))
    for name in (leases.commit, leases.rewrite_yield, *leases.work):  # the pods may not create Leases
        children.append(cluster.coordination.read_namespaced_lease(name, NAMESPACE))
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
    assert deployment.spec.replicas == 0
    commit_lease = children[len(children) - len(leases.work) - 2]
    assert commit_lease.spec.lease_duration_seconds == 15 and commit_lease.spec.holder_identity is None
    container = pod.spec.containers[0]
    assert container.image == "icefall:test"
    assert container.command == [
        "icefall", "ingest", "--namespace", NAMESPACE, "--name", "orders", "--metrics-port=9090"
    ]  # fmt: skip
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


# --- status from the table and Kafka, deletion, contested tables, leader election ------------------------


def lake_catalog(lake: Path) -> CatalogConfig:
    return CatalogConfig.sqlite(lake / "catalog.db", lake / "warehouse", name="lake")


def small_table(
    name: str,
    lake: Path | None,
    *,
    topic: str = "events",
    bootstrap: str = "127.0.0.1:1",
    table: str | None = None,
    deletion: str = "Retain",
    namespace: str = NAMESPACE,
) -> Obj:
    """A one-column StreamingTable; `lake=None` names a catalog that cannot be opened."""
    database = lake / "catalog.db" if lake is not None else Path("/nonexistent-icefall-dir/catalog.db")
    warehouse = lake / "warehouse" if lake is not None else Path("/nonexistent-icefall-dir/warehouse")
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamingTable",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": topic},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long", "required": True}]},
            "table": {
                "namespace": "it",
                "name": table or name.replace("-", "_"),
                "catalog": {
                    "name": "lake",
                    "type": "sql",
                    "uri": f"sqlite:///{database}",
                    "warehouse": f"file://{warehouse}",
                },
            },
            "freshness": {"targetSeconds": 10},
            "deletionPolicy": deletion,
        },
    }


def commit_like_ingestion(
    table: Any,
    rows: list[tuple[int, int]],
    *,
    offsets: dict[int, int],
    produce_ms: int,
    lost: int = 0,
) -> None:
    """Append `rows` (partition, offset) and set the icefall.* properties in one commit, as ingestion does."""
    import pyarrow as pa

    when = datetime.fromtimestamp(produce_ms / 1000, UTC)
    data = pa.Table.from_pylist(
        [{"id": o, "_kafka": {"partition": p, "offset": o, "timestamp": when}} for p, o in rows],
        schema=table.schema().as_arrow(),
    )
    state = CommittedState(
        snapshot_id=None,
        topic="t",
        offsets=offsets,
        epoch=1,
        max_produce_time_ms=produce_ms,
        lost_records=lost,
    )
    with table.transaction() as tx:
        if rows:
            tx.append(data)
        tx.set_properties(state.to_properties())


def mark_running(cluster: Cluster, pod: str, namespace: str = NAMESPACE) -> None:
    """What a kubelet would report once the driver container started."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.core.patch_namespaced_pod_status(
        pod,
        namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "driver", "image": "icefall:test", "imageID": "", "ready": True,
                        "restartCount": 0, "state": {"running": {"startedAt": now}},
                    }
                ],
            }
        },
    )  # fmt: skip


def conditions_of(cluster: Cluster, name: str) -> dict[str, tuple[str, str]]:
    st = cluster.st(name)
    return {c["type"]: (c["status"], c["reason"]) for c in (st.get("status") or {}).get("conditions", [])}


def events_for(cluster: Cluster, name: str, namespace: str = NAMESPACE) -> list[tuple[str, str]]:
    found = cluster.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [(e.reason, e.message) for e in found.items]


def gone(cluster: Cluster, name: str) -> bool:
    try:
        cluster.st(name)
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def printer_columns(kube: KubeAPIServer, name: str) -> dict[str, str]:
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(kube.workdir)}
    out = subprocess.run(
        [kubectl, "get", "st", name, "-n", NAMESPACE], capture_output=True, text=True, env=env, check=True
    ).stdout.splitlines()
    return dict(zip(out[0].split(), out[1].split(), strict=True))


def test_status_printer_columns_and_metrics_show_what_the_driver_reports(
    cluster: Cluster, operator: Operator, kube: KubeAPIServer, tmp_path: Path
) -> None:
    """The operator reads neither the table nor Kafka (the table's catalog is a SQLite file of the test's;
    its brokers an address nobody listens at): the driver, with its own ServiceAccount, reports what it
    measured and read (`WriterStatusReporter` with its `TableMeter`), and status, printer columns, conditions,
    Events and metrics follow the report."""
    a_minute_ago = int(time.time() * 1000) - 60_000
    obj = small_table("status", tmp_path, topic="status-events", bootstrap=f"127.0.0.1:{free_port()}")
    st = streaming_table_from_object(obj)
    table = ensure_tables(lake_catalog(tmp_path).pyiceberg(), st).table
    rows = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    commit_like_ingestion(table, rows, offsets={0: 3, 1: 5}, produce_ms=a_minute_ago)
    snapshot = table.refresh().current_snapshot().snapshot_id
    cluster.create_st(obj)
    wait_for("the driver pod", lambda: cluster.pod("status-ingest"))
    mark_running(cluster, "status-ingest")
    # The driver's side: its meter reads the table, its batches measure the lag (2 records wait in
    # partition 0, the newest committed one a minute old).
    meter = TableMeter(st, lake_catalog(tmp_path))
    assert meter.read_once() is not None
    report = WriterStatusReporter(
        Kube(driver_client(kube, "status")), NAMESPACE, "status", interval=0, meter=meter
    )
    report(BatchReport(8, 8, 0, 1.0, 0.1, snapshot, {0: 3, 1: 5}, 2, 61.0, partition_lag={0: 2, 1: 0}))

    def measured() -> Obj | None:
        status = cluster.st("status").get("status") or {}
        behind = conditions_of(cluster, "status").get("Ingesting") == ("True", "CatchingUp")
        return status if behind and (status.get("freshness") or {}).get("lagRecords") == 2 else None

    status = wait_for("lag 2 with the driver catching up", measured, timeout=30)
    freshness, shape = status["freshness"], status["table"]
    assert freshness["partitionLag"] == {"0": 2, "1": 0}
    assert freshness["seconds"] >= 60 and freshness["snapshotId"] == snapshot
    assert freshness["lastCommitTime"]
    files = table.inspect.files()  # what pyiceberg counts from the manifests
    assert (shape["files"], shape["records"]) == (files.num_rows, len(rows))
    assert shape["avgFileSizeBytes"] == sum(files["file_size_in_bytes"].to_pylist()) // files.num_rows
    assert shape["snapshots"] == len(table.metadata.snapshots)
    assert conditions_of(cluster, "status")["FreshnessMet"] == ("False", "BehindTarget")
    assert conditions_of(cluster, "status")["Ready"] == ("False", "BehindTarget")
    columns = printer_columns(kube, "status")
    assert (columns["LAG"], columns["FILES"]) == ("2", str(files.num_rows)) and float(
        columns["FRESHNESS"]
    ) >= 60

    # The driver commits the rest: caught up, fresh, Ready.
    commit_like_ingestion(table, [(0, 3), (0, 4)], offsets={0: 5, 1: 5}, produce_ms=int(time.time() * 1000))
    meter.read_once()
    landed = table.refresh().current_snapshot().snapshot_id
    report(BatchReport(2, 2, 0, 1.0, 0.1, landed, {0: 5, 1: 5}, 0, 0.0, partition_lag={0: 0, 1: 0}))
    wait_for("Ready", lambda: conditions_of(cluster, "status").get("Ready") == ("True", "Running"), 30)
    assert conditions_of(cluster, "status")["Ingesting"] == ("True", "CaughtUp")
    status = cluster.st("status")["status"]
    assert (status["freshness"]["seconds"], status["freshness"]["lagRecords"]) == (0, 0)
    assert status["freshness"]["snapshotId"] == landed
    assert printer_columns(kube, "status")["FRESHNESS"] == "0"

    # Retention deleted records before they were ingested: Degraded until acknowledged.
    commit_like_ingestion(table, [], offsets={0: 5, 1: 5}, produce_ms=int(time.time() * 1000), lost=4)
    meter.read_once()
    report(None)  # caught up; the meter's reading counts the lost records
    wait_for("DataLoss", lambda: conditions_of(cluster, "status").get("Degraded") == ("True", "DataLoss"), 30)
    assert cluster.st("status")["status"]["dataLossRecords"] == 4
    assert conditions_of(cluster, "status")["Ready"] == ("False", "DataLoss")

    def degraded_events() -> list[str]:
        return [m for r, m in events_for(cluster, "status") if r == "Degraded" and m.startswith("DataLoss: ")]

    wait_for("a Degraded event saying DataLoss", degraded_events, 60)
    cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, "status",
        {"metadata": {"annotations": {"icefall.dev/acknowledged-data-loss": "4"}}},
    )  # fmt: skip
    wait_for("Healthy", lambda: conditions_of(cluster, "status").get("Degraded") == ("False", "Healthy"), 30)
    cleared = wait_for(
        "a DegradationCleared event",
        lambda: [m for r, m in events_for(cluster, "status") if r == "DegradationCleared"],
        60,
    )
    assert cleared == ["no longer degraded (DataLoss)"] and len(degraded_events()) == 1

    # Operator metrics and liveness.
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read()
    text = metrics.decode()
    assert 'icefall_operator_reconciles_total{result="ok"}' in text
    assert 'icefall_lag_records{partition="0",table="operator-test.status"} 0.0' in text
    assert "icefall_operator_leader 1.0" in text
    assert 'icefall_freshness_target_seconds{table="operator-test.status"} 10.0' in text
    assert 'icefall_table_snapshots{table="operator-test.status"}' in text
    assert 'icefall_last_commit_timestamp_seconds{table="operator-test.status"}' in text
    health = urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=5)
    assert health.status == 200

    # deletionPolicy Retain (the default): the StreamingTable goes, the table stays.
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "status")
    wait_for("the StreamingTable to go", lambda: gone(cluster, "status"), 30)
    assert cluster.pod("status-ingest") is None
    catalog = lake_catalog(tmp_path).pyiceberg()
    assert catalog.table_exists(("it", "status")) and catalog.table_exists(("it", "status_dlq"))
    reasons = [reason for reason, _ in events_for(cluster, "status")]
    assert "TableRetained" in reasons


def test_a_service_the_driver_waits_out_is_a_condition_and_retain_deletes_without_it(
    cluster: Cluster, operator: Operator, kube: KubeAPIServer
) -> None:
    """Neither the catalog (a path that does not exist) nor Kafka (nobody listens) can be reached, and the
    operator tries neither: the driver says which one it waits out, and deleting takes neither."""
    cluster.create_st(small_table("nocatalog", None, bootstrap=f"127.0.0.1:{free_port()}"))
    wait_for("the driver pod", lambda: cluster.pod("nocatalog-ingest"))
    mark_running(cluster, "nocatalog-ingest")
    report = WriterStatusReporter(Kube(driver_client(kube, "nocatalog")), NAMESPACE, "nocatalog", interval=0)
    for service, reason, named in (
        (Service.CATALOG, "CatalogUnavailable", "the catalog"),
        (Service.KAFKA, "KafkaUnavailable", "Kafka"),
    ):
        report.waiting(service)

        def blocked(reason: str = reason) -> Obj | None:
            ingesting = condition(cluster.st("nocatalog"), "Ingesting")
            return ingesting if ingesting and ingesting["reason"] == reason else None

        ingesting = wait_for(f"Ingesting=False, {reason}", blocked, timeout=30)
        assert ingesting["status"] == "False"
        assert f"the driver cannot reach {named} and waits for it" in ingesting["message"]
        assert conditions_of(cluster, "nocatalog")["Ready"] == ("False", reason)
    started = time.monotonic()
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "nocatalog")
    wait_for("the StreamingTable to go", lambda: gone(cluster, "nocatalog"), 30)
    assert time.monotonic() - started < 15
    assert cluster.pod("nocatalog-ingest") is None


def test_the_older_streaming_table_wins_a_contested_table(
    cluster: Cluster, operator: Operator, tmp_path: Path
) -> None:
    cluster.create_st(small_table("claim-a", tmp_path, table="shared"))
    time.sleep(1.1)  # creationTimestamp has one-second resolution: make claim-a strictly older
    cluster.create_st(small_table("claim-b", tmp_path, table="SHARED"))  # the same table, case folded
    wait_for("claim-a's driver", lambda: cluster.pod("claim-a-ingest"))

    def claimed() -> Obj | None:
        ready = condition(cluster.st("claim-b"), "Ready")
        return ready if ready and ready["reason"] == "TableClaimedByOther" else None

    ready = wait_for("claim-b: Ready=False TableClaimedByOther", claimed, timeout=30)
    assert ready["status"] == "False" and f"{NAMESPACE}/claim-a" in ready["message"]
    time.sleep(2)  # two resync passes: the loser still has no driver
    assert cluster.pod("claim-b-ingest") is None
    events = events_for(cluster, "claim-b")
    assert any(r == "TableClaimedByOther" and "claim-a" in m for r, m in events), events
    assert conditions_of(cluster, "claim-a")["Ready"][1] != "TableClaimedByOther"

    # The owner goes (its table is retained): the other one takes the table over.
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "claim-a")
    wait_for("claim-b's driver after claim-a left", lambda: cluster.pod("claim-b-ingest"), timeout=30)
    wait_for(
        "claim-b no longer claimed",
        lambda: conditions_of(cluster, "claim-b").get("Ready", ("", ""))[1] != "TableClaimedByOther",
        timeout=30,
    )


LEADER_NAMESPACE = "operator-leader"


def test_only_the_leader_reconciles_and_a_follower_takes_over(
    cluster: Cluster, kube: KubeAPIServer, tmp_path: Path
) -> None:
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=LEADER_NAMESPACE)))
    # Long resync: whatever happens within seconds is the pod watch's doing, not the timer's.
    operators = [
        Operator(kube, tmp_path / f"op{i}.log", namespace=LEADER_NAMESPACE, resync_seconds=300)
        for i in (1, 2)
    ]
    try:
        for op in operators:
            op.start()

        def leader_and_follower() -> tuple[Operator, Operator] | None:
            leads = [op for op in operators if "is the leader" in op.log.read_text(errors="replace")]
            waits = [op for op in operators if "waiting as a follower" in op.log.read_text(errors="replace")]
            return (leads[0], waits[0]) if len(leads) == 1 and len(waits) == 1 else None

        try:
            leader, follower = wait_for("one leader and one follower", leader_and_follower, timeout=90)
        except AssertionError as error:
            logs = "\n".join(
                f"--- {op.log}\n{op.log.read_text(errors='replace')[-2000:]}" for op in operators
            )
            raise AssertionError(f"{error}\n{logs}") from None

        def replaced(old: client.V1Pod) -> bool:
            new = cluster.pod_in("led-ingest", LEADER_NAMESPACE)
            return new is not None and new.metadata.uid != old.metadata.uid

        lease = client.CoordinationV1Api(cluster.core.api_client).read_namespaced_lease(
            "icefall-operator-leader", LEADER_NAMESPACE
        )
        assert lease.spec.holder_identity and lease.spec.holder_identity in leader.log.read_text()

        custom = cluster.custom
        custom.create_namespaced_custom_object(
            GROUP, VERSION, LEADER_NAMESPACE, PLURAL, small_table("led", None, namespace=LEADER_NAMESPACE)
        )
        pod = wait_for("the driver pod", lambda: cluster.pod_in("led-ingest", LEADER_NAMESPACE), timeout=90)
        assert "Handler '" not in follower.log.read_text(errors="replace")  # the follower never ran kopf
        for op in (leader, follower):  # a follower is alive too (its standby probe answers)
            probe = urllib.request.urlopen(f"http://127.0.0.1:{op.health_port}/healthz", timeout=5)
            assert probe.status == 200

        # The pod watch brings a deleted driver back at once: well before the resync timer (300 s away), with
        # room for a busy machine.
        started = time.monotonic()
        cluster.core.delete_namespaced_pod("led-ingest", LEADER_NAMESPACE)
        wait_for(
            "a new driver pod",
            lambda: (
                (p := cluster.pod_in("led-ingest", LEADER_NAMESPACE)) and p.metadata.uid != pod.metadata.uid
            ),
            timeout=60,
        )
        recreated_after = time.monotonic() - started
        assert recreated_after < 60, recreated_after

        # The leader dies without releasing the Lease: the follower takes over within its duration (3 s).
        leader.kill()
        killed = time.monotonic()
        wait_for("the follower to lead", lambda: "is the leader" in follower.log.read_text(), timeout=60)
        took_over = time.monotonic() - killed  # about duration + one acquire poll; more on a busy machine
        print(f"driver recreated after {recreated_after:.1f} s; follower led after {took_over:.1f} s")
        pod = wait_for("the driver pod", lambda: cluster.pod_in("led-ingest", LEADER_NAMESPACE))
        cluster.core.delete_namespaced_pod("led-ingest", LEADER_NAMESPACE)
        wait_for(
            "the new leader to recreate the driver",
            lambda: (
                (p := cluster.pod_in("led-ingest", LEADER_NAMESPACE)) and p.metadata.uid != pod.metadata.uid
            ),
            timeout=10,
        )
        assert "Traceback" not in follower.log.read_text(errors="replace"), follower.tail()
        # kopf now serves the liveness endpoint on the port the standby probe held.
        probe = urllib.request.urlopen(f"http://127.0.0.1:{follower.health_port}/healthz", timeout=5)
        assert probe.status == 200 and b"follower" not in probe.read()
    finally:
        for op in operators:
            op.stop()


def test_a_leader_that_was_paused_past_its_lease_notices_it_lost_leadership(api: client.ApiClient) -> None:
    from icefall.controller.leader import LeaderElection

    lost: list[str] = []
    paused = LeaderElection(
        api, NAMESPACE, name="pause-test", holder="paused", duration_seconds=1, on_lost=lost.append
    )
    paused.acquire()
    time.sleep(1.2)  # paused (no renewal) past its lease: another replica takes over
    LeaderElection(api, NAMESPACE, name="pause-test", holder="successor", duration_seconds=30).acquire()
    paused.start_renewing()  # it wakes up and tries to renew
    wait_for("the paused leader to notice", lambda: lost, timeout=5)
    assert "successor" in lost[0]


def test_a_running_drivers_report_measures_a_table_the_operator_cannot_read(
    kube: KubeAPIServer, cluster: Cluster, operator: Operator, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The operator holds none of this table's catalog credentials, so it cannot measure it; the driver
    (acting with its own ServiceAccount, which only the operator's Role grants) reports what it measured
    into the table's status, and the table reads measured and fresh. The driver may patch no other
    table's status."""
    obj = streaming_table("reported", tmp_path_factory.mktemp("lake-reported"))
    grant_secret(cluster, "lake-credentials", {"password": "p"})
    secret = {"secretKeyRef": {"name": "lake-credentials", "key": "password"}}
    obj["spec"]["table"]["catalog"]["secretProperties"] = {"password": secret}
    cluster.create_st(obj)

    def freshness_reason() -> str | None:
        found = condition(cluster.st("reported"), "FreshnessMet")
        return found["reason"] if found else None

    wait_for("the table read as not measured", lambda: freshness_reason() == "NotMeasured")
    driver = config.new_client_from_config(config_file=str(kube.kubeconfig))
    driver.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{NAMESPACE}:icefall-reported-driver"
    )
    reporter = WriterStatusReporter(Kube(driver), NAMESPACE, "reported")
    reporter(BatchReport(20, 20, 0, 1.0, 0.1, 7, {0: 20}, lag=3, freshness_seconds=1.5))
    wait_for("the driver's figures in status", lambda: freshness_reason() == "WithinTarget")
    status = cluster.st("reported")["status"]
    assert status["writer"]["lagRecords"] == 3 and status["writer"]["snapshotId"] == 7
    assert status["freshness"]["seconds"] == 1.5 and status["freshness"]["lagRecords"] == 3
    with pytest.raises(ApiException) as refused:
        Kube(driver).patch_status(NAMESPACE, "orders", {"writer": status["writer"]})
    assert refused.value.status == 403


def grant_secret(cluster: Cluster, name: str, data: dict[str, str]) -> None:
    """A Secret granted to the namespace's StreamingTables, as an admin would (`icefall.plan.grants`)."""
    cluster.core.create_namespaced_secret(
        NAMESPACE,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, labels={"icefall.dev/streamingtables": "allow"}),
            string_data=data,
        ),
    )


def driver_client(kube: KubeAPIServer, name: str) -> client.ApiClient:
    """The API as the driver of the StreamingTable `name` calls it (its own ServiceAccount, impersonated)."""
    driver = config.new_client_from_config(config_file=str(kube.kubeconfig))
    driver.set_default_header("Impersonate-User", f"system:serviceaccount:{NAMESPACE}:icefall-{name}-driver")
    return driver


def test_compaction_is_scaled_from_the_drivers_report_by_an_operator_without_credentials(
    kube: KubeAPIServer, cluster: Cluster, operator: Operator, tmp_path: Path
) -> None:
    """The table references a credential (its catalog's password, from a granted Secret); the operator
    holds none and reads no table anyway. Its driver reads the table with its own credentials (`TableMeter`)
    and reports the backlog into status.writer (its own ServiceAccount); the operator scales the
    compaction Deployment from that report, and shows the driver's figures (the Files column)."""
    from icefall.plan.scaling import compaction_replicas

    grant_secret(cluster, "tidy-lake", {"password": "table-password"})
    obj = small_table("tidy-reported", tmp_path)
    obj["spec"]["table"]["catalog"]["secretProperties"] = {
        "password": {"secretKeyRef": {"name": "tidy-lake", "key": "password"}}
    }
    st = streaming_table_from_object(obj)
    table = ensure_tables(lake_catalog(tmp_path).pyiceberg(), st).table
    for offset in range(8):  # eight tiny files: what frequent small commits leave behind
        commit_like_ingestion(
            table, [(0, offset)], offsets={0: offset + 1}, produce_ms=int(time.time() * 1000)
        )
    cluster.create_st(obj)
    wait_for("the driver pod", lambda: cluster.pod("tidy-reported-ingest"))
    deployment = "tidy-reported-compact"
    replicas = cluster.apps.read_namespaced_deployment(deployment, NAMESPACE).spec.replicas
    assert replicas == st.spec.compaction.min_replicas  # nothing measured yet: the operator read nothing

    # The driver's side: its credentials are in its environment (the pod's secretKeyRef variable).
    own = CatalogConfig.for_table(st.spec, environ={"ICEFALL_CATALOG_PASSWORD": "table-password"})
    meter = TableMeter(st, own)
    meter.start()  # its own thread, as in the driver pod
    try:
        reading = wait_for("the driver's reading of its table", lambda: meter.latest, timeout=30)
    finally:
        meter.stop()
    assert reading.table.compaction_backlog
    backlog = reading.table.compaction_backlog
    expected = compaction_replicas(backlog, st.spec.compaction.min_replicas, st.spec.compaction.max_replicas)
    assert expected > 0
    WriterStatusReporter(Kube(driver_client(kube, "tidy-reported")), NAMESPACE, "tidy-reported", meter=meter)(
        None
    )

    def scaled() -> bool:
        found = cluster.apps.read_namespaced_deployment(deployment, NAMESPACE)
        return bool(found.spec.replicas == expected)

    wait_for(f"the compaction Deployment at {expected} replicas", scaled, timeout=30)
    shape = wait_for("table status", lambda: (cluster.st("tidy-reported").get("status") or {}).get("table"))
    assert (shape["compactionBacklog"], shape["files"], shape["smallFileRatio"]) == (backlog, 8, 1.0)
    assert "lastCompactionTime" not in shape  # nothing was rewritten yet
    assert printer_columns(kube, "tidy-reported")["FILES"] == "8"
    writer = cluster.st("tidy-reported")["status"]["writer"]
    assert writer["tableUuid"] == str(table.metadata.table_uuid)
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "tidy-reported")
    wait_for("the StreamingTable to go", lambda: gone(cluster, "tidy-reported"), 30)
