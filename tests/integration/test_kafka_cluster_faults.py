"""Broker faults of a three-node Kafka cluster under a running `icefall run`: exactly once by content.

The cluster (`kafka_cluster`: KRaft, three combined broker + controller nodes, replication factor 3,
`min.insync.replicas` 2) serves a topic that keeps receiving records (idempotent producers, `acks=all`)
while one `icefall run` process (local Spark, as a user starts it) ingests it into a table of the test
stack's SQLite catalog. Then the table must hold every record exactly once: record by record, by the
auditor, and by content (every row equals its Kafka record, compared through the `spark` fixture).

Proves, each fault in the middle of ingestion:
- SIGKILL of a partition's leader (`make test`): leadership moves to an in-sync replica, ingestion follows
  it, and the killed node's unclean restart (its log recovered) rejoins the ISR;
- (`long`) SIGKILL of the active controller: the quorum elects another one;
- (`long`) a rolling restart: each node shut down cleanly and started again, the next one only once every
  replica is back in sync;
- (`long`) a transactional producer's coordinator SIGKILLed with a transaction open (its records flushed
  to the partitions' logs): the producer aborts through the new coordinator, and those records (read
  past with read_committed) are never in the table, while the transactions committed before and after are.

Not proven here: unclean leader election (off, Kafka's default: a partition with no in-sync replica left
waits instead of losing acknowledged records); two nodes down at once (writes with `acks=all` stop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka_cluster import KafkaCluster
from icefall.testing.live_run import LiveRun
from icefall.testing.streams import NAMESPACE, assert_exactly_once, audit, manifest_text, produce, watermarks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

FAULT_TIMEOUT = pytest.mark.timeout(1200)


class Traffic:
    """Records `start..` produced in chunks of 20 from a thread until `stop()`; a delivery that fails (a
    producer's flush that times out) fails the test at `stop()`."""

    def __init__(self, cluster: KafkaCluster, topic: str, start: int) -> None:
        self.cluster, self.topic, self.produced = cluster, topic, start
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"traffic-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.2):
                produce(self.cluster, self.topic, self.produced, 20)
                self.produced += 20
        except BaseException as exc:  # reported by stop(), in the test's thread
            self._error = exc

    def stop(self) -> int:
        """Stop producing; the number of records produced in all."""
        self._stop.set()
        self._thread.join(120)
        if self._error is not None:
            raise AssertionError(f"producing to {self.topic} failed: {self._error!r}") from self._error
        return self.produced


@contextmanager
def ingesting(
    cluster: KafkaCluster, config: CatalogConfig, tmp_path: Path, name: str, partitions: int = 3
) -> Iterator[LiveRun]:
    """A new topic with 300 records and `icefall run` committing them; on the way out the run is stopped
    and every node of the cluster running again with the topic in sync."""
    topic = f"it-cluster-{name.replace('_', '-')}"
    cluster.create_topic(topic, partitions=partitions)
    produce(cluster, topic, 0, 300)
    block = {"name": config.name, "type": "sql", "uri": config.uri, "warehouse": config.warehouse}
    batch = {"maxRecords": 100, "minIntervalSeconds": 0}
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, cluster.bootstrap, catalog=block, batch=batch))
    run = LiveRun(manifest, config=config, kafka=cluster, name=name, topic=topic, state=tmp_path / "state")
    try:
        yield run
    finally:
        try:
            run.stop()
        finally:
            cluster.heal((topic,))


def fault_under_traffic(
    cluster: KafkaCluster,
    config: CatalogConfig,
    spark: SparkSession,
    tmp_path: Path,
    name: str,
    *,
    fault: Callable[[KafkaCluster, str], None],
) -> None:
    """Records keep coming while `fault(cluster, topic)` runs in the middle of ingestion; once the cluster
    is whole again and the table caught up, every record is in it exactly once, by content."""
    with ingesting(cluster, config, tmp_path, name) as run:
        run.wait_ingesting()
        traffic = Traffic(cluster, run.topic, 300)
        try:
            fault(cluster, run.topic)
        finally:
            produced = traffic.stop()
        cluster.heal((run.topic,))
        produce(cluster, run.topic, produced, 100)  # after the fault, with every node back
        run.wait_caught_up()
        run.stop()
        assert "Traceback" not in run.text(), run.tail()
    high = watermarks(cluster, run.topic)
    assert sum(high.values()) == produced + 100
    assert_exactly_once(config, name, high, set(), bootstrap=cluster.bootstrap, spark=spark)


def test_sigkill_of_a_partition_leader_during_ingestion(
    kafka_cluster: KafkaCluster, catalog_config: CatalogConfig, spark: SparkSession, tmp_path: Path
) -> None:
    def kill_leader(cluster: KafkaCluster, topic: str) -> None:
        leader = cluster.leader_of(topic, 0)
        cluster.kill(leader)
        time.sleep(2)
        # The controller fences the dead node and elects another leader from the in-sync replicas.
        deadline = time.monotonic() + 60
        while cluster.leader_of(topic, 0) in (leader, -1):
            assert time.monotonic() < deadline, f"{topic}[0] still led by killed node {leader}"
            time.sleep(0.5)
        time.sleep(5)  # ingestion goes on with two nodes before the killed one comes back

    fault_under_traffic(
        kafka_cluster, catalog_config, spark, tmp_path, "cluster_leader_kill", fault=kill_leader
    )


@pytest.mark.long  # `make test-all`: a Spark driver per fault; `make test` has the leader kill
@FAULT_TIMEOUT
def test_sigkill_of_the_active_controller_during_ingestion(
    kafka_cluster: KafkaCluster, catalog_config: CatalogConfig, spark: SparkSession, tmp_path: Path
) -> None:
    def kill_controller(cluster: KafkaCluster, topic: str) -> None:
        controller = cluster.active_controller()
        cluster.kill(controller)
        deadline = time.monotonic() + 60
        while True:
            time.sleep(0.5)
            try:
                if cluster.active_controller() != controller:
                    break
            except (OSError, ValueError, KeyError):  # a file being rewritten
                pass
            assert time.monotonic() < deadline, f"no controller elected after node {controller} was killed"
        time.sleep(5)

    fault_under_traffic(
        kafka_cluster, catalog_config, spark, tmp_path, "cluster_controller_kill", fault=kill_controller
    )


@pytest.mark.long  # `make test-all`: a Spark driver per fault; `make test` has the leader kill
@FAULT_TIMEOUT
def test_rolling_restart_during_ingestion(
    kafka_cluster: KafkaCluster, catalog_config: CatalogConfig, spark: SparkSession, tmp_path: Path
) -> None:
    def rolling_restart(cluster: KafkaCluster, topic: str) -> None:
        for node in cluster.nodes.values():
            node.stop()
            time.sleep(2)
            cluster.restart(node.node_id)
            cluster.wait_in_sync((topic,))

    fault_under_traffic(
        kafka_cluster, catalog_config, spark, tmp_path, "cluster_rolling_restart", fault=rolling_restart
    )


def java_hash(text: str) -> int:
    """Java's `String.hashCode()` of `text` (ASCII): what places a transactional id on a coordinator."""
    value = 0
    for char in text:
        value = (31 * value + ord(char)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def transaction_coordinator(cluster: KafkaCluster, transactional_id: str) -> int:
    """The node leading the `__transaction_state` partition of `transactional_id` (Kafka's own rule)."""
    partitions = cluster.partition_count("__transaction_state")
    return cluster.leader_of("__transaction_state", (java_hash(transactional_id) & 0x7FFFFFFF) % partitions)


def table_ids(config: CatalogConfig, name: str) -> list[int]:
    rows = config.pyiceberg().load_table((NAMESPACE, name)).scan(selected_fields=("id",)).to_arrow()
    return sorted(rows.column("id").to_pylist())


@pytest.mark.long  # `make test-all`: a Spark driver per fault; `make test` has the leader kill
@FAULT_TIMEOUT
def test_a_transaction_aborted_by_the_kill_of_its_coordinator_never_lands(
    kafka_cluster: KafkaCluster, catalog_config: CatalogConfig, spark: SparkSession, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    cluster, name, txn_id = kafka_cluster, "cluster_txn_abort", "icefall-it-cluster-txn"
    with ingesting(cluster, catalog_config, tmp_path, name, partitions=2) as run:
        run.wait_ingesting()
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id})
        producer.init_transactions(60)

        def transaction(ids: range, *, commit: bool, before_end: Callable[[], None] = lambda: None) -> None:
            producer.begin_transaction()
            for i in ids:
                producer.produce(run.topic, key=str(i), value=manifest_event(i), partition=i % 2)
            assert producer.flush(60) == 0  # in the partitions' logs, not yet committed
            before_end()
            if commit:
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)

        transaction(range(300, 350), commit=True)
        coordinator = transaction_coordinator(cluster, txn_id)
        # The open transaction holds ingestion at its first offset; its coordinator dies; the producer then
        # aborts it through the coordinator elected in its place, which writes the abort markers.
        transaction(range(350, 400), commit=False, before_end=lambda: cluster.kill(coordinator))
        transaction(range(400, 450), commit=True)
        cluster.heal((run.topic,))
        run.wait_caught_up()
        run.stop()
    assert table_ids(catalog_config, name) == [*range(0, 350), *range(400, 450)]
    report = audit(catalog_config, name, cluster.bootstrap, spark=spark)
    assert report.ok, report.render()
    assert report.duplicates == report.missing == report.unexpected == report.wrong == 0, report.render()
    assert sum(report.partition(p).in_table for p in (0, 1)) == 400, report.render()


def manifest_event(i: int) -> bytes:
    """Record `i` as `produce` writes it (the test manifest's columns)."""
    import json

    return json.dumps(
        {"id": i, "customer": f"c{i % 7}", "amount": round(i * 1.25, 2), "ts": "2026-11-22T10:00:00Z"}
    ).encode()
