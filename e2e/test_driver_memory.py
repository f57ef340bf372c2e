"""A driver whose memory limit is too small is OOM-killed, the table says so, and a fixed limit recovers
with nothing lost.

The operator runs as a process; the node (the real kubelet on containerd) runs the driver Pod as a
container of the image we ship, where the kernel enforces `resources.limits.memory`. A StreamingTable asks
for a driver of 48Mi (`spec.pods.driver.resources`, requests the same): far less than Spark's JVM and Python
need. Proves:
- the driver container is OOM-killed: its Pod (limit 48Mi, as the table asked) ends with the container
  terminated, reason OOMKilled (seen by a watch: the operator deletes a failed driver at once). Its exit
  code is 137: the kernel kills Python while it imports, before the JVM starts;
- the StreamingTable reports it: Ready False, Degraded True and Ingesting False with reason DriverFailed,
  each message naming OOMKilled, the limit 48Mi and `spec.pods.driver.resources.limits.memory`; a Warning
  Event DriverFailed says the same;
- patching the table to a 2Gi limit starts a new driver at once (a new spec needs no backoff) in a Pod with
  that limit, which runs without a restart; the table catches up with every record produced before, during
  and after the failures, exactly once (record by record, and per the auditor), and Ready turns True again
  with Degraded False.

Not proven here: a Java OutOfMemoryError inside the heap (the JVM's own limit, not the container's), or an
executor pod's OOM kill (Spark replaces lost executors; test_spark_on_kubernetes covers a lost executor).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.driver import DRIVER_MEMORY_FIELD
from icefall.testing.kubeapi import JsonApi, ObjectWatch
from icefall.testing.streams import assert_exactly_once, manifest_text

from .conftest import Lake, NodeView, Operator, TableStream, pod_logs, wait_for

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE = "e2e_oom"  # it.e2e_oom, dead letters in it.e2e_oom_dlq
NAME = "e2e-oom"  # the StreamingTable
DRIVER = f"{NAME}-ingest"
LABEL = f"icefall.dev/streamingtable={NAME}"
TOPIC = "e2e-oom"
TARGET_SECONDS = 30
BAD_EVERY = 40
# Too small for Python alone: its imports hold ~60 MiB of anonymous memory before the JVM starts, which
# the kernel cannot reclaim (no swap), so they end in an OOM kill whatever the load. At 300Mi, 200Mi and
# 128Mi the JVM instead limped along at the limit, its class loading reading jars through a few MiB of
# page cache, for minutes without an OOM kill (cgroup v1: failcnt in the millions, oom_kill 0).
TOO_SMALL, ENOUGH = "48Mi", "2Gi"
Obj = dict[str, Any]


def memory(limit: str, request: str) -> Obj:
    """`spec.pods` with the driver's memory limit and request."""
    return {"driver": {"resources": {"requests": {"memory": request}, "limits": {"memory": limit}}}}


class Pipeline(TableStream):
    """The StreamingTable, its topic and table, and what the test reads of them."""

    def __init__(
        self,
        *,
        rest: JsonApi,
        namespace: str,
        lake: Lake,
        kafka: KafkaBroker,
        node: NodeView,
        operator: Operator,
    ) -> None:
        super().__init__(kafka, lake.catalog, topic=TOPIC, table=TABLE, bad_every=BAD_EVERY)
        self.rest, self.namespace, self.node, self.operator = rest, namespace, node, operator
        self.catalog_block = lake.block  # spec.table.catalog: credentials by reference, from the Secret

    @property
    def st_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def st(self) -> Obj:
        return self.rest.get(f"{self.st_path}/{NAME}") or {}

    def condition(self, kind: str, st: Obj | None = None) -> Obj:
        """The StreamingTable's condition of type `kind` ({} if none yet)."""
        conditions = ((st if st is not None else self.st()).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), {})

    def running_driver(self) -> Obj | None:
        """The driver Pod if its container runs and the Pod is not being deleted."""
        pod = self.rest.get(f"{self.pods_path}/{DRIVER}")
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return pod if statuses[0].get("state", {}).get("running") else None

    def events(self, reason: str) -> list[Obj]:
        """Events about the StreamingTable with `reason`."""
        selector = f"involvedObject.name={NAME},involvedObject.kind=StreamingTable"
        path = f"/api/v1/namespaces/{self.namespace}/events"
        found: list[Obj] = self.rest.call("GET", path, query=[("fieldSelector", selector)])["items"]
        return [e for e in found if e.get("reason") == reason]

    def explain(self) -> str:
        """For a failure message: status, the driver's log tail, the operator's."""
        status = yaml.safe_dump(self.st().get("status"))
        return f"--- status\n{status}{pod_logs(self.node, DRIVER)}\n--- operator\n{self.operator.tail()}"


@pytest.fixture(scope="module")
def table(  # noqa: PLR0917 (fixtures)
    rest: JsonApi, e2e_namespace: str, kafka: KafkaBroker, node: NodeView, operator: Operator, lake: Lake
) -> Pipeline:
    kafka.create_topic(TOPIC, partitions=2)
    return Pipeline(rest=rest, namespace=e2e_namespace, lake=lake, kafka=kafka, node=node, operator=operator)


@pytest.fixture(autouse=True)
def operator_log_is_clean(operator: Operator) -> Iterator[None]:
    """No handler of the operator crashed during the test (kopf logs the traceback and retries)."""
    yield
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def _terminated(pod: Obj) -> Obj:
    """The terminated state of the Pod's container ({} while it has none)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    found: Obj = (statuses[0].get("state") or {}).get("terminated") or {}
    return found


def _memory_limit(pod: Obj) -> str | None:
    (container,) = pod["spec"]["containers"]
    limit: str | None = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    return limit


def test_an_oom_killed_driver_is_reported_and_a_fixed_limit_recovers(
    table: Pipeline, cluster: LocalCluster
) -> None:
    st: Obj = yaml.safe_load(manifest_text(TABLE, TOPIC, table.kafka.bootstrap))
    st["metadata"]["namespace"] = table.namespace
    st["spec"]["table"]["catalog"] = table.catalog_block
    st["spec"]["freshness"] = {"targetSeconds": TARGET_SECONDS}
    st["spec"]["pods"] = memory(TOO_SMALL, TOO_SMALL)
    table.produce(200)  # a backlog waiting for the driver
    pods = ObjectWatch(table.rest, table.pods_path, [("labelSelector", LABEL)])
    tables = ObjectWatch(table.rest, table.st_path, [("fieldSelector", f"metadata.name={NAME}")])
    with pods, tables:
        table.rest.call("POST", table.st_path, st)
        table.started = time.monotonic()

        # 1. The kernel kills the driver at its limit; the Pod says so before the operator deletes it.
        def oom_killed() -> Obj | None:
            return next((p for p in pods.objects() if _terminated(p).get("reason") == "OOMKilled"), None)

        killed = wait_for("the driver's container OOM-killed", oom_killed, timeout=240, details=table.explain)
        state = _terminated(killed)
        table.note(f"driver pod {killed['metadata']['uid']} OOM-killed: {state}")
        assert killed["metadata"]["name"] == DRIVER
        assert _memory_limit(killed) == TOO_SMALL, killed["spec"]["containers"][0].get("resources")
        # The kernel kills the largest process of the container, Spark's JVM; the Python driver (PID 1) then
        # exits 1 on its own. The runtime saw the cgroup's OOM kill, so the reason is OOMKilled either way.
        assert state["exitCode"] in {1, 137}, state
        failed_uids = {p["metadata"]["uid"] for p in pods.objects() if _terminated(p)}

        # 2. The table says why, and what to change.
        def reported() -> Obj | None:
            for st_seen in reversed(tables.objects()):
                ready = table.condition("Ready", st_seen)
                if ready.get("status") == "False" and ready.get("reason") == "DriverFailed":
                    return st_seen
            return None

        reporting = wait_for("Ready False with DriverFailed", reported, timeout=120, details=table.explain)
        for kind, status in (("Ready", "False"), ("Degraded", "True"), ("Ingesting", "False")):
            condition = table.condition(kind, reporting)
            assert (condition["status"], condition["reason"]) == (status, "DriverFailed"), condition
            message = condition["message"]
            assert "OOMKilled" in message and TOO_SMALL in message, condition
            assert DRIVER_MEMORY_FIELD in message, condition
        table.note(f"Ready: {table.condition('Ready', reporting)['message']}")
        warnings = wait_for(
            "a DriverFailed Event", lambda: table.events("DriverFailed"), timeout=60, details=table.explain
        )
        assert all(e["type"] == "Warning" for e in warnings), warnings
        assert any(
            "OOMKilled" in e["message"] and TOO_SMALL in e["message"] and DRIVER_MEMORY_FIELD in e["message"]
            for e in warnings
        ), [e["message"] for e in warnings]
        table.produce(100)  # while the driver cannot run

        # 3. A sufficient limit: a new driver at once, with that limit.
        table.rest.call(
            "PATCH", f"{table.st_path}/{NAME}", {"spec": {"pods": memory(ENOUGH, "1Gi")}},
            content_type="application/merge-patch+json",
        )  # fmt: skip
        table.note(f"spec.pods.driver.resources.limits.memory patched to {ENOUGH}")
        pod = wait_for(
            "a driver with the new limit running",
            lambda: (p := table.running_driver()) and _memory_limit(p) == ENOUGH and p,
            timeout=180,
            details=table.explain,
        )
        table.note(f"driver pod {pod['metadata']['uid']} running with {ENOUGH}")
        assert pod["metadata"]["uid"] not in failed_uids
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == cluster.images.icefall, status
        assert status["containerID"].startswith("containerd://"), status
        table.produce(100)  # while it runs

        # 4. Nothing lost: every record, exactly once; Ready again.
        high = wait_for("the table to catch up", table.caught_up, timeout=360, details=table.explain)
        table.note(f"table caught up with {sum(high.values())} records")
        report = assert_exactly_once(table.catalog, TABLE, high, table.bad, bootstrap=table.kafka.bootstrap)
        assert report is not None and report.ok
        wait_for(
            "Ready True again",
            lambda: table.condition("Ready").get("status") == "True",
            timeout=120,
            details=table.explain,
        )
        assert table.condition("Degraded")["status"] == "False", table.condition("Degraded")
        after = table.rest.get(f"{table.pods_path}/{DRIVER}")
        assert after is not None and after["metadata"]["uid"] == pod["metadata"]["uid"], (
            "the driver restarted"
        )
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0, after["status"]
        assert not [
            p for p in pods.objects() if p["metadata"]["uid"] == pod["metadata"]["uid"] and _terminated(p)
        ]
