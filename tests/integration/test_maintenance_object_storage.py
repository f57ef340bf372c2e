"""Maintenance on tables whose files live in an object store, on a shared catalog: S3 (MinIO), Google Cloud
Storage (fake-gcs-server, `gs://`) and Azure storage (Azurite, `abfss://`), one parametrized test.

Proves, with Spark's Iceberg runtime writing through S3FileIO, GCSFileIO or ADLSFileIO and the maintenance
worker (`run_item`, what the compaction pods run) on a JDBC catalog on PostgreSQL and on Iceberg's REST
server:
- the planner's view lists the table's objects in the store with the table's own FileIO settings
  (endpoint, region, credentials), in the same spelling as the metadata's paths (`s3://`, `gs://`,
  `abfss://`), and sees a stray object as an orphan;
- compaction rewrites a partition's small files into fewer, keeping the rows;
- snapshot expiry deletes the files only expired snapshots reached, from the store;
- orphan removal deletes exactly the stray object from the store once it is past the safety window, and
  the rows are unchanged throughout.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.compact.view import filesystem_for, read_table_view
from icefall.compact.worker import Outcome, run_item
from icefall.plan.maintenance import plan_maintenance
from icefall.plan.maintenance_items import (
    HOUR_MS,
    CompactPartition,
    ExpireSnapshots,
    MaintenancePolicy,
    RemoveOrphans,
)
from icefall.testing.streams import SHARED_CATALOGS, manifest_text, shared_catalog

pytestmark = pytest.mark.integration


def rows(config: CatalogConfig, identifier: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
    table = config.pyiceberg().load_table(identifier).scan().to_arrow()
    return Counter(tuple(map(repr, row.values())) for row in table.to_pylist())


@pytest.mark.parametrize("kind", SHARED_CATALOGS)
def test_compaction_expiry_and_orphan_removal_in_object_storage(
    spark: SparkSession, request: pytest.FixtureRequest, kind: str
) -> None:
    catalog_name = f"maint_{kind.replace('-', '_')}"
    shared = shared_catalog(request, kind, name=catalog_name)
    config = shared.config(
        load_manifest(manifest_text("unused", "it-unused", "127.0.0.1:1", catalog=shared.block))
    )
    for key, value in config.spark_conf().items():  # a second catalog in the tests' one Spark session
        spark.conf.set(key, value)
    table_name = f"{catalog_name}.it.small_files"
    identifier = ("it", "small_files")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog_name}.it")
    spark.sql(
        f"CREATE TABLE {table_name} (id bigint, p string) USING iceberg PARTITIONED BY (p) "
        "TBLPROPERTIES ('format-version'='2')"
    )
    for i in range(6):
        spark.sql(f"INSERT INTO {table_name} VALUES ({i}, 'a'), ({100 + i}, 'b')")
    table = config.pyiceberg().load_table(identifier)
    assert table.location().startswith(f"{shared.scheme}://"), table.location()
    before = rows(config, identifier)

    # A stray object under the table's location, written by someone else: an orphan.
    stray_path = f"{table.location()}/data/stray-orphan.parquet"
    filesystem, stray = filesystem_for(stray_path, table.io)
    with filesystem.open_output_stream(stray) as out:
        out.write(b"not referenced by any metadata")

    view = read_table_view(table)
    listed = {o.path for o in view.storage}
    assert {f.path for f in view.files} <= listed, "the listing spells paths as the metadata does"
    assert listed - view.referenced_paths == {stray_path}

    policy = MaintenancePolicy(
        min_files_to_compact=3,
        snapshot_min_keep=1,
        snapshot_max_age_ms=0,
        expire_batch=1,
        orphan_min_age_ms=HOUR_MS,
    )
    now = int(time.time() * 1000)
    compactions = [w for w in plan_maintenance(view, policy, now) if isinstance(w, CompactPartition)]
    assert len(compactions) == 2
    for item in compactions:
        assert run_item(spark, config, identifier, item).outcome is Outcome.DONE
    after = read_table_view(config.pyiceberg().load_table(identifier), list_storage=False)
    assert len(after.files) == 2 and rows(config, identifier) == before

    view = read_table_view(config.pyiceberg().load_table(identifier))
    expiries = [w for w in plan_maintenance(view, policy, now + 1) if isinstance(w, ExpireSnapshots)]
    assert len(expiries) == 1
    expired = run_item(spark, config, identifier, expiries[0])
    assert expired.outcome is Outcome.DONE
    view = read_table_view(config.pyiceberg().load_table(identifier))
    gone = listed - {o.path for o in view.storage}
    assert len(gone) >= 12, "the small files only expired snapshots reached were deleted from the store"
    assert rows(config, identifier) == before

    later = int(time.time() * 1000) + HOUR_MS + 60_000
    orphans = [w for w in plan_maintenance(view, policy, later) if isinstance(w, RemoveOrphans)]
    assert len(orphans) == 1 and orphans[0].paths == (stray_path,)
    result = run_item(spark, config, identifier, orphans[0])
    assert result.deleted_paths == (stray_path,)
    from pyarrow import fs

    assert filesystem.get_file_info(stray).type == fs.FileType.NotFound
    assert rows(config, identifier) == before
