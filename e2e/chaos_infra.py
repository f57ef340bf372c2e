"""`make chaos`'s infrastructure faults: the services around Icefall SIGKILLed at random moments, restarted.

`InfraFaults.loop` (a thread of the run) makes `count` of them, one at a time, at random moments
(`EVERY` apart) while the kills of Icefall's own processes go on; the next fault waits for the last one's
recovery at most `SETTLE` seconds, then that recovery is awaited alongside the next faults (`_watch`); each
draws a kind (`KINDS`): a Kafka
broker (the leader of a random partition of the three-node cluster), PostgreSQL (the REST catalog's
database), the object store (MinIO), the REST catalog server, and kube-apiserver or etcd of the e2e
cluster. The service gets SIGKILL (no clean shutdown), stays down `DOWN` seconds, and is started again on
its ports with its data. Three more Kafka kinds (issue 46 item 1, as tests/integration/
test_kafka_cluster_faults.py makes them): the KRaft quorum's active controller SIGKILLed (down until
another node is elected, then `DOWN`), an unclean restart of one random broker (SIGKILL and started again
at once: its log is recovered), and a rolling restart (each node stopped cleanly and started again, the
next one only once every replica is back in sync). Its recovery: from that restart (the last node's, for a
rolling restart) until the tables have committed every record that was in their topics then.
Five resource kinds (`RESOURCE_KINDS`, issue 46 item 3: a network partition, an OOM kill, clock skew, an
orphan race, a full spill disk; e2e/chaos_resources.py says what each proves) are drawn with them, made by
the run's `resources`; their recovery counts from the fault's end.
`infra_count(kills)` faults make at least a third of all faults (kills + these).
`ICEFALL_CHAOS_INFRA_KINDS` (comma-separated names of `KINDS`) restricts the draw, for a short run that
must hit given kinds.

The operator exits by design when it could not renew its leader Lease before it ran out (an API server or
etcd down longer than the Lease, `controller.leader`); `revive_operator` (the run's) starts it again, as its
Deployment would, and the run counts it. A measured fault of the run (`Chaos.fault`) and an infrastructure
fault are never made together (`lock`; an infrastructure fault's first `SETTLE` seconds of recovery too);
none is made while the run is calm for one.

Not guaranteed: a service that does not come back (its restart fails) ends the run's loop with an error;
the recovery includes whatever kill of Icefall's own processes, and past `SETTLE` whatever later fault,
happened meanwhile (they go on): a pessimistic figure. Waiting each recovery out before the next fault made
a full run's 67 faults take hours (recoveries of 2 to 9 minutes while drivers are killed every minute).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from icefall.devstack.kafka_cluster import KafkaCluster
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.rest_catalog import RESTCatalogServer

KINDS = (
    "Kafka broker", "Kafka controller", "Kafka unclean restart", "Kafka rolling restart",
    "PostgreSQL", "object store", "REST catalog", "kube-apiserver", "etcd",
)  # fmt: skip
#: Resource faults (e2e/chaos_resources.py: issue 46 item 3), drawn with `KINDS`.
RESOURCE_KINDS = ("network partition", "OOM kill", "clock skew", "orphan race", "spill disk full")
ALL_KINDS = KINDS + RESOURCE_KINDS
#: Seconds a new KRaft controller may take to be elected after the active one was killed.
ELECTION_TIMEOUT = 60.0
#: Seconds between the end of one infrastructure fault's recovery and the next fault.
EVERY = (5.0, 40.0)
#: Seconds a killed service stays down before its restart (the restart itself takes more).
DOWN = (1.0, 10.0)
RECOVER_TIMEOUT = 900.0
#: Seconds the next fault waits for the last one's recovery before it is awaited alongside the next faults.
SETTLE = 30.0
INFRA_SHARE = 1 / 3


def infra_count(kills: int) -> int:
    """How many infrastructure faults make at least `INFRA_SHARE` of `kills` + them."""
    return math.ceil(kills * INFRA_SHARE / (1 - INFRA_SHARE))


@dataclass
class InfraFault:
    kind: str
    down_seconds: float  # from the SIGKILL until the service answered again
    recovered_after: float | None = None  # from its restart until the tables caught up
    note: str = ""
    back: float = 0.0  # monotonic time of its restart (or its end)
    high: dict[int, int] | None = None  # the topics' offsets then, which the tables must reach


@dataclass
class Services:
    """The services the faults kill: this run's own, or the e2e cluster's (kube-apiserver, etcd)."""

    kafka: KafkaCluster
    postgres: PostgresServer
    store: ObjectStore
    catalog: RESTCatalogServer
    kube: KubeAPIServer


class InfraFaults:
    """The run's infrastructure faults (module doc); `faults` as they were made, `errors` what went wrong."""

    def __init__(
        self,
        services: Services,
        *,
        count: int,
        seed: int,
        topics: tuple[str, ...],
        partitions: int,
        high: Callable[[], dict[int, int]],
        caught_up_with: Callable[[dict[int, int]], bool],
        revive_operator: Callable[[], None],
        lock: threading.Lock,
        calm: threading.Event,
        done: threading.Event,
        note: Callable[[str], None],
        resources: Callable[[str, random.Random], str] | None = None,
    ) -> None:
        self.services, self.count, self.topics, self.partitions = services, count, topics, partitions
        self.rng = random.Random(f"{seed}-infra")
        self.high, self.caught_up_with, self.revive_operator = high, caught_up_with, revive_operator
        self.lock, self.calm, self.done, self.note = lock, calm, done, note
        self.faults: list[InfraFault] = []
        self.pending: list[InfraFault] = []  # made, not yet recovered: oldest first
        self.pending_lock = threading.Lock()
        self.made = threading.Event()  # the loop made its last fault
        self.errors: list[str] = []
        self.resources = resources  # makes a resource fault of a kind; what happened, in a few words
        self.kinds = drawn_kinds(os.environ.get("ICEFALL_CHAOS_INFRA_KINDS", ""))

    def loop(self) -> None:
        watcher = threading.Thread(target=self._watch, name="infra-recoveries", daemon=True)
        watcher.start()
        while not self.done.is_set() and len(self.faults) < self.count and not self.errors:
            if self.done.wait(self.rng.uniform(*EVERY)) or self.calm.is_set():
                continue
            with self.lock:
                try:
                    fault = self.one(self.rng.choice(self.kinds))
                except Exception as error:  # a service that did not come back: the run fails, says why
                    self.errors.append(f"infrastructure fault: {type(error).__name__}: {error}"[:2000])
                    break
                settle = fault.back + SETTLE
                while fault.recovered_after is None and time.monotonic() < settle and not self.errors:
                    time.sleep(0.5)
        self.made.set()
        watcher.join()

    def one(self, kind: str) -> InfraFault:
        started = time.monotonic()
        note = self._kill_and_restart(kind, self.rng.uniform(*DOWN))
        back = time.monotonic()
        fault = InfraFault(kind, back - started, note=note, back=back, high=self.high())
        with self.pending_lock:
            self.faults.append(fault)
            self.pending.append(fault)
        self.revive_operator()
        return fault

    def _watch(self) -> None:
        """Record each fault's recovery once the tables caught up with it, oldest first (a later fault's
        offsets are no lower: while the oldest is not caught up, no other is), until every fault made
        recovered, or one did not in `RECOVER_TIMEOUT`."""
        while not self.done.is_set() and not self.errors:
            with self.pending_lock:
                oldest = self.pending[0] if self.pending else None
            if oldest is None:
                if self.made.is_set():
                    return
                time.sleep(0.5)
                continue
            self.revive_operator()
            assert oldest.high is not None
            if self.caught_up_with(oldest.high):
                oldest.recovered_after = time.monotonic() - oldest.back
                with self.pending_lock:
                    self.pending.pop(0)
                number = self.faults.index(oldest) + 1
                self.note(f"infrastructure fault {number}/{self.count}: {oldest.kind} ({oldest.note}); "
                          f"recovered {oldest.recovered_after:.0f} s after its restart")  # fmt: skip
                continue
            if time.monotonic() > oldest.back + RECOVER_TIMEOUT:
                self.errors.append(f"{oldest.kind}: not recovered {RECOVER_TIMEOUT:.0f} s after its restart")
                return
            time.sleep(1)

    def _kill_and_restart(self, kind: str, down: float) -> str:
        """SIGKILL the service of `kind`, wait `down` s, start it again; what happened, in a few words."""
        s = self.services
        if kind in RESOURCE_KINDS:
            assert self.resources is not None, f"{kind}: the run made no resource faults"
            return self.resources(kind, self.rng)
        if kind == "Kafka broker":
            node = s.kafka.leader_of(self.topics[0], self.rng.randrange(self.partitions))
            s.kafka.kill(node)
            time.sleep(down)
            s.kafka.heal(self.topics)
            return f"node {node}, a partition leader; replicas in sync again"
        if kind.startswith("Kafka "):
            return self._kafka_fault(kind, down)
        kill, start = {
            "PostgreSQL": (s.postgres.kill, s.postgres.start),
            "object store": (s.store.kill, s.store.start),
            "REST catalog": (s.catalog.kill, s.catalog.start),
            "kube-apiserver": (s.kube.kill_apiserver, s.kube.restart_apiserver),
            "etcd": (s.kube.kill_etcd, s.kube.restart_etcd),
        }[kind]
        kill()
        time.sleep(down)
        start()
        return f"down {down:.0f} s before its restart"

    def _kafka_fault(self, kind: str, down: float) -> str:
        """The KRaft controller's SIGKILL, an unclean restart of one broker, or a rolling restart."""
        kafka = self.services.kafka
        if kind == "Kafka controller":
            controller = kafka.active_controller()
            kafka.kill(controller)
            elected = _wait_elected(kafka, controller)
            time.sleep(down)
            kafka.heal(self.topics)
            return f"node {controller}, the active controller; node {elected} elected; in sync again"
        if kind == "Kafka unclean restart":
            node = self.rng.choice(sorted(kafka.nodes))
            kafka.kill(node)
            kafka.heal(self.topics)  # started again at once: its log recovered, then caught up
            return f"node {node} SIGKILLed and started again at once; replicas in sync again"
        assert kind == "Kafka rolling restart", kind
        for node in kafka.nodes.values():
            node.stop()  # clean: its leaderships handed over first
            time.sleep(2)
            kafka.restart(node.node_id)
            kafka.wait_in_sync(self.topics)
        return f"nodes {', '.join(map(str, kafka.nodes))} stopped cleanly and started again, one by one"

    def report(self, kills: Mapping[str, int]) -> list[str]:
        """The report's "Faults by kind" section: Icefall's own kills (`kills` per component) and these."""
        infra = len(self.faults)
        total = sum(kills.values()) + infra
        lines = [
            "## Faults by kind",
            "",
            f"{total} faults: {sum(kills.values())} kills of Icefall's own processes, {infra} of the "
            f"infrastructure ({infra / max(total, 1):.0%}; asked: {self.count}, at least a third).",
            "Recovery of an infrastructure fault: from the service's restart until the tables "
            "committed every record that was in their topics then; of a resource fault "
            "(e2e/chaos_resources.py), from its end.",
            "",
            "| kind | faults | recovery p50 | recovery p99 | max |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [f"| kill: {component} | {n} | | | |" for component, n in kills.items()]
        for kind in ALL_KINDS:
            how = "" if kind == "Kafka rolling restart" or kind in RESOURCE_KINDS else "SIGKILL: "
            made = [f for f in self.faults if f.kind == kind]
            times = sorted(f.recovered_after for f in made if f.recovered_after is not None)
            if made:
                p50, p99, most = (
                    percentile(times, 50),
                    percentile(times, 99),
                    seconds(max(times, default=None)),
                )
                lines.append(f"| {how}{kind} | {len(made)} | {p50} | {p99} | {most} |")
        return [*lines, ""]


def drawn_kinds(names: str) -> tuple[str, ...]:
    """The kinds to draw from: `ALL_KINDS`, or the comma-separated `names` of some of them."""
    chosen = tuple(name.strip() for name in names.split(",") if name.strip())
    unknown = [name for name in chosen if name not in ALL_KINDS]
    if unknown:
        known = ", ".join(ALL_KINDS)
        raise ValueError(f"ICEFALL_CHAOS_INFRA_KINDS: unknown kinds {unknown}; known: {known}")
    return chosen or ALL_KINDS


def _wait_elected(kafka: KafkaCluster, killed: int) -> int:
    """The node the KRaft quorum elected after `killed`, once one was."""
    deadline = time.monotonic() + ELECTION_TIMEOUT
    while True:
        time.sleep(0.5)
        try:
            controller = kafka.active_controller()
        except (OSError, ValueError, KeyError, RuntimeError):  # a file being rewritten, no leader yet
            controller = killed
        if controller != killed:
            return controller
        if time.monotonic() > deadline:
            raise AssertionError(f"no KRaft controller elected {ELECTION_TIMEOUT:.0f} s after node {killed}")


def percentile(ordered: list[float], p: float) -> str:
    """The nearest-rank percentile `p` of `ordered`, in seconds ("-" when empty)."""
    if not ordered:
        return "-"
    return seconds(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)])


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"
