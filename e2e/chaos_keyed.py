"""The chaos run's keyed table: a second StreamingTable (`spec.mode: upsert`, key `id`) and its audit.

Its own topic gets, from a producer of its own (`produce_loop`, a thread of the run), changes to a bounded
set of `KEYS` customers: new values of a key (inserts and updates) and, about `TOMBSTONE_SHARE` of them,
tombstones (a null value: the key's row is deleted). Its driver and compaction pods are killed like the
append table's, from the same kill loops: they share the driver and compaction quotas (a kill of either
table's pod counts for its component; the report gives the split per table), since each quota is an
amount of chaos for the run, not for a table. Its containers are armed with the driver points a table
that gets no malformed record passes (`KEYED_DRIVER_POINTS`: no `dlq.*`) and the compaction points.

The audit (`audit`), with none of the ingestion code: every record of the topic read with confluent-kafka
(read_committed), in offset order per partition; the reference (`latest`) keeps the last change per Kafka
key (a key's changes all go to one partition, so their offsets order them); the table (pyiceberg, which
applies the position deletes) must hold exactly one row per key whose last change is a value, equal to it
column by column, and no row for a key whose last change is a tombstone (or that never had one): 0
duplicates, 0 missing, 0 extra, 0 wrong; its dead-letter table (the default one) holds no row (every
change is well-formed: a row there is counted wrong). `icefall verify` runs on it as well.

The run's faults converge (and infrastructure faults recover) once both tables caught up.

Not covered: the keyed table has no dead-letter topic and gets no malformed records; cdc mode (Debezium
envelopes) is not in the run.
"""

from __future__ import annotations

import copy
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from icefall.plan.names import compaction_name, driver_pod_name

from . import chaos_data as data
from .chaos_audit import Problems

Obj = dict[str, Any]

KEYED_NAME, KEYED_TOPIC, KEYED_TABLE = "chaos-keyed", "chaos-keyed", "customers"
KEYED_DRIVER = driver_pod_name(KEYED_NAME)
KEYED_COMPACT_PREFIX = f"{compaction_name(KEYED_NAME)}-"
KEYS = 300
TOMBSTONE_SHARE = 0.1
SCHEMA: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "tier", "type": "string"},
    {"name": "balance", "type": "decimal(12,2)"},
    {"name": "seq", "type": "long"},
    {"name": "updated_at", "type": "timestamptz"},
]
COLUMNS = tuple(f["name"] for f in SCHEMA)
#: The points a keyed driver passes when no record is malformed (see the run's DRIVER_POINTS).
KEYED_DRIVER_POINTS = (
    "main.after-prepare", "main.after-stage", "main.before-commit", "main.after-commit",
    "main.before-sweep", "lease.renew",
)  # fmt: skip
TIERS = ("bronze", "silver", "gold")

Change = tuple[bytes, bytes | None]  # (Kafka key, value); value None: a tombstone


def keyed_streaming_table(append: Obj) -> Obj:
    """The keyed StreamingTable, from the append one (`append`: same catalog, store, batches, compaction)."""
    st = copy.deepcopy(append)
    st["metadata"] = {"name": KEYED_NAME}
    spec = st["spec"]
    spec.pop("deadLetter", None)
    spec["source"]["topic"] = KEYED_TOPIC
    spec["mode"], spec["key"] = "upsert", ["id"]
    spec["format"] = {"type": "json", "schema": SCHEMA}
    spec["table"]["name"] = KEYED_TABLE
    spec["table"]["partitioning"] = [{"field": "id", "transform": "bucket[4]"}]
    return st


def table_of(pod: str, append_driver: str, append_compact_prefix: str) -> str | None:
    """Which table a pod works for: "append", "keyed" or None (neither's driver or compaction pod)."""
    if pod == append_driver or pod.startswith(append_compact_prefix):
        return "append"
    if pod == KEYED_DRIVER or pod.startswith(KEYED_COMPACT_PREFIX):
        return "keyed"
    return None


def changes(rng: random.Random, start: int, count: int) -> list[Change]:
    """`count` changes with sequence numbers `start...` to random keys of `KEYS`: values or tombstones."""
    made: list[Change] = []
    for seq in range(start, start + count):
        key = rng.randrange(KEYS)
        if rng.random() < TOMBSTONE_SHARE:
            made.append((str(key).encode(), None))
            continue
        value = {
            "id": key,
            "name": rng.choice(data.UNICODE_NAMES) if rng.random() < 0.2 else f"customer {key}",
            "tier": rng.choice(TIERS),
            "balance": f"{rng.randrange(-(10**9), 10**9) / 100:.2f}",
            "seq": seq,
            "updated_at": f"2026-11-28T{seq // 3600 % 24:02d}:{seq // 60 % 60:02d}:{seq % 60:02d}Z",
        }
        made.append((str(key).encode(), json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()))
    return made


def expected_row(value: bytes) -> dict[str, Any]:
    """The row a value must become (column → value as pyiceberg reads it)."""
    parsed = json.loads(value)
    return {
        "id": parsed["id"],
        "name": parsed["name"],
        "tier": parsed["tier"],
        "balance": Decimal(parsed["balance"]).quantize(Decimal("0.01")),
        "seq": parsed["seq"],
        "updated_at": datetime.fromisoformat(parsed["updated_at"]).astimezone(UTC),
    }


def latest(records: Iterable[tuple[int, int, bytes | None, bytes | None]]) -> dict[int, bytes | None]:
    """Key → the value of its last change (None: a tombstone), from (partition, offset, key, value) records.
    A key met in two partitions has no order between its changes: an error."""
    last: dict[int, tuple[int, int, bytes | None]] = {}
    for partition, offset, key, value in records:
        assert key is not None, f"record {partition}:{offset} has no key"
        k = int(key)
        seen = last.get(k)
        if seen is not None and seen[0] != partition:
            raise AssertionError(f"key {k} is in partitions {seen[0]} and {partition}")
        if seen is None or offset > seen[1]:
            last[k] = (partition, offset, value)
    return {k: value for k, (_, _, value) in last.items()}


@dataclass
class KeyedAudit(Problems):
    records: int = 0
    tombstones: int = 0
    keys: int = 0  # keys whose last change is a value: the rows the table must hold
    rows: int = 0
    duplicates: int = 0
    missing: int = 0
    extra: int = 0
    wrong: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.duplicates == self.missing == self.extra == self.wrong == 0


def _same(column: str, got: Any, want: Any) -> bool:
    if column == "updated_at":
        return isinstance(got, datetime) and got.astimezone(UTC) == want
    if column == "balance":
        return got is not None and Decimal(got) == want
    return bool(got == want)


def compare(last: dict[int, bytes | None], rows: list[dict[str, Any]], records: int) -> KeyedAudit:
    """The table's `rows` against the reference `last` (see `latest`)."""
    live = {k: expected_row(v) for k, v in last.items() if v is not None}
    result = KeyedAudit(records=records, keys=len(live), rows=len(rows))
    result.tombstones = sum(v is None for v in last.values())
    counted: Counter[int] = Counter(row["id"] for row in rows)
    for key, n in sorted(counted.items()):
        if n > 1:
            result.problem("duplicates", f"key {key} holds {n} rows")
    for row in rows:
        want = live.get(row["id"])
        if want is None:
            gone = "its last change is a tombstone" if row["id"] in last else "never in the topic"
            result.problem("extra", f"key {row['id']} is a row ({gone})")
            continue
        differs = [c for c in COLUMNS if not _same(c, row[c], want[c])]
        if differs:
            shown = {c: (str(row[c])[:60], str(want[c])[:60]) for c in differs}
            result.problem("wrong", f"key {row['id']} differs from its last change: {shown}")
    for key in sorted(set(live) - set(counted)):
        result.problem("missing", f"key {key} (last change seq {live[key]['seq']}) has no row")
    return result


def topic_changes(bootstrap: str, high: dict[int, int]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of the keyed topic below `high`, read_committed: (partition, offset, key, value)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-keyed-audit",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    consumer.assign([TopicPartition(KEYED_TOPIC, p, 0) for p in high])
    found: list[tuple[int, int, bytes | None, bytes | None]] = []
    ends = {p: o for p, o in high.items() if o > 0}
    try:
        while ends:
            message = consumer.poll(30)
            assert message is not None, f"the keyed audit read {len(found)} records, then nothing"
            assert message.error() is None, message.error()
            found.append((message.partition(), message.offset(), message.key(), message.value()))
            if message.offset() + 1 >= ends.get(message.partition(), 0):
                ends.pop(message.partition(), None)
    finally:
        consumer.close()
    return found


def watermarks(bootstrap: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-keyed-high",
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(KEYED_TOPIC, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def audit(bootstrap: str, partitions: int, pyiceberg: Any, namespace: str) -> KeyedAudit:
    """The keyed table against its topic (module doc)."""
    records = topic_changes(bootstrap, watermarks(bootstrap, partitions))
    rows = pyiceberg.load_table((namespace, KEYED_TABLE)).scan().to_arrow().to_pylist()
    result = compare(latest(records), rows, len(records))
    dlq = (namespace, f"{KEYED_TABLE}_dlq")
    if pyiceberg.table_exists(dlq):
        for dead in pyiceberg.load_table(dlq).scan().to_arrow().to_pylist():
            result.problem("wrong", f"change {dead['partition']}:{dead['offset']} is a dead letter")
    return result


@dataclass
class KeyedProducer:
    """The keyed topic's producer: `count` changes every `every` s while `producing`, waiting while the
    table is more than `max_backlog` records behind (`committed`: its committed offsets, {} if unknown)."""

    bootstrap: str
    seed: int
    producing: threading.Event
    committed: Callable[[], dict[int, int]]
    errors: list[str]
    count: int = 10
    every: float = 3.0
    max_backlog: int = 1000
    produced: int = 0
    tombstones: int = 0

    def loop(self) -> None:
        from confluent_kafka import Producer

        rng = random.Random(f"{self.seed}-keyed")
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 20})  # fmt: skip
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        try:
            while self.producing.is_set():
                committed = self.committed()
                if committed and self.produced - sum(committed.values()) > self.max_backlog:
                    time.sleep(self.every)
                    continue
                for key, value in changes(rng, self.produced, self.count):
                    producer.produce(KEYED_TOPIC, key=key, value=value, on_delivery=delivered)
                    self.tombstones += value is None
                    producer.poll(0)
                self.produced += self.count
                if failures:
                    self.errors.append(f"keyed producer: {failures[:3]}")
                    return
                time.sleep(self.every)
        finally:
            left = producer.flush(600)
            if left:
                self.errors.append(f"keyed producer: {left} records never delivered")


def report(
    result: KeyedAudit | None, verify: str, producer: KeyedProducer, kills: Counter[tuple[str, str]]
) -> list[str]:
    """The report's section on the keyed table (`kills`: (table, component) → kills observed)."""
    lines = [
        "## Keyed table (mode upsert)",
        "",
        f"`{KEYED_NAME}`: key `id`, {KEYS} keys; {producer.produced} changes produced, "
        f"{producer.tombstones} of them tombstones. Its pods share the driver and compaction kill quotas "
        "with the append table's; kills observed: "
        + (", ".join(f"{c} {n}" for (t, c), n in sorted(kills.items()) if t == "keyed") or "none")
        + ". Audit: the topic (read_committed), last change per key, against the table's rows (pyiceberg).",
        "",
    ]
    if result is not None:
        lines += [
            f"- records {result.records}; keys whose last change is a value {result.keys}, a tombstone "
            f"{result.tombstones}; table rows {result.rows}",
            "",
            "| duplicates | missing | extra | wrong values |",
            "|---:|---:|---:|---:|",
            f"| {result.duplicates} | {result.missing} | {result.extra} | {result.wrong} |",
        ]
        if result.examples:
            lines += ["", "First problems:", "", *[f"- {e}" for e in result.examples]]
    else:
        lines.append("- not audited (the run ended before)")
    return [*lines, "", f"`icefall verify` (keyed): {verify}", ""]
