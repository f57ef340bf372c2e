"""`icefall run` killed at every crash point of a table's life, one process per point, stays exactly once.

Each test drives ONE table through a chain of `icefall run` processes; each process is killed (status 137,
like SIGKILL) at one failpoint (`icefall.runtime.failpoints`), the next one starts on what it left, and a
last, unarmed run finishes the topic. Every killed run must really have reached its point (its log says
"failpoint <name> triggered"); the table and its dead-letter table must then hold each produced record
exactly once (`assert_exactly_once`, record by record and by the auditor), and the dead-letter topic each
bad record at least once (it is at-least-once by design: kafka/dead_letters.py).

Proves, for a new table on an empty topic: kills after creating the table, before and after its
dead-letter table; after each table's first (genesis) snapshot and epoch claim; after staging the first,
empty batch; before sweeping the branch that left; after the table's first commit. For a table with traffic
and malformed records: kills after preparing a dead-letter stage, mid-produce and after producing to the
dead-letter topic and after the dead-letter commit (the dead-letter table is then ahead of the table; the
next run skips what it holds, never rewinds it: its history holds no delete), after staging dead letters,
before sweeping them, while abandoning a failed dead-letter and a failed main
commit (`raise` at the commit, `exit` while dropping its branch), at a lease renewal, and at the second
main commit of a run (a hit count).
With batches pipelined (clean records): kills at the commit points passed on the commit thread while the
next batch is written on top, and while a refused commit in flight is dropped.
For an upsert table (each batch one MERGE): kills after staging, before and after the commit, after its
dead letters, while abandoning a failed commit; `icefall verify` then finds the last change per key.
Not proved here: maintenance points and `main.after-ensure-staged` (Spark stages an empty snapshot for an
empty batch itself, so `icefall run` passes that point rarely): test_failpoints_in_process.py reaches them;
catalogs other than the embedded one (test_ingest.py kills at the main commit points on those).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.kafka.dead_letters import SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER
from icefall.runtime import failpoints
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import (
    assert_exactly_once,
    assert_exactly_once_by_topic,
    manifest_text,
    produce,
    watermarks,
)

pytestmark = pytest.mark.integration

# One `icefall run` process per kill, each starting Spark (~15 s, minutes on a loaded 2-core machine): a
# chain of ten outlasts the suite's default per-test timeout.
CHAIN_TIMEOUT = pytest.mark.timeout(3600)


class Chain:
    """`icefall run` processes on one table, each killed at a failpoint or run to the end of the topic."""

    def __init__(
        self,
        kafka: KafkaBroker,
        tmp_path: Path,
        name: str,
        partitions: int = 2,
        *,
        keyed: str | None = None,
        topics: int = 1,
    ) -> None:
        """`topics` > 1: the table reads that many topics (`spec.source.topics`), `topic` is the first."""
        self.kafka, self.name = kafka, name
        self.topics = [f"it-kills-{name}"] + [f"it-kills-{name}-{i}" for i in range(1, topics)]
        self.topic, self.dlq_topic = self.topics[0], f"it-kills-{name}-dlq"
        for topic in self.topics:
            kafka.create_topic(topic, partitions=partitions)
        kafka.create_topic(self.dlq_topic, partitions=1)
        self.manifest = tmp_path / "table.yaml"
        text = manifest_text(
            name,
            self.topic if topics == 1 else self.topics,
            kafka.bootstrap,
            batch={"maxRecords": 40, "minIntervalSeconds": 0},
        )
        if keyed == "upsert":
            text += "  mode: upsert\n  key: [id]\n"
        elif keyed == "cdc":
            text += "  mode: cdc\n  key: [id]\n  sequenceBy: [source.lsn]\n"
        self.manifest.write_text(text + f"  deadLetter: {{topic: {self.dlq_topic}}}\n")
        self.state = tmp_path / "state"
        self.killed_at: list[str] = []

    def run(self, spec: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_until_caught_up(self.manifest, self.state, spec)

    def kill_at(self, spec: str) -> str:
        """Run armed with `spec` (`name=exit[@n]`, maybe after `other=raise` entries); it must die there.
        Returns the run's log."""
        point = spec.rsplit(",", maxsplit=1)[-1].partition("=")[0]
        done = self.run(spec)
        output = done.stdout + done.stderr
        assert done.returncode == failpoints.EXIT_STATUS, f"{spec}: exit {done.returncode}\n{output[-4000:]}"
        assert f"failpoint {point} triggered" in done.stderr, f"{spec} was not reached:\n{output[-4000:]}"
        self.killed_at.append(point)
        return done.stderr

    def finish(self, bad: set[tuple[int, int]]) -> None:
        done = self.run()
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        config = CatalogConfig.embedded(self.state)
        assert_exactly_once(
            config, self.name, watermarks(self.kafka, self.topic), bad, bootstrap=self.kafka.bootstrap
        )
        sent = dead_letters_sent(self.kafka, self.dlq_topic)
        assert set(sent) == bad, f"dead-letter topic: missing {sorted(bad - set(sent))[:10]}"

    def verify(self) -> None:
        """`icefall verify` (the auditor, by content) must pass."""
        verify = subprocess.run(
            [sys.executable, "-m", "icefall.cli", "verify", "-f", str(self.manifest),
             "--state-dir", str(self.state)],
            capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        assert verify.stdout.rstrip().endswith("OK") or "OK\n" in verify.stdout, verify.stdout

    def finish_keyed(self, bad: set[tuple[int, int]]) -> None:
        """Run to the end, then `icefall verify`: the table against the topic's last change per key."""
        done = self.run()
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        self.verify()
        table = CatalogConfig.embedded(self.state).pyiceberg().load_table(("it", self.name))
        assert read_committed(table).offsets == watermarks(self.kafka, self.topic)
        sent = dead_letters_sent(self.kafka, self.dlq_topic)
        assert set(sent) == bad, f"dead-letter topic: missing {sorted(bad - set(sent))[:10]}"

    def finish_topics(self, bad: set[tuple[str, int, int]]) -> None:
        """Run to the end: every topic's records exactly once, by (topic, partition, offset) and by the
        auditor by content; each bad record on the dead-letter topic, naming its topic."""
        done = self.run()
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        high = {topic: watermarks(self.kafka, topic) for topic in self.topics}
        assert_exactly_once_by_topic(CatalogConfig.embedded(self.state), self.name, high, bad)
        self.verify()
        sent = dead_letters_sent(self.kafka, self.dlq_topic, by_topic=True)
        assert set(sent) == bad, f"dead-letter topic: missing {sorted(bad - set(sent))[:10]}"


def produce_changes(kafka: KafkaBroker, topic: str, start: int, count: int) -> set[tuple[int, int]]:
    """`count` changes to 25 keys: updates, every 6th a tombstone, every 11th malformed (a dead letter);
    returns the (partition, offset) of the malformed ones."""
    from confluent_kafka import Producer

    delivered: list[tuple[int, int, bool]] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        key = i % 25
        bad = i % 11 == 0
        value = None if i % 6 == 0 else "{not json" if bad else json.dumps(
            {"id": key, "customer": f"c{i}", "amount": round(i * 1.25, 2), "ts": "2026-11-22T10:00:00Z"}
        )  # fmt: skip

        def on_delivery(err: object, msg: object, bad: bool = bad and value is not None) -> None:
            assert err is None, err
            delivered.append((msg.partition(), msg.offset(), bad))  # type: ignore[attr-defined]

        producer.produce(topic, key=str(key), value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return {(p, o) for p, o, bad in delivered if bad}


def produce_cdc_changes(kafka: KafkaBroker, topic: str, start: int, count: int) -> set[tuple[int, int]]:
    """`count` Debezium events of 20 keys, spread over both partitions, positioned by `source.lsn`: every
    5th a delete, every 7th sent late (an older position than events already sent), every 17th without
    its position (a dead letter); returns the (partition, offset) of those."""
    from confluent_kafka import Producer

    delivered: list[tuple[int, int, bool]] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        key, lsn, bad = i % 20, 1000 + i - (30 if i % 7 == 0 else 0), i % 17 == 0
        image = {"id": key, "customer": f"c{i}", "amount": round(i * 1.25, 2), "ts": "2026-11-22T10:00:00Z"}
        op, before, after = ("d", image, None) if i % 5 == 0 else ("u", None, image)
        event = {"op": op, "before": before, "after": after, "source": {} if bad else {"lsn": lsn}}

        def on_delivery(err: object, msg: object, bad: bool = bad) -> None:
            assert err is None, err
            delivered.append((msg.partition(), msg.offset(), bad))  # type: ignore[attr-defined]

        producer.produce(
            topic,
            key=json.dumps({"id": key}),
            value=json.dumps(event),
            partition=i % 2,
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0
    return {(p, o) for p, o, bad in delivered if bad}


@pytest.mark.long  # `make test-all`: keeps `make test` within CI's time
@CHAIN_TIMEOUT
def test_kills_around_the_commits_of_a_cdc_table_ordered_by_position(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A cdc table with sequenceBy (its rows' positions and the deleted keys it remembers, a file the
    commit names) killed around its batches: the table ends as the topic's highest position per key."""
    chain = Chain(kafka, tmp_path, "kills_cdc", keyed="cdc")
    bad = produce_cdc_changes(kafka, chain.topic, 0, 150)
    for spec in ("main.after-stage=exit", "main.before-commit=exit", "main.after-commit=exit@2"):
        chain.kill_at(spec)
    bad |= produce_cdc_changes(kafka, chain.topic, 150, 60)
    chain.finish_keyed(bad)


def pipelined_chain(kafka: KafkaBroker, tmp_path: Path, name: str, specs: tuple[str, ...]) -> None:
    """Clean records, 40 a batch: every batch but the last is committed on the commit thread while the
    next one is read and appended on top of it (pipelining). Killed at each of `specs` on that thread (the
    second batch's), then run to the end, exactly once."""
    chain = Chain(kafka, tmp_path, name)
    produce(kafka, chain.topic, 0, 600)
    for spec in specs:
        log = chain.kill_at(spec)
        point = spec.split("=")[0]
        assert f"failpoint {point} triggered (hit 2) on thread icefall-commit" in log, log[-4000:]
    produce(kafka, chain.topic, 600, 100)
    chain.finish(set())


@CHAIN_TIMEOUT
def test_kills_around_pipelined_commits(kafka: KafkaBroker, tmp_path: Path) -> None:
    """Before a pipelined commit, and while a refused one is dropped with the batch on top of it."""
    specs = ("main.before-commit=exit@2", "main.before-commit=raise@2,main.before-abandon=exit")
    pipelined_chain(kafka, tmp_path, "kills_pipelined", specs)


@pytest.mark.long  # `make test-all`: keeps `make test` within CI's time
@CHAIN_TIMEOUT
def test_kills_after_pipelined_stages_and_commits(kafka: KafkaBroker, tmp_path: Path) -> None:
    """After a pipelined batch is staged, and after its commit, before the next one is."""
    pipelined_chain(
        kafka, tmp_path, "kills_pipelined_after", ("main.after-stage=exit@2", "main.after-commit=exit@2")
    )


@pytest.mark.long  # `make test-all`: keeps `make test` within CI's time
@CHAIN_TIMEOUT
def test_kills_around_the_commits_of_a_keyed_table(kafka: KafkaBroker, tmp_path: Path) -> None:
    """An upsert table killed around its MERGE batches: staged and not committed, before and after the
    compare-and-swap, around its dead letters; the last change per key is in the table exactly once."""
    chain = Chain(kafka, tmp_path, "kills_keyed", keyed="upsert")
    bad = produce_changes(kafka, chain.topic, 0, 150)
    for spec in (
        "main.after-stage=exit",  # the MERGE is on the staging branch, main untouched
        "main.before-commit=exit",
        "main.after-commit=exit",
        "dlq.after-commit=exit",  # dead letters committed, the MERGE batch not
        "main.before-commit=raise,main.before-abandon=exit",
        "main.after-commit=exit@2",
    ):
        chain.kill_at(spec)
    bad |= produce_changes(kafka, chain.topic, 150, 60)
    chain.finish_keyed(bad)


def dead_letters_sent(kafka: KafkaBroker, topic: str, *, by_topic: bool = False) -> Counter[Any]:
    """How often each source (partition, offset) is on the dead-letter topic (read_committed, all of it);
    `by_topic`: each source (topic, partition, offset)."""
    from confluent_kafka import Consumer

    high = watermarks(kafka, topic)
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": f"check-{topic}", "auto.offset.reset": "earliest",
         "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    seen: Counter[Any] = Counter()
    try:
        consumer.subscribe([topic])
        read = 0
        while read < sum(high.values()):
            message = consumer.poll(10)
            assert message is not None, f"dead-letter topic {topic}: only {read} of {sum(high.values())} read"
            assert message.error() is None, message.error()
            read += 1
            headers = dict(message.headers() or [])
            where = (int(headers[SOURCE_PARTITION_HEADER]), int(headers[SOURCE_OFFSET_HEADER]))
            seen[(headers[SOURCE_TOPIC_HEADER].decode(), *where) if by_topic else where] += 1
    finally:
        consumer.close()
    return seen


def new_table_chain(kafka: KafkaBroker, tmp_path: Path, name: str, specs: tuple[str, ...]) -> None:
    """An empty topic's new table killed at each of `specs`, then 60 records (every tenth malformed), run to
    the end, exactly once."""
    chain = Chain(kafka, tmp_path, name)
    for spec in specs:
        chain.kill_at(spec)
    bad = produce(kafka, chain.topic, 0, 60, bad_every=10)
    chain.finish(bad)


@CHAIN_TIMEOUT
def test_kills_while_a_new_table_is_created_and_first_committed(kafka: KafkaBroker, tmp_path: Path) -> None:
    """A new table and its dead-letter table killed once each is created, claimed and first committed
    (`make test`); the points between them are `test_kills_between_a_new_tables_creation_steps`."""
    new_table_chain(
        kafka,
        tmp_path,
        "kills_new",
        (
            "main.after-create=exit",  # the table exists, its dead-letter table not yet
            "dlq.after-genesis=exit",  # the dead-letter table is claimed first, then the table
            "main.after-claim=exit",
            "main.after-commit=exit",  # the table's first commit
        ),
    )


@pytest.mark.long  # `make test-all`: keeps `make test` within CI's time
@CHAIN_TIMEOUT
def test_kills_between_a_new_tables_creation_steps(kafka: KafkaBroker, tmp_path: Path) -> None:
    """The rest of a new table's creation points: each table created but not claimed, and the first
    batch of an empty topic staged and its branch left behind."""
    new_table_chain(
        kafka,
        tmp_path,
        "kills_new_steps",
        (
            "dlq.after-create=exit",
            "dlq.after-claim=exit",
            "main.after-genesis=exit",
            "main.after-stage=exit",  # an empty topic's first batch (no row; it pins the start) is staged
            "main.before-sweep=exit",  # the branch the last kill left
        ),
    )


@CHAIN_TIMEOUT
def test_kills_around_dead_letters_leases_and_commits(kafka: KafkaBroker, tmp_path: Path) -> None:
    """The dead-letter table and topic ahead of the table, a failed dead-letter commit, a lease renewal:
    the kills only a table with malformed records reaches (`make test`). The dead-letter table ahead is a
    destination like a route table: the next run takes only what it does not hold, and never rewinds it (no
    delete in its history); in the end each bad record is in it once and each good one in the table once,
    by offset and by `icefall verify` (content)."""
    chain = Chain(kafka, tmp_path, "kills_dlq")
    bad = produce(kafka, chain.topic, 0, 120, bad_every=10)
    for spec in (
        "dlq-topic.mid-produce=exit@2",  # the dead-letter table is committed, the main table not
        "dlq.after-commit=exit",  # the run after it skips what that left (no commit), is killed ahead again
        "dlq-topic.after-produce=exit",  # every dead letter acknowledged, the main commit next
        "dlq.before-commit=raise,dlq.before-abandon=exit",  # a failed dead-letter commit, then its drop
        "lease.renew=exit@2",  # the check before the first main commit
    ):
        chain.kill_at(spec)
    bad |= produce(kafka, chain.topic, 120, 40, bad_every=10)
    chain.finish(bad)
    chain.verify()
    dead_letters = CatalogConfig.embedded(chain.state).pyiceberg().load_table(("it", f"{chain.name}_dlq"))
    operations = [s.summary.operation.value for s in dead_letters.snapshots() if s.summary is not None]
    assert set(operations) == {"append"}, f"the dead-letter table was rewound: {operations}"


@pytest.mark.long  # `make test-all`: keeps `make test` within CI's time
@CHAIN_TIMEOUT
def test_kills_around_dead_letter_staging_and_a_failed_main_commit(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The rest of a dead-letter table's crash points: its staging branch before and after it holds dead
    letters and before it is swept; a failed main commit beside dead letters; a run's second commit.
    (`make test` reaches the same kinds of point on the main table: the pipelined and new-table chains.)"""
    chain = Chain(kafka, tmp_path, "kills_dlq_staging")
    bad = produce(kafka, chain.topic, 0, 120, bad_every=10)
    for spec in (
        "dlq.after-prepare=exit",  # a dead-letter staging branch, nothing on it
        "dlq.after-stage=exit",  # leaves a dead-letter staging branch
        "dlq.before-sweep=exit",
        "main.before-commit=raise,main.before-abandon=exit",
        "main.after-commit=exit@2",  # the second batch of the run
    ):
        chain.kill_at(spec)
    bad |= produce(kafka, chain.topic, 120, 40, bad_every=10)
    chain.finish(bad)


@CHAIN_TIMEOUT
def test_kills_around_the_commits_of_a_table_of_two_topics(kafka: KafkaBroker, tmp_path: Path) -> None:
    """Two topics into one table (`spec.source.topics`), malformed records in both: killed before and after
    the main commit (each batch reads both topics: one commit lands or not both), after its dead letters'
    commit, and after a later main commit; then run to the end: exactly once per (topic, partition,
    offset), by content."""
    chain = Chain(kafka, tmp_path, "kills_topics", topics=2)
    bad: set[tuple[str, int, int]] = set()
    for topic, every in zip(chain.topics, (10, 7), strict=True):
        bad |= {(topic, p, o) for p, o in produce(kafka, topic, 0, 90, bad_every=every)}
    for spec in (
        "main.before-commit=exit",
        "main.after-commit=exit",
        "dlq.after-commit=exit",  # dead letters of both topics committed, the main commit not
        "main.after-commit=exit@2",
    ):
        chain.kill_at(spec)
    bad |= {(chain.topics[1], p, o) for p, o in produce(kafka, chain.topics[1], 90, 40, bad_every=7)}
    chain.finish_topics(bad)


# Points a run of `icefall run` on a table with traffic and malformed records can reach, for the chaos run.
CHAOS_POINTS = (
    "main.after-prepare",
    "main.after-stage",
    "main.before-commit",
    "main.after-commit",
    "dlq.after-prepare",
    "dlq.after-stage",
    "dlq.before-commit",
    "dlq.after-commit",
    "dlq-topic.mid-produce",
    "dlq-topic.after-produce",
    "main.before-sweep",
    "dlq.before-sweep",
    "lease.renew",
)
# Passed once per run, at its start: armed on the 1st hit.
AT_START = {"main.before-sweep", "dlq.before-sweep"}


def source_records(kafka: KafkaBroker, topic: str) -> dict[tuple[int, int], bytes | None]:
    """The value of every record of `topic` by (partition, offset), read_committed."""
    from confluent_kafka import Consumer

    high = watermarks(kafka, topic)
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": f"content-{topic}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    records: dict[tuple[int, int], bytes | None] = {}
    try:
        consumer.subscribe([topic])
        while len(records) < sum(high.values()):
            message = consumer.poll(10)
            assert message is not None, f"{topic}: only {len(records)} of {sum(high.values())} read"
            assert message.error() is None, message.error()
            records[message.partition(), message.offset()] = message.value()
    finally:
        consumer.close()
    return records


def assert_rows_match_their_records(config: CatalogConfig, name: str, kafka: KafkaBroker, topic: str) -> None:
    """Each row of `it.<name>` holds the values of the Kafka record at its (partition, offset)."""
    records = source_records(kafka, topic)
    table = config.pyiceberg().load_table(("it", name)).scan().to_arrow().to_pylist()
    assert table, "the table is empty"
    for row in table:
        where = (row["_kafka"]["partition"], row["_kafka"]["offset"])
        value = records[where]
        assert value is not None, where
        produced = json.loads(value)
        assert (row["id"], row["customer"], str(row["amount"])) == (
            produced["id"], produced["customer"], f"{Decimal(str(produced['amount'])):.2f}",
        ), where  # fmt: skip


@pytest.mark.long  # `make test-all`: keeps `make test` within CI's time
@CHAIN_TIMEOUT
def test_a_small_chaos_run_of_random_kills_stays_exactly_once(kafka: KafkaBroker, tmp_path: Path) -> None:
    """6 runs (`make chaos` is the long run), each armed to exit at a random point on a random hit (1-2)
    while records keep arriving; a run that never reaches its point finishes normally. Then exactly once
    by offset, the auditor, and by content: every row equals the record at its offset. Seed:
    ICEFALL_CHAOS_SEED (default 12)."""
    seed = int(os.environ.get("ICEFALL_CHAOS_SEED", "12"))
    rng = random.Random(seed)
    chain = Chain(kafka, tmp_path, "chaos_small", partitions=3)
    bad: set[tuple[int, int]] = set()
    produced = 0
    outcomes: list[str] = []
    for _ in range(6):
        bad |= produce(kafka, chain.topic, produced, 80, bad_every=7)
        produced += 80  # two batches or more per run
        point = rng.choice(CHAOS_POINTS)
        hit = 1 if point in AT_START else rng.randint(1, 2)
        done = chain.run(f"{point}=exit@{hit}")
        if done.returncode == failpoints.EXIT_STATUS:
            assert f"failpoint {point} triggered" in done.stderr, done.stderr[-3000:]
            outcomes.append(f"{point}@{hit}: killed")
        else:
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            outcomes.append(f"{point}@{hit}: not reached")
    print(f"\n[chaos seed {seed}] " + "; ".join(outcomes))
    chain.finish(bad)
    assert_rows_match_their_records(CatalogConfig.embedded(chain.state), chain.name, kafka, chain.topic)
    assert sum(o.endswith("killed") for o in outcomes) >= 3, outcomes  # the run really was chaotic
