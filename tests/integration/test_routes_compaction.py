"""Compaction of a routed StreamingTable's tables, against real Spark (Iceberg runtime) and SQLite.

Proves: the compaction pods' runner (`tables_runner`, what `icefall compact` and `icefall run` use) tidies a
route's table, not only spec.table: a route table of many small files is rewritten into fewer with the same
rows, under that table's own work Lease (`destination_leases`), while a tidy spec.table has nothing to do
and a route table not created yet is passed over; then a table the dynamic route made (found by its owner
property) is rewritten the same way under the Leases the dynamic route's tables share
(`dynamic_route_leases`), and a table of its template without the owner property is never touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from icefall.api import streaming_table_from_object
from icefall.api.routes import DYNAMIC_OWNER_PROPERTY
from icefall.catalog import CatalogConfig
from icefall.compact.runner import TablesRunner, file_leases, tables_runner
from icefall.compact.view import read_table_view
from icefall.plan.maintenance_items import CompactPartition, MaintenancePolicy
from icefall.plan.names import destination_leases, dynamic_route_leases
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
    obj["spec"]["dynamicRoute"] = {"from": "Field", "name": "customer", "nameTemplate": "rc_{value}"}
    st = streaming_table_from_object(obj)
    prefix = f"{catalog_config.name}.{NAMESPACE}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {prefix}")
    owner = f"'{DYNAMIC_OWNER_PROPERTY}'='{NAMESPACE}.rc_main'"
    made = (("rc_main", 1, ""), ("rc_clicks", 6, ""), ("rc_made", 6, f", {owner}"), ("rc_other", 6, ""))
    for name, inserts, extra in made:
        spark.sql(
            f"CREATE TABLE {prefix}.{name} (id bigint) USING iceberg "
            f"TBLPROPERTIES ('format-version'='2'{extra})"
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

    # The dynamic route's table takes its turn next, under the Leases its tables share.
    step = runner.step()
    assert step.table == "it.rc_made" and step.result is not None and step.result.files_rewritten == 6
    shared = dynamic_route_leases(st)
    assert shared is not None
    assert any(path.name.startswith(shared.work[0].rsplit("-work-", 1)[0]) for path in leases.iterdir())
    later = [runner.step() for _ in range(4)]  # whatever else is due (e.g. manifests), then nothing
    assert not later[-1].ran and "it.rc_other" not in {r.table for r in later}  # no owner property
    other = catalog_config.pyiceberg().load_table((NAMESPACE, "rc_other"))
    assert len(read_table_view(other, list_storage=False).files) == 6
