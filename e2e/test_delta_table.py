"""A Delta Lake table (`spec.table.format: delta`) run by the operator: the driver Pod, a container of the
image we ship, fills a Delta table on the object store (MinIO, `s3://`) with its own Delta log writer
(put-if-absent by `If-None-Match`), the commit Lease a Kubernetes Lease, Spark inside the pod (Delta's jars
from the image's own folder, `ICEFALL_DELTA_JARS`), the S3 credentials from a Secret by reference
(`spec.pods.driver.env[].valueFrom.secretKeyRef`, the Secret granted by its label and the operator's pod
policy, as an admin would).

Proves: records produced before and while the driver runs, with the driver Pod deleted once mid-stream
with a 1 s grace period (SIGTERM, then SIGKILL if the batch in flight is not done), become rows of the Delta
table exactly once, by content, read back with delta-rs (an independent reader); the Delta log's committed
offsets are the topic's ends; the operator created a new driver Pod, which took the commit Lease with a
newer epoch; the driver's report gives status its lag (0 once caught up), freshness, last commit (the Delta
version of the last batch) and the table's figures from the Delta log (records, files, the log's table id
as `tableUuid`), and Ready is True; a compaction pod (the same Secret in `spec.pods.compaction.env`),
started by the operator on the merges due that the driver reports, merges small files while the stream
runs (an OPTIMIZE commit of Icefall's in the log, put-if-absent beside the batches), and the rows stay
exactly once; `Compacting` follows the merges due (Compacting or NoCompactionNeeded); deleted with
`deletionPolicy: Delete`, the purge Job deletes the table's folder (its log id the reported one) and the
StreamingTable goes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from icefall.api import streaming_table_from_object
from icefall.commit.delta import DeltaLog
from icefall.commit.delta_storage import S3Settings
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.ingest.delta_meter import BATCH_OPERATIONS
from icefall.plan.grants import SECRET_GRANT_LABEL, SECRET_GRANT_VALUE
from icefall.plan.names import table_leases
from icefall.testing.delta import aws_env, plain
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import produce, watermarks

from .conftest import Kubectl, NodeView, Operator, pod_logs, wait_for

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
NAME = "e2e-delta"
DRIVER = f"{NAME}-ingest"
TOPIC = "e2e-delta"
SECRET = "delta-s3"
TARGET_SECONDS = 30
#: The cluster admin allows the S3 Secret in spec.pods (the chart's podPolicy.secrets).
OPERATOR_ENV = {"ICEFALL_POD_POLICY": json.dumps({"secrets": [SECRET]})}
Obj = dict[str, Any]


def manifest(namespace: str, bootstrap: str, location: str, store: ObjectStore) -> Obj:
    secret_env = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": name}}}
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    plain_env = [
        {"name": "AWS_REGION", "value": store.region},
        {"name": "AWS_ENDPOINT_URL", "value": store.endpoint},
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamingTable",
        # No spark-master annotation: a Delta table's driver runs Spark inside its pod by default (the Delta
        # writer stages a batch's files on the driver's disk), whatever the operator's spark.master.
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": TOPIC},
            "format": {
                "type": "json",
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "customer", "type": "string"},
                    {"name": "amount", "type": "decimal(10,2)"},
                    {"name": "ts", "type": "timestamptz", "required": True},
                ],
            },
            "table": {"format": "delta", "namespace": "it", "name": "e2e_delta", "location": location},
            "freshness": {"targetSeconds": TARGET_SECONDS},
            "batch": {"maxRecords": 200},
            "pods": {
                "driver": {"env": [*secret_env, *plain_env]},
                "compaction": {"env": [*secret_env, *plain_env]},  # the pods' merge and VACUUM
            },
        },
    }


class DeltaPipeline:
    def __init__(self, rest: JsonApi, namespace: str, kafka: KafkaBroker, node: NodeView, operator: Operator,
                 *, location: str, store: ObjectStore) -> None:  # fmt: skip
        self.rest, self.namespace, self.kafka, self.node = rest, namespace, kafka, node
        self.operator, self.location, self.store = operator, location, store
        self.produced = 0
        self.started = time.monotonic()

    def note(self, what: str) -> None:
        print(f"[e2e +{time.monotonic() - self.started:5.1f}s] {what}", flush=True)

    def produce(self, count: int) -> None:
        produce(self.kafka, TOPIC, self.produced, count)
        self.produced += count

    @property
    def st_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"

    def st(self) -> Obj:
        return self.rest.get(f"{self.st_path}/{NAME}") or {}

    def running_driver(self) -> Obj | None:
        pod = self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods/{DRIVER}")
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    def lease(self) -> Obj:
        name = table_leases(streaming_table_from_object(self.st())).commit
        return self.rest.get(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{name}") or {}

    def log(self) -> DeltaLog:
        return DeltaLog(self.location)  # S3 settings from the AWS_* environment (the `pipeline` fixture's)

    def committed(self) -> dict[int, int]:
        return dict(self.log().snapshot().committed.offsets)

    def caught_up(self) -> dict[int, int] | None:
        high = watermarks(self.kafka, TOPIC)
        return high if self.committed() == high and sum(high.values()) == self.produced else None

    def rows(self) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        options = S3Settings.from_env(aws_env(self.store)).delta_rs_options()
        found: list[dict[str, Any]] = (
            DeltaTable(self.location, storage_options=options).to_pyarrow_table().to_pylist()
        )
        return found

    def merges(self) -> list[int]:
        """The versions of the log that are a merge of the compaction pods (Icefall's OPTIMIZE)."""
        log = self.log()
        return [
            v for v in sorted(log.history().commit_file_ms)
            if any((a.get("commitInfo") or {}).get("operation") == "OPTIMIZE" for a in log.actions(v))
        ]  # fmt: skip

    def explain(self) -> str:
        status = json.dumps(self.st().get("status"), indent=1)
        pods = (self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods") or {}).get("items") or []
        compaction = [p for p in pods if p["metadata"]["name"].startswith(f"{NAME}-compact-")]
        deployment = self.rest.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{NAME}-compact")
        replicas = (deployment or {}).get("spec", {}).get("replicas")
        compaction_text = "\n".join(
            pod_logs(self.node, p["metadata"]["name"])
            + "\n"
            + json.dumps(p.get("status", {}).get("containerStatuses"))
            for p in compaction
        )
        return (
            f"--- status\n{status}\n{pod_logs(self.node, DRIVER)}\n--- compaction (replicas {replicas})\n"
            f"{compaction_text}\n--- operator\n{self.operator.tail()}"
        )


@pytest.fixture(scope="module")
def pipeline(  # noqa: PLR0917 (fixtures)
    rest: JsonApi, e2e_namespace: str, kafka: KafkaBroker, node: NodeView, operator: Operator,
    object_store: ObjectStore,
) -> Iterator[DeltaPipeline]:  # fmt: skip
    bucket = "delta-lake"  # the `lake` fixture's bucket is the namespace's: the Delta table has its own
    object_store.create_bucket(bucket)
    location = f"s3://{bucket}/{e2e_namespace}/e2e_delta"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "labels": {SECRET_GRANT_LABEL: SECRET_GRANT_VALUE}},
        "stringData": {k: v for k, v in aws_env(object_store).items() if k.endswith(("_ID", "_KEY"))},
    }
    rest.call("POST", f"/api/v1/namespaces/{e2e_namespace}/secrets", secret)
    kafka.create_topic(TOPIC, partitions=2)
    running = DeltaPipeline(rest, e2e_namespace, kafka, node, operator, location=location, store=object_store)
    saved = {k: os.environ.get(k) for k in aws_env(object_store)}
    os.environ.update(aws_env(object_store))  # the test's own reads of the Delta log
    running.produce(300)  # before the table exists: the driver starts with a backlog
    rest.call("POST", running.st_path, manifest(e2e_namespace, kafka.bootstrap, location, object_store))
    try:
        yield running
    finally:
        print(running.explain())  # shown when a test failed
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


@pytest.fixture(autouse=True)
def operator_log_is_clean(operator: Operator) -> Iterator[None]:
    """No handler of the operator crashed during the test (kopf logs the traceback and retries)."""
    yield
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def _expected(i: int) -> tuple[Any, ...]:
    """Event `i` as `icefall.testing.streams.produce` wrote it."""
    return (i, f"c{i % 7}", Decimal(str(round(i * 1.25, 2))).quantize(Decimal("0.01")), "2026-11-22T10:00:00")


def _content(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row as delta-rs reads it, its time as naive UTC (`plain`)."""
    row = plain(row)
    return (row["id"], row["customer"], row["amount"], row["ts"].strftime("%Y-%m-%dT%H:%M:%S"))


def test_a_delta_table_on_s3_through_a_deleted_driver_pod_is_exactly_once(
    pipeline: DeltaPipeline, kubectl: Kubectl, tmp_path: Path
) -> None:
    old = wait_for("the driver pod running", pipeline.running_driver, timeout=180, details=pipeline.explain)
    pipeline.note(f"driver pod {old['metadata']['uid']} running")
    wait_for(
        "a first commit to the Delta log", lambda: sum(pipeline.committed().values()) > 0, timeout=180,
        details=pipeline.explain,
    )  # fmt: skip
    epoch_before = pipeline.lease()["spec"]["leaseTransitions"]
    assert pipeline.lease()["spec"]["holderIdentity"] == DRIVER
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            pipeline.produce(20)
            time.sleep(0.25)

    producer = threading.Thread(target=keep_producing, name="producer")
    producer.start()
    try:
        start = sum(watermarks(pipeline.kafka, TOPIC).values())
        wait_for(
            "a commit of the running stream", lambda: sum(pipeline.committed().values()) > start, timeout=180,
            details=pipeline.explain,
        )  # fmt: skip
        pipeline.note(f"stream committed past {start}; deleting the driver pod (1 s grace)")
        kubectl("-n", pipeline.namespace, "delete", "pod", DRIVER, "--grace-period=1", "--wait=false")
        new = wait_for(
            "a new driver pod running",
            lambda: (p := pipeline.running_driver()) and p["metadata"]["uid"] != old["metadata"]["uid"] and p,
            timeout=180,
            details=pipeline.explain,
        )
        pipeline.note(f"new driver pod {new['metadata']['uid']} running")
        resumed_from = sum(pipeline.committed().values())
        wait_for(
            "the new driver to commit",
            lambda: sum(pipeline.committed().values()) > resumed_from,
            timeout=180,
            details=pipeline.explain,
        )
        merged = wait_for(
            "a compaction pod to merge small files while the stream runs", pipeline.merges, timeout=240,
            details=pipeline.explain,
        )  # fmt: skip
        pipeline.note(f"compaction pod merged small files in version(s) {merged}")
    finally:
        stop.set()
        producer.join(timeout=60)
    high = wait_for("the table to catch up", pipeline.caught_up, timeout=180, details=pipeline.explain)
    pipeline.note(f"table caught up with {sum(high.values())} records ({pipeline.produced} produced)")

    # Every record exactly once, by content, as delta-rs reads the table.
    rows = pipeline.rows()
    ids = Counter(row["id"] for row in rows)
    assert ids == Counter(range(pipeline.produced)), (
        f"duplicates {sorted(i for i, n in ids.items() if n > 1)[:20]}, "
        f"missing {sorted(set(range(pipeline.produced)) - set(ids))[:20]}"
    )
    assert sorted(_content(row) for row in rows) == [_expected(i) for i in range(pipeline.produced)]
    # The new driver took the Lease over with a newer epoch (which fences the old one's late commits).
    assert pipeline.lease()["spec"]["leaseTransitions"] > epoch_before
    assert pipeline.lease()["spec"]["holderIdentity"] == DRIVER

    # Status from the Delta log, as the new driver reports it.
    log = pipeline.log()
    history = log.history()
    last_batch = max(
        v for v in history.commit_file_ms
        if any((a.get("commitInfo") or {}).get("operation") in BATCH_OPERATIONS for a in log.actions(v))
    )  # fmt: skip

    def settled() -> Obj | None:
        status = pipeline.st().get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        writer, table = status.get("writer") or {}, status.get("table") or {}
        done = (
            conditions.get("Ready", {}).get("status") == "True"
            and (status.get("freshness") or {}).get("lagRecords") == 0
            and writer.get("snapshotId") == last_batch
            and table.get("records") == pipeline.produced
        )
        return status if done else None

    status = wait_for(
        "status to show the caught-up Delta table", settled, timeout=120, details=pipeline.explain
    )
    pipeline.note(f"status: freshness {status['freshness']}, table {status['table']}")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["FreshnessMet"]["status"] == "True", conditions
    assert conditions["Degraded"]["status"] == "False", conditions
    assert float(status["freshness"]["seconds"]) <= TARGET_SECONDS
    assert status["freshness"]["snapshotId"] == last_batch
    assert status["table"]["files"] >= 1
    writer = status["writer"]
    assert writer["tableUuid"] == log.snapshot().metadata["id"], writer  # what a purge checks
    assert [t["table"] for t in writer.get("tables") or []] == ["it.e2e_delta"], writer
    # Compaction pods tidy a Delta table on S3; Compacting follows the merges due.
    compacting = conditions["Compacting"]
    assert compacting["reason"] in ("Compacting", "NoCompactionNeeded"), compacting
    assert len(log.history().commit_file_ms) > 0 and pipeline.merges()

    # deletionPolicy Delete: the purge Job (the driver's pod template, its S3 Secret) deletes the folder
    # whose log id the driver reported, then the StreamingTable goes.
    pipeline.rest.call(
        "PATCH", f"{pipeline.st_path}/{NAME}", {"spec": {"deletionPolicy": "Delete"}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    pipeline.rest.call("DELETE", f"{pipeline.st_path}/{NAME}")
    wait_for("the StreamingTable gone", lambda: not pipeline.st(), timeout=240, details=pipeline.explain)
    assert not pipeline.log().snapshot().exists, "the Delta table's log is still there"
    pipeline.note("deletionPolicy Delete: the purge Job deleted the Delta table's folder")
