"""`make chaos`: hundreds of random kills and four outages on the whole system, then an audit by content.

A benchmark-style run, not a test of the suite: the file name does not match `test_*.py`, so `make test`
never collects it; `make chaos` passes it to pytest explicitly (it then gets the e2e fixtures). Knobs, from
the environment: `ICEFALL_CHAOS_KILLS` (default 200), `ICEFALL_CHAOS_SEED` (default 1),
`ICEFALL_CHAOS_REPORT` (default bench/results/chaos.md).

The system, as in a cluster: the operator as a process; the real kube-controller-manager turning the
compaction Deployment into Pods; the local kubelet running the driver Pod and the compaction Pod (each
its own Spark, `local[1]`); Kafka; Iceberg's REST catalog server on PostgreSQL with the table files in an
object store (MinIO), both of this run's own so they can be stopped and started on the same port. One
StreamingTable with a dead-letter table and topic, small batches, a compaction pod always running
(`minReplicas: 1`) and snapshot expiry after a minute, so compaction and expiry really run meanwhile.

Chaos, while a producer keeps writing edge-case records (`chaos_data`: unicode, extreme numbers and
timestamps, large values, every malformed kind):
- kills, until as many were observed as asked (split driver 40 % / compaction 35 % / operator 25 %):
  each start of a driver or compaction container is armed (kubelet hook `container_env`), with a chance,
  to exit at a random failpoint (`ICEFALL_FAILPOINTS=<point>=exit@<hit>`, status 137 like SIGKILL), and
  the others get SIGKILL (the whole process group) at a random moment (an armed one that has not reached
  its point after 300 s too); the operator gets
  SIGKILL at random moments and is started again. A kill is counted only when its exit was seen: status
  137 and the log line `failpoint <name> triggered`, or 137 of a process this run SIGKILLed;
- faults, one at a time while kills pause, spread over the run: the Kafka broker stopped and started
  mid-batch (same ports, same data); the REST catalog down 30 s; the object store down 30 s; the driver
  paused (SIGSTOP) past its commit Lease while a second writer (`icefall ingest`, the driver's command,
  as a pod rescheduled during a partition) takes the Lease and commits, then resumed (SIGCONT): it must
  be fenced. Each fault's time to converge: from its end until the table committed every record that
  was in the topic at that moment.

Then, with the producer stopped and the table caught up, the audit, which uses none of the ingestion
code: every record of the topic read with confluent-kafka (read_committed), decoded by `chaos_data`'s
reference decoder, compared with the table's rows (pyiceberg, from the object store) by `_kafka`
(partition, offset) and by every value, and with the dead-letter table's rows (by offset and value
bytes): duplicates, missing and wrong values must all be 0. `icefall verify` runs as well. The report
goes to `bench/results/chaos.md`, written even when the run fails.

Not covered: kills of Kafka, the API server, PostgreSQL or MinIO themselves (only the outages above);
the operator has no failpoints (its kills are all at random moments); orphan-file deletion (its safety
window is at least an hour) and so `main.before-orphan-delete`; the dead-letter topic is checked by
nobody here (it is at-least-once by design).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, KubeControllerManager
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.procs import tail
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.plan.children import compaction_name, secret_env_vars
from icefall.testing.kubelet import ContainerExit, JsonApi, LocalKubelet

from . import chaos_data as data
from .conftest import REPO, Operator, pod_logs, wait_for

pytestmark = pytest.mark.e2e

KILLS = int(os.environ.get("ICEFALL_CHAOS_KILLS", "200"))
SEED = int(os.environ.get("ICEFALL_CHAOS_SEED", "1"))
REPORT = Path(os.environ.get("ICEFALL_CHAOS_REPORT", str(REPO / "bench" / "results" / "chaos.md")))
NAME, TOPIC, DLQ_TOPIC = "chaos", "chaos", "chaos-dlq"
TABLE_NAMESPACE, TABLE = "chaos", "events"
DRIVER = f"{NAME}-ingest"
COMPACT_PREFIX = f"{compaction_name(NAME)}-"
PARTITIONS = 3
SHARES = {"driver": 0.40, "compaction": 0.35, "operator": 0.25}
#: Failpoints a driver passes on a table with traffic and malformed records (see
#: tests/integration/test_failpoint_kills.py); the `AT_START` ones are passed once per process.
DRIVER_POINTS = (
    "main.after-prepare", "main.after-stage", "main.before-commit", "main.after-commit",
    "dlq.after-prepare", "dlq.after-stage", "dlq.before-commit", "dlq.after-commit",
    "dlq-topic.mid-produce", "dlq-topic.after-produce", "dlq.before-rewind", "dlq.after-rewind",
    "main.before-sweep", "dlq.before-sweep", "lease.renew",
)  # fmt: skip
AT_START = {"dlq.before-rewind", "dlq.after-rewind", "main.before-sweep", "dlq.before-sweep"}
COMPACTION_POINTS = ("main.mid-rewrite", "main.before-expire")
ARM_CHANCE = 0.7  # of a container start getting a failpoint; the others die at a random moment
#: Seconds after a container (or the operator) started before its SIGKILL: short enough that 200 kills fit
#: in about an hour on 2 cores (a Spark start is most of a cycle), long enough to land mid-batch as well.
RANDOM_KILL_AFTER = (2.0, 45.0)
ARMED_GRACE = 150.0  # an armed container gets this long to reach its failpoint before a SIGKILL
OUTAGE_SECONDS = 30.0
#: The producer's pace: ~3 records/s, well under what a driver ingests between kills on a loaded 2-core
#: machine (~10/s), so each fault's convergence measures recovery rather than a growing backlog.
PRODUCE_RECORDS, PRODUCE_EVERY_SECONDS = 10, 3.0
#: ... and it waits while the table is this many records behind (a loaded machine ingests slower).
MAX_BACKLOG = 1000
CONVERGE_TIMEOUT = 900.0
RANDOM = "random moment"
FAILPOINT_LINE = re.compile(r"failpoint (\S+) triggered")
SIGKILL_STATUS = 137
#: secretProperties key → key in the Secret `lake`.
SECRET_KEYS = {"s3.access-key-id": "access-key-id", "s3.secret-access-key": "secret-access-key"}
Obj = dict[str, Any]


# --- the stack: this run's own object store and REST catalog (so they can go down), the controller-manager


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    running = ObjectStore(tmp_path_factory.mktemp("chaos-store")).start()
    running.create_bucket("chaos")
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


def streaming_table(kafka: KafkaBroker, catalog: RESTCatalogServer, store: ObjectStore) -> Obj:
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


# --- what the run observes -----------------------------------------------------------------------------


@dataclass
class Fault:
    name: str
    started: float
    ended: float = 0.0
    converged_after: float | None = None
    note: str = ""


@dataclass
class Tally:
    """Kills observed, per component and per crash point; what the run armed and SIGKILLed."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    killed_pids: set[int] = field(default_factory=set)  # container processes this run SIGKILLed
    by_component: Counter[str] = field(default_factory=Counter)
    by_point: Counter[tuple[str, str]] = field(default_factory=Counter)  # (component, point)
    other_exits: Counter[tuple[str, int]] = field(default_factory=Counter)  # exits that were no kill of ours
    armed: Counter[str] = field(default_factory=Counter)
    seen_exits: int = 0

    def kill(self, component: str, point: str) -> None:
        with self.lock:
            self.by_component[component] += 1
            self.by_point[component, point] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.by_component.values())

    def of(self, component: str) -> int:
        with self.lock:
            return self.by_component[component]


def component_of(pod: str) -> str | None:
    if pod == DRIVER:
        return "driver"
    if pod.startswith(COMPACT_PREFIX):
        return "compaction"
    return None


class Chaos:
    """The run: the system's handles, the producer, the kill loops, the faults, progress and the tally."""

    def __init__(
        self,
        *,
        kafka: KafkaBroker,
        store: ObjectStore,
        catalog_server: RESTCatalogServer,
        catalog: CatalogConfig,
        kubelet: LocalKubelet,
        operator: Operator,
        rest: JsonApi,
        namespace: str,
        writer_env: dict[str, str],
        workdir: Path,
    ) -> None:
        self.kafka, self.store, self.catalog_server, self.catalog = kafka, store, catalog_server, catalog
        self.kubelet, self.operator, self.rest, self.namespace = kubelet, operator, rest, namespace
        self.writer_env, self.workdir = writer_env, workdir
        self.rng = random.Random(SEED)
        self.arm_rng = random.Random(SEED + 1)  # the kubelet's thread draws from its own generator
        self.quota = {name: max(1, round(KILLS * share)) for name, share in SHARES.items()}
        self.quota["operator"] = max(1, KILLS - self.quota["driver"] - self.quota["compaction"])
        self.tally = Tally()
        self.faults: list[Fault] = []
        self.calm = threading.Event()  # set: no arming, no SIGKILL (a fault is being measured)
        self.done = threading.Event()
        self.errors: list[str] = []
        self.kinds: Counter[str] = Counter()
        self.produced = 0
        self.started = time.monotonic()
        self._producing = threading.Event()
        #: Pod name → whether its latest container start was armed (the kubelet calls the hook just before
        #: it starts the process, so this is about the pid running now).
        self.armed_now: dict[str, bool] = {}

    # --- progress and failure details ---

    def note(self, what: str) -> None:
        print(f"[chaos +{time.monotonic() - self.started:7.1f}s] {what}", flush=True)

    def progress(self) -> str:
        with self.tally.lock:
            kills = dict(self.tally.by_component)
        converged = sum(f.converged_after is not None for f in self.faults)
        return (
            f"kills {sum(kills.values())}/{KILLS} {kills}, produced {self.produced}, "
            f"committed {sum(self.committed().values())}, faults converged {converged}"
        )

    def progress_loop(self) -> None:
        """A progress line every 30 s, faults included (the main thread blocks in them)."""
        while not self.done.wait(30):
            fault = next((f.name for f in reversed(self.faults) if not f.converged_after), None)
            self.note(self.progress() + (f"; in fault: {fault}" if fault else ""))

    def explain(self) -> str:
        status = yaml.safe_dump((self.st() or {}).get("status"))
        compact = [name for name in self.kubelet.running_pids() if name.startswith(COMPACT_PREFIX)]
        more = "\n".join(pod_logs(self.kubelet, name) for name in compact)
        driver = pod_logs(self.kubelet, DRIVER)
        return f"--- status\n{status}{driver}\n{more}\n--- operator\n{self.operator.tail()}"

    def st(self) -> Obj | None:
        return self.rest.get(f"/apis/icefall.dev/v1alpha1/namespaces/{self.namespace}/streamingtables/{NAME}")

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
        return _watermarks(self.kafka)

    def caught_up_with(self, high: dict[int, int]) -> bool:
        committed = self.committed()
        return bool(committed) and all(committed.get(p, 0) >= o for p, o in high.items())

    def converge(self, fault: Fault) -> None:
        """Wait until the table has every record that was in the topic when `fault` ended; record how long."""
        high = self.high()
        wait_for(
            f"the table to converge after {fault.name} (offsets {high})",
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

    # --- arming and kills ---

    def container_env(self, pod: Obj, _restarts: int) -> dict[str, str]:
        """The kubelet hook: maybe arm this container start to exit at a random failpoint."""
        name = pod["metadata"]["name"]
        component = component_of(name)
        self.armed_now[name] = False
        if component is None or self.calm.is_set() or self.done.is_set():
            return {}
        if self.tally.of(component) >= self.quota[component] or self.arm_rng.random() > ARM_CHANCE:
            return {}
        self.armed_now[name] = True
        if component == "driver":
            point = self.arm_rng.choice(DRIVER_POINTS)
            hit = 1 if point in AT_START else self.arm_rng.randint(1, 3)
        else:
            point, hit = self.arm_rng.choice(COMPACTION_POINTS), 1
        with self.tally.lock:
            self.tally.armed[point] += 1
        return {"ICEFALL_FAILPOINTS": f"{point}={'exit'}@{hit}"}

    def count_exits(self) -> None:
        """Turn the kubelet's new container exits into kills (status 137 that this run caused)."""
        exits: list[ContainerExit] = self.kubelet.exits[self.tally.seen_exits :]
        self.tally.seen_exits += len(exits)
        for ended in exits:
            component = component_of(ended.name)
            if component is None:
                continue
            point = FAILPOINT_LINE.search(ended.output()) if ended.exit_code == SIGKILL_STATUS else None
            if point is not None:
                self.tally.kill(component, point.group(1))
            elif ended.exit_code == SIGKILL_STATUS and ended.pid in self.tally.killed_pids:
                self.tally.kill(component, RANDOM)
            else:
                with self.tally.lock:
                    self.tally.other_exits[component, ended.exit_code] += 1

    def pod_killer(self, component: str) -> None:
        """SIGKILL the component's running container at a random moment, until its quota was observed."""
        rng = random.Random(f"{SEED}-{component}")
        deadline: dict[int, float] = {}
        while not self.done.is_set() and self.tally.of(component) < self.quota[component]:
            time.sleep(0.5)
            if self.calm.is_set():
                deadline.clear()  # a container that lived through a fault gets a new moment afterwards
                continue
            pids = [(n, p) for n, p in self.kubelet.running_pids().items() if component_of(n) == component]
            for name, pid in pids:
                after = ARMED_GRACE if self.armed_now.get(name) else rng.uniform(*RANDOM_KILL_AFTER)
                when = deadline.setdefault(pid, time.monotonic() + after)
                if time.monotonic() >= when and pid not in self.tally.killed_pids:
                    with self.tally.lock:
                        self.tally.killed_pids.add(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)

    def operator_killer(self) -> None:
        rng = random.Random(f"{SEED}-operator")
        while not self.done.is_set() and self.tally.of("operator") < self.quota["operator"]:
            if self.done.wait(rng.uniform(*RANDOM_KILL_AFTER) / 3) or self.calm.is_set():
                continue
            process = self.operator.process
            assert process is not None
            process.send_signal(signal.SIGKILL)
            code = process.wait(30)
            if code == -signal.SIGKILL:
                self.tally.kill("operator", RANDOM)
            else:
                self.errors.append(f"the operator exited {code} before its SIGKILL")
            self.operator.start()

    # --- faults ---

    def fault(self, name: str, act: Callable[[Fault], None]) -> None:
        self.calm.set()
        try:
            self.note(f"fault {name}: waiting for a running driver")
            self.wait_driver_committing()
            fault = Fault(name, time.monotonic())
            self.faults.append(fault)
            act(fault)
            fault.ended = fault.ended or time.monotonic()
            self.converge(fault)
        finally:
            self.calm.clear()

    def wait_driver_committing(self) -> None:
        """A driver runs and commits (after any kill in flight): the fault then hits a working pipeline."""
        wait_for("a running driver", lambda: self.kubelet.running_pids().get(DRIVER), timeout=600,
                 every=1, details=self.explain)  # fmt: skip
        before = sum(self.committed().values())
        wait_for("a commit by the running driver", lambda: sum(self.committed().values()) > before,
                 timeout=600, every=1, details=self.explain)  # fmt: skip

    def broker_restart(self, fault: Fault) -> None:
        self.kafka.stop()
        time.sleep(5)
        self.kafka.start()
        fault.note = "stopped and started on the same ports and data, 5 s down"

    def catalog_outage(self, fault: Fault) -> None:
        self.catalog_server.stop()
        time.sleep(OUTAGE_SECONDS)
        self.catalog_server.start()
        fault.note = f"REST catalog server down {OUTAGE_SECONDS:.0f} s (plus its restart)"

    def store_outage(self, fault: Fault) -> None:
        self.store.stop()
        time.sleep(OUTAGE_SECONDS)
        self.store.start()
        fault.note = f"object store down {OUTAGE_SECONDS:.0f} s (plus its restart)"

    def paused_writer(self, fault: Fault) -> None:
        """SIGSTOP the driver past its Lease; a second `icefall ingest` takes over and commits; SIGCONT."""
        pid = self.kubelet.running_pids()[DRIVER]
        os.killpg(pid, signal.SIGSTOP)
        paused = time.monotonic()
        log = self.workdir / "second-writer.log"
        before = sum(self.committed().values())
        with log.open("wb") as out:
            second = subprocess.Popen(
                [sys.executable, "-m", "icefall.cli", "ingest", "--namespace", self.namespace,
                 "--name", NAME],
                env=self.writer_env, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
            )  # fmt: skip
        try:
            wait_for(
                "the second writer to commit",
                lambda: sum(self.committed().values()) > before,
                timeout=600, every=1, details=lambda: tail(log, 40),
            )  # fmt: skip
            time.sleep(max(0.0, 20 - (time.monotonic() - paused)))  # well past the 15 s Lease either way
            os.killpg(pid, signal.SIGCONT)
            resumed = time.monotonic()
            fenced = wait_for(
                "the paused writer to stop once resumed",
                lambda: next((e for e in self.kubelet.exits if e.pid == pid), None),
                timeout=300, every=1, details=self.explain,
            )  # fmt: skip
        finally:
            second.terminate()
            second.wait(60)
        output = fenced.output()
        said = "newer writer took over" in output or "lost the commit lease" in output
        fault.note = (
            f"paused {resumed - paused:.0f} s; second writer committed; the resumed writer exited "
            f"{fenced.exit_code} {'fenced (its log says so)' if said else 'WITHOUT saying it was fenced'}"
        )
        if not said:
            self.errors.append(f"paused writer not fenced: exit {fenced.exit_code}\n{output[-3000:]}")


# --- the audit: the topic against both tables, by content, with none of the ingestion code ------------------


@dataclass
class Audit:
    records: int = 0
    good: int = 0
    bad: int = 0
    rows: int = 0
    dead_rows: int = 0
    duplicates: int = 0
    missing: int = 0
    wrong: int = 0
    examples: list[str] = field(default_factory=list)

    def problem(self, kind: str, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {text}")

    def place(self, seen: Counter[tuple[int, int]], where: tuple[int, int], records: Any, what: str) -> bool:
        """Count a row at `where`: seen twice is a duplicate; False when the topic has no such record."""
        seen[where] += 1
        if seen[where] == 2:
            self.problem("duplicates", f"{what} {where} twice")
        if where not in records:
            self.problem("wrong", f"{what} {where} has no record in the topic")
            return False
        return True


def topic_records(kafka: KafkaBroker, high: dict[int, int]) -> dict[tuple[int, int], bytes | None]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "chaos-audit",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in high])
    records: dict[tuple[int, int], bytes | None] = {}
    ends = {p: o for p, o in high.items() if o > 0}
    try:
        while ends:
            message = consumer.poll(30)
            assert message is not None, f"the audit read {len(records)} records, then nothing"
            assert message.error() is None, message.error()
            records[message.partition(), message.offset()] = message.value()
            if message.offset() + 1 >= ends.get(message.partition(), 0):
                ends.pop(message.partition(), None)
    finally:
        consumer.close()
    return records


def _same(column: str, got: Any, want: Any) -> bool:
    if column == "ts":
        return isinstance(got, datetime) and got.astimezone(UTC) == want
    if column == "amount" and want is not None:
        return got is not None and Decimal(got) == want
    return bool(got == want)


def audit(kafka: KafkaBroker, catalog: CatalogConfig) -> Audit:
    high = {p: o for p, o in _watermarks(kafka).items()}
    records = topic_records(kafka, high)
    iceberg = catalog.pyiceberg()
    rows = iceberg.load_table((TABLE_NAMESPACE, TABLE)).scan().to_arrow().to_pylist()
    dead = iceberg.load_table((TABLE_NAMESPACE, f"{TABLE}_dlq")).scan().to_arrow().to_pylist()
    result = Audit(records=len(records), rows=len(rows), dead_rows=len(dead))
    in_table: Counter[tuple[int, int]] = Counter()
    for row in rows:
        where = (row["_kafka"]["partition"], row["_kafka"]["offset"])
        if not result.place(in_table, where, records, "table row"):
            continue
        want = data.expected(records[where])
        if want is data.BAD:
            result.problem("wrong", f"bad record {where} is a table row")
            continue
        assert isinstance(want, dict)
        differs = [c for c in data.COLUMNS if not _same(c, row[c], want[c])]
        if differs:
            shown = {c: (str(row[c])[:60], str(want[c])[:60]) for c in differs}
            result.problem("wrong", f"row {where} differs from its record: {shown}")
    in_dead: Counter[tuple[int, int]] = Counter()
    for row in dead:
        where = (row["partition"], row["offset"])
        if not result.place(in_dead, where, records, "dead letter"):
            continue
        if data.expected(records[where]) is not data.BAD:
            result.problem("wrong", f"good record {where} is a dead letter")
        elif row["value"] != records[where]:
            result.problem("wrong", f"dead letter {where}: its value is not the record's")
    for where, value in records.items():
        is_bad = data.expected(value) is data.BAD
        result.bad += is_bad
        result.good += not is_bad
        if where in in_table and where in in_dead:
            result.problem("duplicates", f"record {where} is a row and a dead letter")
        elif where not in in_table and where not in in_dead:
            result.problem("missing", f"record {where} ({'bad' if is_bad else 'good'}) is in neither table")
    return result


def _watermarks(kafka: KafkaBroker) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "chaos-audit-high",
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


# --- the run --------------------------------------------------------------------------------------------


@pytest.mark.timeout(1800 + KILLS * 90)
def test_chaos(  # noqa: PLR0917 (fixtures; the run reads top to bottom)
    kafka: KafkaBroker,
    kube: KubeAPIServer,
    store: ObjectStore,
    rest_catalog: RESTCatalogServer,
    controller_manager: KubeControllerManager,
    kubelet: LocalKubelet,
    rest: JsonApi,
    api: client.ApiClient,
    e2e_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    workdir = tmp_path_factory.mktemp("chaos")
    kafka.create_topic(TOPIC, partitions=PARTITIONS)
    kafka.create_topic(DLQ_TOPIC, partitions=1)
    s3 = store.properties()
    secret = {"access-key-id": s3["s3.access-key-id"], "secret-access-key": s3["s3.secret-access-key"]}
    rest.call("POST", f"/api/v1/namespaces/{e2e_namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lake", "namespace": e2e_namespace},
        "stringData": secret,
    })  # fmt: skip
    st_object = streaming_table(kafka, rest_catalog, store)
    manifest = workdir / "chaos.yaml"
    manifest.write_text(yaml.safe_dump(st_object, allow_unicode=True))
    st = load_manifest(manifest)
    _, catalog_env, problems = secret_env_vars(st.spec)
    assert problems == []
    variables = {ref.name: secret[ref.key] for ref in catalog_env}
    catalog = CatalogConfig.for_table(st.spec, environ=variables)
    operator = Operator(kube, e2e_namespace, workdir / "operator.log", env={
        **variables, "ICEFALL_DRIVER_MAX_BACKOFF_SECONDS": "2", "ICEFALL_STATUS_REFRESH_SECONDS": "2",
    })  # fmt: skip
    writer_env = {
        **{k: v for k, v in os.environ.items() if k != "ICEFALL_FAILPOINTS"},
        **variables,
        "KUBECONFIG": str(kube.kubeconfig),
        "ICEFALL_POD_NAME": "chaos-second-writer",
        "ICEFALL_SPARK_CONF": json.dumps({"spark.master": "local[1]"}),
        "ICEFALL_STATE_DIR": str(workdir / "second-writer-state"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(REPO / "operator" / "src"),
    }
    chaos = Chaos(
        kafka=kafka, store=store, catalog_server=rest_catalog, catalog=catalog, kubelet=kubelet,
        operator=operator, rest=rest, namespace=e2e_namespace, writer_env=writer_env, workdir=workdir,
    )  # fmt: skip
    kubelet.container_env = chaos.container_env
    outcome: Audit | None = None
    verify = "not run"
    failure: BaseException | None = None
    threads: list[threading.Thread] = []
    try:
        operator.start()
        chaos._producing.set()
        threads.append(threading.Thread(target=chaos.produce_loop, name="chaos-producer", daemon=True))
        threads[-1].start()
        st_path = f"/apis/icefall.dev/v1alpha1/namespaces/{e2e_namespace}/streamingtables"
        rest.call("POST", st_path, {**st_object, "metadata": {"name": NAME, "namespace": e2e_namespace}})
        chaos.calm.set()  # the first driver and compaction pod start unarmed: a broken setup fails here
        wait_for("the first driver pod running", lambda: kubelet.running_pids().get(DRIVER), timeout=300,
                 every=1, details=chaos.explain)  # fmt: skip
        wait_for("the first commit", chaos.committed, timeout=900, every=2, details=chaos.explain)
        wait_for("the compaction pod running",
                 lambda: any(n.startswith(COMPACT_PREFIX) for n in kubelet.running_pids()),
                 timeout=300, every=1, details=chaos.explain)  # fmt: skip
        chaos.note(f"pipeline up: {chaos.progress()}")
        chaos.calm.clear()

        killers = [
            threading.Thread(target=chaos.pod_killer, args=("driver",), name="kill-driver", daemon=True),
            threading.Thread(target=chaos.pod_killer, args=("compaction",), name="kill-compact", daemon=True),
            threading.Thread(target=chaos.operator_killer, name="kill-operator", daemon=True),
        ]
        for thread in killers:
            thread.start()
        faults: list[tuple[str, Callable[[Fault], None]]] = [
            ("Kafka broker restart mid-batch", chaos.broker_restart),
            ("catalog outage (30 s)", chaos.catalog_outage),
            ("object-store outage (30 s)", chaos.store_outage),
            ("writer paused past its lease", chaos.paused_writer),
        ]
        chaos.rng.shuffle(faults)
        due = [round(KILLS * (i + 1) / (len(faults) + 1)) for i in range(len(faults))]
        threads.append(threading.Thread(target=chaos.progress_loop, name="chaos-progress", daemon=True))
        threads[-1].start()
        while any(t.is_alive() for t in killers) or faults:
            time.sleep(1)
            chaos.count_exits()
            assert not chaos.errors, chaos.errors
            if faults and (chaos.tally.total() >= due[0] or not any(t.is_alive() for t in killers)):
                name, act = faults.pop(0)
                due.pop(0)
                chaos.fault(name, act)
        chaos.done.set()
        chaos._producing.clear()
        threads[0].join(900)
        assert not chaos.errors, chaos.errors
        chaos.note(f"kills done, producer stopped: {chaos.progress()}")
        final = Fault("the end of the run (producer stopped)", time.monotonic(), time.monotonic())
        chaos.converge(final)
        chaos.faults.append(final)
        chaos.count_exits()
        outcome = audit(kafka, catalog)
        chaos.note(f"audit: {outcome}")
        verify = run_verify(manifest, variables, workdir)
    except BaseException as error:
        failure = error
        raise
    finally:
        chaos.done.set()
        chaos._producing.clear()
        kubelet.container_env = None
        operator.stop()
        write_report(chaos, outcome, verify, failure)
    assert outcome.duplicates == outcome.missing == outcome.wrong == 0, outcome.examples
    assert chaos.tally.total() >= KILLS


def run_verify(manifest: Path, variables: dict[str, str], workdir: Path) -> str:
    """`icefall verify -f` on the table (its own audit, with Spark): its last lines and exit status."""
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(manifest)],
        env={**os.environ, **variables, "SPARK_LOCAL_IP": "127.0.0.1"}, cwd=workdir,
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.strip()][-6:]
    return f"exit {done.returncode}: " + " / ".join(lines)


def _result(failure: BaseException | None) -> str:
    if failure is None:
        return "passed"
    first = (str(failure).splitlines() or [""])[0][:300]
    return f"FAILED: {type(failure).__name__}: {first}"


def write_report(chaos: Chaos, outcome: Audit | None, verify: str, failure: BaseException | None) -> None:
    elapsed = time.monotonic() - chaos.started
    tally = chaos.tally
    total = tally.total()
    lines = [
        "# Chaos run",
        "",
        "`make chaos` (e2e/chaos_run.py): random kills and outages on the whole system while edge-case "
        "records arrive, then an audit by content that uses none of the ingestion code (the topic, "
        "read_committed, decoded by a reference decoder, against both tables read by pyiceberg).",
        "",
        f"- seed {SEED}, kills asked {KILLS}, kills observed {total}; duration {elapsed / 60:.1f} min "
        f"({elapsed / max(total, 1):.0f} s per kill)",
        f"- result: {_result(failure)}",
    ]
    if outcome is not None:
        lines += [
            f"- records: {outcome.records} ({outcome.good} good, {outcome.bad} malformed); table rows "
            f"{outcome.rows}, dead-letter rows {outcome.dead_rows}",
            "",
            "| duplicates | missing | wrong values |",
            "|---:|---:|---:|",
            f"| {outcome.duplicates} | {outcome.missing} | {outcome.wrong} |",
        ]
        if outcome.examples:
            lines += ["", "First problems:", "", *[f"- {e}" for e in outcome.examples]]
    lines += ["", f"`icefall verify`: {verify}", "", "## Kills per component", "",
              "| component | kills | asked |", "|---|---:|---:|"]  # fmt: skip
    lines += [f"| {c} | {tally.by_component[c]} | {chaos.quota[c]} |" for c in SHARES]
    lines += ["", "## Kills per crash point", "", "| component | crash point | kills |", "|---|---|---:|"]
    lines += [f"| {c} | {p} | {n} |" for (c, p), n in sorted(tally.by_point.items())]
    armed = ", ".join(f"{p} {n}" for p, n in sorted(tally.armed.items()))
    other = ", ".join(f"{c} exit {code}: {n}" for (c, code), n in sorted(tally.other_exits.items()))
    lines += [
        "",
        f"Armed failpoints (container starts armed; a point a process never reached is not a kill): {armed}.",
        f"Container exits that were not kills of this run: {other or 'none'}.",
        "",
        "## Faults",
        "",
        "| fault | converged after | what happened |",
        "|---|---:|---|",
    ]
    for fault in chaos.faults:
        after = f"{fault.converged_after:.0f} s" if fault.converged_after is not None else "did not"
        lines.append(f"| {fault.name} | {after} | {fault.note} |")
    lines += [
        "",
        "Converged: the table committed every record that was in the topic when the fault ended.",
        "",
        "## Records produced, by kind",
        "",
        ", ".join(f"{kind} {n}" for kind, n in sorted(chaos.kinds.items())),
        "",
        "## Not covered",
        "",
        "Kills of Kafka, the API server, PostgreSQL or MinIO themselves (only the outages above); the "
        "operator has no failpoints, so its kills are all at random moments; orphan-file deletion (its "
        "safety window is at least an hour), so `main.before-orphan-delete` is never reached; the "
        "dead-letter topic is not audited (at-least-once by design); NaN/Infinity, lone surrogates, nested "
        "structs and maps, and decimal rounding are not in the data (see e2e/chaos_data.py).",
        "",
    ]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines))
    print(f"[chaos] report written to {REPORT}", flush=True)
