"""Two StreamingTables in one Kubernetes namespace whose catalog tables share a name run side by side.

`it.e2e_twin` and `twin.e2e_twin` live in one catalog (the `lake` fixture) and are filled from two topics
by two driver Pods, which the node runs as containers of the image we ship, each with its own
ServiceAccount. Before Lease names carried the table's whole identity, both drivers took
`icefall-e2e-twin-commit` and the second waited for ever. Proves:
- both drivers hold their own commit Lease at the same moment, each under its own pod name;
- both tables catch up and each equals its own topic exactly once (record by record, and per the auditor).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from icefall.api import streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.names import table_leases
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import assert_exactly_once, manifest_text, watermarks

from .conftest import Lake, NodeView, Operator, TableStream, pod_logs, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE = "e2e_twin"
TWINS = {"e2e-twin-it": "it", "e2e-twin-twin": "twin"}  # StreamingTable -> Iceberg namespace
RECORDS = 80
BAD_EVERY = 40
Obj = dict[str, Any]


class Twin(TableStream):
    """One of the two tables: its StreamingTable, topic and Iceberg namespace."""

    def __init__(self, name: str, namespace: str, kafka: KafkaBroker, catalog: CatalogConfig) -> None:
        super().__init__(kafka, catalog, topic=name, table=TABLE, bad_every=BAD_EVERY)
        self.name, self.iceberg_namespace = name, namespace

    def committed(self) -> dict[int, int]:
        from icefall.commit import read_committed

        catalog, identifier = self.catalog.pyiceberg(), (self.iceberg_namespace, TABLE)
        if not catalog.table_exists(identifier):
            return {}
        return dict(read_committed(catalog.load_table(identifier)).offsets)


@pytest.fixture(autouse=True)
def operator_log_is_clean(operator: Operator) -> Iterator[None]:
    yield
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def test_same_named_tables_run_side_by_side_exactly_once(  # noqa: PLR0917 (fixtures)
    rest: JsonApi, e2e_namespace: str, kafka: KafkaBroker, node: NodeView, operator: Operator, lake: Lake
) -> None:
    tables_path = f"/apis/{GROUP}/{VERSION}/namespaces/{e2e_namespace}/{PLURAL}"
    twins = [Twin(name, namespace, kafka, lake.catalog) for name, namespace in TWINS.items()]
    for twin in twins:
        kafka.create_topic(twin.topic, partitions=2)
        twin.produce(RECORDS)

    def explain() -> str:
        return (
            "\n".join(
                f"--- {t.name}\n{yaml.safe_dump((rest.get(f'{tables_path}/{t.name}') or {}).get('status'))}"
                f"{pod_logs(node, f'{t.name}-ingest')}"
                for t in twins
            )
            + f"\n--- operator\n{operator.tail()}"
        )

    leases: dict[str, str] = {}
    for twin in twins:
        st: Obj = yaml.safe_load(manifest_text(TABLE, twin.topic, kafka.bootstrap))
        st["metadata"] = {"name": twin.name, "namespace": e2e_namespace}
        st["spec"]["table"]["namespace"] = twin.iceberg_namespace
        st["spec"]["table"]["catalog"] = lake.block
        st["spec"]["freshness"] = {"targetSeconds": 30}
        rest.call("POST", tables_path, st)
        leases[twin.name] = table_leases(streaming_table_from_object(st)).commit
    assert len(set(leases.values())) == 2, leases
    started = time.monotonic()

    def both_held() -> dict[str, str] | None:
        holders = {}
        for name, lease in leases.items():
            found = rest.get(f"/apis/coordination.k8s.io/v1/namespaces/{e2e_namespace}/leases/{lease}") or {}
            holders[name] = (found.get("spec") or {}).get("holderIdentity") or ""
        return holders if all(holders.values()) else None

    holders = wait_for("both commit Leases held at once", both_held, timeout=420, details=explain, every=1)
    assert holders == {name: f"{name}-ingest" for name in leases}, holders
    for twin in twins:
        high = wait_for(f"{twin.name} caught up", twin.caught_up, timeout=300, details=explain)
        twin.note(f"{twin.name} caught up {time.monotonic() - started:.0f} s after both were applied")
        assert high == watermarks(kafka, twin.topic)
        assert_exactly_once(
            lake.catalog, TABLE, high, twin.bad, namespace=twin.iceberg_namespace, bootstrap=kafka.bootstrap
        )
