"""The auditor finds every way a table can differ from its topic, against a real Kafka and a real catalog.

Proves, with the `kafka` fixture's broker and a `SqlCatalog` in a temporary folder (rows written by pyiceberg
in ingestion's layout: the main table's `_kafka` struct, the `<table>_dlq` dead-letter table):
- a table holding every committed record exactly once (some of them in the DLQ) passes, read through a
  live consumer and through `audit_from_catalog`;
- a row present twice, or in both the table and the DLQ, is a duplicate, reported with its offset;
- a record in neither table is missing, reported with its offset; with a filter configured it is counted
  as filtered and the audit passes;
- rows beyond the committed end, below the start, in a partition never committed, or where Kafka holds
  no record (an aborted transaction) are unexpected; dead letters past the committed end are unexpected
  too, except while ingestion runs (`ingesting=True`: its dead letters are committed before its batch);
- the range starts at `icefall.start-offsets`; records Kafka's retention deleted are counted as lost and
  not compared; offset gaps (transaction markers, aborted records) are neither expected nor waited for;
- a table with nothing committed and no rows passes with nothing to report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType, TimestamptzType

from icefall.audit import AuditReport, KafkaTopic, audit_from_catalog, audit_table, dlq_identifier
from icefall.catalog.layout import DEAD_LETTER_SCHEMA
from icefall.commit.state import EPOCH, OFFSETS, START_OFFSETS, TOPIC
from icefall.devstack.kafka import KafkaBroker

pytestmark = pytest.mark.integration

PARTITIONS, RECORDS = 3, 20  # the shared topic: offsets 0..19 in each of 3 partitions
TS = datetime(2024, 5, 1, tzinfo=UTC)

MAIN_SCHEMA = Schema(
    NestedField(1, "value", StringType(), required=False),
    NestedField(
        2,
        "_kafka",
        StructType(
            NestedField(3, "partition", IntegerType(), required=True),
            NestedField(4, "offset", LongType(), required=True),
            NestedField(5, "timestamp", TimestamptzType(), required=False),
        ),
        required=True,
    ),
)
Offsets = Mapping[int, Iterable[int]]


def everything(records: int = RECORDS, partitions: int = PARTITIONS) -> dict[int, list[int]]:
    return {p: list(range(records)) for p in range(partitions)}


def slug(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60]


@pytest.fixture(scope="module")
def topic(kafka: KafkaBroker) -> str:
    """3 partitions, offsets 0..19 each, no gaps."""
    name = "audit-orders"
    kafka.create_topic(name, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for p, offsets in everything().items():
        for o in offsets:
            producer.produce(name, key=f"k{o}", value=json.dumps({"p": p, "o": o}), partition=p)
    assert producer.flush(30) == 0
    return name


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "warehouse").mkdir()
    catalog = SqlCatalog(
        "icefall", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri()
    )
    catalog.create_namespace("lake")
    return catalog


def ingested(
    catalog: SqlCatalog,
    topic: str,
    committed: Mapping[int, int],
    rows: Offsets,
    dlq: Offsets | None = None,
    *,
    start_offsets: Mapping[int, int] | None = None,
    name: str = "lake.orders",
) -> tuple[Table, Table]:
    """A main table and its DLQ holding `rows` and `dlq` (partition → offsets), committed to `committed`."""
    table = catalog.create_table(name, MAIN_SCHEMA)
    dead = catalog.create_table(dlq_identifier(name), DEAD_LETTER_SCHEMA)
    main_rows = [
        {"value": f"p{p}-o{o}", "_kafka": {"partition": p, "offset": o, "timestamp": TS}}
        for p, offsets in rows.items()
        for o in offsets
    ]
    table.append(pa.Table.from_pylist(main_rows, schema=schema_to_pyarrow(table.schema())))
    if dlq:
        dead_rows = [
            {
                "partition": p,
                "offset": o,
                "timestamp": TS,
                "key": f"k{o}".encode(),
                "value": b"{not json",
                "headers": [{"key": "source", "value": b"test"}],
                "error": "invalid JSON",
                "ingested_at": TS,
            }
            for p, offsets in dlq.items()
            for o in offsets
        ]
        dead.append(pa.Table.from_pylist(dead_rows, schema=schema_to_pyarrow(dead.schema())))
    properties = {
        TOPIC: topic,
        OFFSETS: json.dumps({str(p): o for p, o in committed.items()}),
        EPOCH: "1",
    }
    if start_offsets is not None:
        properties[START_OFFSETS] = json.dumps({str(p): o for p, o in start_offsets.items()})
    with table.transaction() as tx:
        tx.set_properties(properties)
    return table, dead


def audit(
    kafka: KafkaBroker,
    topic: str,
    table: Table,
    dlq: Table | None,
    *,
    filter_configured: bool = False,
    ingesting: bool = False,
) -> AuditReport:
    with KafkaTopic(kafka.bootstrap, topic, timeout=20) as source:
        report = audit_table(table, dlq, source, filter_configured=filter_configured, ingesting=ingesting)
    print(report.render())
    return report


ALL_COMMITTED = dict.fromkeys(range(PARTITIONS), RECORDS)


def test_a_perfect_table_passes(kafka: KafkaBroker, topic: str, catalog: SqlCatalog) -> None:
    rows = everything()
    rows[1] = [o for o in rows[1] if o not in (3, 7)]  # two records went to the DLQ
    table, dlq = ingested(catalog, topic, ALL_COMMITTED, rows, {1: [3, 7]})

    report = audit(kafka, topic, table, dlq)
    assert report.ok, report.render()
    assert report.topic == topic and report.snapshot_id == table.metadata.current_snapshot_id
    assert [(p.partition, p.expected, p.in_table, p.in_dlq) for p in report.partitions] == [
        (0, 20, 20, 0),
        (1, 20, 18, 2),
        (2, 20, 20, 0),
    ]
    assert all(p.result == "ok" for p in report.partitions)
    lines = report.render().splitlines()
    assert lines[0].endswith(": OK")
    assert lines[1].split() == ["partition", "committed", "kafka", "table", "dlq", "dup", "missing", "result"]
    assert lines[3].split() == ["1", "20", "20", "18", "2", "0", "0", "ok"]

    same = audit_from_catalog(catalog, "lake.orders", kafka.bootstrap)
    assert same.ok and same.dlq_table == "lake.orders_dlq"
    assert same.partitions == report.partitions


def test_a_duplicated_row_is_reported_with_its_offset(
    kafka: KafkaBroker, topic: str, catalog: SqlCatalog
) -> None:
    rows = everything()
    rows[2] = [*rows[2], 5, 5]  # offset 5 three times
    table, dlq = ingested(catalog, topic, ALL_COMMITTED, rows)

    report = audit(kafka, topic, table, dlq)
    assert not report.ok
    p2 = report.partition(2)
    assert (p2.duplicates, p2.duplicate_rows, p2.duplicate_examples) == (1, 2, (5,))
    assert (p2.in_table, p2.missing, p2.unexpected) == (22, 0, 0)
    assert report.partition(0).ok and report.partition(1).ok
    assert p2.result == "FAIL: 1 duplicated"
    assert "partition 2: duplicated offsets 5" in report.render()


def test_a_missing_offset_is_reported(kafka: KafkaBroker, topic: str, catalog: SqlCatalog) -> None:
    rows = everything()
    rows[0].remove(11)
    table, dlq = ingested(catalog, topic, ALL_COMMITTED, rows)

    report = audit(kafka, topic, table, dlq)
    assert not report.ok and report.missing == 1
    assert report.partition(0).missing_examples == (11,)
    assert report.partition(0).duplicates == report.partition(0).unexpected == 0
    assert "partition 0: missing offsets 11" in report.render()


def test_a_row_in_both_the_dlq_and_the_table_is_a_duplicate(
    kafka: KafkaBroker, topic: str, catalog: SqlCatalog
) -> None:
    table, dlq = ingested(catalog, topic, ALL_COMMITTED, everything(), {1: [3]})

    report = audit(kafka, topic, table, dlq)
    assert not report.ok
    p1 = report.partition(1)
    assert (p1.duplicates, p1.in_table_and_dlq, p1.duplicate_examples) == (1, 1, (3,))
    assert (p1.in_table, p1.in_dlq) == (20, 1)


def test_a_configured_filter_turns_missing_records_into_filtered_ones(
    kafka: KafkaBroker, topic: str, catalog: SqlCatalog
) -> None:
    rows = everything()
    rows[0] = [o for o in rows[0] if o % 2 == 0]  # the filter dropped the odd offsets
    table, dlq = ingested(catalog, topic, ALL_COMMITTED, rows)

    assert not audit(kafka, topic, table, dlq).ok
    report = audit(kafka, topic, table, dlq, filter_configured=True)
    assert report.ok
    assert (report.missing, report.filtered) == (0, 10)
    assert report.partition(0).missing_examples == (1, 3, 5, 7, 9, 11, 13, 15, 17, 19)
    assert report.partition(0).result == "ok (10 filtered)"


def test_rows_beyond_the_committed_end_or_outside_the_range_are_unexpected(
    kafka: KafkaBroker, topic: str, catalog: SqlCatalog
) -> None:
    committed = {0: 15, 1: 20}  # partition 2 was never committed
    rows = everything()  # partition 0 holds 15..19 too: rows of a batch never committed
    table, dlq = ingested(catalog, topic, committed, rows, {1: [25]}, start_offsets={0: 0, 1: 2})

    report = audit(kafka, topic, table, dlq)
    assert not report.ok
    p0, p1, p2 = report.partitions
    assert (p0.unexpected, p0.unexpected_examples, p0.expected, p0.missing) == (
        5,
        (15, 16, 17, 18, 19),
        15,
        0,
    )
    # partition 1 started at offset 2: rows 0 and 1 are below the range; 25 is past the end (and past Kafka)
    assert (p1.start, p1.unexpected_examples, p1.expected) == (2, (0, 1, 25), 18)
    assert (p2.committed, p2.unexpected, p2.expected) == (0, 20, 0)
    assert report.unexpected == 5 + 3 + 20
    assert p1.dlq_ahead == 1

    # While ingestion runs, dead letters past the end belong to a batch not committed yet: pending, not wrong.
    live = audit(kafka, topic, table, dlq, ingesting=True)
    assert live.partition(1).unexpected_examples == (0, 1)
    assert (live.partition(1).dlq_ahead, live.partition(1).in_dlq) == (1, 1)
    assert "partition 1: 1 dead-letter rows past the committed end" in live.render()


def test_retention_and_offset_gaps(
    kafka: KafkaBroker, catalog: SqlCatalog, request: pytest.FixtureRequest
) -> None:
    """One partition: committed transactions, an aborted one (never expected), then retention."""
    name = slug(request)
    kafka.create_topic(name, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": name})
    producer.init_transactions(30)
    # read_uncommitted: the high watermark of an open transaction's records, not the last stable offset
    # (a plain consumer: Icefall's TopicView always reads committed records only)
    probe = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": name, "isolation.level": "read_uncommitted"}
    )
    data: list[int] = []  # offsets of committed records
    aborted: list[int] = []
    for count, commit in ((5, True), (3, False), (2, True), (10, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(name, value=f"v{i}", partition=0)
        producer.flush(30)  # abort_transaction would purge records not sent yet
        high = probe.get_watermark_offsets(TopicPartition(name, 0), timeout=10, cached=False)[1]
        (data if commit else aborted).extend(range(high - count, high))
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    probe.close()
    # 0-4 data, 5 marker, 6-8 aborted, 9 marker, 10-11 data, 12 marker, 13-22 data, 23 marker
    assert (data, aborted) == ([*range(5), 10, 11, *range(13, 23)], [6, 7, 8])

    # Committed up to 12 (a marker): reading stops there, without waiting for records that never come.
    table, dlq = ingested(catalog, name, {0: 12}, {0: [0, 1, 2, 4, 10, 11]}, {0: [3]})
    report = audit(kafka, name, table, dlq)
    assert report.ok, report.render()
    assert (report.partition(0).expected, report.partition(0).high_watermark) == (7, 24)

    # A row from the aborted transaction is not a record of the topic.
    table, dlq = ingested(catalog, name, {0: 24}, {0: [*data, 7]}, name="lake.aborted")
    report = audit(kafka, name, table, dlq)
    assert (report.partition(0).unexpected_examples, report.partition(0).expected) == ((7,), 17)

    # Retention deletes offsets below 10; ingestion had started at 2 (icefall.start-offsets).
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(name, 0, 10)]).values():
        future.result(30)
    table, dlq = ingested(catalog, name, {0: 24}, {0: data[2:]}, start_offsets={0: 2}, name="lake.retained")
    report = audit(kafka, name, table, dlq)
    p0 = report.partition(0)
    assert report.ok, report.render()
    assert (p0.low_watermark, p0.lost_to_retention, p0.unverified, p0.expected) == (10, 8, 3, 12)
    assert p0.result == "ok (8 lost to retention)"


def test_a_table_with_nothing_committed_passes_with_nothing_to_report(
    kafka: KafkaBroker, topic: str, catalog: SqlCatalog
) -> None:
    table = catalog.create_table("lake.empty", MAIN_SCHEMA)
    report = audit(kafka, topic, table, None)
    assert report.ok and report.partitions == () and report.snapshot_id is None
    assert report.render().splitlines()[0].endswith(": OK")
