"""Keyed tables (`spec.mode` upsert and cdc) against real Kafka, Spark and catalog: the table holds the
latest row per key, checked row by row against the changes produced.

Proves: several changes to one key in one batch collapse to the last by offset; insert-then-delete and
delete-then-insert in one batch end right, and so do the same across batches; a tombstone deletes the
key its Kafka key names (JSON object, Debezium's schema envelope, bare value); a key missing from the
value is read from the Kafka key; a tombstone whose key gives no key, and a Debezium event Icefall does
not apply, are dead-lettered with a reason; each batch is ONE snapshot holding new rows and position
deletes, readable alike by Spark, pyiceberg and DuckDB (its iceberg extension); a keyed batch staged when
compaction commits in between is planned again (never landed on files it did not see), and compaction
over position deletes keeps the rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import StreamingTable
from icefall.audit import KeyedAuditReport, audit_keyed
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.lease import FileLease
from icefall.compact.worker import is_delete_conflict
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.runtime import failpoints
from icefall.testing import streams
from icefall.testing.streams import drain, send_changes, started_ingestor

pytestmark = pytest.mark.integration

FIELDS = {"status": "string", "amount": "decimal(10,2)"}


def keyed_table(name: str, topic: str, bootstrap: str, mode: str = "upsert") -> StreamingTable:
    return streams.keyed_table(name, topic, bootstrap, mode=mode, fields=FIELDS)


send = send_changes


def row(i: int, status: str, amount: float = 1.0) -> dict[str, Any]:
    return {"id": i, "status": status, "amount": amount}


def table_rows(config: CatalogConfig, name: str) -> dict[int, tuple[str | None, str | None]]:
    """id → (status, amount as text), read by pyiceberg (which applies the position deletes itself)."""
    table = config.pyiceberg().load_table(("it", name))
    rows = table.scan().to_arrow().to_pylist()
    by_id = {r["id"]: (r["status"], None if r["amount"] is None else str(r["amount"])) for r in rows}
    assert len(by_id) == len(rows), f"a key appears twice: {sorted(r['id'] for r in rows)}"
    return by_id


def spark_rows(spark: SparkSession, config: CatalogConfig, name: str) -> dict[int, tuple[Any, Any]]:
    rows = spark.sql(f"SELECT id, status, amount FROM {config.name}.it.{name}").collect()
    return {r.id: (r.status, None if r.amount is None else str(r.amount)) for r in rows}


def duckdb_rows(config: CatalogConfig, name: str) -> dict[int, tuple[Any, Any]]:
    """id → (status, amount as text), read by DuckDB's iceberg extension from the table's metadata file (it
    applies the position deletes itself)."""
    import duckdb
    import duckdb_extensions

    location = config.pyiceberg().load_table(("it", name)).metadata_location
    con = duckdb.connect()
    for extension in ("avro", "iceberg"):  # from their wheels: no download
        duckdb_extensions.import_extension(extension, con=con)
        con.sql(f"LOAD {extension}")
    rows = con.sql(f"SELECT id, status, amount FROM iceberg_scan('{location}')").fetchall()
    return {i: (status, None if amount is None else str(amount)) for i, status, amount in rows}


def dead_letters(config: CatalogConfig, name: str) -> list[str]:
    table = config.pyiceberg().load_table(("it", f"{name}_dlq"))
    return sorted(table.scan().to_arrow().column("error").to_pylist())


def run_to_end(st: StreamingTable, config: CatalogConfig, spark: SparkSession, tmp_path: Path) -> list[Any]:
    with started_ingestor(st, config, spark, tmp_path / f"{st.table_name}.lease") as ingestor:
        return drain(ingestor)


def audited(spark: SparkSession, st: StreamingTable, config: CatalogConfig) -> KeyedAuditReport:
    return audit_keyed(spark, st, config.pyiceberg(), config.name)


def expect(rows: Mapping[int, tuple[str, float]]) -> dict[int, tuple[str, str]]:
    return {i: (status, f"{amount:.2f}") for i, (status, amount) in rows.items()}


def test_upsert_ordering_tombstones_and_keys(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-upsert-order"
    kafka.create_topic(topic, partitions=2)
    st = keyed_table("upsert_order", topic, kafka.bootstrap)
    send(
        kafka,
        topic,
        [
            (0, 3, row(3, "old")),  # deleted then inserted again in the next batch
            (0, 4, row(4, "old")),  # deleted in the next batch
            (1, 6, row(6, "old")),  # updated in the next batch
        ],
    )
    reports = run_to_end(st, catalog_config, spark, tmp_path)
    assert sum(r.records_read for r in reports) == 3
    assert table_rows(catalog_config, "upsert_order") == expect(
        {3: ("old", 1.0), 4: ("old", 1.0), 6: ("old", 1.0)}
    )

    send(
        kafka,
        topic,
        [
            (0, 1, row(1, "v1")),
            (0, 1, row(1, "v2")),
            (0, 1, row(1, "v3", 3.5)),  # three changes in one batch: the last wins
            (1, "2", row(2, "new")),
            (1, "2", None),  # insert then delete in one batch: no row
            (0, {"id": 3}, None),
            (0, {"id": 3}, row(3, "again", 2.0)),  # delete then insert in one batch: the insert
            (0, {"schema": {}, "payload": {"id": 4}}, None),  # Debezium-style key: deletes 4
            (1, 5, None),  # deleting a key that was never there: nothing
            (1, 6, row(6, "updated", 6.0)),
            (1, {"id": 7}, {"status": "from the Kafka key", "amount": 7}),  # value without its key
            (0, "not a key", None),  # a tombstone whose key gives no id: dead-lettered
            (0, 8, {"status": "no id in the value"}),  # the id from the Kafka key (a bare 8)
            (1, None, {"status": "no id", "amount": 1}),  # no key in the value nor the Kafka key
        ],
    )
    reports = run_to_end(st, catalog_config, spark, tmp_path)
    assert sum(r.records_read for r in reports) == 14
    assert len(reports) == 1, "the changes are meant to be one batch"
    expected = expect(
        {
            1: ("v3", 3.5),
            3: ("again", 2.0),
            6: ("updated", 6.0),
            7: ("from the Kafka key", 7.0),
        }
    )
    expected[8] = ("no id in the value", None)
    assert table_rows(catalog_config, "upsert_order") == expected
    assert spark_rows(spark, catalog_config, "upsert_order") == expected
    assert duckdb_rows(catalog_config, "upsert_order") == expected
    errors = dead_letters(catalog_config, "upsert_order")
    assert len(errors) == 2, errors
    assert any(
        e.startswith("tombstone (null value): the Kafka key gives no value for key field 'id'")
        for e in errors
    )
    assert any("required field 'id' is missing or null" in e for e in errors)

    # The batch is one snapshot on top of the last: new rows plus position deletes of the replaced ones.
    table = catalog_config.pyiceberg().load_table(("it", "upsert_order"))
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    assert int(head.summary.get("added-position-deletes") or 0) >= 2  # 3, 4 and 6 replaced or deleted
    committed = read_committed(table)
    assert committed.snapshot_id == head.snapshot_id
    assert sum(committed.offsets.values()) == 17

    # `icefall verify` by key: the table matches the topic's last change per key, then each tampering
    # (a deleted key brought back, a row changed, a row lost) is found.
    report = audited(spark, st, catalog_config)
    assert report.ok, report.render()
    assert (report.records, report.keys, report.rows) == (17, 5, 5)
    table_name = f"{catalog_config.name}.it.upsert_order"
    spark.sql(
        f"INSERT INTO {table_name} SELECT 2L, 'resurrected', 1.00, _kafka FROM {table_name} WHERE id = 1"
    )
    spark.sql(f"UPDATE {table_name} SET status = 'tampered' WHERE id = 6")
    spark.sql(f"DELETE FROM {table_name} WHERE id = 3")
    report = audited(spark, st, catalog_config)
    assert not report.ok
    assert (report.unexpected, report.wrong, report.missing, report.duplicates) == (1, 1, 1, 0), (
        report.render()
    )
    assert report.examples["unexpected"] == ('{"id":2}',)


def test_cdc_debezium_events(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-cdc"
    kafka.create_topic(topic, partitions=1)
    st = keyed_table("cdc_orders", topic, kafka.bootstrap, mode="cdc")

    def event(op: str, before: Any, after: Any, wrapped: bool = False) -> dict[str, Any]:
        payload = {"op": op, "before": before, "after": after, "source": {"lsn": 1}, "ts_ms": 1}
        return {"schema": {"type": "struct"}, "payload": payload} if wrapped else payload

    send(
        kafka,
        topic,
        [
            (0, {"id": 1}, event("r", None, row(1, "snapshot"))),
            (0, {"id": 2}, event("c", None, row(2, "created"))),
            (0, {"id": 3}, event("c", None, row(3, "created"))),
            (0, {"id": 1}, event("u", row(1, "snapshot"), row(1, "updated", 9.0), wrapped=True)),
            (0, {"id": 2}, event("d", row(2, "created"), None)),
            (0, {"id": 2}, None),  # Debezium's tombstone after a delete
            (0, {"id": 3}, event("d", None, None)),  # no before image: the Kafka key's
            (0, {"id": 4}, event("c", None, row(4, "kept"))),
            (0, {"id": 5}, event("t", None, None)),  # truncate: not applied
            (0, {"id": 6}, event("c", None, None)),  # create without an after image
            (0, {"id": 7}, {"id": 7, "status": "not an event"}),
        ],
    )
    run_to_end(st, catalog_config, spark, tmp_path)
    expected = expect({1: ("updated", 9.0), 4: ("kept", 1.0)})
    assert table_rows(catalog_config, "cdc_orders") == expected
    assert spark_rows(spark, catalog_config, "cdc_orders") == expected
    assert duckdb_rows(catalog_config, "cdc_orders") == expected
    report = audited(spark, st, catalog_config)
    assert report.ok and report.dead_letters_missing == 0, report.render()
    assert (report.records, report.keys) == (11, 2)
    errors = dead_letters(catalog_config, "cdc_orders")
    assert errors == sorted(
        [
            "Debezium op 'c' has no after image",
            "Debezium op 't' is not one of c, r, u, d",
            "not a Debezium change event: it has no op (nor payload.op)",
        ]
    )


def test_cdc_ordered_by_the_source_position(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """spec.sequenceBy: a key's changes from several partitions, and changes that come again or late,
    end as the change with the highest source position (MySQL-style: binlog file as text, then the
    position as a number), within a batch and across batches."""
    topic = "it-cdc-sequence"
    kafka.create_topic(topic, partitions=2)
    st = streams.keyed_table(
        "cdc_sequence",
        topic,
        kafka.bootstrap,
        mode="cdc",
        fields=FIELDS,
        sequence_by=["source.file", "source.pos"],
    )

    def event(op: str, i: int, status: str | None, file: str | None, pos: int | None) -> dict[str, Any]:
        source = {"connector": "mysql", **({"file": file} if file else {}), **({"pos": pos} if pos else {})}
        image = row(i, status) if status else None
        before, after = (image, None) if op == "d" else (None, image)
        return {"op": op, "before": before, "after": after, "source": source, "ts_ms": 1}

    send(
        kafka,
        topic,
        [
            (0, {"id": 1}, event("c", 1, "created", "bin.000001", 10)),
            (1, {"id": 1}, event("u", 1, "older, another partition", "bin.000001", 9)),
            (1, {"id": 2}, event("c", 2, "two", "bin.000001", 20)),
            (0, {"id": 3}, event("c", 3, "three", "bin.000001", 30)),
            (0, {"id": 5}, event("c", 5, "five", "bin.000001", 50)),
            (0, {"id": 6}, event("c", 6, "no position", "bin.000001", None)),
            (1, {"id": 7}, event("d", 7, "no source file", None, 70)),
        ],
    )
    run_to_end(st, catalog_config, spark, tmp_path)
    assert table_rows(catalog_config, "cdc_sequence") == expect(
        {1: ("created", 1.0), 2: ("two", 1.0), 3: ("three", 1.0), 5: ("five", 1.0)}
    )

    send(
        kafka,
        topic,
        [
            (1, {"id": 1}, event("u", 1, "stale", "bin.000001", 8)),  # older than the row: skipped
            (0, {"id": 2}, event("d", 2, "stale delete", "bin.000001", 15)),  # older: the row stays
            (1, {"id": 3}, event("u", 3, "next binlog", "bin.000002", 1)),  # a later file: applied
            (0, {"id": 5}, None),  # a tombstone has no position: not applied
            (1, {"id": 5}, event("c", 5, "five", "bin.000001", 50)),  # sent again after a restart
            (1, {"id": 4}, event("c", 4, "four", "bin.000002", 5)),
            (0, {"id": 4}, event("d", 4, "four", "bin.000002", 6)),  # later position, lower partition
        ],
    )
    reports = run_to_end(st, catalog_config, spark, tmp_path)
    assert sum(r.records_read for r in reports) == 7
    expected = expect({1: ("created", 1.0), 2: ("two", 1.0), 3: ("next binlog", 1.0), 5: ("five", 1.0)})
    assert table_rows(catalog_config, "cdc_sequence") == expected
    assert spark_rows(spark, catalog_config, "cdc_sequence") == expected
    assert duckdb_rows(catalog_config, "cdc_sequence") == expected
    stored = spark.sql(
        f"SELECT id, _sequence FROM {catalog_config.name}.it.cdc_sequence WHERE id = 3"
    ).first()
    assert stored is not None and stored._sequence == ["bin.000002", "1".rjust(38, "0")]
    assert dead_letters(catalog_config, "cdc_sequence") == [
        "Debezium event has no source.file (spec.sequenceBy orders a key's changes by it)",
        "Debezium event has no source.pos (spec.sequenceBy orders a key's changes by it)",
    ]

    # Keys 1 and 4 were changed in both partitions: the position orders them, so the audit judges them.
    report = audited(spark, st, catalog_config)
    assert report.ok, report.render()
    assert (report.records, report.keys, report.unordered) == (14, 4, 0)


def test_cdc_remembers_deleted_keys_against_late_older_changes(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """spec.sequenceBy: a deleted key has no row to keep its position, so the table remembers it: a change
    older than the delete that arrives in a later batch stays out, a newer one brings the key back (and
    is then guarded by its row); the set lands with the offsets and maintenance keeps its file."""
    from icefall.commit.state import DELETED_KEYS
    from icefall.compact.view import read_table_view
    from icefall.ingest import deleted_keys

    topic = "it-cdc-deleted"
    kafka.create_topic(topic, partitions=2)
    st = streams.keyed_table(
        "cdc_deleted", topic, kafka.bootstrap, mode="cdc", fields=FIELDS, sequence_by=["source.lsn"]
    )

    def event(op: str, i: int, status: str, lsn: int) -> dict[str, Any]:
        image = row(i, status)
        before, after = (image, None) if op == "d" else (None, image)
        return {"op": op, "before": before, "after": after, "source": {"lsn": lsn}}

    def remembered() -> dict[int, list[str]]:
        table = catalog_config.pyiceberg().load_table(("it", "cdc_deleted"))
        keys = deleted_keys.load(table, table.properties.get(DELETED_KEYS))
        return {} if keys is None else {json.loads(r["key"])["id"]: r["_sequence"] for r in keys.to_pylist()}

    def lsn(n: int) -> list[str]:
        return [str(n).rjust(38, "0")]

    batches = [
        [
            (0, {"id": 10}, event("c", 10, "ten", 100)),
            (1, {"id": 11}, event("d", 11, "eleven", 200)),  # deleted before its (older) insert arrives
            (0, {"id": 12}, event("c", 12, "twelve", 300)),
        ],
        [(1, {"id": 12}, event("d", 12, "twelve", 400))],
        [
            (0, {"id": 11}, event("c", 11, "late insert", 150)),  # older than its delete: stays out
            (0, {"id": 12}, event("u", 12, "late update", 350)),  # older than its delete: stays out
            (1, {"id": 13}, event("c", 13, "thirteen", 500)),
        ],
        [(1, {"id": 12}, event("c", 12, "back again", 450))],  # newer than the delete: the key is back
    ]
    expected_after = [
        ({10: ("ten", 1.0), 12: ("twelve", 1.0)}, {11: lsn(200)}),
        ({10: ("ten", 1.0)}, {11: lsn(200), 12: lsn(400)}),
        ({10: ("ten", 1.0), 13: ("thirteen", 1.0)}, {11: lsn(200), 12: lsn(400)}),
        ({10: ("ten", 1.0), 12: ("back again", 1.0), 13: ("thirteen", 1.0)}, {11: lsn(200)}),
    ]
    for changes, (rows, keys) in zip(batches, expected_after, strict=True):
        send(kafka, topic, changes)
        run_to_end(st, catalog_config, spark, tmp_path)
        assert table_rows(catalog_config, "cdc_deleted") == expect(rows)
        assert remembered() == keys

    table = catalog_config.pyiceberg().load_table(("it", "cdc_deleted"))
    path = table.properties[DELETED_KEYS]
    assert path in read_table_view(table).referenced_paths  # orphan removal keeps it
    report = audited(spark, st, catalog_config)
    assert report.ok, report.render()
    assert (report.records, report.keys) == (8, 3)


def _compact_all(spark: SparkSession, config: CatalogConfig, identifier: tuple[str, ...]) -> Any:
    """Run compaction of every data file of the table's head (one partition: unpartitioned)."""
    from icefall.compact.view import read_table_view
    from icefall.compact.worker import run_item
    from icefall.plan.maintenance_items import CompactPartition
    from icefall.plan.table_view import FileContent

    view = read_table_view(config.pyiceberg().load_table(identifier))
    files = tuple(f.path for f in view.files if f.content is FileContent.DATA)
    item = CompactPartition(
        partition=(), files=files, input_bytes=1, target_size_bytes=128 << 20, reason="test"
    )
    return run_item(spark, config, identifier, item)


def test_compaction_and_a_keyed_batch_in_between_each_other(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """Compaction commits while a keyed batch is staged: re-staging the batch on top would miss the files
    its position deletes point at (two versions of a key), so the commit refuses it and the batch is
    planned again on the compacted table. A keyed batch commits while compaction is rewriting: Iceberg's
    validation of new deletes refuses the rewrite (it would bring the deleted rows back)."""
    from icefall.commit import MaintenanceConflictError
    from icefall.compact.worker import Outcome

    topic = "it-upsert-compact"
    kafka.create_topic(topic, partitions=1)
    st = keyed_table("upsert_compact", topic, kafka.bootstrap)
    identifier = ("it", "upsert_compact")
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease", "w"))
    ingestor.start(lease_timeout=10)
    try:
        for i in range(3):  # three versions of ten keys, in three files
            send(kafka, topic, [(0, k, row(k, f"v{i}")) for k in range(10)])
            assert ingestor.run_batch() is not None
        send(kafka, topic, [(0, k, row(k, "last")) for k in range(5)])

        def compact(_: str) -> None:
            assert _compact_all(spark, catalog_config, identifier).outcome is Outcome.DONE

        with (
            failpoints.armed("main.before-commit", compact, hit=1),
            pytest.raises(MaintenanceConflictError),
        ):
            ingestor.run_batch()
        assert table_rows(catalog_config, "upsert_compact") == expect({k: ("v2", 1.0) for k in range(10)})
        assert ingestor.run_batch() is not None  # planned again: lands on the compacted files
        expected = expect({k: ("last" if k < 5 else "v2", 1.0) for k in range(10)})
        assert table_rows(catalog_config, "upsert_compact") == expected

        send(kafka, topic, [(0, k, None) for k in range(3)])  # deletes, committed mid-rewrite

        def ingest(_: str) -> None:
            assert ingestor.run_batch() is not None

        with failpoints.armed("main.mid-rewrite", ingest, hit=1), pytest.raises(Exception) as refused:
            _compact_all(spark, catalog_config, identifier)
        assert is_delete_conflict(refused.value), refused.value  # the runner counts these
    finally:
        ingestor.close()
    expected = {k: v for k, v in expected.items() if k >= 3}
    assert table_rows(catalog_config, "upsert_compact") == expected

    # Compaction over position deletes keeps the rows, and Spark reads what pyiceberg reads.
    assert _compact_all(spark, catalog_config, identifier).outcome is Outcome.DONE
    assert table_rows(catalog_config, "upsert_compact") == expected
    assert spark_rows(spark, catalog_config, "upsert_compact") == expected
    assert duckdb_rows(catalog_config, "upsert_compact") == expected
    report = audited(spark, st, catalog_config)
    assert report.ok, report.render()
