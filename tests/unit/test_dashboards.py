"""The Grafana dashboard the chart ships (charts/icefall/dashboards/icefall.json).

Proves:
- the checked-in JSON is what `icefall.devstack.dashboards` generates (refresh it with `make dashboards`);
- every PromQL expression (panel targets, the `table` variable) names only series the code's Prometheus
  registries define (counters with `_total`, histograms by `_bucket`), and the metric-name extraction finds
  the names it should on tricky expressions;
- the JSON loads into the Grafana foundation SDK's dashboard model (generated from Grafana's own dashboard
  schema) and serialises back unchanged, so no field is unknown to it or of the wrong shape;
- layout: unique panel ids, every panel inside the 24-column grid, expanded rows with their panels at the
  top level (Grafana ignores an expanded row's nested panels), every query on the `${datasource}`
  variable and every per-table query filtered by `$table`;
- the panels the issue asks for are there (freshness against target, lag per partition, records and bytes
  per second, dead letters, commit latency, files and snapshots, compaction backlog and replicas).
Not proved: how a real Grafana renders it (no Grafana here), or that a deployment scrapes every process
whose series a panel reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from icefall.devstack.dashboards import defined_metric_names, promql_metric_names, queries, render

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "icefall" / "dashboards" / "icefall.json"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_checked_in_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD.read_text() == render(), "run `make dashboards`"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (table, le) (rate(a_bucket{table=~"$table", x="by (y)"}[5m]))', {"a_bucket"}),
        ("max by (table) (a) > bool on (table) group_left (x) max(b)", {"a", "b"}),
        ("avg_over_time((a <= bool b)[$__range:1m]) and c unless d or e offset 5m", set("abcde")),
        ("time() - max(a) > 600 * 1e3", {"a"}),
        ("table:icefall_lag_records:sum > 0", {"table:icefall_lag_records:sum"}),
        ('absent(icefall_operator_leader == 1) or sum(rate(x_total{result="ok"}[15m])) == 0', {
            "icefall_operator_leader", "x_total"}),
    ],
)  # fmt: skip
def test_metric_names_are_found_in_expressions(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_queries_name_only_metrics_the_code_defines(dashboard: dict[str, Any]) -> None:
    defined = defined_metric_names()
    assert {"icefall_records_read_total", "icefall_commit_duration_seconds_bucket"} <= defined
    assert "icefall_records_read" not in defined and "icefall_commit_duration_seconds" not in defined
    found = set()
    for expr in queries(dashboard):
        names = promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= defined, f"{sorted(names - defined)} in {expr!r} are not defined by icefall's metrics"
        found |= names
    assert len(found) >= 15, sorted(found)


def test_dashboard_round_trips_through_the_sdk_model(dashboard: dict[str, Any]) -> None:
    parsed = model.Dashboard.from_json(dashboard)
    assert json.loads(json.dumps(parsed, cls=JSONEncoder)) == dashboard
    assert parsed.uid == "icefall-overview" and parsed.title == "Icefall"


def test_layout_datasource_and_table_filter(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            assert panel["collapsed"] is False and not panel.get("panels"), panel["title"]
            continue
        assert panel["type"] in {"timeseries", "stat"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel.get("description"), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            if "icefall_operator_" not in target["expr"]:
                assert '{table=~"$table"}' in target["expr"], target["expr"]
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "table"]


def test_the_panels_on_call_needs_are_there(dashboard: dict[str, Any]) -> None:
    exprs = "\n".join(queries(dashboard))
    for metric in (
        "icefall_freshness_seconds",
        "icefall_freshness_target_seconds",
        "icefall_lag_records",
        "icefall_records_read_total",
        "icefall_read_bytes_total",
        "icefall_records_dead_lettered_total",
        "icefall_commit_duration_seconds_bucket",
        "icefall_table_data_files",
        "icefall_table_snapshots",
        "icefall_maintenance_backlog_items",
        "icefall_compaction_replicas",
        "icefall_operator_reconciles_total",
    ):
        assert metric in exprs, metric
    lag = next(p for p in dashboard["panels"] if p["title"] == "Lag per partition")
    assert "partition" in lag["targets"][0]["expr"] and "{{partition}}" in lag["targets"][0]["legendFormat"]
