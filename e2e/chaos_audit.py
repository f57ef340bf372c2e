"""The chaos run's audit of the append table: the topic against the table and its dead-letter table, by
content, with none of the ingestion code.

Every record of the topic read with confluent-kafka (read_committed), decoded by `chaos_data`'s reference
decoder, compared (`compare`) with the table's rows (pyiceberg; the Delta table's, e2e/chaos_delta.py:
delta-rs) by `_kafka` (partition, offset) and by every value, and with the dead-letter table's rows (by
offset and value bytes): duplicates, missing and wrong values counted, the first 20 problems kept as
examples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka_cluster import KafkaCluster

from . import chaos_data as data


class Problems:
    """A tally of problems by kind (a counter field each), with the first 20 as examples."""

    examples: list[str]

    def problem(self, kind: str, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {text}")


@dataclass
class Audit(Problems):
    records: int = 0
    good: int = 0
    bad: int = 0
    rows: int = 0
    dead_rows: int = 0
    duplicates: int = 0
    missing: int = 0
    wrong: int = 0
    examples: list[str] = field(default_factory=list)

    def place(self, seen: Counter[tuple[int, int]], where: tuple[int, int], records: Any, what: str) -> bool:
        """Count a row at `where`: seen twice is a duplicate; False when the topic has no such record."""
        seen[where] += 1
        if seen[where] == 2:
            self.problem("duplicates", f"{what} {where} twice")
        if where not in records:
            self.problem("wrong", f"{what} {where} has no record in the topic")
            return False
        return True


def topic_records(
    kafka: KafkaCluster, topic: str, high: dict[int, int]
) -> dict[tuple[int, int], bytes | None]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "chaos-audit",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in high])
    records: dict[tuple[int, int], bytes | None] = {}
    ends = {p: o for p, o in high.items() if o > 0}
    try:
        while ends:
            message = consumer.poll(30)
            assert message is not None, f"the audit read {len(records)} records, then nothing"
            assert message.error() is None, message.error()
            records[message.partition(), message.offset()] = message.value()
            if message.offset() + 1 >= ends.get(message.partition(), 0):
                ends.pop(message.partition(), None)
    finally:
        consumer.close()
    return records


def _same(column: str, got: Any, want: Any) -> bool:
    if column == "ts":
        return isinstance(got, datetime) and got.astimezone(UTC) == want
    if column == "amount" and want is not None:
        return got is not None and Decimal(got) == want
    return bool(got == want)


def audit(
    kafka: KafkaCluster, catalog: CatalogConfig, topic: str, partitions: int, table: tuple[str, str]
) -> Audit:
    """The append table `table` (and its dead-letter table) against every record of `topic`."""
    high = {p: o for p, o in watermarks(kafka, topic, partitions).items()}
    records = topic_records(kafka, topic, high)
    iceberg = catalog.pyiceberg()
    namespace, name = table
    rows = iceberg.load_table((namespace, name)).scan().to_arrow().to_pylist()
    dead = iceberg.load_table((namespace, f"{name}_dlq")).scan().to_arrow().to_pylist()
    return compare(records, rows, dead)


def compare(
    records: dict[tuple[int, int], bytes | None], rows: list[dict[str, Any]], dead: list[dict[str, Any]]
) -> Audit:
    """A table's `rows` and its dead-letter table's `dead` (as pyiceberg or delta-rs read them) against the
    topic's `records` ((partition, offset) → value)."""
    result = Audit(records=len(records), rows=len(rows), dead_rows=len(dead))
    in_table: Counter[tuple[int, int]] = Counter()
    for row in rows:
        where = (row["_kafka"]["partition"], row["_kafka"]["offset"])
        if not result.place(in_table, where, records, "table row"):
            continue
        want = data.expected(records[where])
        if want is data.BAD:
            result.problem("wrong", f"bad record {where} is a table row")
            continue
        assert isinstance(want, dict)
        differs = [c for c in data.COLUMNS if not _same(c, row[c], want[c])]
        if differs:
            shown = {c: (str(row[c])[:60], str(want[c])[:60]) for c in differs}
            result.problem("wrong", f"row {where} differs from its record: {shown}")
    in_dead: Counter[tuple[int, int]] = Counter()
    for row in dead:
        where = (row["partition"], row["offset"])
        if not result.place(in_dead, where, records, "dead letter"):
            continue
        if data.expected(records[where]) is not data.BAD:
            result.problem("wrong", f"good record {where} is a dead letter")
        elif row["value"] != records[where]:
            result.problem("wrong", f"dead letter {where}: its value is not the record's")
    for where, value in records.items():
        is_bad = data.expected(value) is data.BAD
        result.bad += is_bad
        result.good += not is_bad
        if where in in_table and where in in_dead:
            result.problem("duplicates", f"record {where} is a row and a dead letter")
        elif where not in in_table and where not in in_dead:
            result.problem("missing", f"record {where} ({'bad' if is_bad else 'good'}) is in neither table")
    return result


def watermarks(kafka: KafkaCluster, topic: str, partitions: int) -> dict[int, int]:
    """`topic`'s high watermarks (read_committed: the last stable offsets)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "chaos-audit-high",
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()
