"""Spark on Kubernetes for real: the driver pod's Spark creates its executors as pods through the API server,
and the node runs them as containers of the image we ship, with the image's own entry point.

The operator runs with its default Spark master, `kubernetes`: the driver Pod it renders is a client-mode
Spark driver (`k8s://` the API server's in-cluster address, from the `KUBERNETES_SERVICE_HOST`/`_PORT` the
cluster's pod template gives every pod), and Spark's own scheduler backend creates executor Pods through
the API server with the driver's ServiceAccount, under the Role the operator rendered for it, from the
executor pod template ConfigMap, owned by the driver Pod. The node (the real kubelet on containerd + runc)
runs them: executor pods have no `command`, so the image's ENTRYPOINT (`tini -- python -m
icefall.spark.entrypoint`, where Apache Spark's images have `/opt/entrypoint.sh`) turns Spark's `executor`
argument and SPARK_* variables into the executor JVM, as uid 10001 with a read-only root. Every pod is on
the host network (there is no pod network here): executors dial the driver at its pod IP (127.0.0.1) on the
ports Spark picked, and reach Kafka, the PostgreSQL catalog and the object store over the network. Proves:
- (a) executor pods are created by Spark (label `spark-role=executor`, owner reference to the driver Pod,
  the driver's ServiceAccount name in their spec, no `command`), they are containers of the image whose
  entry point started the executor (its `[entrypoint] executor` line) running as uid 10001, they run the
  tasks (their logs), the table files are in the object store, and the topic's records are in the table
  exactly once;
- Spark RPC authenticated and encrypted with the table's own secret: the executor JVM starts with
  `spark.authenticate` and `spark.network.crypto.enabled` and the secret file's path (and a `k8s://`
  master, without which it could not read the file), the secret (the Secret `icefall-<st>-spark-auth`) is
  on no command line and in no environment of the driver's or the executor's processes, in no pod spec and
  no ConfigMap; and the driver's RPC port refuses a Spark RPC client without a secret and one with another
  secret, and accepts one with the table's (e2e/SparkRpcProbe.java, a real Spark client);
- (b) executor loss: an executor pod deleted mid-stream is replaced by a new one, and the table still
  equals the topic exactly once;
- (c) dynamic allocation: with no records to read, idle executors are released (Spark deletes their
  pods) and new records bring an executor back.

Operator settings (what the chart's `spark.*` values set): executors of the default memory (2g), at most
one, released after 30 s idle; every pod requests 100m CPU (the cluster's pod template, which Spark's
executors get as `spark.kubernetes.executor.request.cores`), so the driver and an executor fit 2 CPUs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from icefall.catalog import CatalogConfig
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.procs import java
from icefall.plan.env import ENV_SPARK_CONF
from icefall.plan.isolation import SPARK_AUTH_FILE, SPARK_AUTH_KEY
from icefall.plan.names import driver_account_name, spark_auth_secret_name
from icefall.plan.spark_conf import KUBERNETES_MASTER
from icefall.spark.entrypoint import EXECUTOR_BACKEND
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import NAMESPACE as TABLE_NAMESPACE
from icefall.testing.streams import assert_exactly_once, manifest_text

from .conftest import Lake, NodeView, Operator, TableStream, pod_logs, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE = "e2e_executors"
NAME = "e2e-executors"
TOPIC = "e2e-executors"
DRIVER = f"{NAME}-ingest"
EXECUTORS = f"icefall.dev/streamingtable={NAME},spark-role=executor"
IDLE_SECONDS = 30
BAD_EVERY = 30
UID = 10001  # the image's user
PROBE = Path(__file__).with_name("SparkRpcProbe.java")
Obj = dict[str, Any]
#: The operator's settings here (conftest's `operator` fixture adds them): its default Spark master,
#: at most one executor, released soon when idle.
OPERATOR_ENV = {
    "ICEFALL_SPARK_MASTER": "kubernetes",
    "ICEFALL_MAX_EXECUTORS": "1",  # one executor JVM at a time: 2 cores
    "ICEFALL_EXECUTOR_IDLE_TIMEOUT_SECONDS": str(IDLE_SECONDS),
}


class Executors(TableStream):
    """What the tests share: the stream and table, plus the API and the node."""

    def __init__(
        self,
        *,
        rest: JsonApi,
        namespace: str,
        catalog: CatalogConfig,
        kafka: KafkaBroker,
        node: NodeView,
        operator: Operator,
    ) -> None:
        super().__init__(kafka, catalog, topic=TOPIC, table=TABLE, bad_every=BAD_EVERY)
        self.rest, self.namespace, self.node, self.operator = rest, namespace, node, operator

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
        """The container log of this executor pod (that incarnation of its name)."""
        return self.node.log(pod["metadata"]["name"], pod["metadata"]["uid"])

    def explain(self) -> str:
        """For failure messages: the executor pods' states, the driver's and executors' log tails, the
        operator's."""
        pods = self.executors(running=False)
        states = "\n".join(f"{p['metadata']['name']}: {_state(p)}" for p in pods) or "(no executor pods)"
        logs = "\n".join(pod_logs(self.node, p["metadata"]["name"]) for p in pods)
        return (
            f"--- executor pods\n{states}\n{pod_logs(self.node, DRIVER)}\n{logs}\n"
            f"--- operator\n{self.operator.tail()}"
        )


def _state(pod: Obj) -> str:
    """A pod's phase, unmet conditions and container states, on one line."""
    status = pod.get("status") or {}
    unmet = [
        f"{c['type']}: {c.get('reason', '')} {c.get('message', '')}".strip()
        for c in status.get("conditions") or []
        if c.get("status") != "True"
    ]
    containers = [s.get("state") for s in status.get("containerStatuses") or []]
    return f"{status.get('phase')} {unmet} {containers}"


def _process_uid(pid: int) -> int:
    """The real uid of a host process (the `Uid:` line of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def _children(pid: int) -> dict[int, list[str]]:
    """A host process's children: pid → command line."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # `pid (comm) state ppid ...`: comm may hold spaces, so split after its closing parenthesis.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(stat.parent.name)] = (
                    stat.with_name("cmdline").read_bytes().decode().split("\0")[:-1]
                )
        except (FileNotFoundError, ProcessLookupError):  # gone meanwhile
            continue
    return found


def _process_tree(pid: int) -> list[int]:
    """A host process and all its descendants."""
    tree, todo = [], [pid]
    while todo:
        tree.append(current := todo.pop())
        todo.extend(_children(current))
    return tree


def _proc_bytes(pid: int, name: str) -> bytes:
    """/proc/<pid>/<name> (`cmdline`, `environ`), b'' for a process gone meanwhile."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _assert_spark_rpc_authenticated(stream: Executors, executor: Obj, jvm: int, pids: list[int]) -> None:
    """Spark RPC between the driver and `executor` (whose JVM is `jvm`) is authenticated and encrypted with
    the table's own secret, which no process of `pids` (the driver's and the executor's) has on its command
    line or in its environment, and no pod spec or ConfigMap holds (module doc)."""
    options = [o for o in _proc_bytes(jvm, "cmdline").decode().split("\0") if o.startswith("-D")]
    assert {
        "-Dspark.authenticate=true",
        "-Dspark.network.crypto.enabled=true",
        "-Dspark.network.crypto.saslFallback=false",
        f"-Dspark.authenticate.secret.file={SPARK_AUTH_FILE}",
        f"-Dspark.authenticate.secret.executor.file={SPARK_AUTH_FILE}",
    } <= set(options), options
    assert any(o.startswith("-Dspark.master=k8s://") for o in options), options
    secret = stream.rest.get(f"/api/v1/namespaces/{stream.namespace}/secrets/{spark_auth_secret_name(NAME)}")
    assert secret is not None
    encoded: str = secret["data"][SPARK_AUTH_KEY]  # as Spark uses it: the base64 of the file's bytes
    values = (encoded.encode(), base64.b64decode(encoded))
    for pid in pids:
        for name in ("cmdline", "environ"):
            text = _proc_bytes(pid, name)
            assert not any(value in text for value in values), f"the secret in /proc/{pid}/{name}"
            assert b"_SPARK_AUTH_SECRET" not in text, f"Spark's secret variable in /proc/{pid}/{name}"
    config_maps = stream.rest.call("GET", f"/api/v1/namespaces/{stream.namespace}/configmaps")["items"]
    rendered = json.dumps([stream.pod(DRIVER), executor, config_maps])
    assert encoded not in rendered and "_SPARK_AUTH_SECRET" not in rendered
    (spec,) = executor["spec"]["containers"]
    url = next(e["value"] for e in spec["env"] if e["name"] == "SPARK_DRIVER_URL")
    jars = Path(pyspark.__file__).parent / "jars"
    probe = subprocess.run(
        [*java("-Xmx256m"), "-cp", f"{jars}/*", str(PROBE), url],
        env={**os.environ, "_SPARK_AUTH_SECRET": encoded},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    tries = dict(line.split(" ", 1) for line in probe.stdout.splitlines() if " " in line)
    stream.note(f"Spark RPC clients at {url}: {tries}")
    assert tries.get("none", "").startswith("REFUSED"), f"{probe.stdout}\n{probe.stderr[-3000:]}"
    assert tries.get("wrong", "").startswith("REFUSED"), f"{probe.stdout}\n{probe.stderr[-3000:]}"
    assert tries.get("table") == "ACCEPTED", f"{probe.stdout}\n{probe.stderr[-3000:]}"


def _root_mount_options(pid: int) -> list[str]:
    """The mount options of a host process's root file system (its mount namespace's `/`)."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError(f"no root mount for pid {pid}")


@pytest.fixture(scope="module")
def stream(  # noqa: PLR0917 (fixtures)
    rest: JsonApi,
    e2e_namespace: str,
    kafka: KafkaBroker,
    node: NodeView,
    operator: Operator,
    lake: Lake,
) -> Iterator[Executors]:
    kafka.create_topic(TOPIC, partitions=2)
    shared = Executors(
        rest=rest, namespace=e2e_namespace, catalog=lake.catalog, kafka=kafka, node=node, operator=operator
    )
    st: Obj = yaml.safe_load(manifest_text(TABLE, TOPIC, kafka.bootstrap))
    st["metadata"]["namespace"] = e2e_namespace
    st["spec"]["table"]["catalog"] = lake.block
    shared.produce(150)
    rest.call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{e2e_namespace}/{PLURAL}", st)
    shared.started = time.monotonic()
    yield shared
    print(shared.explain())  # shown when a test failed


def test_spark_creates_executor_pods_from_the_image_that_write_the_table(
    stream: Executors, cluster: LocalCluster
) -> None:
    driver = wait_for("the driver pod", lambda: stream.pod(DRIVER), timeout=60, details=stream.explain)
    (container,) = driver["spec"]["containers"]
    conf = next(e["value"] for e in container["env"] if e["name"] == ENV_SPARK_CONF)
    assert f'"spark.master":"{KUBERNETES_MASTER}"' in conf
    executors = wait_for("a running executor pod", stream.executors, timeout=420, details=stream.explain)
    stream.note(f"executor pods: {[p['metadata']['name'] for p in executors]}")
    executor = executors[0]
    # Spark made it: owned by the driver Pod, the driver's account, from the operator's template.
    owner = executor["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", DRIVER, driver["metadata"]["uid"])
    assert executor["spec"]["serviceAccountName"] == driver_account_name(NAME)
    assert executor["spec"]["automountServiceAccountToken"] is False
    assert executor["spec"]["hostNetwork"] is True
    (spec,) = executor["spec"]["containers"]
    assert "command" not in spec and spec["args"][0] == "executor"  # the image's entry point runs it
    assert spec["resources"]["requests"]["cpu"] == "100m", spec["resources"]
    # On the host network the executor dials the driver at the driver's pod IP (the node's address, its
    # own too) on the port the driver's Spark picked.
    address = (stream.pod(DRIVER) or {})["status"]["podIP"]
    assert executor["status"]["podIP"] == address
    env = {e["name"]: e.get("value") for e in spec["env"]}
    assert re.fullmatch(rf"spark://CoarseGrainedScheduler@{re.escape(address)}:\d+", env["SPARK_DRIVER_URL"])
    # A container of the image we ship, its processes the image's user on a read-only root.
    (status,) = executor["status"]["containerStatuses"]
    assert status["image"] == cluster.images.icefall, status
    assert status["containerID"].startswith("containerd://"), status
    pid = stream.node.node.container_pid(status["containerID"])
    assert pid is not None, f"no process for {status['containerID']}"
    assert _process_uid(pid) == UID
    assert "ro" in _root_mount_options(pid)
    # tini (PID 1 in the container) started the entry point, which replaces itself with the executor JVM.
    (jvm,) = wait_for(
        "the executor JVM in place of the entry point",
        lambda: [child for child, argv in _children(pid).items() if EXECUTOR_BACKEND in argv],
        timeout=60,
        details=lambda: f"{_children(pid)}\n{stream.explain()}",
    )
    assert _process_uid(jvm) == UID
    driver_status = (stream.pod(DRIVER) or {})["status"]["containerStatuses"][0]
    driver_pid = stream.node.node.container_pid(driver_status["containerID"])
    assert driver_pid is not None, f"no process for {driver_status['containerID']}"
    _assert_spark_rpc_authenticated(stream, executor, jvm, [*_process_tree(driver_pid), *_process_tree(pid)])
    wait_for(
        "the entry point's line in the executor's log",
        lambda: "[entrypoint] executor" in stream.executor_log(executor),
        timeout=60,
        details=stream.explain,
    )

    high = wait_for("the table to catch up", stream.caught_up, timeout=600, details=stream.explain)
    stream.note(f"table caught up with {sum(high.values())} records")
    report = assert_exactly_once(stream.catalog, TABLE, high, stream.bad, bootstrap=stream.kafka.bootstrap)
    assert report is not None and report.ok
    # The tasks ran in the executor pods (the driver runs none with a Kubernetes master) and the files
    # they wrote are in the object store.
    logs = "".join(stream.executor_log(p) for p in [executor, *stream.executors(running=False)])
    assert "Finished task" in logs, stream.explain()
    table = stream.catalog.pyiceberg().load_table((TABLE_NAMESPACE, TABLE))
    paths = table.inspect.files().column("file_path").to_pylist()
    assert paths and all(path.startswith("s3://") for path in paths), paths[:3]


def test_a_lost_executor_is_replaced_and_nothing_is_lost(stream: Executors) -> None:
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            stream.produce(10)
            time.sleep(0.5)

    producer = threading.Thread(target=keep_producing, name="producer")
    producer.start()
    try:
        start = sum(stream.committed().values())
        wait_for("a commit mid-stream", lambda: sum(stream.committed().values()) > start, timeout=420)
        # An idle executor may be released (dynamic allocation) between the look and the delete: retry.
        name = wait_for("an executor pod deleted while it runs", stream.delete_an_executor, timeout=420)
        stream.note(f"deleted executor pod {name}")
        replacement = wait_for(
            "a replacement executor pod",
            lambda: [p for p in stream.executors() if p["metadata"]["name"] != name],
            timeout=420,
            details=stream.explain,
        )[0]
        stream.note(f"replacement executor {replacement['metadata']['name']} running")
        resumed = sum(stream.committed().values())
        wait_for(
            "a commit after the loss",
            lambda: sum(stream.committed().values()) > resumed,
            timeout=420,
            details=stream.explain,
        )
    finally:
        stop.set()
        producer.join(timeout=60)
    high = wait_for("the table to catch up", stream.caught_up, timeout=600, details=stream.explain)
    stream.note(f"table caught up with {sum(high.values())} records")
    report = assert_exactly_once(stream.catalog, TABLE, high, stream.bad, bootstrap=stream.kafka.bootstrap)
    assert report is not None and report.ok
    # Deleted with grace 0, the object goes at once and the kubelet kills the container: bounded wait.
    wait_for("the deleted executor pod to be gone", lambda: stream.pod(name) is None, timeout=120,
             details=stream.explain)  # fmt: skip


def test_idle_executors_are_released_and_new_records_bring_one_back(stream: Executors) -> None:
    wait_for("the table to catch up", stream.caught_up, timeout=600, details=stream.explain)
    before = {p["metadata"]["name"] for p in stream.executors(running=False)}
    wait_for(
        f"Spark to release its idle executors (idle timeout {IDLE_SECONDS} s)",
        lambda: not stream.executors(running=False),
        timeout=180,
        every=1,
        details=stream.explain,
    )
    stream.note(f"released executor pods {sorted(before)}")
    stream.produce(60)
    back = wait_for("an executor for new records", stream.executors, timeout=420, details=stream.explain)
    assert {p["metadata"]["name"] for p in back}.isdisjoint(before)
    high = wait_for("the table to catch up", stream.caught_up, timeout=600, details=stream.explain)
    report = assert_exactly_once(stream.catalog, TABLE, high, stream.bad, bootstrap=stream.kafka.bootstrap)
    assert report is not None and report.ok
