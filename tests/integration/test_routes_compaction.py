"""Compaction of a routed StreamingTable's tables, against real Spark (Iceberg runtime) and SQLite.

Proves: the compaction pods' runner (`tables_runner`, what `icefall compact` and `icefall run` use) tidies a
route's table, not only spec.table: a route table of many small files is rewritten into fewer with the same
rows, under that table's own work Lease (`destination_leases`), while a tidy spec.table has nothing to do
and a route table not created yet is passed over.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from icefall.api import streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.compact.runner import TablesRunner, file_leases, tables_runner
from icefall.compact.view import read_table_view
from icefall.plan.maintenance_items import CompactPartition, MaintenancePolicy
from icefall.plan.names import destination_leases
from icefall.testing.streams import NAMESPACE, manifest_text

pytestmark = pytest.mark.integration


def test_the_compaction_runner_tidies_a_route_table(
    spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    obj = yaml.safe_load(manifest_text("rc_main", "rc-events", "127.0.0.1:1"))
    obj["spec"]["routes"] = [
        {"table": {"name": "rc_clicks"}, "when": "customer = 'click'"},
        {"table": {"name": "rc_missing"}, "when": "customer = 'view'"},
    ]
    st = streaming_table_from_object(obj)
    prefix = f"{catalog_config.name}.{NAMESPACE}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {prefix}")
    for name, inserts in (("rc_main", 1), ("rc_clicks", 6)):
        spark.sql(
            f"CREATE TABLE {prefix}.{name} (id bigint) USING iceberg TBLPROPERTIES ('format-version'='2')"
        )
        for i in range(inserts):
            spark.sql(f"INSERT INTO {prefix}.{name} VALUES ({i})")  # one small file each
    clicks = (NAMESPACE, "rc_clicks")
    before = read_table_view(catalog_config.pyiceberg().load_table(clicks), list_storage=False).files
    assert len(before) == 6

    leases = tmp_path / "leases"
    runner = tables_runner(
        st,
        catalog_config,
        spark,
        file_leases(leases, "worker"),
        policy=MaintenancePolicy(min_files_to_compact=3),
    )
    assert isinstance(runner, TablesRunner) and len(runner.runners) == 3
    step = runner.step()
    assert step.table == "it.rc_clicks" and isinstance(step.item, CompactPartition), step
    assert step.result is not None and step.result.files_rewritten == 6
    table = catalog_config.pyiceberg().load_table(clicks)
    assert len(read_table_view(table, list_storage=False).files) == 1
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == list(range(6))
    # Claimed with the route table's own work Lease (its identity), released after.
    own = destination_leases(st)[1]
    assert any(path.name.startswith(own.work[0].rsplit("-work-", 1)[0]) for path in leases.iterdir())
