"""The whole system: a StreamingTable applied to a real API server becomes a running pipeline.

The operator runs as a process (`icefall operator`, Spark master `local[1]` for the driver); the node (the
real kubelet on containerd) runs the driver Pod it renders as a container of the image we ship, as uid
10001 with a read-only root, against the session's real Kafka broker and a PostgreSQL JDBC catalog with
its files in the object store (the `lake` fixture), which the pod reaches only over the network. Proves:
- (a) events produced to the topic become rows in the table, exactly once (malformed ones in the
  dead-letter table), and `kubectl get st` — the CRD's printer columns — shows READY True and a
  FRESHNESS under the table's target; `status.freshness.seconds` says the same, and, while records keep
  arriving (lag > 0), is measured (above 0) and under the target; the driver holds the commit Lease under
  its pod name, reached with the Pod's projected ServiceAccount token, and reports its own lag and
  freshness into `status.writer` with that token;
- (b) deleting the driver Pod while events keep arriving: the kubelet stops the container (SIGTERM, the
  Pod's grace period) and the old driver stops cleanly, the operator creates a new driver Pod (new uid,
  an Event), the node runs it, it takes the commit Lease with a newer epoch and resumes from the
  offsets in the table, and once producing stops the table equals the topic exactly once (record by
  record, and per the auditor); only the new Pod is left;
- (c) `deletionPolicy: Delete`: the purge Job (the driver's pod template and the catalog's Secret; the
  operator holds no lake credential) drops the table and its dead-letter table and deletes their files,
  then the StreamingTable goes.

The three tests share one StreamingTable and run in order: (b) starts from the running driver of (a),
which saves a Spark start, and (c) deletes what (b) left. Each still checks everything it claims on its
own.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.api import streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.names import table_leases
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import assert_exactly_once, manifest_text, watermarks

from .conftest import TABLE_NAMESPACE, Kubectl, Lake, NodeView, Operator, TableStream, pod_logs, wait_for

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE = "e2e_orders"  # it.e2e_orders, dead letters in it.e2e_orders_dlq
NAME = "e2e-orders"  # the StreamingTable
DRIVER = f"{NAME}-ingest"
LABEL = f"icefall.dev/streamingtable={NAME}"
TOPIC = "e2e-orders"
TARGET_SECONDS = 30
BAD_EVERY = 40
#: The operator's Event reasons for starting a driver Pod.
STARTS = frozenset({"DriverCreated", "DriverRestarted"})
Obj = dict[str, Any]


class Pipeline(TableStream):
    """What the tests share: the stream and table, plus the clients and the operator."""

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
        self.rest = rest
        self.namespace = namespace
        self.node = node
        self.operator = operator

    @property
    def st_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"

    def st(self) -> Obj:
        return self.rest.get(f"{self.st_path}/{NAME}") or {}

    def pods(self) -> list[Obj]:
        """The StreamingTable's pods."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        found: list[Obj] = self.rest.call("GET", path, query=[("labelSelector", LABEL)])["items"]
        return found

    def running_driver(self) -> Obj | None:
        """The driver Pod if it runs and is not being deleted."""
        pod = self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods/{DRIVER}")
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    def lease(self) -> Obj:
        """The table's commit Lease (the driver takes it with its ServiceAccount's token)."""
        name = table_leases(streaming_table_from_object(self.st())).commit
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{name}"
        return self.rest.get(path) or {}

    def events(self, reasons: frozenset[str]) -> list[Obj]:
        """Events about the StreamingTable with one of `reasons`."""
        selector = f"involvedObject.name={NAME},involvedObject.kind=StreamingTable"
        path = f"/api/v1/namespaces/{self.namespace}/events"
        found: list[Obj] = self.rest.call("GET", path, query=[("fieldSelector", selector)])["items"]
        return [e for e in found if e.get("reason") in reasons]

    def explain(self) -> str:
        """Logs for a failure message: the driver's and the operator's tails."""
        status = yaml.safe_dump(self.st().get("status"))
        return f"--- status\n{status}{pod_logs(self.node, DRIVER)}\n--- operator\n{self.operator.tail()}"


@pytest.fixture(scope="module")
def pipeline(  # noqa: PLR0917 (fixtures)
    rest: JsonApi,
    e2e_namespace: str,
    kafka: KafkaBroker,
    node: NodeView,
    operator: Operator,
    lake: Lake,
) -> Iterator[Pipeline]:
    catalog = lake.catalog
    kafka.create_topic(TOPIC, partitions=2)
    running = Pipeline(
        rest=rest, namespace=e2e_namespace, catalog=catalog, kafka=kafka, node=node, operator=operator
    )
    st: Obj = yaml.safe_load(manifest_text(TABLE, TOPIC, kafka.bootstrap))
    st["metadata"]["namespace"] = e2e_namespace
    st["spec"]["table"]["catalog"] = lake.block  # credentials by reference, from the Secret
    st["spec"]["freshness"] = {"targetSeconds": TARGET_SECONDS}
    running.produce(200)  # before the table exists: the driver starts with a backlog
    rest.call("POST", running.st_path, st)
    running.started = time.monotonic()
    yield running
    print(running.explain())  # shown when a test failed


@pytest.fixture(autouse=True)
def operator_log_is_clean(operator: Operator) -> Iterator[None]:
    """No handler of the operator crashed during the test (kopf logs the traceback and retries)."""
    yield
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def _count(events: list[Obj]) -> int:
    """How many times these Events happened (a repeated Event may be one object with a count)."""
    return sum(int(e.get("count") or 1) for e in events)


def _printed_row(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """`kubectl get st <name>` as the user sees it: header → value of the one row."""
    header, row = kubectl("-n", namespace, "get", "st", NAME).rstrip().splitlines()
    # Columns are fixed-width and an unset value prints as nothing: cut the row where header words start.
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def test_events_become_rows_and_kubectl_shows_ready_and_fresh(
    pipeline: Pipeline, kubectl: Kubectl, cluster: LocalCluster
) -> None:
    pod = wait_for("the driver pod running", pipeline.running_driver, timeout=180, details=pipeline.explain)
    pipeline.note(f"driver pod {pod['metadata']['uid']} running")
    (container,) = pod["spec"]["containers"]
    assert container["command"][:-1] == [
        "icefall",
        "ingest",
        "--namespace",
        pipeline.namespace,
        "--name",
        NAME,
    ]
    assert re.fullmatch(r"--metrics-port=\d+", container["command"][-1]), container["command"]
    # A container of the image we ship, run by the runtime as the image's user with a read-only root.
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"] == cluster.images.icefall and status["containerID"].startswith("containerd://")
    who = kubectl(
        "-n", pipeline.namespace, "exec", DRIVER, "--", "bash", "-c", "id -u; touch /x 2>&1 || true"
    )
    assert who.splitlines() == ["10001", "touch: cannot touch '/x': Read-only file system"], who

    pipeline.produce(100)  # while it runs
    high = wait_for("the table to catch up", pipeline.caught_up, timeout=300, details=pipeline.explain)
    pipeline.note(f"table caught up with {sum(high.values())} records")
    assert_exactly_once(pipeline.catalog, TABLE, high, pipeline.bad, bootstrap=pipeline.kafka.bootstrap)
    # The driver took the commit Lease as itself: its pod name came from a fieldRef, the API access from
    # the ServiceAccount token the kubelet got for the pod, under the Role the operator rendered.
    assert pipeline.lease()["spec"]["holderIdentity"] == DRIVER
    # The pod's emptyDir for Spark's scratch space is where Spark put it (spark.local.dir was mapped).
    assert any(pipeline.node.node.pod_volume(pod["metadata"]["uid"], "spark-local").iterdir())

    def ready_row() -> dict[str, str] | None:
        row = _printed_row(kubectl, pipeline.namespace)
        return row if row.get("READY") == "True" and "FRESHNESS" in row else None

    row = wait_for(
        "kubectl get st to show READY True with a freshness",
        ready_row,
        timeout=90,
        details=pipeline.explain,
        every=1,
    )
    pipeline.note(f"kubectl get st: {row}")
    assert float(row["FRESHNESS"]) <= TARGET_SECONDS, row
    assert row["LAG"] == "0", row
    freshness = kubectl(
        "-n", pipeline.namespace, "get", "st", NAME, "-o", "jsonpath={.status.freshness.seconds}"
    )
    assert freshness and float(freshness) <= TARGET_SECONDS, freshness
    # The driver in its container reports what it measured into its own status (its Role allows that).
    writer = wait_for(
        "the driver's report in status.writer",
        lambda: (pipeline.st().get("status") or {}).get("writer"),
        timeout=60,
        details=pipeline.explain,
    )
    pipeline.note(f"status.writer: {writer}")
    assert writer["lagRecords"] >= 0 and writer["reportedAt"], writer
    # Caught up, freshness is 0 by definition: it is measured for real while records keep arriving.
    waiting = _freshness_while_producing(pipeline, readings=3, timeout=240)
    assert all(seconds is not None and 0 < seconds <= TARGET_SECONDS for _, seconds in waiting), waiting
    wait_for("the table to catch up again", pipeline.caught_up, timeout=300, details=pipeline.explain)


def _freshness_while_producing(pipeline: Pipeline, *, readings: int, timeout: float) -> list[tuple[int, Any]]:
    """Distinct (lagRecords, seconds) of `status.freshness`, read every 2 s while 20 records a second are
    produced without pause (so the driver is seldom caught up when it reports), until `readings` of them
    show records waiting (lag > 0)."""
    waiting: list[tuple[int, Any]] = []
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            pipeline.produce(5)
            time.sleep(0.25)

    producer = threading.Thread(target=keep_producing, name="producer")
    producer.start()
    try:
        deadline = time.monotonic() + timeout
        while len(waiting) < readings:
            assert time.monotonic() < deadline, f"status showed records waiting only {len(waiting)} times"
            time.sleep(2)
            fresh = (pipeline.st().get("status") or {}).get("freshness") or {}
            reading = (fresh.get("lagRecords", 0), fresh.get("seconds"))
            if reading[0] > 0 and reading not in waiting:  # a new refresh (every 10 s), records waiting
                waiting.append(reading)
    finally:
        stop.set()
        producer.join()
    pipeline.note(f"status.freshness while records arrive (lagRecords, seconds): {waiting}")
    return waiting


def test_deleted_driver_pod_is_recreated_and_the_table_equals_the_topic(
    pipeline: Pipeline, kubectl: Kubectl, tmp_path: Path
) -> None:
    old = wait_for("the driver pod running", pipeline.running_driver, timeout=180, details=pipeline.explain)
    created_before = _count(pipeline.events(STARTS))
    epoch_before = pipeline.lease()["spec"]["leaseTransitions"]
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            pipeline.produce(20)
            time.sleep(0.25)

    producer = threading.Thread(target=keep_producing, name="producer")
    producer.start()
    old_log = tmp_path / "old-driver.log"
    following = kubectl.following_logs(pipeline.namespace, DRIVER, old_log)
    try:
        # Mid-stream: the driver has committed records produced after the stream started.
        start = sum(watermarks(pipeline.kafka, TOPIC).values())
        wait_for(
            "a commit of the running stream",
            lambda: sum(pipeline.committed().values()) > start,
            timeout=240,
            details=pipeline.explain,
        )
        pipeline.note(f"stream committed past {start}; deleting the driver pod")
        kubectl("-n", pipeline.namespace, "delete", "pod", DRIVER, "--wait=false")  # the pod's grace period
        new = wait_for(
            "a new driver pod running",
            lambda: (p := pipeline.running_driver()) and p["metadata"]["uid"] != old["metadata"]["uid"] and p,
            timeout=240,
            details=pipeline.explain,
        )
        pipeline.note(f"new driver pod {new['metadata']['uid']} running")
        resumed_from = sum(pipeline.committed().values())
        wait_for(
            "the new driver to commit",
            lambda: sum(pipeline.committed().values()) > resumed_from,
            timeout=300,
            details=pipeline.explain,
        )
        pipeline.note("the new driver committed")
    finally:
        stop.set()
        producer.join(timeout=60)
        try:
            following.wait(timeout=120)  # it ends with the old driver's container
        finally:
            following.kill()
    high = wait_for("the table to catch up", pipeline.caught_up, timeout=300, details=pipeline.explain)
    pipeline.note(f"table caught up with {sum(high.values())} records")
    report = assert_exactly_once(
        pipeline.catalog, TABLE, high, pipeline.bad, bootstrap=pipeline.kafka.bootstrap
    )
    assert report is not None and report.ok

    text = old_log.read_text(errors="replace")
    assert "[run] stopped after" in text, f"the old driver did not stop cleanly:\n{text[-3000:]}"
    # The new driver writes under a newer epoch (the commit Lease changed hands), which fences the old one.
    assert pipeline.lease()["spec"]["leaseTransitions"] > epoch_before
    starts = pipeline.events(STARTS)
    assert _count(starts) > created_before, [(e["reason"], e["message"]) for e in starts]

    # The old pod is gone from the API (the kubelet finished its deletion); only the new one is left. The
    # table's other pods (compaction) do not count.
    def drivers() -> list[Obj]:
        return [p for p in pipeline.pods() if p["metadata"]["name"] == DRIVER]

    wait_for(
        "only the new driver pod left",
        lambda: [p["metadata"]["uid"] for p in drivers()] == [new["metadata"]["uid"]],
        timeout=90,
        details=lambda: str(
            [
                (p["metadata"]["name"], p["metadata"]["uid"], p.get("status", {}).get("phase"))
                for p in pipeline.pods()
            ]
        ),
    )


def test_deletion_policy_delete_purges_both_tables_with_the_drivers_credentials(pipeline: Pipeline) -> None:
    """(c) `deletionPolicy: Delete`: the operator (which holds none of the lake's credentials) runs the purge
    Job under the driver's pod template and the catalog Secret; the Job drops the table and its dead-letter
    table with their files (the uuids the driver reported checked first), then the StreamingTable goes."""
    catalog = pipeline.catalog.pyiceberg()
    tables = [catalog.load_table((TABLE_NAMESPACE, name)) for name in (TABLE, f"{TABLE}_dlq")]
    files = [t.metadata_location for t in tables] + [
        task.file.file_path for t in tables for task in t.scan().plan_files()
    ]
    assert all(tables[0].io.new_input(path).exists() for path in files)
    pipeline.rest.call(
        "PATCH", f"{pipeline.st_path}/{NAME}", {"spec": {"deletionPolicy": "Delete"}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    pipeline.rest.call("DELETE", f"{pipeline.st_path}/{NAME}")
    wait_for("the StreamingTable gone", lambda: not pipeline.st(), timeout=240, details=pipeline.explain)
    assert [e["reason"] for e in pipeline.events(frozenset({"TablePurgeStarted"}))] == ["TablePurgeStarted"]
    assert not any(catalog.table_exists((TABLE_NAMESPACE, t.name()[-1])) for t in tables)
    left = [path for path in files if tables[0].io.new_input(path).exists()]
    assert not left, f"files of the purged tables still in the store: {left}"
    pipeline.note(f"deletionPolicy Delete: the purge Job dropped both tables and deleted {len(files)} files")
