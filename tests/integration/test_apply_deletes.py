"""Delete application (`ApplyDeletes`) on keyed tables, against real Kafka, Spark and the SQLite catalog.

Proves: `read_table_view` names the data file each position delete file of a keyed batch deletes from,
with its deleted-row count; the planner picks exactly the data files whose deleted share passes the
threshold; a data file never has more than one delete file (each batch merges the earlier ones into
its own); running the items rewrites them without the deleted rows and drops their delete files in the
same commit, while Spark and pyiceberg read the same rows as before and `audit_keyed` finds the table
right; a keyed batch that commits new deletes against those files while the rewrite is running makes
Iceberg refuse the rewrite (no deleted row comes back), and the item planned again afterwards succeeds;
a data file whose rows are all deleted goes with its delete file and nothing is written in its place.

Does not prove: the per-partition delete-file-count trigger on a real table (unit-tested), partitioned
tables, or equality deletes (Icefall writes none).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.audit import audit_keyed
from icefall.catalog import CatalogConfig
from icefall.compact.view import read_table_view
from icefall.compact.worker import Outcome, is_delete_conflict, run_item
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.maintenance import plan_maintenance
from icefall.plan.maintenance_items import ApplyDeletes, MaintenancePolicy
from icefall.plan.table_view import FileContent, TableView
from icefall.runtime import failpoints
from icefall.testing.streams import keyed_table, send_changes, started_ingestor

pytestmark = pytest.mark.integration

NOW = 2_000_000_000_000  # the planner's clock; no item here depends on it


def send(kafka: KafkaBroker, topic: str, changes: Iterable[tuple[int, str | None]]) -> None:
    """Produce (key, status) changes to partition 0 in order; status None is a tombstone."""
    send_changes(kafka, topic, [(0, k, None if s is None else {"id": k, "status": s}) for k, s in changes])


def pyiceberg_rows(config: CatalogConfig, identifier: tuple[str, str]) -> dict[int, str]:
    rows = config.pyiceberg().load_table(identifier).scan().to_arrow().to_pylist()
    by_id = {r["id"]: r["status"] for r in rows}
    assert len(by_id) == len(rows), "a key appears twice"
    return by_id


def spark_rows(spark: SparkSession, config: CatalogConfig, identifier: tuple[str, str]) -> dict[int, str]:
    rows = spark.sql(f"SELECT id, status FROM {config.name}.{'.'.join(identifier)}").collect()
    return {r.id: r.status for r in rows}


def view_of(config: CatalogConfig, identifier: tuple[str, str]) -> TableView:
    return read_table_view(config.pyiceberg().load_table(identifier), list_storage=False)


def delete_files(view: TableView) -> list[Any]:
    return [f for f in view.files if f.content is FileContent.POSITION_DELETES]


def apply_deletes_items(view: TableView) -> list[ApplyDeletes]:
    """The ApplyDeletes items of a plan in which no partition is due for compaction (that rewrite would take
    the small files, with their deletes, first)."""
    work = plan_maintenance(view, MaintenancePolicy(min_files_to_compact=1000), NOW)
    return [item for item in work if isinstance(item, ApplyDeletes)]


def test_apply_deletes_rewrites_the_files_past_the_threshold_and_drops_their_delete_files(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-apply-deletes"
    kafka.create_topic(topic, partitions=1)
    st = keyed_table("apply_deletes", topic, kafka.bootstrap)
    identifier = ("it", "apply_deletes")
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease") as ingestor:
        send(kafka, topic, [(k, "v0") for k in range(200)])  # file A: 200 rows
        assert ingestor.run_batch() is not None
        send(kafka, topic, [(k, "v1") for k in range(40)] + [(k, None) for k in range(190, 200)])
        assert ingestor.run_batch() is not None  # file B: 40 rows; A: 50 rows deleted
        send(kafka, topic, [(k, "v2") for k in range(5)] + [(k, "v2") for k in range(100, 104)])
        assert ingestor.run_batch() is not None  # file C: 9 rows; B: 5 of 40 deleted, A: 4 more
        send(kafka, topic, [(k, "v3") for k in range(5, 6)] + [(k, "v3") for k in range(200, 300)])
        assert ingestor.run_batch() is not None  # file D: 101 rows; B: 6 of 40 deleted (15 %)
        send(kafka, topic, [(200, "v4")])
        assert ingestor.run_batch() is not None  # file E: 1 row; D: 1 of 101 deleted (1 %)

    before = pyiceberg_rows(catalog_config, identifier)
    assert spark_rows(spark, catalog_config, identifier) == before
    assert len(before) == 290
    view = view_of(catalog_config, identifier)
    data = {f.path: f for f in view.files if f.content is FileContent.DATA}
    deletes = delete_files(view)
    deleted_rows: dict[str, int] = {}
    for d in deletes:
        assert d.referenced_data_file in data, "a keyed batch's deletes are file-scoped"
        deleted_rows[d.referenced_data_file] = deleted_rows.get(d.referenced_data_file, 0) + d.record_count
    by_rows = {data[path].record_count: n for path, n in deleted_rows.items()}
    assert by_rows == {200: 54, 40: 6, 101: 1}, by_rows  # A, B and D: C and E have no deletes
    file_a, file_b, file_d = (
        next(p for p, f in data.items() if f.record_count == rows) for rows in (200, 40, 101)
    )
    # Each keyed batch merges a data file's earlier position deletes into its new delete file (Iceberg's
    # file-scoped deletes), so there is never more than one per data file: no small delete files to merge.
    per_file = {p: sum(d.referenced_data_file == p for d in deletes) for p in deleted_rows}
    assert set(per_file.values()) == {1}, per_file

    items = apply_deletes_items(view)
    assert len(items) == 1  # one partition (unpartitioned), one step
    (item,) = items
    assert set(item.data_files) == {file_a, file_b}  # 27 % and 15 % deleted; D's 1 % stays
    assert item.deleted_rows == 60

    result = run_item(spark, catalog_config, identifier, item)
    assert result.outcome is Outcome.DONE, result.detail
    assert result.files_rewritten == 2
    assert result.extra["delete_files_removed"] == sum(
        d.referenced_data_file in (file_a, file_b) for d in deletes
    )

    after = view_of(catalog_config, identifier)
    live = {f.path for f in after.files if f.content is FileContent.DATA}
    assert not live & {file_a, file_b}
    remaining = delete_files(after)
    assert [d.referenced_data_file for d in remaining] == [file_d] * len(remaining)
    assert len(remaining) < len(deletes)
    assert pyiceberg_rows(catalog_config, identifier) == before
    assert spark_rows(spark, catalog_config, identifier) == before
    report = audit_keyed(spark, st, catalog_config.pyiceberg(), catalog_config.name)
    assert report.ok, report.render()
    assert apply_deletes_items(after) == []  # nothing due any more: D is below the threshold


def test_apply_deletes_is_refused_when_a_keyed_batch_deletes_from_its_files_meanwhile(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-apply-deletes-race"
    kafka.create_topic(topic, partitions=1)
    st = keyed_table("apply_deletes_race", topic, kafka.bootstrap)
    identifier = ("it", "apply_deletes_race")
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease") as ingestor:
        send(kafka, topic, [(k, "v0") for k in range(20)])
        assert ingestor.run_batch() is not None
        send(kafka, topic, [(k, "v1") for k in range(5)])
        assert ingestor.run_batch() is not None  # 5 of 20 rows of the first file deleted
        (item,) = apply_deletes_items(view_of(catalog_config, identifier))
        send(kafka, topic, [(k, None) for k in range(10, 13)])  # deletes from the file being rewritten

        def ingest(_: str) -> None:
            assert ingestor.run_batch() is not None

        with failpoints.armed("main.mid-rewrite", ingest, hit=1), pytest.raises(Exception) as refused:
            run_item(spark, catalog_config, identifier, item)
        assert is_delete_conflict(refused.value), refused.value  # the runner counts these

    expected = {k: "v1" if k < 5 else "v0" for k in range(20) if k not in (10, 11, 12)}
    assert pyiceberg_rows(catalog_config, identifier) == expected  # no deleted row came back
    (again,) = apply_deletes_items(view_of(catalog_config, identifier))
    assert run_item(spark, catalog_config, identifier, again).outcome is Outcome.DONE
    assert pyiceberg_rows(catalog_config, identifier) == expected
    assert spark_rows(spark, catalog_config, identifier) == expected
    assert delete_files(view_of(catalog_config, identifier)) == []
    report = audit_keyed(spark, st, catalog_config.pyiceberg(), catalog_config.name)
    assert report.ok, report.render()


def test_a_data_file_whose_rows_are_all_deleted_goes_with_its_delete_file(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-apply-deletes-all"
    kafka.create_topic(topic, partitions=1)
    st = keyed_table("apply_deletes_all", topic, kafka.bootstrap)
    identifier = ("it", "apply_deletes_all")
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease") as ingestor:
        send(kafka, topic, [(k, "v0") for k in range(10)])
        assert ingestor.run_batch() is not None
        send(kafka, topic, [(k, "v1") for k in range(10)])
        assert ingestor.run_batch() is not None  # every row of the first file replaced
    (item,) = apply_deletes_items(view_of(catalog_config, identifier))
    assert len(item.data_files) == 1 and item.deleted_rows == 10

    result = run_item(spark, catalog_config, identifier, item)

    assert result.outcome is Outcome.DONE, result.detail
    assert (result.files_rewritten, result.files_added, result.extra["delete_files_removed"]) == (1, 0, 1)
    after = view_of(catalog_config, identifier)
    assert [f.record_count for f in after.files] == [10]  # the second file alone, no delete file
    expected = {k: "v1" for k in range(10)}
    assert pyiceberg_rows(catalog_config, identifier) == expected
    assert spark_rows(spark, catalog_config, identifier) == expected
    report = audit_keyed(spark, st, catalog_config.pyiceberg(), catalog_config.name)
    assert report.ok, report.render()
