"""A routed StreamingTable (`spec.routes`) in the operator: status, compaction and deletion per destination.

Proves, with the operator in a subprocess against a real kube-apiserver + etcd and a real SQLite catalog
(the driver's side played by its meter and reporter, under its own ServiceAccount):
- `status.tables` lists spec.table, each route's table and the table the dynamic route made, each with the
  lag from its own committed offsets (a route table left behind by a crash shows its own, larger lag and
  its own freshness), its last commit and snapshot; `status.tableCount` and the `Tables` printer column
  say how many tables it writes (the dynamic route's as the driver reported them);
- compaction covers every destination: the operator creates each route table's work and yield Leases
  (named from that table's identity), and the set the dynamic route's tables share, and the compaction
  Role names them;
- `deletionPolicy: Delete`: the purge Job names each route table's recorded uuid, and the dynamic
  table's, and drops them all.
Without a cluster: `icefall purge -f` drops a route table only with its recorded uuid, keeps one without
(said), and a wrong uuid drops nothing; a table the dynamic route made is dropped by its owner property
(no uuid recorded), one of its template without the property is kept; `icefall status` (a real Kafka)
shows each destination's lag from its own committed offsets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from icefall.api import load_manifest, streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import ensure_dynamic_table, ensure_route_tables, ensure_tables
from icefall.commit.state import CommittedState
from icefall.controller.kube import Kube
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.devstack.tools import tool_dir
from icefall.ingest.report import BatchReport
from icefall.ingest.table_meter import TableMeter
from icefall.ingest.writer_status import WriterStatusReporter
from icefall.plan.names import destination_leases, dynamic_route_leases
from icefall.testing.e2e import Operator, wait_for
from icefall.testing.kubeapi import JsonApi

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "routes-operator"
ST = f"/apis/icefall.dev/v1alpha1/namespaces/{NAMESPACE}/streamingtables"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> JsonApi:
    install_crds(kube, REPO / "crds", NAMESPACE)
    return JsonApi(config.new_client_from_config(config_file=str(kube.kubeconfig)))


@pytest.fixture(scope="module")
def operator(
    kube: KubeAPIServer, api: JsonApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    running = Operator(kube, NAMESPACE, tmp_path_factory.mktemp("operator") / "operator.log")
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert "Traceback" not in running.log.read_text(errors="replace"), running.tail()


def routed(name: str, lake: Path, **spec: Any) -> Obj:
    """spec.table `it.<name>`, two routes, `it.clicks` and `it.views`, and tables `it.dyn_<key>`."""
    catalog = {"name": "lake", "type": "sql", "uri": f"sqlite:///{lake / 'catalog.db'}",
               "warehouse": f"file://{lake / 'warehouse'}"}  # fmt: skip
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": {"bootstrapServers": "127.0.0.1:1", "topic": "events"},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long", "required": True}]},
            "table": {"namespace": "it", "name": name, "catalog": catalog},
            "routes": [
                {"table": {"name": "clicks"}, "when": "id > 100"},
                {"table": {"name": "views"}, "when": "id < 0"},
            ],
            "dynamicRoute": {"from": "Key", "nameTemplate": "dyn_{value}"},
            **spec,
        },
    }


def commit_like_ingestion(table: Any, offsets: dict[int, int], produce_ms: int) -> int:
    """One row and the icefall.* properties in one commit, as ingestion does; the new snapshot's id."""
    import pyarrow as pa

    when = datetime.fromtimestamp(produce_ms / 1000, UTC)
    row = {"id": 1, "_kafka": {"partition": 0, "offset": offsets[0] - 1, "timestamp": when}}
    state = CommittedState(
        snapshot_id=None, topic="events", offsets=offsets, epoch=1, max_produce_time_ms=produce_ms
    )
    with table.transaction() as tx:
        tx.append(pa.Table.from_pylist([row], schema=table.schema().as_arrow()))
        tx.set_properties(state.to_properties())
    return int(table.refresh().current_snapshot().snapshot_id)


def printer_columns(kube: KubeAPIServer, name: str) -> dict[str, str]:
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(kube.workdir)}
    out = subprocess.run(
        [kubectl, "get", "st", name, "-n", NAMESPACE], capture_output=True, text=True, env=env, check=True
    ).stdout.splitlines()
    # By the header's columns: a column with no value yet is blank.
    starts = [i for i, c in enumerate(out[0]) if c != " " and (i == 0 or out[0][i - 1] == " ")]
    bounds = zip(starts, [*starts[1:], None], strict=True)
    return {out[0][a:b].strip(): out[1][a:b].strip() for a, b in bounds}


def test_status_compaction_and_purge_cover_every_destination(
    kube: KubeAPIServer, api: JsonApi, operator: Operator, tmp_path: Path
) -> None:
    lake = CatalogConfig.sqlite(tmp_path / "catalog.db", tmp_path / "warehouse", name="lake")
    obj = routed("events", tmp_path, deletionPolicy="Delete")
    st = streaming_table_from_object(obj)
    catalog = lake.pyiceberg()
    table = ensure_tables(catalog, st).table
    clicks, views = ensure_route_tables(catalog, st)
    made = ensure_dynamic_table(catalog, st, "dyn_a")
    assert made is not None
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    # A crash between commits: spec.table, clicks and dyn_a hold offset 5, views only 3 (an hour old).
    landed = commit_like_ingestion(table, {0: 5}, now_ms - 30_000)
    commit_like_ingestion(clicks, {0: 5}, now_ms - 30_000)
    commit_like_ingestion(made, {0: 5}, now_ms - 30_000)
    behind = commit_like_ingestion(views, {0: 3}, now_ms - 3_600_000)
    api.call("POST", ST, obj)
    wait_for("the driver pod", lambda: api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/events-ingest"))
    first = wait_for(
        "tableCount", lambda: ((api.get(f"{ST}/events") or {}).get("status") or {}).get("tableCount")
    )
    assert first == 3 and printer_columns(kube, "events")["TABLES"] == "3"

    # Compaction tidies every destination: each route table's Leases exist, and the Role names them.
    role = api.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/icefall-events-compact")
    assert role is not None
    named = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    for leases in destination_leases(st):
        assert {*leases.work, leases.rewrite_yield} <= named
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{leases.work[0]}"
        wait_for(f"the Lease {leases.work[0]}", lambda p=path: api.get(p))
    assert len({leases.rewrite_yield for leases in destination_leases(st)}) == 3  # one per table identity
    shared = dynamic_route_leases(st)  # the dynamic route's tables share one set
    assert shared is not None and {*shared.work, shared.rewrite_yield} <= named
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{shared.work[0]}"
    wait_for(f"the Lease {shared.work[0]}", lambda: api.get(path))

    # The driver's side: its meter reads the three tables, its last batch left 2 records of the topic.
    driver = config.new_client_from_config(config_file=str(kube.kubeconfig))
    driver.set_default_header("Impersonate-User", f"system:serviceaccount:{NAMESPACE}:icefall-events-driver")
    meter = TableMeter(st, lake)
    reading = meter.read_once()
    assert reading is not None
    reporter = WriterStatusReporter(Kube(driver), NAMESPACE, "events", interval=0, meter=meter)
    reporter(BatchReport(1, 1, 0, 1.0, 0.1, landed, {0: 5}, 2, 30.0, partition_lag={0: 2}))

    def listed() -> list[Obj] | None:
        tables: list[Obj] = ((api.get(f"{ST}/events") or {}).get("status") or {}).get("tables") or []
        return tables if any("lagRecords" in t for t in tables) else None

    tables = {t["table"]: t for t in wait_for("status.tables with figures", listed, timeout=30)}
    assert list(tables) == ["it.events", "it.clicks", "it.views", "it.dyn_a"]
    assert [tables[t]["lagRecords"] for t in tables] == [2, 2, 4, 2]  # each from its own offsets
    assert tables["it.clicks"]["freshnessSeconds"] == 30.0  # holds what spec.table holds
    assert tables["it.views"]["freshnessSeconds"] >= 3600  # behind: from its own newest record
    assert tables["it.views"]["snapshotId"] == behind and tables["it.views"]["lastCommitTime"]
    assert tables["it.events"]["snapshotId"] == landed
    count = wait_for("tableCount", lambda: (api.get(f"{ST}/events") or {})["status"].get("tableCount") == 4)
    assert count and printer_columns(kube, "events")["TABLES"] == "4"

    # deletionPolicy Delete: the purge Job names every route table's uuid, and drops them all.
    api.call("DELETE", f"{ST}/events")
    jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    job = wait_for("the purge Job", lambda: api.get(f"{jobs}/events-purge"), 30, details=operator.tail)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert [r.table for r in reading.routes] == ["it.clicks", "it.views", "it.dyn_a"]
    for route in reading.routes:
        assert f"{route.table}={route.table_uuid}" in command
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PYTHONPATH": str(REPO / "operator" / "src")}
    done = subprocess.run([sys.executable, "-m", "icefall.cli", *command[1:]], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(catalog.table_exists(("it", name)) for name in ("events", "clicks", "views", "dyn_a"))
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    complete = {"type": "Complete", "status": "True", "lastTransitionTime": now}
    met = {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now}
    api.call("PATCH", f"{jobs}/events-purge/status", {"status": {
        "startTime": now, "completionTime": now, "succeeded": 1, "conditions": [met, complete],
    }}, content_type="application/merge-patch+json")  # fmt: skip
    wait_for("the StreamingTable to go", lambda: api.get(f"{ST}/events") is None, timeout=30)


def test_purge_drops_a_route_table_only_with_its_recorded_uuid(tmp_path: Path) -> None:
    from icefall.cli import main
    from icefall.plan.purge import EXIT_REFUSED

    manifest = tmp_path / "table.yaml"
    manifest.write_text(yaml.safe_dump(routed("local", tmp_path)))
    st = load_manifest(manifest)
    catalog = CatalogConfig.for_table(st.spec).pyiceberg()
    table = ensure_tables(catalog, st).table
    clicks, _ = ensure_route_tables(catalog, st)
    assert ensure_dynamic_table(catalog, st, "dyn_a") is not None
    catalog.create_table(("it", "dyn_b"), table.schema())  # the template's name, no owner property
    uuid, clicks_uuid = str(table.metadata.table_uuid), str(clicks.metadata.table_uuid)
    wrong = "00000000-0000-0000-0000-000000000000"
    base = ["purge", "-f", str(manifest), "--table-uuid", uuid]
    assert main([*base, "--route-table-uuid", f"it.clicks={wrong}"]) == EXIT_REFUSED
    assert all(catalog.table_exists(("it", name)) for name in ("local", "clicks", "views", "dyn_a"))  # none
    assert main([*base, "--route-table-uuid", f"it.clicks={clicks_uuid}"]) == 0
    assert not catalog.table_exists(("it", "local")) and not catalog.table_exists(("it", "clicks"))
    assert catalog.table_exists(("it", "views"))  # no uuid recorded for it: kept
    assert not catalog.table_exists(("it", "dyn_a"))  # its owner property names this table: dropped
    assert catalog.table_exists(("it", "dyn_b"))  # not made by the route: never dropped


def test_icefall_status_shows_each_destination_from_its_own_offsets(
    kafka: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`icefall status` of a routed table lists every table it writes (a table its dynamic route made
    too), each one's lag from its own committed offsets against the topic's end (a route table left
    behind by a crash shows more)."""
    import json

    from confluent_kafka import Producer

    from icefall import cli

    topic = "it-routes-status"
    kafka.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(7):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=0)
    assert producer.flush(30) == 0
    obj = routed("shown", tmp_path)
    obj["spec"]["source"] = {"bootstrapServers": kafka.bootstrap, "topic": topic}
    manifest = tmp_path / "table.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    st = load_manifest(manifest)
    catalog = CatalogConfig.for_table(st.spec).pyiceberg()
    table = ensure_tables(catalog, st).table
    clicks, _ = ensure_route_tables(catalog, st)  # views: never committed
    made = ensure_dynamic_table(catalog, st, "dyn_a")
    assert made is not None
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    commit_like_ingestion(table, {0: 5}, now_ms)
    commit_like_ingestion(clicks, {0: 6}, now_ms)
    commit_like_ingestion(made, {0: 4}, now_ms)
    capsys.readouterr()
    assert cli.main(["status", "-f", str(manifest), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lags = {row["table"]: row["lagRecords"] for row in report["tables"]}
    assert lags == {"it.shown": 2, "it.clicks": 1, "it.views": 7, "it.dyn_a": 3}, report["tables"]
    assert cli.main(["status", "-f", str(manifest)]) == 0
    assert "it.clicks" in capsys.readouterr().out
