"""A real Apache Kafka 4 broker in KRaft combined mode on loopback, run from the Maven-resolved jars.

Used by the tests, `make demo` and the benchmarks. One node, replication factor 1, free ports,
storage formatted with `kafka.tools.StorageTool` in a fresh folder on the first start. `stop()` followed by
`start()` is a broker restart: the same ports, listeners, cluster id and log folder, so every record and
topic written before the outage is there after it (what a client sees of a broker that went away and came
back). Not guaranteed: the ports are free when first picked, so a restart fails loudly if another program
took one during the outage.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path

from icefall.devstack.procs import ManagedProcess, free_port, run_checked
from icefall.devstack.tools import tool_dir

_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = STDOUT
"""


class KafkaBroker:
    """Start with `start()`, stop with `stop()`; `bootstrap` is `127.0.0.1:<port>`.

    With `sasl_users` (name -> password) the broker also listens on `sasl_bootstrap` with SASL_PLAINTEXT
    and mechanism PLAIN for those users; PLAINTEXT stays the default and inter-broker listener.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        heap: str = "768m",
        log_level: str = "WARN",
        sasl_users: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.heap = heap
        self.log_level = log_level
        self.sasl_users = dict(sasl_users or {})
        self.port = 0
        self.controller_port = 0
        self.sasl_port = 0
        self._proc: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """`127.0.0.1:<port>` of the SASL_PLAINTEXT (PLAIN) listener; only with `sasl_users`."""
        if not self.sasl_users:
            raise RuntimeError("this broker has no SASL listener; create it with sasl_users")
        return f"127.0.0.1:{self.sasl_port}"

    def _listener_config(self) -> list[str]:
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        advertised = list(listeners)
        protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        extra = []
        if self.sasl_users:
            sasl = f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
            listeners.append(sasl)
            advertised.append(sasl)
            protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
            users = " ".join(f"user_{name}={json.dumps(pw)}" for name, pw in self.sasl_users.items())
            extra = [
                "sasl.enabled.mechanisms=PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            ]
        return [
            f"listeners={','.join(listeners)},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners={','.join(advertised)}",
            f"listener.security.protocol.map={','.join(protocols)}",
            *extra,
        ]

    @property
    def log_path(self) -> Path:
        return self.workdir / "kafka.log"

    def _java(self, main: str, *args: str) -> list[str]:
        jars = tool_dir("ICEFALL_KAFKA_JARS")
        java = shutil.which("java") or "java"
        return [
            java, f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp", f"{jars}/*", main, *args,
        ]  # fmt: skip

    def start(self, timeout: float = 90) -> KafkaBroker:
        """First call: a fresh folder, ports and formatted storage. Later calls (after `stop()`): the same
        broker again, with its data."""
        if self._proc is not None:
            raise RuntimeError("the broker is already running")
        config = self.workdir / "server.properties"
        if self.port == 0:
            self._format(config)
        self._proc = ManagedProcess("kafka", self._java("kafka.Kafka", str(config)), self.log_path).start()
        self._proc.wait_ready(self._ready, timeout, "accepting requests")
        return self

    def _format(self, config: Path) -> None:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        data = self.workdir / "data"
        data.mkdir(parents=True)
        self.port, self.controller_port = free_port(), free_port()
        self.sasl_port = free_port() if self.sasl_users else 0
        (self.workdir / "log4j2.properties").write_text(_LOG4J2.format(level=self.log_level))
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    *self._listener_config(),
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={data}",
                    "num.partitions=1",
                    "auto.create.topics.enable=false",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    # Tests delete old segments on purpose (retention); make that quick to observe.
                    "log.retention.check.interval.ms=1000",
                    "log.segment.delete.delay.ms=0",
                    "",
                ]
            )
        )
        # "=" form: a random id may start with "-", which would read as an option.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        run_checked(
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(config)),
            self.log_path,
            "formatting Kafka storage",
        )

    def _ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        # A plain connect first: an AdminClient pointed at a closed port logs a line every 50 ms.
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            pass
        metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
        return bool(metadata.brokers)

    def stop(self) -> None:
        """Stop the broker (a clean shutdown); its ports and data are kept for the next `start()`."""
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        create_topic(self.bootstrap, name, partitions, config)

    def add_partitions(self, name: str, total: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_partitions([NewPartitions(name, total)])[name].result(30)


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    """Create topic `name` (replication factor 1) on the broker at `bootstrap`."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
    )
    futures[name].result(30)
