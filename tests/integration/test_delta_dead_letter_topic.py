"""A Delta table's dead letters (`spec.table.format: delta`) on a real Kafka topic, read from a real topic by
real Spark: the dead-letter topic is at least once with a dedupe key, exactly as an Iceberg table's
(kafka/dead_letters.py, test_dead_letter_topic.py).

Proves, with the Delta dead-letter table and without it (the topic only): each bad record reaches
`spec.deadLetter.topic` with its original key, value and headers, its reason (the dead-letter table's
error text, where there is one) and its source topic, topic id, partition and offset; a writer failing
right after a batch's dead letters are acknowledged and before the table's commit (`dlq-topic.after-produce`)
leaves them to be sent again by the next writer (a newer epoch, the same `icefall.dedupe-key`), so keeping
the first record per key gives each bad record exactly once, while the table holds each good record once
and the dead-letter table each bad one once. `icefall run` killed (status 137) after a dead-letter table's
commit (the dead letters not sent yet) and then between the topic and the table's commit, then run again:
the same.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from icefall.api.manifest import parse_manifest
from icefall.commit.delta import DeltaLog
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.delta_dead_letters import dead_letter_location
from icefall.ingest.delta_sink import DeltaIngestor
from icefall.kafka.admin import TopicView
from icefall.kafka.dead_letters import header
from icefall.runtime import failpoints
from icefall.testing.delta import delta_ids, delta_manifest, drain, start_writer
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import watermarks

pytestmark = pytest.mark.integration

TS = "2026-11-22T10:00:00Z"
COUNT = 60


@dataclass(frozen=True)
class Sent:
    """A record produced to the source topic, as the dead-letter topic must give it back."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    reason: str | None  # None: a good record


def record(i: int) -> Sent:
    """Record `i`: every sixth is bad, in one of three ways."""
    key, headers = b"k%d" % i, [("trace", b"t-%d" % i)]
    if i % 6:
        value = json.dumps({"id": i, "customer": f"c{i}", "amount": 1.25, "ts": TS}).encode()
        return Sent(key, value, headers, None)
    kind = (i // 6) % 3
    if kind == 0:
        value = b'{"id": %d, "cust' % i
        return Sent(key, value, headers, f"malformed JSON: '{value.decode()}'")
    if kind == 1:
        value = json.dumps({"id": i, "customer": "no ts"}).encode()
        return Sent(key, value, headers, "required field 'ts' is missing or null")
    value = json.dumps({"id": f"x{i}", "ts": TS}).encode()
    return Sent(key, value, headers, f"field 'id': 'x{i}' does not fit long")


def produce(kafka: KafkaBroker, topic: str) -> dict[tuple[int, int], Sent]:
    """Records 0..COUNT-1 over two partitions; {(partition, offset): record}."""
    placed: dict[tuple[int, int], Sent] = {}
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(COUNT):
        sent = record(i)

        def on_delivery(err: Any, msg: Any, sent: Sent = sent) -> None:
            assert err is None, err
            placed[(msg.partition(), msg.offset())] = sent

        producer.produce(
            topic, key=sent.key, value=sent.value, headers=list(sent.headers), partition=i % 2,
            on_delivery=on_delivery,
        )  # fmt: skip
    assert producer.flush(60) == 0 and len(placed) == COUNT
    return placed


@dataclass(frozen=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    def text(self, name: str) -> str:
        found = header(self.headers, name)
        assert found is not None, f"no header {name} in {self.headers}"
        return found.decode()


def dead_letters(kafka: KafkaBroker, topic: str) -> list[DeadLetter]:
    """Every record of the dead-letter topic (read_committed), up to its high watermarks."""
    high = sum(watermarks(kafka, topic).values())
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": f"check-{topic}", "auto.offset.reset": "earliest",
         "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    found: list[DeadLetter] = []
    try:
        consumer.subscribe([topic])
        while len(found) < high:
            message = consumer.poll(10)
            assert message is not None, f"dead-letter topic {topic}: only {len(found)} of {high} read"
            assert message.error() is None, message.error()
            found.append(DeadLetter(message.key(), message.value(), list(message.headers() or [])))
    finally:
        consumer.close()
    return found


class Table:
    """A Delta table on a new topic with a dead-letter topic (and its dead-letter table, or none)."""

    def __init__(self, kafka: KafkaBroker, tmp_path: Path, name: str, *, dlq_table: bool) -> None:
        self.kafka, self.tmp_path = kafka, tmp_path
        self.topic, self.dlq_topic = f"it-delta-{name}", f"it-delta-{name}-dead"
        kafka.create_topic(self.topic, partitions=2)
        kafka.create_topic(self.dlq_topic, partitions=1)
        self.location = str(tmp_path / name)
        self.manifest = tmp_path / "table.yaml"
        without_table = "" if dlq_table else ", table: {enabled: false}"
        self.manifest.write_text(
            delta_manifest(
                name,
                kafka.bootstrap,
                self.topic,
                self.location,
                max_records=20,
                spec=f"  deadLetter: {{topic: {self.dlq_topic}{without_table}}}",
            )
        )
        location = dead_letter_location(parse_manifest(self.manifest.read_text()), self.location)
        self.dlq_location = location or str(tmp_path / "none")  # beside the table, named <table>_dlq
        self.placed = produce(kafka, self.topic)
        with TopicView(kafka.bootstrap, self.topic) as view:
            self.topic_id = view.topic_id()
        self.writers = 0

    def writer(self, spark: Any) -> DeltaIngestor:
        self.writers += 1
        st = parse_manifest(self.manifest.read_text())
        return start_writer(st, spark, self.location, self.tmp_path / "leases", f"w{self.writers}")

    @property
    def bad(self) -> dict[tuple[int, int], Sent]:
        return {where: sent for where, sent in self.placed.items() if sent.reason is not None}

    def assert_table_exactly_once(self) -> None:
        assert delta_ids(self.location) == Counter(i for i in range(COUNT) if i % 6)
        assert DeltaLog(self.location).snapshot().committed.offsets == watermarks(self.kafka, self.topic)

    def dead_letter_table_errors(self) -> dict[tuple[int, int], str]:
        """The dead-letter table's (partition, offset) → error; each bad record once in it."""
        from deltalake import DeltaTable

        rows = DeltaTable(self.dlq_location).to_pyarrow_table().to_pylist()
        held = Counter((r["partition"], r["offset"]) for r in rows)
        assert held == Counter(list(self.bad)), "the dead-letter table holds each bad record once"
        return {(r["partition"], r["offset"]): r["error"] for r in rows}

    def assert_dead_letter_topic(self) -> dict[str, list[DeadLetter]]:
        """Each bad record on the dead-letter topic at least once, every copy by content; keeping the first
        per `icefall.dedupe-key` leaves each once. Returns the copies per key."""
        by_key: dict[str, list[DeadLetter]] = {}
        for letter in dead_letters(self.kafka, self.dlq_topic):
            by_key.setdefault(letter.text("icefall.dedupe-key"), []).append(letter)
        assert set(by_key) == {f"{self.topic_id}/{p}/{o}" for p, o in self.bad}
        for key, copies in by_key.items():
            # librdkafka's topic id is standard base64, which may hold '/': parse from the right.
            partition, offset = (int(n) for n in key.rsplit("/", 2)[1:])
            sent = self.bad[(partition, offset)]
            for letter in copies:
                assert (letter.key, letter.value) == (sent.key, sent.value)
                assert letter.headers[: len(sent.headers)] == sent.headers
                assert letter.text("icefall.error") == sent.reason
                assert letter.text("icefall.source.topic") == self.topic
                assert letter.text("icefall.source.topic-id") == self.topic_id
                assert letter.text("icefall.source.partition") == str(partition)
                assert letter.text("icefall.source.offset") == str(offset)
        return by_key


@pytest.mark.parametrize("dlq_table", [True, False], ids=["with-dead-letter-table", "topic-only"])
def test_dead_letters_reach_the_topic_by_content_once_per_dedupe_key_through_a_failure_before_the_commit(
    kafka: KafkaBroker, spark: Any, tmp_path: Path, dlq_table: bool
) -> None:
    table = Table(kafka, tmp_path, "dlqt" if dlq_table else "dlqt-only", dlq_table=dlq_table)
    failing = table.writer(spark)
    try:  # the second batch's dead letters are acknowledged, its table commit never comes
        with (
            failpoints.armed("dlq-topic.after-produce", "raise", hit=2),
            pytest.raises(failpoints.FailpointError),
        ):
            drain(failing)
    finally:
        failing.close()
    after = table.writer(spark)
    try:
        drain(after)
    finally:
        after.close()
    assert after.epoch > failing.epoch
    table.assert_table_exactly_once()
    by_key = table.assert_dead_letter_topic()
    epochs = {key: sorted(int(c.text("icefall.epoch")) for c in copies) for key, copies in by_key.items()}
    resent = {key for key, found in epochs.items() if len(found) == 2}
    assert resent, "the failed batch's dead letters were sent again"
    assert all(epochs[key] == [failing.epoch, after.epoch] for key in resent), epochs
    assert all(len(found) == 1 for key, found in epochs.items() if key not in resent), epochs
    if dlq_table:
        errors = table.dead_letter_table_errors()
        assert errors == {where: sent.reason for where, sent in table.bad.items()}
    else:
        assert not Path(table.dlq_location).exists()


def test_icefall_run_killed_around_the_dead_letter_topic_then_run_again(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    table = Table(kafka, tmp_path, "dlqt-run", dlq_table=True)

    for armed in (
        "dlq.after-commit=exit@2",  # the dead-letter table ahead of the table, the topic not sent yet
        "dlq-topic.after-produce=exit",  # that batch again: sent, the table's commit next
    ):
        killed = run_until_caught_up(table.manifest, tmp_path / "state", armed, maintenance=True)
        output = killed.stdout[-3000:] + killed.stderr[-3000:]
        assert killed.returncode == failpoints.EXIT_STATUS, output
        assert f"failpoint {armed.partition('=')[0]} triggered" in killed.stderr, output
    done = run_until_caught_up(table.manifest, tmp_path / "state", maintenance=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table.assert_table_exactly_once()
    table.dead_letter_table_errors()
    copies = Counter(len(found) for found in table.assert_dead_letter_topic().values())
    assert set(copies) <= {1, 2} and copies[2] > 0, copies  # the batch killed after its send, twice
