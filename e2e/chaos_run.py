"""`make chaos`: hundreds of random kills of Icefall's processes and of the services around it, then an audit.

A benchmark-style run, not a test of the suite: the file name does not match `test_*.py`, so `make test`
never collects it; `make chaos` passes it to pytest explicitly (it then gets the e2e fixtures). Knobs, from
the environment: `ICEFALL_CHAOS_KILLS` (default 200), `ICEFALL_CHAOS_SEED` (default 1),
`ICEFALL_CHAOS_REPORT` (default bench/results/chaos.md), `ICEFALL_CHAOS_MEASURED_FAULTS` (how many of the four
measured faults below, default all: a short run of given infrastructure kinds may ask for none).

The system, as in a cluster: the e2e's one-node cluster (`cluster`: API server, controller-manager,
scheduler, and a node of containerd + runc + the real kubelet) runs the driver Pod and the compaction
Deployment's Pod as containers of the image we ship, on the host network (each its own Spark, `local[1]`
and `local[*]`); the operator runs as a process; Kafka; Iceberg's REST catalog server on PostgreSQL with
the table files in an object store (MinIO), both of this run's own so they can be stopped and started on
the same port. One StreamingTable with a dead-letter table and topic, small batches, a compaction pod
always running (`minReplicas: 1`) and snapshot expiry after a minute, so compaction and expiry really run
meanwhile; and a keyed one (e2e/chaos_keyed.py: `mode: upsert` by `id`, its own topic and producer of
updates and tombstones to a bounded set of keys, the same batches and compaction), whose driver and
compaction pods are killed from the same loops and count against the same quotas; its audit: exactly the
last change per key of its topic (read_committed) as rows, by content; and a Delta table (e2e/chaos_delta.py:
the append table's topic into an append-mode Delta table on the same object store, its own dead-letter
table, merges Z-ordered by a sort order), killed from the same loops too, audited like the append table
with delta-rs as its reader. A fault converges, below, once all three tables committed every record of
their topics (`high`: the keyed topic's partition p as `KEYED_PARTITIONS_FROM + p`); the faults that need
a running driver wait for the append table's.

Chaos, while a producer keeps writing edge-case records (`chaos_data`: unicode, extreme numbers and
timestamps, large values, every malformed kind):
- kills, until as many were observed as asked (split driver 40 % / compaction 35 % / operator 25 %):
  each start of a driver or compaction container arms itself, with a chance, to exit at a random
  failpoint (`ICEFALL_FAILPOINTS_CHAOS` in the StreamingTable's `spec.pods.driver.env` and
  `spec.pods.compaction.env`: see icefall.runtime.failpoints; status 137 like SIGKILL), and says what it drew
  in its log; the others get SIGKILL at a random moment (an armed one that has not reached its point after
  `ARMED_GRACE` too): the SIGKILL goes to the container's PID 1 (tini, its host pid from containerd), so
  the kernel kills every process of the container, as a node-level kill does. The operator gets SIGKILL
  at random moments and is started again. A kill is counted only when its exit was seen in the Pod's
  status (a watch on the namespace's Pods): status 137 with the termination message `failpoint <name>
  triggered` (icefall.runtime.failpoints writes it), or 137 of a container this run SIGKILLed;
- faults, one at a time while random kills pause, spread over the run: the Kafka broker stopped and
  started mid-batch (same ports, same data); the REST catalog down 30 s; the object store down 30 s; the
  driver paused (SIGSTOP to every process of its container) past its commit Lease while a second writer
  (a Pod with the driver Pod's spec under another name, as if rescheduled during a partition) takes the
  Lease and commits, then resumed (SIGCONT): it must be fenced (its log says so). The paused driver is
  one that drew no failpoint (an armed one could exit at its point before its commit is refused): an
  armed driver is SIGKILLed first, a kill like any other. Each fault's time to converge: from its end
  until both tables committed every record that was in their topics at that moment.

Then, with the producer stopped, the arming removed and the table caught up, the audit, which uses none
of the ingestion code: every record of the topic read with confluent-kafka (read_committed), decoded by
`chaos_data`'s reference decoder, compared with the table's rows (pyiceberg, from the object store) by
`_kafka` (partition, offset) and by every value, and with the dead-letter table's rows (by offset and
value bytes): duplicates, missing and wrong values must all be 0. `icefall verify` runs as well. The
report goes to `bench/results/chaos.md`, written even when the run fails.

What changed with the move from the local kubelet (pods as host processes) to the real node: arming is
the containers' own draw from the pod template, not a kubelet hook at each start, so it is switched on
once the pipeline is up and off once the kills are done (a spec roll each: setup and the final audit run
unarmed), and a container that starts during a fault may be armed too (the hook never armed those); the
kubelet restarts a killed compaction container in place under its CrashLoopBackOff (10 s, doubling to
5 min, reset after 10 min of running), so a compaction Pod that waits in it is deleted and its Deployment
replaces it at once (repeated kills in place would wait 5 min each; the operator restarts the driver as
a new Pod, with its own short backoff); kills are read from Pod statuses, not from the
kubelet's records; the second writer is a Pod, not a host process.

Infrastructure faults (e2e/chaos_infra.py), at least a third of all faults (`ICEFALL_CHAOS_INFRA_FAULTS`,
default half the kills): a broker of the three-node Kafka cluster (`kafka_cluster`: a partition leader's
or the KRaft controller's SIGKILL, an unclean restart, a rolling restart), PostgreSQL, the
object store, the REST catalog server, and the cluster's kube-apiserver or etcd SIGKILLed at random moments
and started again, one at a time, while the kills go on; drawn with them, resource faults
(e2e/chaos_resources.py): a service's port partitioned (packets dropped), a driver or compaction container
OOM-killed by the kernel (counted as a kill of its component), a commit from a clock minutes ahead, the
driver paused with a staged batch while orphan removal runs past its safety window, and the keyed driver's
spill disk full (a small tmpfs filled to ENOSPC). The report lists every fault by kind with its recovery.

Where things are: e2e/chaos_pods.py (the Pod watch, the kill tally, signals to containers),
e2e/chaos_faults.py (the measured faults), e2e/chaos_audit.py (the append table's audit), e2e/chaos_keyed.py
(the keyed table), e2e/chaos_delta.py (the Delta table), e2e/chaos_infra.py, e2e/chaos_resources.py and
e2e/chaos_spill.py (the infrastructure and resource faults), e2e/chaos_report.py (the report).

Not covered: kills of the kubelet and containerd; a disk-backed emptyDir past its `sizeLimit` (a kubelet
eviction, not ENOSPC; the spill disk fault is a small tmpfs); the operator has no failpoints (its kills
are all at random moments); orphan removal by the compaction pods (its safety window is at least an hour:
the orphan race runs it from the run, clock ahead) and so `main.before-orphan-delete`; the dead-letter topic
is checked by nobody here (it is at-least-once by design). A container whose whole life fell in a gap of
the Pod watch (the API server expired it: "watch gaps" in the report) is not seen.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from icefall.api import load_manifest
from icefall.api.pod_policy import DEFAULT_RESERVED_ENV
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.delta_storage import S3Settings
from icefall.controller.leader import EXIT_LEADERSHIP_LOST
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka_cluster import KafkaCluster
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.ingest.delta_dead_letters import dead_letter_location
from icefall.plan.env import secret_env_vars
from icefall.plan.grants import SECRET_GRANT_LABEL, SECRET_GRANT_VALUE
from icefall.runtime.failpoints import CHAOS_ENV_VAR
from icefall.testing.delta import aws_env
from icefall.testing.kubeapi import JsonApi

from . import chaos_data as data
from . import chaos_delta as delta
from . import chaos_faults as measured
from . import chaos_keyed as keyed
from .chaos_audit import Audit, audit, watermarks
from .chaos_faults import Fault
from .chaos_infra import InfraFaults, Services, infra_count
from .chaos_pods import (
    COMPACT_PREFIX,
    DRAW_UNKNOWN_AFTER,
    DRIVER,
    NAME,
    RANDOM,
    Container,
    PodWatch,
    Tally,
    count_exits,
    sigkill,
    table_of,
)
from .chaos_report import run_verify, write_report
from .chaos_resources import Cluster, ResourceFaults
from .conftest import REPO, Kubectl, NodeView, Operator, pod_logs, wait_for

pytestmark = pytest.mark.e2e

KILLS = int(os.environ.get("ICEFALL_CHAOS_KILLS", "200"))
#: Infrastructure faults (e2e/chaos_infra.py): by default enough for a third of all faults.
INFRA_FAULTS = int(os.environ.get("ICEFALL_CHAOS_INFRA_FAULTS", str(infra_count(KILLS))))
MEASURED_FAULTS = int(os.environ.get("ICEFALL_CHAOS_MEASURED_FAULTS", str(len(measured.FAULTS))))
ICEFALL = "ICEFALL_*"  # reserved for spec.pods by default; the run's failpoint variable is one
SEED = int(os.environ.get("ICEFALL_CHAOS_SEED", "1"))
REPORT = Path(os.environ.get("ICEFALL_CHAOS_REPORT", str(REPO / "bench" / "results" / "chaos.md")))
TOPIC, DLQ_TOPIC = "chaos", "chaos-dlq"
TABLE_NAMESPACE, TABLE = "chaos", "events"
BUCKET = "chaos"  # the object store's: the Iceberg warehouse and the Delta table
PARTITIONS = 3
SHARES = {"driver": 0.40, "compaction": 0.35, "operator": 0.25}
#: Failpoints a driver passes on a table with traffic and malformed records (see
#: tests/integration/test_failpoint_kills.py); the `AT_START` ones are passed once per process.
DRIVER_POINTS = (
    "main.after-prepare", "main.after-stage", "main.before-commit", "main.after-commit",
    "dlq.after-prepare", "dlq.after-stage", "dlq.before-commit", "dlq.after-commit",
    "dlq-topic.mid-produce", "dlq-topic.after-produce", "main.before-sweep", "dlq.before-sweep",
    "lease.renew",
)  # fmt: skip
AT_START = {"main.before-sweep", "dlq.before-sweep"}
COMPACTION_POINTS = ("main.mid-rewrite", "main.before-expire")
ARM_CHANCE = 0.7  # of a container start arming a failpoint; the others die at a random moment
#: `ICEFALL_FAILPOINTS_CHAOS` per pod role: a driver exits on hit 1 to 3 of its point (1 for a point passed
#: once per process), a compaction pod on hit 1.
ARMING = {
    "driver": f"{SEED}:{ARM_CHANCE}:" + ",".join(p if p in AT_START else f"{p}@3" for p in DRIVER_POINTS),
    "compaction": f"{SEED}:{ARM_CHANCE}:" + ",".join(COMPACTION_POINTS),
}
#: The keyed table's (e2e/chaos_keyed.py): it gets no malformed record, so no `dlq.*` point.
KEYED_ARMING = {
    **ARMING,
    "driver": f"{SEED}:{ARM_CHANCE}:"
    + ",".join(p if p in AT_START else f"{p}@3" for p in keyed.KEYED_DRIVER_POINTS),
}
DELTA_ARMING = delta.arming(SEED, ARM_CHANCE)
TABLES = ("append", "keyed", "delta")
KEYED_PARTITIONS_FROM = 1000  # the keyed topic's partitions in `Chaos.high` and `caught_up_with`
#: Seconds after a container (or the operator) started before its SIGKILL: short enough that many kills fit
#: in an hour on 2 cores (a Spark start is most of a cycle), long enough to land mid-batch as well.
RANDOM_KILL_AFTER = (2.0, 45.0)
ARMED_GRACE = 150.0  # an armed container gets this long to reach its failpoint before a SIGKILL
#: The producer's pace: ~3 records/s, well under what a driver ingests between kills on a loaded 2-core
#: machine (~10/s), so each fault's convergence measures recovery rather than a growing backlog.
PRODUCE_RECORDS, PRODUCE_EVERY_SECONDS = 10, 3.0
#: ... and it waits while the table is this many records behind (a loaded machine ingests slower).
MAX_BACKLOG = 1000
CONVERGE_TIMEOUT = 900.0
Obj = dict[str, Any]


# --- the stack: this run's own object store and REST catalog (so they can go down) -------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    running = ObjectStore(tmp_path_factory.mktemp("chaos-store")).start()
    running.create_bucket(BUCKET)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def rest_catalog(
    store: ObjectStore, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RESTCatalogServer]:
    server = RESTCatalogServer.on_postgres(
        tmp_path_factory.mktemp("chaos-rest"),
        postgres,
        "chaos",
        warehouse="s3://chaos/warehouse",
        store=store,
    ).start()
    yield server
    server.stop()


def streaming_table(kafka: KafkaCluster, catalog: RESTCatalogServer, store: ObjectStore) -> Obj:
    s3 = store.properties()
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": NAME},
        "spec": {
            "source": {"bootstrapServers": kafka.bootstrap, "topic": TOPIC},
            "format": {"type": "json", "schema": data.SCHEMA},
            "table": {
                "namespace": TABLE_NAMESPACE,
                "name": TABLE,
                "partitioning": [{"field": "ts", "transform": "day"}],
                "catalog": {
                    "name": "lake",
                    "type": "rest",
                    "uri": catalog.uri,
                    "warehouse": "s3://chaos/warehouse",
                    "properties": {
                        "s3.endpoint": s3["s3.endpoint"],
                        "s3.region": s3["s3.region"],
                        "s3.path-style-access": "true",
                    },
                    "secretProperties": {
                        "s3.access-key-id": {"secretKeyRef": {"name": "lake", "key": "access-key-id"}},
                        "s3.secret-access-key": {
                            "secretKeyRef": {"name": "lake", "key": "secret-access-key"}
                        },
                    },
                },
            },
            "deadLetter": {"topic": DLQ_TOPIC, "maxRecordBytes": data.MAX_RECORD_BYTES},
            "batch": {"maxRecords": 400, "minIntervalSeconds": 1},
            "freshness": {"targetSeconds": 5},
            "compaction": {"minReplicas": 1, "maxReplicas": 1, "maxSnapshotAgeSeconds": 60},
        },
    }


def arming_patch(on: bool, arming: dict[str, str] = ARMING, base: list[Obj] | None = None) -> Obj:
    """A merge patch of a StreamingTable that arms (or disarms) every new driver and compaction container.
    Each is a spec change: the operator rolls the driver and the compaction pods. `base`: the pods' own
    env, kept (a merge patch replaces the whole list)."""
    kept = list(base or [])
    env = {
        role: [*kept, {"name": CHAOS_ENV_VAR, "value": spec}] if on else (kept or None)
        for role, spec in arming.items()
    }
    return {"spec": {"pods": {role: {"env": value} for role, value in env.items()}}}


class Chaos:
    """The run: the system's handles, the producer, the kill loops, the faults, progress and the tally."""

    def __init__(
        self,
        *,
        kafka: KafkaCluster,
        store: ObjectStore,
        catalog_server: RESTCatalogServer,
        catalog: CatalogConfig,
        cluster: LocalCluster,
        pods: PodWatch,
        kubectl: Kubectl,
        operator: Operator,
        rest: JsonApi,
        namespace: str,
        workdir: Path,
        delta_env: list[Obj] | None = None,
    ) -> None:
        self.kafka, self.store, self.catalog_server, self.catalog = kafka, store, catalog_server, catalog
        self.cluster, self.pods, self.kubectl = cluster, pods, kubectl
        self.operator, self.rest, self.namespace, self.workdir = operator, rest, namespace, workdir
        self.node = pods.node
        self.topics = (TOPIC, DLQ_TOPIC, keyed.KEYED_TOPIC)
        self.rng = random.Random(SEED)
        self.quota = {name: max(1, round(KILLS * share)) for name, share in SHARES.items()}
        self.quota["operator"] = max(1, KILLS - self.quota["driver"] - self.quota["compaction"])
        self.tally = Tally()
        self.faults: list[Fault] = []
        self.fault_lock = threading.Lock()  # a measured fault and an infrastructure fault never overlap
        self.operator_lock = threading.Lock()  # its killer and its reviver
        self.operator_exits = 0  # exits on its own: leadership lost in an API server outage (restarted)
        self.infra: InfraFaults | None = None
        self.calm = threading.Event()  # set: no SIGKILL (a fault is being measured)
        self.done = threading.Event()
        self.errors: list[str] = []
        self.kinds: Counter[str] = Counter()
        self.produced = 0
        self.started = time.monotonic()
        self._producing = threading.Event()
        self.keyed = keyed.KeyedProducer(
            kafka.bootstrap, SEED, self._producing, self.keyed_committed, self.errors,
            count=PRODUCE_RECORDS, every=PRODUCE_EVERY_SECONDS, max_backlog=MAX_BACKLOG,
        )  # fmt: skip
        self.keyed_audit: keyed.KeyedAudit | None = None
        self.keyed_verify = "not run"
        self.delta_env = list(delta_env or [])  # the Delta table's pods' S3 variables
        self.delta_offsets = delta.DeltaOffsets(delta.location(BUCKET))
        self.delta_audit: Audit | None = None
        self.delta_verify = "not run"

    # --- progress and failure details ---

    def note(self, what: str) -> None:
        print(f"[chaos +{time.monotonic() - self.started:7.1f}s] {what}", flush=True)

    def progress(self) -> str:
        with self.tally.lock:
            kills = dict(self.tally.by_component)
        converged = sum(f.converged_after is not None for f in self.faults)
        return (
            f"kills {sum(kills.values())}/{KILLS} {kills}, produced {self.produced}, "
            f"committed {sum(self.committed().values())}, faults converged {converged}; keyed: produced "
            f"{self.keyed.produced}, committed {sum(self.keyed_committed().values())}; delta: committed "
            f"{sum(self.delta_offsets.committed().values())}"
        )

    def progress_loop(self) -> None:
        """A progress line every 30 s, faults included (the main thread blocks in them)."""
        while not self.done.wait(30):
            fault = next((f.name for f in reversed(self.faults) if not f.converged_after), None)
            self.note(self.progress() + (f"; in fault: {fault}" if fault else ""))

    def explain(self) -> str:
        status = yaml.safe_dump((self.st() or {}).get("status"))
        compact = {c.pod for c in self.pods.running("compaction")}
        more = "\n".join(pod_logs(self.node, name) for name in sorted(compact))
        driver = pod_logs(self.node, DRIVER)
        delta_driver = pod_logs(self.node, delta.DELTA_DRIVER)[-4000:]
        return (
            f"--- status\n{status}{driver}\n{more}\n--- Delta driver\n{delta_driver}\n"
            f"--- operator\n{self.operator.tail()}"
        )

    def st_path(self, name: str = NAME) -> str:
        return f"/apis/icefall.dev/v1alpha1/namespaces/{self.namespace}/streamingtables/{name}"

    def st(self) -> Obj | None:
        return self.rest.get(self.st_path())

    def arm(self, on: bool) -> None:
        """Arm (or disarm) every driver and compaction container started from now on; wait for the roll."""
        tables = ((NAME, ARMING, None), (keyed.KEYED_NAME, KEYED_ARMING, None),
                  (delta.DELTA_NAME, DELTA_ARMING, self.delta_env))  # fmt: skip
        for name, arming, base in tables:
            self.rest.call("PATCH", self.st_path(name), arming_patch(on, arming, base),
                           content_type="application/merge-patch+json")  # fmt: skip
        self.note(f"failpoint arming {'on' if on else 'off'}: the tables' driver and compaction pods roll")

        def rolled() -> bool:
            """Each component of each table runs, and only from Pods whose spec says what was asked."""
            now = self.pods.running()
            return all(
                any(c.component == k and table_of(c.pod) == t for c in now)
                and all(c.spec_armed == on for c in now if c.component == k)
                for k in ARMING
                for t in TABLES
            )

        wait_for(f"the pods to roll with arming {'on' if on else 'off'}", rolled, timeout=600, every=1,
                 details=self.explain)  # fmt: skip

    # --- the table and the topic ---

    def committed(self) -> dict[int, int]:
        """The table's committed offsets; {} while the catalog or store cannot be read."""
        try:
            catalog = self.catalog.pyiceberg()
            if not catalog.table_exists((TABLE_NAMESPACE, TABLE)):
                return {}
            return dict(read_committed(catalog.load_table((TABLE_NAMESPACE, TABLE))).offsets)
        except Exception:  # an outage of the catalog or the store: not known now
            return {}

    def high(self) -> dict[int, int]:
        """Both topics' high watermarks: the keyed topic's partition p as `KEYED_PARTITIONS_FROM + p`."""
        keyed_high = keyed.watermarks(self.kafka.bootstrap, PARTITIONS)
        appended = watermarks(self.kafka, TOPIC, PARTITIONS)
        return appended | {KEYED_PARTITIONS_FROM + p: o for p, o in keyed_high.items()}

    def keyed_committed(self) -> dict[int, int]:
        """The keyed table's committed offsets; {} while the catalog or store cannot be read."""
        try:
            catalog = self.catalog.pyiceberg()
            identifier = (TABLE_NAMESPACE, keyed.KEYED_TABLE)
            if not catalog.table_exists(identifier):
                return {}
            return dict(read_committed(catalog.load_table(identifier)).offsets)
        except Exception:  # an outage of the catalog or the store: not known now
            return {}

    def caught_up_with(self, high: dict[int, int]) -> bool:
        """Every table committed the offsets `high` (as `high()` gives them; the Delta table reads the append
        table's topic)."""
        committed, keyed_committed = self.committed(), self.keyed_committed()
        both = committed | {KEYED_PARTITIONS_FROM + p: o for p, o in keyed_committed.items()}
        if not (committed and keyed_committed and all(both.get(p, 0) >= o for p, o in high.items())):
            return False
        delta_committed = self.delta_offsets.committed()
        return bool(delta_committed) and all(
            delta_committed.get(p, 0) >= o for p, o in high.items() if p < KEYED_PARTITIONS_FROM
        )

    def converge(self, fault: Fault) -> None:
        """Wait until both tables have every record that was in their topics when `fault` ended; record how
        long."""
        high = self.high()
        wait_for(
            f"the tables to converge after {fault.name} (offsets {high})",
            lambda: self.caught_up_with(high),
            timeout=CONVERGE_TIMEOUT,
            every=2,
            details=self.explain,
        )
        fault.converged_after = time.monotonic() - fault.ended
        self.note(f"{fault.name}: converged {fault.converged_after:.0f} s after it ended")

    # --- the producer ---

    def produce_loop(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.kafka.bootstrap, "enable.idempotence": True,
                             "message.max.bytes": 1_000_000, "linger.ms": 20})  # fmt: skip
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        try:
            while self._producing.is_set():
                committed = self.committed()
                if committed and self.produced - sum(committed.values()) > MAX_BACKLOG:
                    time.sleep(PRODUCE_EVERY_SECONDS)
                    continue
                batch = list(data.records(self.rng, self.produced, PRODUCE_RECORDS))
                for record in batch:
                    producer.produce(TOPIC, key=record.key, value=record.value, on_delivery=delivered)
                    self.kinds[record.kind] += 1
                    producer.poll(0)
                self.produced += len(batch)
                if failures:
                    self.errors.append(f"producer: {failures[:3]}")
                    return
                time.sleep(PRODUCE_EVERY_SECONDS)
        finally:
            left = producer.flush(600)
            if left:
                self.errors.append(f"producer: {left} records never delivered")

    # --- kills ---

    def count_exits(self) -> None:
        count_exits(self.pods, self.tally)

    def sigkill(self, container: Container) -> None:
        sigkill(self.cluster, self.tally, container)

    def pod_killer(self, component: str) -> None:
        """SIGKILL the component's running container at a random moment, until its quota was observed."""
        rng = random.Random(f"{SEED}-{component}")
        deadline: dict[str, float] = {}
        while not self.done.is_set() and self.tally.of(component) < self.quota[component]:
            time.sleep(0.5)
            if self.calm.is_set():
                deadline.clear()  # a container that lived through a fault gets a new moment afterwards
                continue
            for container in self.pods.running(component):
                if container.cid in self.tally.killed:
                    continue
                if container.cid not in deadline:
                    drew = self.pods.read_draw(container)
                    waited = time.monotonic() - container.seen
                    if drew is None and waited < DRAW_UNKNOWN_AFTER:
                        continue  # not said yet: it decides how long this one may live
                    after = ARMED_GRACE if container.armed else rng.uniform(*RANDOM_KILL_AFTER)
                    deadline[container.cid] = max(container.seen + after, time.monotonic())
                if time.monotonic() >= deadline[container.cid]:
                    self.sigkill(container)
            if component == "compaction":
                self.replace_backing_off(component)

    def replace_backing_off(self, component: str) -> None:
        """Delete a Pod that waits out CrashLoopBackOff: its Deployment replaces it at once. After a few
        kills in place the kubelet waits 5 min before each restart, which would stretch the run by hours
        and test the kubelet, not Icefall (its exit was already seen in the Pod's status)."""
        for name in self.pods.backing_off(component):
            with contextlib.suppress(ApiException):
                self.pods.core.delete_namespaced_pod(name, self.namespace)
                self.note(f"{name}: in CrashLoopBackOff; deleted, its Deployment replaces it")

    def operator_killer(self) -> None:
        rng = random.Random(f"{SEED}-operator")
        while not self.done.is_set() and self.tally.of("operator") < self.quota["operator"]:
            if self.done.wait(rng.uniform(*RANDOM_KILL_AFTER) / 3) or self.calm.is_set():
                continue
            with self.operator_lock:
                process = self.operator.process
                assert process is not None
                if process.poll() is not None:
                    self._revived(process.returncode)
                    continue
                process.send_signal(signal.SIGKILL)
                code = process.wait(30)
                if code == -signal.SIGKILL:
                    self.tally.kill("operator", RANDOM)
                else:
                    self.errors.append(f"the operator exited {code} before its SIGKILL")
                self.operator.start()

    def revive_operator(self) -> None:
        """Start the operator again if it exited on its own (what its Deployment does)."""
        with self.operator_lock:
            process = self.operator.process
            if process is not None and process.poll() is not None:
                self._revived(process.returncode)

    def _revived(self, code: int) -> None:
        if code == EXIT_LEADERSHIP_LOST:  # by design after an API server outage longer than its Lease
            self.operator_exits += 1
            self.note("the operator lost its leader Lease in an outage and exited; starting it again")
        else:
            self.errors.append(f"the operator exited {code} on its own")
        self.operator.start()

    # --- faults ---

    def fault(self, name: str, act: Callable[[Fault], None]) -> None:
        self.calm.set()
        try:
            with self.fault_lock:
                self._fault(name, act)
        finally:
            self.calm.clear()

    def _fault(self, name: str, act: Callable[[Fault], None]) -> None:
        self.note(f"fault {name}: waiting for a running driver")
        self.wait_driver_committing()
        fault = Fault(name, time.monotonic())
        self.faults.append(fault)
        act(fault)
        fault.ended = fault.ended or time.monotonic()
        self.converge(fault)

    def is_running(self, container: Container) -> bool:
        return any(c.cid == container.cid for c in self.pods.running())

    def running_driver(self) -> Container | None:
        """The append table's driver (the faults are measured on it)."""
        return next((c for c in self.pods.running("driver") if c.pod == DRIVER), None)

    def wait_driver_committing(self) -> Container:
        """A driver runs and commits (after any kill in flight): the fault then hits a working pipeline."""
        driver = wait_for("a running driver", self.running_driver, timeout=600, every=1, details=self.explain)
        before = sum(self.committed().values())
        wait_for("a commit by the running driver", lambda: sum(self.committed().values()) > before,
                 timeout=600, every=1, details=self.explain)  # fmt: skip
        return driver


# --- the run --------------------------------------------------------------------------------------------


KEYED_EXTRA_SECONDS = 1800  # the keyed table's first commit and its `icefall verify`
DELTA_EXTRA_SECONDS = 1800  # the Delta table's, the same


@pytest.mark.timeout(3600 + KEYED_EXTRA_SECONDS + DELTA_EXTRA_SECONDS + KILLS * 150 + INFRA_FAULTS * 120)
def test_chaos(  # noqa: PLR0917 (fixtures; the run reads top to bottom)
    kafka_cluster: KafkaCluster,
    postgres: PostgresServer,
    cluster: LocalCluster,
    node: NodeView,
    store: ObjectStore,
    rest_catalog: RESTCatalogServer,
    rest: JsonApi,
    api: client.ApiClient,
    kubectl: Kubectl,
    e2e_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    workdir = tmp_path_factory.mktemp("chaos")
    kafka = kafka_cluster  # three nodes: a broker's SIGKILL is a fault the cluster survives
    kafka.create_topic(TOPIC, partitions=PARTITIONS)
    kafka.create_topic(DLQ_TOPIC, partitions=1)
    kafka.create_topic(keyed.KEYED_TOPIC, partitions=PARTITIONS)
    s3 = store.properties()
    secret = {"access-key-id": s3["s3.access-key-id"], "secret-access-key": s3["s3.secret-access-key"]}
    rest.call("POST", f"/api/v1/namespaces/{e2e_namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "lake", "namespace": e2e_namespace, "labels": {SECRET_GRANT_LABEL: SECRET_GRANT_VALUE},
        },
        "stringData": secret,
    })  # fmt: skip
    st_object = streaming_table(kafka, rest_catalog, store)
    manifest = workdir / "chaos.yaml"
    manifest.write_text(yaml.safe_dump(st_object, allow_unicode=True))
    st = load_manifest(manifest)
    keyed_object = keyed.keyed_streaming_table(st_object)
    keyed_manifest = workdir / "chaos-keyed.yaml"
    keyed_manifest.write_text(yaml.safe_dump(keyed_object, allow_unicode=True))
    delta_env = delta.pod_env("lake", store)
    delta_object = delta.delta_streaming_table(st_object, bucket=BUCKET, env=delta_env)
    delta_manifest = workdir / "chaos-delta.yaml"
    delta_manifest.write_text(yaml.safe_dump(delta_object, allow_unicode=True))
    delta_location = delta_object["spec"]["table"]["location"]
    delta_dead = dead_letter_location(load_manifest(delta_manifest), delta_location)
    assert delta_dead is not None
    s3_env = aws_env(store)  # what the Delta pods get; the run's own reads of the Delta tables use it too
    saved_env = {k: os.environ.get(k) for k in s3_env}
    os.environ.update(s3_env)
    _, catalog_env, problems = secret_env_vars(st.spec)
    assert problems == []
    variables = {ref.name: secret[ref.key] for ref in catalog_env}
    catalog = CatalogConfig.for_table(st.spec, environ=variables)
    # As the `operator` fixture runs it (pods from the image, on this cluster's host network; no table
    # credential), plus short driver backoff and status refresh.
    operator = Operator(cluster.api, e2e_namespace, workdir / "operator.log", env={
        "ICEFALL_IMAGE": cluster.images.icefall,
        "ICEFALL_POD_TEMPLATE": json.dumps({"common": cluster.pod_template()}),
        # The run arms failpoints through spec.pods (`arming_patch`): its pod policy lets a table set them;
        # the Delta table's pods take the S3 keys from the Secret `lake` (as an admin allows it).
        "ICEFALL_POD_POLICY": json.dumps({"reservedEnv": [p for p in DEFAULT_RESERVED_ENV if p != ICEFALL],
                                          "secrets": ["lake"]}),
        "ICEFALL_DRIVER_MAX_BACKOFF_SECONDS": "2", "ICEFALL_STATUS_REFRESH_SECONDS": "2",
    })  # fmt: skip
    pods = PodWatch(api, node).start()
    chaos = Chaos(
        kafka=kafka, store=store, catalog_server=rest_catalog, catalog=catalog, cluster=cluster, pods=pods,
        kubectl=kubectl, operator=operator, rest=rest, namespace=e2e_namespace, workdir=workdir,
        delta_env=delta_env,
    )  # fmt: skip
    chaos.infra = infra = InfraFaults(
        Services(kafka=kafka, postgres=postgres, store=store, catalog=rest_catalog, kube=cluster.api),
        count=INFRA_FAULTS, seed=SEED, topics=(TOPIC, DLQ_TOPIC, keyed.KEYED_TOPIC), partitions=PARTITIONS,
        high=chaos.high,
        caught_up_with=chaos.caught_up_with, revive_operator=chaos.revive_operator, lock=chaos.fault_lock,
        calm=chaos.calm, done=chaos.done, note=chaos.note, resources=ResourceFaults(Cluster(
            kafka=kafka, store=store, catalog_server=rest_catalog, cluster=cluster, pods=pods,
            tally=chaos.tally,
            catalog=catalog, tables=((TABLE_NAMESPACE, TABLE), (TABLE_NAMESPACE, keyed.KEYED_TABLE)),
            driver=DRIVER, compact_prefix=COMPACT_PREFIX, topics=(TOPIC, DLQ_TOPIC, keyed.KEYED_TOPIC),
        ), chaos.note).make,
    )  # fmt: skip
    outcome: Audit | None = None
    verify = "not run"
    failure: BaseException | None = None
    threads: list[threading.Thread] = []
    try:
        operator.start()
        chaos._producing.set()
        threads.append(threading.Thread(target=chaos.produce_loop, name="chaos-producer", daemon=True))
        threads.append(threading.Thread(target=chaos.keyed.loop, name="chaos-keyed-producer", daemon=True))
        for thread in threads:
            thread.start()
        st_path = f"/apis/icefall.dev/v1alpha1/namespaces/{e2e_namespace}/streamingtables"
        for obj in (st_object, keyed_object, delta_object):
            rest.call("POST", st_path, {**obj, "metadata": {**obj["metadata"], "namespace": e2e_namespace}})
        # The first driver and compaction pod start unarmed: a broken setup fails here, not in the chaos.
        wait_for("the first driver pod running", chaos.running_driver, timeout=600, every=1,
                 details=chaos.explain)  # fmt: skip
        wait_for("the first commit", chaos.committed, timeout=900, every=2, details=chaos.explain)
        wait_for("the compaction pod running", lambda: pods.running("compaction"), timeout=600, every=1,
                 details=chaos.explain)  # fmt: skip
        wait_for("the keyed table's first commit", chaos.keyed_committed, timeout=900, every=2,
                 details=chaos.explain)  # fmt: skip
        wait_for("the Delta table's first commit", chaos.delta_offsets.committed, timeout=900, every=2,
                 details=chaos.explain)  # fmt: skip
        chaos.note(f"pipeline up: {chaos.progress()}")
        chaos.arm(True)

        killers = [
            threading.Thread(target=chaos.pod_killer, args=("driver",), name="kill-driver", daemon=True),
            threading.Thread(target=chaos.pod_killer, args=("compaction",), name="kill-compact", daemon=True),
            threading.Thread(target=chaos.operator_killer, name="kill-operator", daemon=True),
            threading.Thread(target=infra.loop, name="infra-faults", daemon=True),
        ]
        for thread in killers:
            thread.start()
        faults: list[tuple[str, Callable[[Fault], None]]] = [
            (name, functools.partial(act, chaos)) for name, act in measured.FAULTS
        ]
        chaos.rng.shuffle(faults)
        del faults[MEASURED_FAULTS:]
        due = [round(KILLS * (i + 1) / (len(faults) + 1)) for i in range(len(faults))]
        threads.append(threading.Thread(target=chaos.progress_loop, name="chaos-progress", daemon=True))
        threads[-1].start()
        armed = True
        while any(t.is_alive() for t in killers) or faults:
            time.sleep(1)
            chaos.count_exits()
            assert not chaos.errors and not infra.errors, chaos.errors + infra.errors
            if armed and not any(t.is_alive() for t in killers[:3]):
                # The kills are done: a container that starts from now on ends only of a fault (armed ones
                # kept exiting at their failpoints, and the faults left waited minutes for each recovery).
                with chaos.fault_lock:  # not while a service is down: the roll needs the API server
                    chaos.arm(False)
                armed = False
            if faults and (chaos.tally.total() >= due[0] or not any(t.is_alive() for t in killers)):
                name, act = faults.pop(0)
                due.pop(0)
                chaos.fault(name, act)
        chaos.done.set()
        if armed:
            chaos.arm(False)
        chaos._producing.clear()
        threads[0].join(900)
        threads[1].join(900)
        assert not chaos.errors, chaos.errors
        chaos.note(f"kills done, arming off, producer stopped: {chaos.progress()}")
        final = Fault("the end of the run (producer stopped)", time.monotonic(), time.monotonic())
        chaos.converge(final)
        chaos.faults.append(final)
        chaos.count_exits()
        outcome = audit(kafka, catalog, TOPIC, PARTITIONS, (TABLE_NAMESPACE, TABLE))
        chaos.note(f"audit: {outcome}")
        chaos.keyed_audit = keyed.audit(kafka.bootstrap, PARTITIONS, catalog.pyiceberg(), TABLE_NAMESPACE)
        chaos.note(f"keyed audit: {chaos.keyed_audit}")
        options = S3Settings.from_env(s3_env).delta_rs_options()
        chaos.delta_audit = delta.audit(kafka, TOPIC, PARTITIONS, (delta_location, delta_dead), options)
        chaos.note(f"Delta audit: {chaos.delta_audit}")
        verify = run_verify(manifest, variables, workdir)
        chaos.keyed_verify = run_verify(keyed_manifest, variables, workdir)
        chaos.delta_verify = run_verify(delta_manifest, s3_env, workdir)
    except BaseException as error:
        failure = error
        raise
    finally:
        chaos.done.set()
        chaos._producing.clear()
        for key, was in saved_env.items():
            if was is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = was
        try:
            operator.stop()
        finally:
            try:
                pods.stop()
            finally:
                write_report(chaos, outcome, verify, failure, path=REPORT, seed=SEED, kills=KILLS)
    assert outcome.duplicates == outcome.missing == outcome.wrong == 0, outcome.examples
    assert chaos.keyed_audit is not None and chaos.keyed_audit.clean, chaos.keyed_audit
    found = chaos.delta_audit
    assert found is not None and found.duplicates == found.missing == found.wrong == 0, found.examples
    assert chaos.tally.total() >= KILLS
    assert len(infra.faults) >= INFRA_FAULTS
