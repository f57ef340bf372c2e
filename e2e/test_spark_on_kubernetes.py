"""Spark on Kubernetes for real: the driver pod's Spark creates its executors as pods through the API server.

The operator runs with its default Spark master, `kubernetes`: the driver Pod it renders is a client-mode
Spark driver (`k8s://` the API server's in-cluster address, the address every pod is given), and Spark's
own scheduler backend creates executor Pods through the API server with the driver's ServiceAccount,
under the Role the operator rendered for it, from the executor pod template ConfigMap, owned by the
driver Pod. The local kubelet runs them like any pod: executor pods have no `command`, so the image's
entry point runs (`icefall.testing.spark_entrypoint`, standing in for Spark's `/opt/entrypoint.sh`
`executor`), each in its own mount namespace with a read-only root; they reach the driver, Kafka, the
PostgreSQL catalog and the object store over the network. Proves:
- (a) executor pods are created by Spark (label `spark-role=executor`, owner reference to the driver Pod,
  the driver's ServiceAccount name in their spec), they run tasks (their logs), the table files are in the
  object store, and the topic's records are in the table exactly once;
- (b) executor loss: an executor pod deleted mid-stream is replaced by a new one, and the table still
  equals the topic exactly once;
- (c) dynamic allocation: with no records to read, idle executors are released (Spark deletes their
  pods) and new records bring an executor back.

Operator settings (what the chart's `spark.*` values set): executors of 512m, at most 1, released after
30 s idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.children import ENV_SPARK_CONF, KUBERNETES_MASTER, driver_account_name
from icefall.testing.kubelet import JsonApi, LocalKubelet
from icefall.testing.streams import NAMESPACE as TABLE_NAMESPACE
from icefall.testing.streams import assert_exactly_once, manifest_text

from .conftest import Lake, Operator, TableStream, pod_logs, wait_for

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE = "e2e_executors"
NAME = "e2e-executors"
TOPIC = "e2e-executors"
DRIVER = f"{NAME}-ingest"
EXECUTORS = f"icefall.dev/streamingtable={NAME},spark-role=executor"
IDLE_SECONDS = 30
BAD_EVERY = 30
Obj = dict[str, Any]
#: The operator's settings here (conftest's `operator` fixture adds them): its default Spark master,
#: small executors.
OPERATOR_ENV = {
    "ICEFALL_SPARK_MASTER": "kubernetes",
    "ICEFALL_EXECUTOR_MEMORY": "512m",
    "ICEFALL_MAX_EXECUTORS": "1",  # one executor JVM at a time: 2 cores
    "ICEFALL_EXECUTOR_IDLE_TIMEOUT_SECONDS": str(IDLE_SECONDS),
}


class Cluster(TableStream):
    """What the tests share: the stream and table, plus the API and the kubelet."""

    def __init__(
        self, rest: JsonApi, namespace: str, catalog: CatalogConfig, kafka: KafkaBroker, kubelet: LocalKubelet
    ) -> None:
        super().__init__(kafka, catalog, topic=TOPIC, table=TABLE, bad_every=BAD_EVERY)
        self.rest, self.namespace, self.kubelet = rest, namespace, kubelet

    def pod(self, name: str) -> Obj | None:
        return self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def executors(self, *, running: bool = True) -> list[Obj]:
        """Executor pods not being deleted (and Running, unless `running=False`)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        pods: list[Obj] = self.rest.call("GET", path, query=[("labelSelector", EXECUTORS)])["items"]
        alive = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return [p for p in alive if not running or (p.get("status") or {}).get("phase") == "Running"]

    def delete_an_executor(self) -> str | None:
        """Delete a running executor pod at once (grace 0); its name, or None if none could be."""
        for pod in self.executors():
            name: str = pod["metadata"]["name"]
            try:
                self.rest.call(
                    "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}", {"gracePeriodSeconds": 0}
                )
            except ApiException as error:
                if error.status == 404:  # released by Spark meanwhile
                    continue
                raise
            return name
        return None

    def executor_log(self, pod: Obj) -> str:
        path = self.kubelet.log_path(pod["metadata"]["name"], pod["metadata"]["uid"])
        return path.read_text(errors="replace") if path else ""

    def explain(self) -> str:
        executors = "\n".join(
            pod_logs(self.kubelet, p["metadata"]["name"]) for p in self.executors(running=False)
        )
        return f"{pod_logs(self.kubelet, DRIVER)}\n{executors}"


@pytest.fixture(scope="module")
def cluster(  # noqa: PLR0917 (fixtures)
    rest: JsonApi,
    e2e_namespace: str,
    kafka: KafkaBroker,
    kubelet: LocalKubelet,
    operator: Operator,
    lake: Lake,
) -> Iterator[Cluster]:
    kafka.create_topic(TOPIC, partitions=2)
    shared = Cluster(rest, e2e_namespace, lake.catalog, kafka, kubelet)
    st: Obj = yaml.safe_load(manifest_text(TABLE, TOPIC, kafka.bootstrap))
    st["metadata"]["namespace"] = e2e_namespace
    st["spec"]["table"]["catalog"] = lake.block
    shared.produce(150)
    rest.call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{e2e_namespace}/{PLURAL}", st)
    shared.started = time.monotonic()
    yield shared
    print(shared.explain())  # shown when a test failed
    print(f"--- operator\n{operator.tail()}")


def test_spark_creates_executor_pods_that_write_the_table(cluster: Cluster) -> None:
    driver = wait_for("the driver pod", lambda: cluster.pod(DRIVER), timeout=60, details=cluster.explain)
    (container,) = driver["spec"]["containers"]
    conf = next(e["value"] for e in container["env"] if e["name"] == ENV_SPARK_CONF)
    assert f'"spark.master":"{KUBERNETES_MASTER}"' in conf
    executors = wait_for("a running executor pod", cluster.executors, timeout=420, details=cluster.explain)
    cluster.note(f"executor pods: {[p['metadata']['name'] for p in executors]}")
    executor = executors[0]
    # Spark made it: owned by the driver Pod, the driver's account, from the operator's template.
    owner = executor["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", DRIVER, driver["metadata"]["uid"])
    assert executor["spec"]["serviceAccountName"] == driver_account_name(NAME)
    assert executor["spec"]["automountServiceAccountToken"] is False
    assert "command" not in executor["spec"]["containers"][0]  # the image's entry point runs it
    assert executor["metadata"]["uid"] in cluster.kubelet.started

    high = wait_for("the table to catch up", cluster.caught_up, timeout=600, details=cluster.explain)
    cluster.note(f"table caught up with {sum(high.values())} records")
    report = assert_exactly_once(cluster.catalog, TABLE, high, cluster.bad, bootstrap=cluster.kafka.bootstrap)
    assert report is not None and report.ok
    # The tasks ran in the executor pods (the driver runs none with a Kubernetes master) and the files
    # they wrote are in the object store.
    logs = "".join(cluster.executor_log(p) for p in cluster.executors(running=False))
    assert "Finished task" in logs, cluster.explain()
    table = cluster.catalog.pyiceberg().load_table((TABLE_NAMESPACE, TABLE))
    paths = table.inspect.files().column("file_path").to_pylist()
    assert paths and all(path.startswith("s3://") for path in paths), paths[:3]


def test_a_lost_executor_is_replaced_and_nothing_is_lost(cluster: Cluster) -> None:
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            cluster.produce(10)
            time.sleep(0.5)

    producer = threading.Thread(target=keep_producing, name="producer")
    producer.start()
    try:
        start = sum(cluster.committed().values())
        wait_for("a commit mid-stream", lambda: sum(cluster.committed().values()) > start, timeout=420)
        # An idle executor may be released (dynamic allocation) between the look and the delete: retry.
        name = wait_for("an executor pod deleted while it runs", cluster.delete_an_executor, timeout=420)
        cluster.note(f"deleted executor pod {name}")
        replacement = wait_for(
            "a replacement executor pod",
            lambda: [p for p in cluster.executors() if p["metadata"]["name"] != name],
            timeout=420,
            details=cluster.explain,
        )[0]
        cluster.note(f"replacement executor {replacement['metadata']['name']} running")
        resumed = sum(cluster.committed().values())
        wait_for(
            "a commit after the loss",
            lambda: sum(cluster.committed().values()) > resumed,
            timeout=420,
            details=cluster.explain,
        )
    finally:
        stop.set()
        producer.join(timeout=60)
    high = wait_for("the table to catch up", cluster.caught_up, timeout=600, details=cluster.explain)
    cluster.note(f"table caught up with {sum(high.values())} records")
    report = assert_exactly_once(cluster.catalog, TABLE, high, cluster.bad, bootstrap=cluster.kafka.bootstrap)
    assert report is not None and report.ok
    # The local kubelet removes a deleted pod's object after its containers stop: wait for it, bounded.
    wait_for("the deleted executor pod to be gone", lambda: cluster.pod(name) is None, timeout=120,
             details=cluster.explain)  # fmt: skip


def test_idle_executors_are_released_and_new_records_bring_one_back(cluster: Cluster) -> None:
    wait_for("the table to catch up", cluster.caught_up, timeout=600, details=cluster.explain)
    before = {p["metadata"]["name"] for p in cluster.executors(running=False)}
    wait_for(
        f"Spark to release its idle executors (idle timeout {IDLE_SECONDS} s)",
        lambda: not cluster.executors(running=False),
        timeout=180,
        every=1,
        details=cluster.explain,
    )
    cluster.note(f"released executor pods {sorted(before)}")
    cluster.produce(60)
    back = wait_for("an executor for new records", cluster.executors, timeout=420, details=cluster.explain)
    assert {p["metadata"]["name"] for p in back}.isdisjoint(before)
    high = wait_for("the table to catch up", cluster.caught_up, timeout=600, details=cluster.explain)
    report = assert_exactly_once(cluster.catalog, TABLE, high, cluster.bad, bootstrap=cluster.kafka.bootstrap)
    assert report is not None and report.ok
