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
from typing import TYPE_CHECKING

from icefall.devstack.procs import ManagedProcess, free_port, java, run_checked
from icefall.devstack.tools import tool_dir

if TYPE_CHECKING:
    from icefall.devstack.tls import Pki

#: The SCRAM mechanisms every `scram_users` user can log in with.
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")

LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = STDOUT
"""


class KafkaBroker:
    """Start with `start()`, stop with `stop()`; `bootstrap` is `127.0.0.1:<port>` of the PLAINTEXT listener,
    the default and inter-broker one.

    Optional listeners, each on its own port (`bootstrap_of(<listener>)`):
    - `SASL_PLAINTEXT`, with `sasl_users` (name -> password, mechanism PLAIN) and/or `scram_users` (name ->
      password, mechanisms SCRAM-SHA-256 and SCRAM-SHA-512; the credentials are stored at format time);
    - with `tls` (an `icefall.devstack.tls.Pki`): `SSL` (server authentication only), `SASL_SSL` (the SASL
      users above over TLS) and `MTLS` (protocol SSL, a client certificate signed by the CA required).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        heap: str = "768m",
        log_level: str = "WARN",
        sasl_users: Mapping[str, str] | None = None,
        scram_users: Mapping[str, str] | None = None,
        tls: Pki | None = None,
    ) -> None:
        self.workdir = workdir
        self.heap = heap
        self.log_level = log_level
        self.sasl_users = dict(sasl_users or {})
        self.scram_users = dict(scram_users or {})
        self.tls = tls
        self.port = 0
        self.controller_port = 0
        self.ports: dict[str, int] = {}  # the optional listeners' ports, by listener name
        self._proc: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """`127.0.0.1:<port>` of the SASL_PLAINTEXT listener; only with `sasl_users` or `scram_users`."""
        return self.bootstrap_of("SASL_PLAINTEXT")

    def bootstrap_of(self, listener: str) -> str:
        """`127.0.0.1:<port>` of an optional listener: SASL_PLAINTEXT, SSL, SASL_SSL or MTLS."""
        if listener not in self._listeners():
            raise RuntimeError(
                f"this broker has no {listener} listener (SASL ones need sasl_users or scram_users, TLS "
                "ones tls)"
            )
        if listener not in self.ports:
            raise RuntimeError("the broker was never started")
        return f"127.0.0.1:{self.ports[listener]}"

    def _listeners(self) -> dict[str, str]:
        """The optional listeners this broker has: name -> security protocol."""
        sasl = bool(self.sasl_users or self.scram_users)
        listeners = {"SASL_PLAINTEXT": "SASL_PLAINTEXT"} if sasl else {}
        if self.tls is not None:
            listeners["SSL"] = "SSL"
            if sasl:
                listeners["SASL_SSL"] = "SASL_SSL"
            listeners["MTLS"] = "SSL"
        return listeners

    def _listener_config(self) -> list[str]:
        optional = self._listeners()
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        listeners += [f"{name}://127.0.0.1:{self.ports[name]}" for name in optional]
        protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        protocols += [f"{name}:{protocol}" for name, protocol in optional.items()]
        extra: list[str] = []
        mechanisms = (["PLAIN"] if self.sasl_users else []) + (list(SCRAM) if self.scram_users else [])
        if mechanisms:
            extra.append(f"sasl.enabled.mechanisms={','.join(mechanisms)}")
        for name, protocol in optional.items():
            if not protocol.startswith("SASL_"):
                continue
            if self.sasl_users:
                users = " ".join(f"user_{user}={json.dumps(pw)}" for user, pw in self.sasl_users.items())
                extra.append(
                    f"listener.name.{name.lower()}.plain.sasl.jaas.config="
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
                )
            if self.scram_users:
                extra += [
                    f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config="
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                    for mechanism in SCRAM
                ]
        if self.tls is not None:
            extra += [
                # PEM files: no keytool. The trust store is the CA that signs the clients' certificates.
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={self.tls.server_keystore_path}",
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={self.tls.ca_path}",
                "listener.name.mtls.ssl.client.auth=required",
            ]
        return [
            f"listeners={','.join(listeners)},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners={','.join(listeners)}",
            f"listener.security.protocol.map={','.join(protocols)}",
            *extra,
        ]

    @property
    def log_path(self) -> Path:
        return self.workdir / "kafka.log"

    def _java(self, main: str, *args: str) -> list[str]:
        jars = tool_dir("ICEFALL_KAFKA_JARS")
        return [
            *java(
                f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            ),
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
        self.ports = {name: free_port() for name in self._listeners()}
        (self.workdir / "log4j2.properties").write_text(LOG4J2.format(level=self.log_level))
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
        # SCRAM credentials are metadata records: written at format time, before any listener accepts.
        scram = [
            f"--add-scram={mechanism}=[name={user},password={password}]"
            for user, password in self.scram_users.items()
            for mechanism in SCRAM
        ]
        run_checked(
            self._java(
                "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(config), *scram
            ),
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
