"""A real three-node Apache Kafka 4 cluster in KRaft on loopback, for the tests of broker faults.

Each node is a combined broker + controller (`process.roles=broker,controller`): three JVMs, not four
(three brokers and a separate controller), on a 2-core machine, and a controller quorum of three voters, so
SIGKILL of the active controller is a fault the cluster survives (a lone controller would be a single point
of failure, not a fault to test). Topics default to replication factor 3 and `min.insync.replicas` 2, and so
do the offsets and transaction state topics: any one node may die without losing an acknowledged record or
refusing `acks=all` writes. Unclean leader election stays off (Kafka's default).

`kill(node)` is SIGKILL (no clean shutdown: the node's log is recovered on the next start), `stop(node)` a
clean shutdown; `start(node)` brings it back on the same ports with its data. `leader_of()` and
`active_controller()` say whom to kill; `wait_in_sync()` waits until every replica has caught up again (what
a rolling restart waits for between nodes).

Not guaranteed: the ports are free when first picked, so a restart fails loudly if another program took one;
failure detection is tuned for tests (a dead broker is fenced after `SESSION_TIMEOUT_MS`), not production.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from icefall.devstack.kafka import LOG4J2
from icefall.devstack.procs import ManagedProcess, StartError, free_port, java, run_checked
from icefall.devstack.tools import tool_dir

#: A broker that has not heartbeated for this long is fenced by the controller and loses its leaderships.
SESSION_TIMEOUT_MS = 6000
REPLICATION = 3
MIN_INSYNC = 2


class KafkaNode:
    """One combined broker + controller of a `KafkaCluster`; `bootstrap` is its PLAINTEXT listener."""

    def __init__(self, workdir: Path, node_id: int, heap: str) -> None:
        self.workdir, self.node_id, self.heap = workdir, node_id, heap
        self.port = free_port()
        self.controller_port = free_port()
        self._proc: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "kafka.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "server.properties"

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def java(self, main: str, *args: str) -> list[str]:
        jars = tool_dir("ICEFALL_KAFKA_JARS")
        return [
            *java(
                f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            ),
            "-cp", f"{jars}/*", main, *args,
        ]  # fmt: skip

    def write_config(self, voters: str, log_level: str) -> None:
        self.data_dir.mkdir(parents=True)
        (self.workdir / "log4j2.properties").write_text(LOG4J2.format(level=log_level))
        settings = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            "default.replication.factor": REPLICATION,
            "min.insync.replicas": MIN_INSYNC,
            "auto.create.topics.enable": "false",
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": REPLICATION,
            "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": REPLICATION,
            "transaction.state.log.min.isr": MIN_INSYNC,
            "transaction.state.log.num.partitions": 3,
            "share.coordinator.state.topic.replication.factor": REPLICATION,
            "share.coordinator.state.topic.min.isr": MIN_INSYNC,
            "group.initial.rebalance.delay.ms": 0,
            # Quick failure detection (tests wait on it), few threads (three JVMs on two cores).
            "broker.session.timeout.ms": SESSION_TIMEOUT_MS,
            "broker.heartbeat.interval.ms": 1000,
            "replica.lag.time.max.ms": 10000,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "num.replica.fetchers": 1,
            "background.threads": 2,
            "log.cleaner.threads": 1,
            "num.recovery.threads.per.data.dir": 1,
        }
        self.config_path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))

    def start(self) -> None:
        if self.running():
            raise RuntimeError(f"kafka node {self.node_id} is already running")
        self._proc = ManagedProcess(
            f"kafka-{self.node_id}", self.java("kafka.Kafka", str(self.config_path)), self.log_path
        ).start()

    def wait_ready(self, timeout: float) -> None:
        if self._proc is None:
            raise RuntimeError(f"kafka node {self.node_id} was not started")
        self._proc.wait_ready(self._registered, timeout, "registered with the cluster")

    def _registered(self) -> bool:
        from confluent_kafka.admin import AdminClient

        # A plain connect first: an AdminClient pointed at a closed port logs a line every 50 ms.
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            pass
        metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
        return self.node_id in metadata.brokers  # unfenced: the controller counts it in

    def kill(self) -> None:
        """SIGKILL to the node's process group: no clean shutdown, its log is recovered on the next start."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): leaderships are handed over first."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(grace=60)

    def quorum_state(self) -> dict[str, int]:
        """What this node last knew of the controller quorum: `leaderId`, `leaderEpoch` (its file)."""
        path = self.data_dir / "__cluster_metadata-0" / "quorum-state"
        data = json.loads(path.read_text())
        return {"leaderId": int(data.get("leaderId", -1)), "leaderEpoch": int(data.get("leaderEpoch", -1))}


class KafkaCluster:
    """`nodes` combined broker + controller nodes (ids 1..nodes); `start()` formats and starts them all.
    `bootstrap` names every node, as clients of a real cluster are configured."""

    def __init__(self, workdir: Path, *, nodes: int = 3, heap: str = "384m", log_level: str = "WARN") -> None:
        if workdir.exists():
            shutil.rmtree(workdir)
        self.workdir, self.log_level = workdir, log_level
        self.nodes = {i: KafkaNode(workdir / f"node-{i}", i, heap) for i in range(1, nodes + 1)}

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id]

    def start(self, timeout: float = 180) -> KafkaCluster:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes.values())
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        for node in self.nodes.values():
            node.write_config(voters, self.log_level)

        def format_storage(node: KafkaNode) -> None:
            # "=" form: a random id may start with "-", which would read as an option.
            argv = node.java(
                "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(node.config_path)
            )
            run_checked(argv, node.log_path, f"formatting Kafka node {node.node_id}'s storage")

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(format_storage, self.nodes.values()))
        try:
            for node in self.nodes.values():
                node.start()
            for node in self.nodes.values():
                node.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (SIGKILL: the cluster is thrown away, nothing to hand over)."""
        for node in self.nodes.values():
            node.kill()

    def kill(self, node_id: int) -> None:
        self.nodes[node_id].kill()

    def restart(self, node_id: int, timeout: float = 120) -> None:
        """Start a stopped or killed node again and wait until the controller counts it in."""
        node = self.nodes[node_id]
        node.start()
        node.wait_ready(timeout)

    def heal(self, topics: tuple[str, ...] = (), timeout: float = 120) -> None:
        """Start every node that is down; then every replica of `topics` in sync."""
        for node in self.nodes.values():
            if not node.running():
                self.restart(node.node_id, timeout)
        if topics:
            self.wait_in_sync(topics, timeout)

    def _metadata(self, topic: str | None = None) -> object:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=10)

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading `topic`'s `partition` now."""
        metadata = self._metadata(topic)
        return int(metadata.topics[topic].partitions[partition].leader)  # type: ignore[attr-defined]

    def partition_count(self, topic: str) -> int:
        return len(self._metadata(topic).topics[topic].partitions)  # type: ignore[attr-defined]

    def active_controller(self) -> int:
        """The node id of the controller quorum's leader, from the newest epoch any running node recorded."""
        states = [node.quorum_state() for node in self.nodes.values() if node.running()]
        newest = max(states, key=lambda state: state["leaderEpoch"])
        if newest["leaderId"] < 0:
            raise RuntimeError(f"the controller quorum has no leader: {states}")
        return newest["leaderId"]

    def wait_in_sync(self, topics: tuple[str, ...], timeout: float = 120) -> None:
        """Until every partition of `topics` has all its replicas in sync and a leader."""
        deadline = time.monotonic() + timeout
        lagging: list[str] = []
        while time.monotonic() < deadline:
            lagging = []
            for topic in topics:
                partitions = self._metadata(topic).topics[topic].partitions  # type: ignore[attr-defined]
                lagging += [
                    f"{topic}[{p}] isr={info.isrs} leader={info.leader}"
                    for p, info in partitions.items()
                    if len(info.isrs) < len(info.replicas) or info.leader < 0
                ]
            if not lagging:
                return
            time.sleep(0.5)
        raise StartError(f"replicas not in sync after {timeout:.0f}s: {lagging}")

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        """A topic with replication factor 3 (`min.insync.replicas` 2, the cluster's default)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        topic = NewTopic(name, num_partitions=partitions, replication_factor=REPLICATION, config=config or {})
        admin.create_topics([topic])[name].result(30)
        self.wait_in_sync((name,))
