"""A Delta Lake table (`spec.table.format: delta`) in a cluster, planned without a cluster.

Proves: the operator runs a Delta table whose `spec.table.location` is an object store (s3://, s3a://,
gs://, abfss://)
with Spark inside the driver pod, and needs no catalog for it; it holds one without a location, at a local
path or file:/ URI (pods share no disk), or with executors on Kubernetes (the Delta writer stages a batch's
files on the driver's disk), each time naming the field and the fix; an Iceberg table without a catalog is
refused as before; the object-store schemes are those the Delta writer commits to; compaction pods run for
a Delta table in an object store (its Deployment at the backlog's replicas) and `Compacting` follows the
merges the driver measured due (True, False NoCompactionNeeded, kept without a recent measure), while a
local Delta table's stays at 0 with `Compacting` saying why, and an Iceberg table's replicas and conditions
are unchanged; an offset reset request on a Delta table holds its driver, naming the annotation (resets are
Iceberg's only so far); `icefall compact` of a local Delta table exits 0 saying why there is nothing to do.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall import cli
from icefall.api import ConditionReason, ConditionStatus, ConditionType, StreamingTable
from icefall.commit.delta_storage import OBJECT_STORE_SCHEMES
from icefall.plan.children import (
    DELTA_SHARED_SCHEMES,
    cluster_table_problem,
    desired_children,
    upkeep_in_pods,
)
from icefall.plan.conditions import Observations, derive_conditions
from icefall.plan.driver import DriverState
from icefall.plan.names import ANNOTATION_RESET_OFFSETS
from icefall.plan.offset_reset import FIELD as RESET_FIELD
from icefall.plan.settings import OperatorSettings
from icefall.plan.spark_conf import ANNOTATION_SPARK_MASTER, KUBERNETES_MASTER

pytestmark = pytest.mark.unit

LOCAL_MASTER = "local[*]"
ANNOTATION = f"metadata.annotations[{ANNOTATION_SPARK_MASTER}]"
NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
REQUEST = '{"to": "earliest", "requestedAt": "2026-11-29T08:00:00Z"}'


def table(
    *, location: str | None = "s3://lake/tables/orders", fmt: str = "delta", **metadata: Any
) -> StreamingTable:
    spec_table: dict[str, Any] = {"namespace": "shop", "name": "orders", "format": fmt}
    if location is not None:
        spec_table["location"] = location
    return StreamingTable.model_validate(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders", **metadata},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": spec_table,
            },
        }
    )


GCS = "gs://lake/tables/orders"
AZURE = "abfss://lake@shop.dfs.core.windows.net/tables/orders"


def test_a_delta_table_in_an_object_store_with_spark_in_the_driver_pod_runs_without_a_catalog() -> None:
    assert cluster_table_problem(table(), spark_master=LOCAL_MASTER) is None
    assert cluster_table_problem(table(location="s3a://lake/tables/orders"), spark_master="local[2]") is None
    assert cluster_table_problem(table(location=GCS), spark_master=LOCAL_MASTER) is None
    assert cluster_table_problem(table(location=AZURE), spark_master=LOCAL_MASTER) is None


@pytest.mark.parametrize("location", [None, "/data/tables/orders", "file:/data/tables/orders"])
def test_a_delta_table_without_an_object_store_location_is_held_naming_the_location(
    location: str | None,
) -> None:
    found = cluster_table_problem(table(location=location), spark_master=LOCAL_MASTER)
    assert found is not None
    field, message = found
    assert field == "spec.table.location"
    assert "s3://<bucket>/<path>" in message and "gs://<bucket>/<path>" in message  # the fix
    assert "abfss://<container>@<account>.dfs.core.windows.net/<path>" in message
    assert "secretKeyRef" in message
    if location is not None:
        assert "pods share no disk" in message and repr(location) in message


def test_a_delta_table_with_executors_on_kubernetes_is_held_naming_the_master_and_the_fix() -> None:
    annotated = table(annotations={ANNOTATION_SPARK_MASTER: "kubernetes"})
    found = cluster_table_problem(annotated, spark_master=KUBERNETES_MASTER)
    assert found is not None
    field, message = found
    assert field == ANNOTATION and message.startswith("is kubernetes,")
    assert "remove the annotation, or set it to local[*]" in message and "driver's local disk" in message


def test_a_delta_table_runs_spark_in_its_driver_pod_unless_annotated_otherwise() -> None:
    settings = OperatorSettings()  # spark_master kubernetes: an Iceberg table's executors are pods
    plan = {
        "namespace": "shop",
        "uid": "u-1",
        "generation": 1,
        "image": "icefall",
        "operator_settings": settings,
    }
    runs = desired_children(table(), **plan)
    assert runs.spark_master == LOCAL_MASTER and not runs.problems
    assert cluster_table_problem(table(), spark_master=runs.spark_master) is None
    iceberg = desired_children(table(location=None, fmt="iceberg"), **plan)
    assert iceberg.spark_master == KUBERNETES_MASTER
    annotated = table(annotations={ANNOTATION_SPARK_MASTER: "kubernetes"})
    held = desired_children(annotated, **plan)
    assert cluster_table_problem(annotated, spark_master=held.spark_master) is not None
    local = table(annotations={ANNOTATION_SPARK_MASTER: "local[2]"})
    assert desired_children(local, **plan).spark_master == "local[2]"


def test_an_iceberg_table_still_needs_a_catalog() -> None:
    found = cluster_table_problem(table(location=None, fmt="iceberg"), spark_master=LOCAL_MASTER)
    assert found is not None and found[0] == "spec.table.catalog"


def test_the_shared_schemes_are_those_the_delta_writer_commits_to() -> None:
    assert DELTA_SHARED_SCHEMES == OBJECT_STORE_SCHEMES


def test_compaction_pods_run_for_a_delta_table_on_s3_and_compacting_follows_its_backlog() -> None:
    local = {"annotations": {ANNOTATION_SPARK_MASTER: LOCAL_MASTER}}
    delta, iceberg = table(**local), table(location=None, fmt="iceberg", **local)
    on_disk = table(location="/data/orders", **local)
    assert upkeep_in_pods(delta) and upkeep_in_pods(iceberg) and not upkeep_in_pods(on_disk)
    assert upkeep_in_pods(table(location="s3a://lake/orders", **local))
    assert upkeep_in_pods(table(location=GCS, **local)) and upkeep_in_pods(table(location=AZURE, **local))

    def replicas(st: StreamingTable) -> int:
        children = desired_children(
            st, namespace="shop", uid="u-1", generation=1, image="icefall",
            operator_settings=OperatorSettings(), compaction_replicas=3,
        )  # fmt: skip
        count: int = children.get("Deployment", "orders-compact")["spec"]["replicas"]
        return count

    assert replicas(delta) == 3 and replicas(iceberg) == 3 and replicas(on_disk) == 0

    def compacting(st: StreamingTable, backlog: int | None = None) -> list[Any]:
        observed = Observations(driver=DriverState.RUNNING, compaction_backlog=backlog)
        conditions = derive_conditions(observed, st, NOW)
        return [c for c in conditions if c.type is ConditionType.COMPACTING]

    (due,) = compacting(delta, 2)
    assert (due.status, due.reason) == (ConditionStatus.TRUE, ConditionReason.COMPACTING)
    assert "2 merges" in due.message
    (tidy,) = compacting(delta, 0)
    assert (tidy.status, tidy.reason) == (ConditionStatus.FALSE, ConditionReason.NO_COMPACTION_NEEDED)
    assert compacting(delta) == []  # no recent measure: nothing to say yet (an existing one is kept)
    (held,) = compacting(on_disk, 2)
    assert (held.status, held.reason) == (ConditionStatus.FALSE, ConditionReason.UPKEEP_NOT_AVAILABLE)
    assert "s3://" in held.message
    assert compacting(iceberg, 2) == []


def test_an_offset_reset_request_on_a_delta_table_holds_nothing_as_for_iceberg() -> None:
    """The driver applies it before its first batch (`commands.delta.ingest_delta_pod`)."""
    request = {
        ANNOTATION_SPARK_MASTER: LOCAL_MASTER,
        ANNOTATION_RESET_OFFSETS: REQUEST,
    }
    iceberg = table(location=None, fmt="iceberg")
    iceberg = iceberg.model_copy(
        update={"metadata": iceberg.metadata.model_copy(update={"annotations": request})}
    )
    for st in (table(annotations=request), iceberg):
        children = desired_children(
            st,
            namespace="shop",
            uid="u-1",
            generation=1,
            image="icefall",
            operator_settings=OperatorSettings(),
        )
        assert not [p for p in children.problems if p.path == RESET_FIELD], children.problems
        assert children.driver_pod is not None


def test_icefall_compact_of_a_local_delta_table_exits_cleanly_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "table.yaml"
    local = table(location=str(tmp_path / "orders"))
    manifest.write_text(yaml.safe_dump(local.model_dump(mode="json", by_alias=True, exclude_none=True)))
    assert cli.main(["compact", "-f", str(manifest), "--state-dir", str(tmp_path / "state"), "--once"]) == 0
    assert "upkeep runs beside its batches in `icefall run`" in capsys.readouterr().out


def test_the_compaction_role_names_the_work_leases_of_a_delta_tables_folder() -> None:
    from icefall.plan.names import destination_leases, table_leases
    from icefall.plan.rbac import compaction_rules

    delta = table()
    assert destination_leases(delta)[0] == table_leases(delta)
    named = {n for rule in compaction_rules(delta) for n in rule.get("resourceNames", [])}
    assert set(table_leases(delta).work) <= named
