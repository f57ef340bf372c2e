"""Maintenance committed by real Spark between staging and commit never costs an ingestion batch.

Proves, with Spark (the Iceberg runtime's procedures and SQL) committing to `main` at a deterministic moment
(the failpoints `main.after-stage` / `main.before-commit` of `commit_staged`) on a table partitioned by day,
whose batches Spark writes to the staging branch as the ingestion engine does:
- a `rewrite_data_files` compaction, a retention `DELETE FROM … WHERE <whole days>` (a metadata-only
  delete) and a `rewrite_manifests` landing after the batch was staged: the batch is re-staged on top, in one
  commit; the table then holds, as a multiset, exactly the rows before, minus what the retention deleted,
  plus the batch, once; the committed offsets are the batch's end; the staging branch is gone;
- each compaction commit kept the multiset of rows (time travel to its parent and to it agree);
- a compaction that lands inside the re-stage's commit window (after the re-check) makes the catalog refuse
  the re-stage, and the next attempt re-stages over it: still exactly once;
- an ingestion commit by another writer between staging and commit is still refused (StaleHeadError).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta

import pytest
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, TimestamptzType
from pyspark.sql import SparkSession

from icefall.catalog import CatalogConfig
from icefall.commit import (
    Batch,
    MaintenanceConflictError,
    Stage,
    StaleHeadError,
    commit_staged,
    commit_staged_outcome,
    prepare_stage,
    read_committed,
    stage_branch_name,
)
from icefall.runtime import failpoints

pytestmark = pytest.mark.integration

TOPIC = "orders"
NAMESPACE = "maint"
DAY0 = datetime(2026, 1, 1, tzinfo=UTC)
ROWS_PER_DAY = 5  # record (p, o) is on day o // ROWS_PER_DAY: every batch touches a few day partitions

Row = tuple[int, int, str, datetime]


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


@pytest.fixture
def table(request: pytest.FixtureRequest, catalog_config: CatalogConfig) -> Table:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    catalog = catalog_config.pyiceberg()
    catalog.create_namespace_if_not_exists(NAMESPACE)
    schema = Schema(
        NestedField(1, "partition", IntegerType(), required=False),
        NestedField(2, "offset", LongType(), required=False),
        NestedField(3, "value", StringType(), required=False),
        NestedField(4, "ts", TimestamptzType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=4, field_id=1000, transform=DayTransform(), name="ts_day"))
    name = f"{NAMESPACE}.{request.node.name.removeprefix('test_')[:40]}"
    if catalog.table_exists(name):
        catalog.purge_table(name)
    return catalog.create_table(name, schema, partition_spec=spec)


def spark_name(config: CatalogConfig, table: Table, branch: str | None = None) -> str:
    parts = [config.name, *table.name()]
    return ".".join(parts + ([f"branch_{branch}"] if branch else []))


def rows_of(batch: Batch) -> list[Row]:
    return [
        (p, o, f"p{p}-o{o}", DAY0 + timedelta(days=o // ROWS_PER_DAY, minutes=p))
        for p in sorted(batch.start)
        for o in range(batch.start[p], batch.end[p])
    ]


def stage_with_spark(
    spark: SparkSession, config: CatalogConfig, table: Table, attempt: int, sizes: Mapping[int, int]
) -> tuple[Stage, Batch, list[Row]]:
    """Stage the next `sizes[p]` records of each partition with one Spark append to the staging branch."""
    stage = prepare_stage(table, stage_branch_name("spark", attempt))
    start = {p: stage.base.offsets.get(p, 0) for p in sizes}
    batch = Batch(TOPIC, start=start, end={p: start[p] + n for p, n in sizes.items()})
    rows = rows_of(batch)
    frame = spark.createDataFrame(rows, "partition int, offset bigint, value string, ts timestamp")
    frame.writeTo(spark_name(config, table, stage.branch)).append()
    return stage, batch, rows


def ingest(
    spark: SparkSession, config: CatalogConfig, table: Table, attempt: int, sizes: Mapping[int, int]
) -> list[Row]:
    stage, batch, rows = stage_with_spark(spark, config, table, attempt, sizes)
    commit_staged(table, stage, batch, epoch=1)
    return rows


def table_rows(table: Table, snapshot_id: int | None = None) -> Counter[Row]:
    """The rows of `main` (or of `snapshot_id`), as a multiset."""
    table.refresh()
    scan = table.scan(snapshot_id=snapshot_id) if snapshot_id is not None else table.scan()
    return Counter((r["partition"], r["offset"], r["value"], r["ts"]) for r in scan.to_arrow().to_pylist())


def data_files(table: Table) -> int:
    table.refresh()
    return len(table.inspect.files())


def compaction(config: CatalogConfig, table: Table) -> str:
    """Spark's compaction of every partition with at least two data files (a `replace` snapshot)."""
    ident = ".".join(table.name())
    options = "map('min-input-files', '2')"
    return f"CALL {config.name}.system.rewrite_data_files(table => '{ident}', options => {options})"


def in_spark(spark: SparkSession, *statements: str) -> Callable[[str], None]:
    """A failpoint action: Spark runs `statements` (each must commit something to main), once."""

    def act(name: str) -> None:
        failpoints.disarm(name)
        for statement in statements:
            spark.sql(statement).collect()

    return act


def assert_compactions_kept_the_rows(table: Table) -> int:
    """Every `replace` snapshot on main shows the same multiset of rows as its parent; returns how many."""
    table.refresh()
    checked = 0
    for snapshot in table.snapshots():
        if snapshot.summary is not None and snapshot.summary.operation.value == "replace":
            assert snapshot.parent_snapshot_id is not None
            assert table_rows(table, snapshot.snapshot_id) == table_rows(table, snapshot.parent_snapshot_id)
            checked += 1
    return checked


def test_a_compaction_a_retention_delete_and_a_manifest_rewrite_are_restaged_over(
    spark: SparkSession, catalog_config: CatalogConfig, table: Table
) -> None:
    cat, ident = catalog_config.name, ".".join(table.name())
    expected: Counter[Row] = Counter()
    for attempt in range(4):  # a few small files per day partition, for compaction to merge
        expected.update(ingest(spark, catalog_config, table, attempt, {0: 4, 1: 3}))
    assert table_rows(table) == expected
    files_before = data_files(table)

    # 1. Compaction (operation "replace") lands between staging and commit.
    stage, batch, rows = stage_with_spark(spark, catalog_config, table, 10, {0: 3, 1: 2})
    compact = (
        f"CALL {cat}.system.rewrite_data_files(table => '{ident}', options => map('min-input-files', '2'))"
    )
    with failpoints.armed("main.after-stage", in_spark(spark, compact)):
        outcome = commit_staged_outcome(table, stage, batch, epoch=1)
    assert outcome.restaged
    expected.update(rows)
    assert table_rows(table) == expected
    assert read_committed(table).offsets == {0: 19, 1: 14}
    assert data_files(table) < files_before  # the compaction really merged files

    # 2. Retention: a whole-day delete (metadata only: operation "delete") lands between staging and commit.
    stage, batch, rows = stage_with_spark(spark, catalog_config, table, 11, {0: 2, 1: 2})
    cutoff = DAY0 + timedelta(days=1)
    retention = f"DELETE FROM {spark_name(catalog_config, table)} WHERE ts < TIMESTAMP '{cutoff.isoformat()}'"
    with failpoints.armed("main.after-stage", in_spark(spark, retention)):
        outcome = commit_staged_outcome(table, stage, batch, epoch=1)
    assert outcome.restaged
    table.refresh()
    operations = [table.snapshot_by_id(s).summary.operation.value for s in outcome.restaged_over]  # type: ignore[union-attr]
    assert operations == ["delete"]
    expected = Counter({row: n for row, n in expected.items() if row[3] >= cutoff})
    expected.update(rows)
    assert table_rows(table) == expected
    assert read_committed(table).offsets == {0: 21, 1: 16}

    # 3. A manifest rewrite, then a compaction inside the re-stage's commit window: the catalog refuses the
    # re-stage (main moved after the re-check), and the next attempt re-stages over both.
    stage, batch, rows = stage_with_spark(spark, catalog_config, table, 12, {0: 1, 1: 4})
    failpoints.arm("main.after-stage", in_spark(spark, f"CALL {cat}.system.rewrite_manifests('{ident}')"))
    failpoints.arm("main.before-commit", in_spark(spark, compact))
    outcome = commit_staged_outcome(table, stage, batch, epoch=1)
    assert outcome.restaged and len(outcome.restaged_over) == 2
    expected.update(rows)
    assert table_rows(table) == expected
    assert max(table_rows(table).values()) == 1
    assert read_committed(table).offsets == {0: 22, 1: 20}
    meta = table.refresh().metadata
    on_main = {s.snapshot_id for s in ancestors_of(meta.current_snapshot(), meta)}
    assert all(ref.snapshot_id in on_main for ref in meta.refs.values())  # no branch holds a batch main lacks

    assert assert_compactions_kept_the_rows(table) >= 2


def test_an_ingestion_commit_in_between_is_still_refused(
    spark: SparkSession, catalog_config: CatalogConfig, table: Table
) -> None:
    expected: Counter[Row] = Counter()
    for attempt in range(2):
        expected.update(ingest(spark, catalog_config, table, attempt, {0: 3}))
    stage, batch, _ = stage_with_spark(spark, catalog_config, table, 5, {0: 3})

    def compaction_then_another_writer(name: str) -> None:
        failpoints.disarm(name)
        spark.sql(compaction(catalog_config, table)).collect()
        other = table.catalog.load_table(table.name())
        expected.update(ingest(spark, catalog_config, other, 6, {0: 3}))

    with (
        failpoints.armed("main.after-stage", compaction_then_another_writer),
        pytest.raises(StaleHeadError) as refused,
    ):
        commit_staged(table, stage, batch, epoch=1)
    assert not isinstance(refused.value, MaintenanceConflictError)
    assert table_rows(table) == expected
    assert read_committed(table).offsets == {0: 9}
