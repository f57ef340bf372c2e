"""Dead letters reach a real Kafka topic with their original key, value and headers, the exact reason and
the source coordinates; records read from a real topic through Spark's Kafka source are each either good or
sent to the dead-letter topic exactly once by one call; a delivery failure raises.

Delivery to the topic is at least once: a writer that crashes after sending a batch's dead letters and
before committing the batch sends them again from the next writer (another epoch). Proved here: every
dead letter carries `icefall.dedupe-key` (source topic id, partition, offset) and `icefall.epoch`; keeping
the first record per key leaves each bad record exactly once; a source topic deleted and created again
gives its records new keys although their partitions and offsets repeat."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession

from icefall import cli
from icefall.api import StreamingTableSpec, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.decode.decode import prepare
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.kafka.admin import TopicView
from icefall.kafka.dead_letters import DeadLetterDeliveryError, Source, produce_dead_letters
from icefall.runtime.failpoints import FailpointError, armed
from icefall.testing.streams import audit, drain, manifest_text, recreate_topic
from icefall.testing.streams import produce as stream_produce

pytestmark = pytest.mark.integration

MAX_RECORD_BYTES = 300
TS = "2026-11-22T10:00:00Z"


def make_spec(topic: str, dead_letter_topic: str) -> StreamingTableSpec:
    manifest = f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: dlq-orders}}
spec:
  source: {{bootstrapServers: "localhost:9092", topic: {topic}}}
  format:
    type: json
    schema:
      - {{name: id, type: long, required: true}}
      - {{name: customer, type: string}}
      - {{name: amount, type: "decimal(10,2)"}}
      - {{name: ts, type: timestamptz, required: true}}
  deadLetter: {{topic: {dead_letter_topic}, maxRecordBytes: {MAX_RECORD_BYTES}}}
"""
    return load_manifest(manifest).spec


@dataclass(frozen=True)
class Input:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    reason: str | None  # None: a good record


def good(i: int, partition: int) -> Input:
    value = json.dumps({"id": i, "customer": f"c{i}", "amount": 12.5, "ts": TS}).encode()
    return Input(partition, b"k%d" % i, value, [("trace", b"t-%d" % i)], None)


OVERSIZED = json.dumps({"id": 5, "customer": "x" * 400, "ts": TS}).encode()
BAD = [
    Input(0, b"bad-json", b'{"id": 1, "customer": "c', [("trace", b"t-b1")],
          """malformed JSON: '{"id": 1, "customer": "c'"""),
    Input(1, b"no-ts", b'{"id": 2, "customer": "c2"}', [], "required field 'ts' is missing or null"),
    Input(0, b"wrong-type", json.dumps({"id": "two", "ts": TS}).encode(), [("a", None), ("b", b"")],
          "field 'id': 'two' does not fit long"),
    Input(1, None, json.dumps({"id": None, "ts": TS}).encode(), [], "required field 'id' is missing or null"),
    Input(0, b"big", OVERSIZED, [("trace", b"t-b5")],
          f"record is {len(OVERSIZED)} bytes, over the limit of {MAX_RECORD_BYTES} "
          "(spec.deadLetter.maxRecordBytes)"),
    Input(1, b"decimal", b'{"id": 6, "amount": 123456789012.5, "ts": "' + TS.encode() + b'"}', [],
          "field 'amount': '1.234567890125E11' does not fit decimal(10,2)"),
    # A record that already carries an icefall.error header (a replayed dead letter): ours comes last.
    Input(0, b"replayed", None, [("icefall.error", b"earlier reason")],
          "tombstone: the record's value is null"),
]  # fmt: skip


def produce(kafka: KafkaBroker, topic: str, inputs: list[Input]) -> dict[tuple[int, int], tuple[Input, int]]:
    """Produce `inputs` to their partitions; returns {(partition, offset): (input, produce timestamp ms)}.

    Timestamps are set explicitly, so the header can be checked exactly, and recent: the test broker
    enforces retention every second, and records older than 7 days would vanish before Spark reads them.
    """
    base_ts = int(time.time() * 1000) - 60_000
    placed: dict[tuple[int, int], tuple[Input, int]] = {}
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for n, item in enumerate(inputs):
        timestamp = base_ts + n

        def on_delivery(err: object, msg: object, item: Input = item, timestamp: int = timestamp) -> None:
            assert err is None, err
            placed[(msg.partition(), msg.offset())] = (item, timestamp)  # type: ignore[attr-defined]

        producer.produce(
            topic,
            key=item.key,
            value=item.value,
            headers=[*item.headers],
            partition=item.partition,
            timestamp=timestamp,
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0
    assert len(placed) == len(inputs)
    return placed


def read_with_spark(spark: SparkSession, kafka: KafkaBroker, topic: str) -> DataFrame:
    with TopicView(kafka.bootstrap, topic) as view:
        marks = view.watermarks()
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("assign", json.dumps({topic: sorted(marks)}))
        .option("startingOffsets", json.dumps({topic: {str(p): low for p, (low, _) in marks.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): high for p, (_, high) in marks.items()}}))
        .option("includeHeaders", "true")
        .load()
    )


@dataclass(frozen=True)
class Received:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, str | bytes | None]]  # the client's type; values are bytes or None

    def header(self, name: str) -> str:
        """The last value of header `name`, as text."""
        values = [value for key, value in self.headers if key == name]
        assert values and isinstance(values[-1], bytes), f"no header {name} in {self.headers}"
        return values[-1].decode()


def consume_all(kafka: KafkaBroker, topic: str) -> Iterator[Received]:
    """Every record of `topic`, up to the high watermarks."""
    with TopicView(kafka.bootstrap, topic) as view:
        remaining = {p: high - low for p, (low, high) in view.watermarks().items() if high > low}
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "dlq-test", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in remaining])
        idle_polls = 0
        while any(remaining.values()):
            msg = consumer.poll(1.0)
            if msg is None:
                idle_polls += 1
                assert idle_polls < 60, f"records of {topic} never arrived: {remaining} left"
                continue
            assert msg.error() is None, msg.error()
            partition, headers = msg.partition(), msg.headers() or []
            assert partition is not None and isinstance(headers, list)  # a list of (key, value) here
            remaining[partition] -= 1
            yield Received(msg.key(), msg.value(), headers)
    finally:
        consumer.close()


def test_bad_records_reach_the_dead_letter_topic_once_with_reason_and_source(
    kafka: KafkaBroker, spark: SparkSession
) -> None:
    topic, dlq = "dlq-src", "dlq-src-dead"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(dlq, partitions=2)
    inputs = [good(i, i % 2) for i in range(100, 106)] + BAD + [good(i, i % 2) for i in range(106, 110)]
    placed = produce(kafka, topic, inputs)

    prepared = prepare(read_with_spark(spark, kafka, topic), make_spec(topic, dlq))
    with TopicView(kafka.bootstrap, topic) as view:
        topic_id = view.topic_id()
    source = Source(topic, topic_id, epoch=3)
    sent = produce_dead_letters(prepared.bad, bootstrap=kafka.bootstrap, topic=dlq, source=source)
    valid = prepared.good.count()

    assert sent == len(BAD)
    assert valid + sent == len(inputs)
    received: dict[tuple[int, int], list[Received]] = {}
    for record in consume_all(kafka, dlq):
        source = (int(record.header("icefall.source.partition")), int(record.header("icefall.source.offset")))
        received.setdefault(source, []).append(record)
    expected = {coordinates for coordinates, (item, _) in placed.items() if item.reason is not None}
    assert set(received) == expected
    for coordinates, records in received.items():
        assert len(records) == 1, f"{coordinates} was dead-lettered {len(records)} times"
        [record] = records
        item, timestamp = placed[coordinates]
        assert record.header("icefall.error") == item.reason
        assert record.header("icefall.source.topic") == topic
        assert record.header("icefall.source.timestamp") == str(timestamp)
        assert record.header("icefall.source.topic-id") == topic_id
        assert record.header("icefall.epoch") == "3"
        assert record.header("icefall.dedupe-key") == f"{topic_id}/{coordinates[0]}/{coordinates[1]}"
        assert (record.key, record.value) == (item.key, item.value)
        assert record.headers[: len(item.headers)] == item.headers
        assert [key for key, _ in record.headers[len(item.headers) :]] == [
            "icefall.error",
            "icefall.source.topic",
            "icefall.source.topic-id",
            "icefall.source.partition",
            "icefall.source.offset",
            "icefall.source.timestamp",
            "icefall.epoch",
            "icefall.dedupe-key",
        ]


def dead_letter_rows(spark: SparkSession) -> DataFrame:
    schema = (
        "partition int, offset bigint, timestamp timestamp, key binary, value binary, "
        "headers array<struct<key:string,value:binary>>, error string, ingested_at timestamp"
    )
    now = datetime(2026, 11, 22, 10, 0, 0)
    return spark.createDataFrame([(0, 41, now, b"k", b"{oops", [], "malformed JSON: '{oops'", now)], schema)


def test_a_failed_delivery_raises(kafka: KafkaBroker, spark: SparkSession) -> None:
    # The broker does not create topics on demand: the record can never be delivered.
    with pytest.raises(DeadLetterDeliveryError, match="dlq-missing"):
        produce_dead_letters(
            dead_letter_rows(spark),
            bootstrap=kafka.bootstrap,
            topic="dlq-missing",
            source=Source("orders"),
            kafka_config={"message.timeout.ms": "3000"},
        )


def test_no_bad_records_sends_nothing(spark: SparkSession) -> None:
    no_rows = dead_letter_rows(spark).limit(0)
    # Nothing listens on port 1: a batch without bad records never needs the dead-letter cluster.
    assert produce_dead_letters(no_rows, bootstrap="127.0.0.1:1", topic="t", source=Source("orders")) == 0


def test_a_crash_before_the_commit_resends_dead_letters_that_the_dedupe_key_removes(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """Real ingestion, dead letters to a topic only: the first writer sends a batch's dead letters, then
    crashes before its commit (failpoint); the next writer (a newer epoch) sends them again. Then the source
    topic is deleted, created again and refilled: same partitions and offsets, new keys."""
    topic, dlq, name = "dlq-crash-src", "dlq-crash-dead", "dlq_crash"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(dlq, partitions=1)
    bad = stream_produce(kafka, topic, 0, 30, bad_every=4)
    text = manifest_text(name, topic, kafka.bootstrap) + (
        f"  deadLetter: {{topic: {dlq}, table: {{enabled: false}}}}\n"
    )
    st = load_manifest(text)
    with TopicView(kafka.bootstrap, topic) as view:
        first_id = view.topic_id()

    def writer(holder: str) -> Ingestor:
        ingestor = Ingestor(
            st, catalog_config, spark, FileLease(tmp_path / "lease.json", holder, duration_seconds=30)
        )
        ingestor.start(lease_timeout=30)
        return ingestor

    crashed = writer("w1")
    try:
        with armed("main.before-commit", "raise"), pytest.raises(FailpointError):
            crashed.run_batch()
    finally:
        crashed.close()
    second = writer("w2")
    try:
        drain(second)
    finally:
        second.close()
    assert second.epoch > crashed.epoch

    received = list(consume_all(kafka, dlq))
    by_key: dict[str, list[Received]] = {}
    for record in received:
        by_key.setdefault(record.header("icefall.dedupe-key"), []).append(record)
    expected_keys = {f"{first_id}/{p}/{o}" for p, o in bad}
    assert set(by_key) == expected_keys
    assert len(received) == 2 * len(bad), "each dead letter was sent twice: before the crash and after"
    for copies in by_key.values():
        assert sorted(int(c.header("icefall.epoch")) for c in copies) == [crashed.epoch, second.epoch]
        assert len({(c.key, c.value, c.header("icefall.error")) for c in copies}) == 1
    # The table holds the good records once; the auditor counts the bad ones as sent to the topic.
    report = audit(catalog_config, name, kafka.bootstrap, spark=spark, st=st)
    assert report.ok and report.content_checked, report.render()
    assert sum(p.dead_letters_elsewhere for p in report.partitions) == len(bad), report.render()

    # The source topic recreated and refilled: its records reuse the partitions and offsets, not the keys.
    recreate_topic(kafka, topic, partitions=2)
    again = stream_produce(kafka, topic, 0, 30, bad_every=4)
    with TopicView(kafka.bootstrap, topic) as view:
        second_id = view.topic_id()
    assert second_id != first_id and again & bad
    assert (
        cli.main(["reset-offsets", "-f", str(write(tmp_path, text)), "--state-dir", state_of(catalog_config)])
        == 0
    )
    third = writer("w3")
    try:
        drain(third)
    finally:
        third.close()
    keys = [r.header("icefall.dedupe-key") for r in consume_all(kafka, dlq)]
    assert set(keys) == expected_keys | {f"{second_id}/{p}/{o}" for p, o in again}
    assert len(set(keys)) == len(bad) + len(again), "deduplicated: each bad record of each topic once"


def write(tmp_path: Path, text: str) -> Path:
    manifest = tmp_path / "table.yaml"
    manifest.write_text(text)
    return manifest


def state_of(config: CatalogConfig) -> str:
    return str(config.database.parent)
