"""Kafka semantics people rely on, against a real broker, Spark's real Kafka source and the catalog.

Proves:
- transactions: records of aborted transactions never reach the table; a still-open transaction holds
  ingestion at the last stable offset (records after it, committed by another producer, wait too), and
  ingestion moves on by itself when the transaction commits; the offset gaps of transaction markers are
  committed past like any offset, and the auditor agrees record by record (ids compared, not only offsets);
- a compacted topic (offset gaps where Kafka removed older values of a key) is read through Spark, and the
  table holds exactly the records Kafka still holds;
- a topic deleted and created again under the same name is never skipped: ingestion stops with
  SourceChangedError naming `icefall reset-offsets` (the old code resumed at the old offsets and skipped the
  new topic's first records), `icefall verify` and `icefall status` fail, and after `icefall reset-offsets`
  ingestion goes on with every record of the new topic, the reset recorded in the table; the auditor then
  sets the old topic's rows aside (the reset's snapshot holds exactly them) and passes by content, although
  old and new rows share offsets 0..29 (it reported them as duplicates before);
- a partition added to the topic whose first records retention already deleted counts them as lost;
- the produce time status freshness is measured from is that of the first record past the table's offset
  that a read_committed reader sees (aborted records skipped).

Not proven here: brokers with more than one replica (leader elections, truncation by unclean election).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from icefall import cli
from icefall.api import ConditionReason
from icefall.catalog import CatalogConfig
from icefall.commands.run import EXIT_SOURCE_CHANGED
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.commit.state import OFFSET_RESETS
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor, SourceChangedError
from icefall.kafka.admin import TopicView
from icefall.testing.streams import (
    NAMESPACE,
    audit,
    drain,
    manifest_text,
    produce,
    recreate_topic,
    streaming_table,
    watermarks,
)

pytestmark = pytest.mark.integration


def event(i: int) -> bytes:
    return json.dumps({"id": i, "customer": f"c{i}", "amount": 1.5, "ts": "2026-11-22T10:00:00Z"}).encode()


def transactional(kafka: KafkaBroker, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    return producer


def send(producer: Producer, topic: str, ids: range) -> None:
    for i in ids:
        producer.produce(topic, key=str(i), value=event(i), partition=0)
    producer.flush(30)


def table_ids(config: CatalogConfig, name: str) -> list[int]:
    rows = config.pyiceberg().load_table((NAMESPACE, name)).scan(selected_fields=("id",)).to_arrow()
    return sorted(rows.column("id").to_pylist())


def ingestor_for(st: object, config: CatalogConfig, spark: SparkSession, tmp_path: Path) -> Ingestor:
    lease = FileLease(tmp_path / "lease.json", "w", duration_seconds=30)
    ingestor = Ingestor(st, config, spark, lease)  # type: ignore[arg-type]
    ingestor.start(lease_timeout=10)
    return ingestor


def test_aborted_transactions_never_land_and_open_ones_hold_ingestion(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-txn", "txn"
    kafka.create_topic(topic, partitions=1)
    first = transactional(kafka, "icefall-it-txn-1")
    first.begin_transaction()
    send(first, topic, range(0, 10))
    first.commit_transaction(30)
    first.begin_transaction()
    send(first, topic, range(10, 15))
    first.abort_transaction(30)
    first.begin_transaction()
    send(first, topic, range(15, 20))
    first.commit_transaction(30)

    ingestor = ingestor_for(streaming_table(name, topic, kafka.bootstrap), catalog_config, spark, tmp_path)
    try:
        drain(ingestor)
        assert table_ids(catalog_config, name) == [*range(0, 10), *range(15, 20)]

        # An open transaction, then records another producer commits after it: all wait for the first.
        pending = transactional(kafka, "icefall-it-txn-2")
        pending.begin_transaction()
        send(pending, topic, range(20, 25))
        later = transactional(kafka, "icefall-it-txn-3")
        later.begin_transaction()
        send(later, topic, range(25, 30))
        later.commit_transaction(30)
        stable = read_committed(catalog_config.pyiceberg().load_table((NAMESPACE, name))).offsets[0]
        assert ingestor.run_batch() is None, "nothing is readable past the open transaction"
        assert table_ids(catalog_config, name) == [*range(0, 10), *range(15, 20)]

        pending.commit_transaction(30)
        drain(ingestor)
    finally:
        ingestor.close()
    assert table_ids(catalog_config, name) == [*range(0, 10), *range(15, 30)]
    committed = read_committed(catalog_config.pyiceberg().load_table((NAMESPACE, name)))
    assert committed.offsets == watermarks(kafka, topic)
    # 30 records (5 of them aborted) and 5 markers (4 commits, 1 abort): offsets 0..34. The open transaction
    # began after 20 records and 3 markers, at offset 23: where ingestion had to wait.
    assert committed.offsets[0] == 30 + 5 and stable == 23
    report = audit(catalog_config, name, kafka.bootstrap)
    assert report.ok and report.partition(0).in_table == 25, report.render()


def test_freshness_reads_the_produce_time_of_the_first_committed_record_past_an_offset(
    kafka: KafkaBroker,
) -> None:
    """What status freshness is measured from (`TopicView.produce_times`): the first record past the table's
    offset that a read_committed reader sees; an aborted transaction's records are skipped."""
    topic = "it-produce-times"
    kafka.create_topic(topic, partitions=2)
    base = int(time.time() * 1000) - 60_000
    aborted = transactional(kafka, "icefall-it-times")
    aborted.begin_transaction()
    for i in range(3):
        aborted.produce(topic, value=event(i), partition=0, timestamp=base + 100 + i)
    aborted.abort_transaction(30)  # offsets 0..2, then the abort marker
    plain = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for partition, offset_time in ((0, 1), (0, 2), (1, 3), (1, 4)):
        plain.produce(topic, value=event(offset_time), partition=partition, timestamp=base + offset_time)
    assert plain.flush(30) == 0
    with TopicView(kafka.bootstrap, topic) as view:
        assert view.produce_times({0: 0, 1: 1}) == {0: base + 1, 1: base + 4}
        last = view.watermarks()[0][1] - 1
        assert view.produce_times({0: last}) == {0: base + 2}
        assert view.produce_times({}) == {}


def test_a_compacted_topic_is_read_through_its_offset_gaps(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-compacted", "compacted"
    kafka.create_topic(
        topic,
        partitions=1,
        config={"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
                "delete.retention.ms": "0"},
    )  # fmt: skip
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for round_ in range(3):  # keys k0..k9 written three times: the cleaner keeps the newest of each
        for key in range(10):
            producer.produce(topic, key=f"k{key}", value=event(round_ * 10 + key), partition=0)
        producer.flush(30)
        time.sleep(0.3)  # past segment.ms: the next record rolls a new segment, the old ones can be cleaned
    present = _wait_for_compaction(kafka, topic, total=30)
    producer.produce(topic, key="k-last", value=event(99), partition=0)
    producer.flush(30)

    ingestor = ingestor_for(streaming_table(name, topic, kafka.bootstrap), catalog_config, spark, tmp_path)
    try:
        drain(ingestor)
    finally:
        ingestor.close()
    held = _offsets_held(kafka, topic)
    high = watermarks(kafka, topic)
    assert len(held) < high[0] and set(held) >= {o for o in present if o >= held[0]}
    rows = (
        catalog_config.pyiceberg().load_table((NAMESPACE, name)).scan(selected_fields=("_kafka",)).to_arrow()
    )
    offsets = sorted(r["offset"] for r in rows.column("_kafka").to_pylist())
    assert offsets == held, "the table holds exactly the records the compacted topic holds"
    assert read_committed(catalog_config.pyiceberg().load_table((NAMESPACE, name))).offsets == high
    report = audit(catalog_config, name, kafka.bootstrap)
    assert report.ok, report.render()


def _offsets_held(kafka: KafkaBroker, topic: str) -> list[int]:
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "it-compacted", "enable.partition.eof": True}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[int] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is None:
            continue
        if message.error() is not None:
            break  # end of partition
        found.append(message.offset())
    consumer.close()
    return found


def _wait_for_compaction(kafka: KafkaBroker, topic: str, total: int, timeout: float = 90) -> list[int]:
    """Offsets held once the log cleaner removed some of the first `total` (an offset gap exists)."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = [o for o in _offsets_held(kafka, topic) if o < total]
        if len(held) < total:
            return held
        # The active segment is never cleaned: keep rolling it with a record the test discards later.
        producer.produce(topic, key="k9", value=event(29), partition=0)
        producer.flush(30)
        time.sleep(1)
    raise AssertionError(f"Kafka's log cleaner did not compact {topic} within {timeout}s")


def test_a_recreated_topic_stops_ingestion_until_the_offsets_are_reset(
    kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, name = "it-recreated", "recreated"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 30, partitions=[0])
    st = streaming_table(name, topic, kafka.bootstrap)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap))
    state_dir = str(catalog_config.database.parent)

    ingestor = ingestor_for(st, catalog_config, spark, tmp_path)
    try:
        drain(ingestor)
        table = catalog_config.pyiceberg().load_table((NAMESPACE, name))
        before = read_committed(table)
        assert before.offsets == {0: 30} and before.topic_id is not None

        recreate_topic(kafka, topic)
        # More records than the old topic had: resuming at offset 30 would skip the first 30 silently.
        produce(kafka, topic, 100, 40, partitions=[0])

        with pytest.raises(
            SourceChangedError, match=r"deleted and created again.*icefall reset-offsets"
        ) as raised:
            ingestor.run_batch()
        assert raised.value.reason is ConditionReason.TOPIC_RECREATED  # a driver's last words name it
        assert read_committed(table).snapshot_id == before.snapshot_id, "nothing was committed"
        report = audit(catalog_config, name, kafka.bootstrap)
        assert not report.ok and report.source_changed is not None
        assert "deleted and created again" in report.render()
        assert cli.main(["status", "-f", str(manifest), "--state-dir", state_dir]) == EXIT_SOURCE_CHANGED
        assert "INGESTION STOPPED" in capsys.readouterr().out
        status = ["status", "-f", str(manifest), "--state-dir", state_dir, "--output", "json"]
        assert cli.main(status) == EXIT_SOURCE_CHANGED
        shown = json.loads(capsys.readouterr().out)
        assert "deleted and created again" in shown["problem"]
        assert shown["partitions"] == [{"partition": 0, "committed": 30, "high": 40, "lag": 10}]

        assert cli.main(["reset-offsets", "-f", str(manifest), "--state-dir", state_dir]) == 0
        assert "now follows topic id" in capsys.readouterr().out
        assert cli.main(["reset-offsets", "-f", str(manifest), "--state-dir", state_dir]) == 1, "only once"
        drain(ingestor)
    finally:
        ingestor.close()

    assert table_ids(catalog_config, name) == [*range(0, 30), *range(100, 140)]
    table = catalog_config.pyiceberg().load_table((NAMESPACE, name))
    after = read_committed(table)
    assert after.offsets == {0: 40} and after.topic_id not in (None, before.topic_id)
    (reset,) = json.loads(table.properties[OFFSET_RESETS])
    assert reset["reason"] == "topic-recreated"
    assert (reset["from_topic_id"], reset["to_topic_id"]) == (before.topic_id, after.topic_id)
    assert (reset["from_offsets"], reset["to_offsets"]) == ({"0": 30}, {"0": 0})
    assert cli.main(["status", "-f", str(manifest), "--state-dir", state_dir]) == 0
    # Old rows at offsets 0..29 and new ones at 0..39: only the rows committed after the reset are audited.
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark)
    assert report.ok and report.content_checked, report.render()
    p0 = report.partition(0)
    assert (p0.in_table, p0.before_reset, p0.expected, p0.duplicates) == (40, 30, 40, 0), report.render()
    assert report.reset_note is not None and "30 set aside" in report.reset_note, report.render()


def test_a_partition_added_with_its_first_records_deleted_counts_them_lost(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-added-lost", "added_lost"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 10, partitions=[0])
    ingestor = ingestor_for(streaming_table(name, topic, kafka.bootstrap), catalog_config, spark, tmp_path)
    try:
        drain(ingestor)
        kafka.add_partitions(topic, 2)
        produce(kafka, topic, 10, 10, partitions=[1])
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.delete_records([TopicPartition(topic, 1, 4)])[TopicPartition(topic, 1, 4)].result(30)
        reports = drain(ingestor)
    finally:
        ingestor.close()
    assert sum(r.data_loss for r in reports) == 4
    committed = read_committed(catalog_config.pyiceberg().load_table((NAMESPACE, name)))
    assert committed.offsets == {0: 10, 1: 10} and committed.lost_records == 4
    assert table_ids(catalog_config, name) == [*range(0, 10), *range(14, 20)]


def test_an_unreachable_broker_is_one_line_naming_it_never_a_traceback(tmp_path: Path) -> None:
    """`status` and `verify` with the broker down: one line naming the bootstrap servers and the topic, a
    non-zero exit, no Python traceback. `icefall run` waits for the broker instead (one line per attempt;
    test_outages.py has it come back): stopped by `--max-seconds` while it is down, it exits 1."""
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text("down", "it-down", f"127.0.0.1:{port}"))
    state = str(tmp_path / "state")
    for command in (["status"], ["verify"], ["run", "--until-caught-up", "--max-seconds", "5"]):
        done = subprocess.run(
            [sys.executable, "-m", "icefall.cli", *command, "-f", str(manifest), "--state-dir", state],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode != 0, done.stdout
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        if command in (["status"], ["verify"]):
            # The table does not exist yet: that is said first, as plainly.
            assert last.startswith("icefall: ") and "does not exist yet" in last, last
        else:
            attempts = [line for line in done.stderr.splitlines() if "retrying in" in line]
            assert attempts and all(
                f"cannot reach Kafka at 127.0.0.1:{port} for topic 'it-down'" in line for line in attempts
            ), done.stderr[-3000:]
            assert "[run] stopped while Kafka was unreachable" in done.stdout, done.stdout[-3000:]
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "status", "-f", str(manifest), "--state-dir", state],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("icefall: cannot reach Kafka at"), done.stderr
