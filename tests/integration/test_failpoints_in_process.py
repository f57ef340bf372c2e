"""Failpoints no `icefall run` kill reaches: maintenance between its re-check and its delete, and an empty
batch staged by Icefall rather than by Spark. Each changes nothing it should not, and finishes later.

Proves: a process running orphan removal (`run_item` of a planned `RemoveOrphans`, in a child: orphan
removal needs no Spark) killed at `main.before-orphan-delete` on its 2nd file has deleted exactly the first
orphan and nothing referenced, the table reads the same, and a second run deletes the rest; snapshot expiry
failing at `main.before-expire` (in process, with the shared Spark) has expired nothing and the table
reads the same, and the next run expires the planned snapshots; an empty batch that the writer staged
nothing for gets its empty snapshot on the staging branch (`main.after-ensure-staged`, where `main` is
untouched) and then commits. The compaction rewrite's point (`main.mid-rewrite`) is killed in
test_compaction.py; the others in test_failpoint_kills.py.
Not proved: a kill inside Iceberg's `expire_snapshots` between its metadata commit and its file deletes
(Spark's procedure has no hook there; files it leaves are orphans by construction).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from icefall.catalog import CatalogConfig
from icefall.compact.view import read_table_view, to_local_path
from icefall.compact.worker import Outcome, run_item
from icefall.plan.maintenance import plan_maintenance, plan_orphans
from icefall.plan.maintenance_items import HOUR_MS, ExpireSnapshots, MaintenancePolicy
from icefall.runtime import failpoints
from icefall.runtime.failpoints import FailpointError

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import json, sys
    from icefall.catalog import CatalogConfig
    from icefall.catalog.config import CatalogType
    from icefall.compact.worker import run_item
    from icefall.plan.maintenance_items import RemoveOrphans

    args = json.loads(sys.argv[1])
    config = CatalogConfig(
        name=args["name"], type=CatalogType.SQL, uri=args["uri"], warehouse=args["warehouse"]
    )
    item = RemoveOrphans(args["older_than_ms"], tuple(args["paths"]))
    run_item(None, config, tuple(args["identifier"]), item)
    print("survived")
    """
)


@pytest.fixture(autouse=True)
def _no_failpoints() -> Any:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def rows(config: CatalogConfig, identifier: tuple[str, ...]) -> list[int]:
    return sorted(config.pyiceberg().load_table(identifier).scan().to_arrow().column("id").to_pylist())


def test_orphan_removal_killed_before_a_delete_deleted_only_orphans(
    catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    identifier = ("it", "fp_orphans")
    catalog = catalog_config.pyiceberg()
    catalog.create_namespace_if_not_exists("it")
    data = pa.table({"id": pa.array(range(10), pa.int64())})
    table = catalog.create_table(identifier, schema=data.schema)
    table.append(data)
    folder = Path(to_local_path(table.metadata.location) or "") / "data"
    folder.mkdir(parents=True, exist_ok=True)
    old = time.time() - 2 * 3600
    junk = []
    for i in range(3):
        path = folder / f"orphan-{i}.parquet"
        path.write_bytes(b"written by a writer that died")
        os.utime(path, (old, old))
        junk.append(path)
    now_ms = int(time.time() * 1000)
    item = plan_orphans(read_table_view(table), MaintenancePolicy(orphan_min_age_ms=HOUR_MS), now_ms)
    assert item is not None
    assert sorted(Path(to_local_path(p) or "") for p in item.paths) == junk
    args = {
        "name": catalog_config.name,
        "uri": catalog_config.uri,
        "warehouse": catalog_config.warehouse,
        "identifier": list(identifier),
        "older_than_ms": item.older_than_ms,
        "paths": list(item.paths),
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],  # this checkout (set by the test plugin)
        failpoints.ENV_VAR: "main.before-orphan-delete=exit@2",
    }
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert child.returncode == failpoints.EXIT_STATUS, child.stdout + child.stderr
    assert "failpoint main.before-orphan-delete triggered (hit 2)" in child.stderr, child.stderr
    assert "survived" not in child.stdout
    assert [p.exists() for p in junk] == [False, True, True]  # the first deleted, the second was next
    assert rows(catalog_config, identifier) == list(range(10))

    again = run_item(cast(Any, None), catalog_config, identifier, item)  # orphan removal needs no Spark
    assert again.outcome is Outcome.DONE and len(again.deleted_paths) == 2
    assert not any(p.exists() for p in junk)
    assert rows(catalog_config, identifier) == list(range(10))


def test_expiry_stopped_before_its_call_expires_nothing(
    spark: SparkSession, catalog_config: CatalogConfig
) -> None:
    identifier = ("it", "fp_expire")
    catalog = catalog_config.pyiceberg()
    catalog.create_namespace_if_not_exists("it")
    table = catalog.create_table(identifier, schema=pa.schema([pa.field("id", pa.int64())]))
    for i in range(4):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    table = catalog.load_table(identifier)
    snapshots = {s.snapshot_id for s in table.metadata.snapshots}
    policy = MaintenancePolicy(snapshot_max_age_ms=0, snapshot_min_keep=1)
    view = read_table_view(table, list_storage=False)
    [item] = [
        w
        for w in plan_maintenance(view, policy, int(time.time() * 1000) + 1000)
        if isinstance(w, ExpireSnapshots)
    ]
    assert item.expire_ids

    with failpoints.armed("main.before-expire", "raise"), pytest.raises(FailpointError):
        run_item(spark, catalog_config, identifier, item)
    after = catalog.load_table(identifier)
    assert {s.snapshot_id for s in after.metadata.snapshots} == snapshots
    assert rows(catalog_config, identifier) == [0, 1, 2, 3]

    hits = failpoints.hits("main.before-expire")
    result = run_item(spark, catalog_config, identifier, item)
    assert failpoints.hits("main.before-expire") == hits + 1
    assert result.outcome is Outcome.DONE and set(item.expire_ids) <= set(result.expired_ids)
    assert rows(catalog_config, identifier) == [0, 1, 2, 3]


def test_an_empty_batch_staged_by_icefall_passes_its_point(catalog_config: CatalogConfig) -> None:
    """Spark stages an empty snapshot for an empty append itself: this is the fallback for other writers."""
    from icefall.commit import (
        Batch,
        StaleHeadError,
        abandon_stage,
        commit_staged,
        prepare_stage,
        read_committed,
        stage_branch_name,
    )
    from icefall.ingest.commits import stage_empty

    identifier = ("it", "fp_empty_batch")
    catalog = catalog_config.pyiceberg()
    catalog.create_namespace_if_not_exists("it")
    table = catalog.create_table(identifier, schema=pa.schema([pa.field("id", pa.int64())]))
    stage = prepare_stage(table, stage_branch_name("w", 1))
    base = stage.base.snapshot_id

    with failpoints.armed("main.after-ensure-staged", "raise"), pytest.raises(FailpointError):
        stage_empty(table, stage.branch, base)
    table.refresh()
    assert table.metadata.refs[stage.branch].snapshot_id != base  # staged
    assert table.metadata.refs["main"].snapshot_id == base  # main untouched

    staged = table.metadata.refs[stage.branch].snapshot_id
    stage_empty(table, stage.branch, base)  # the branch holds a snapshot already: not staged twice
    table.refresh()
    assert table.metadata.refs[stage.branch].snapshot_id == staged
    other = prepare_stage(table, stage_branch_name("w", 2))
    with pytest.raises(StaleHeadError):  # a branch that is not at (or one snapshot past) the base
        stage_empty(table, other.branch, staged)
    abandon_stage(table, other.branch)
    commit_staged(table, stage, Batch("t", start={0: 0}, end={0: 0}), epoch=1)
    assert read_committed(table).offsets == {0: 0}
    assert rows(catalog_config, identifier) == []
