"""The Grafana dashboard the chart ships (charts/icefall/dashboards/icefall.json), built with Grafana's
foundation SDK (`grafana-foundation-sdk`, a dev dependency: this module is tooling, never imported at run
time, and the wheel does not ship it).

Regenerate with `make dashboards` (`python -m icefall.devstack.dashboards > <file>`);
tests/unit/test_dashboards.py fails when the checked-in file drifts, when a query names a metric the code
does not define, or when the JSON does not load into the SDK's dashboard model.

Guarantees: every query filters on the `$table` variable and reads only metrics of `icefall.runtime.metrics`
and `icefall.controller.metrics`; the output is deterministic (sorted keys, fixed panel ids).
Not guaranteed: that every panel has data in a given deployment — ingestion and compaction figures come
from the driver and compaction pods (scraped by the chart's PodMonitor) or `icefall run --metrics-port`;
per-table freshness, lag, files, snapshots, backlog and replicas also from the operator.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

UID = "icefall-overview"
TITLE = "Icefall"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Every query's table filter.
T = '{table=~"$table"}'
RATE = "$__rate_interval"
DASHED = model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def _series(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[tuple[str, str]],
    *,
    width: int = 12,
    stacked: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .span(width)
        .height(8)
        .line_width(1)
        .fill_opacity(10 if not stacked else 40)
        .legend(cb.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.TABLE)
                .placement(common.LegendPlacement.BOTTOM).calcs(["lastNotNull", "max"]))
        .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                 .sort(common.SortOrder.DESCENDING))
    )  # fmt: skip
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def _stat(title: str, description: str, unit: str, expr: str, legend: str, *, width: int = 6) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .with_target(_query(expr, legend, "A"))
    )


def _freshness_row() -> db.Row:
    freshness = f"max by (table) (icefall_freshness_seconds{T})"
    within = f"{freshness} <= bool max by (table) (icefall_freshness_target_seconds{T})"
    return (
        db.Row("Freshness and lag")
        .with_panel(
            _series(
                "Freshness against target",
                "Seconds between now and the newest committed record (solid) and the table's target "
                "(spec.freshness.targetSeconds, dashed). Above the target FreshnessMet is False.",
                "s",
                [
                    (f"max by (table) (icefall_freshness_seconds{T})", "{{table}}"),
                    (f"max by (table) (icefall_freshness_target_seconds{T})", "{{table}} target"),
                ],
            ).override_by_regexp(".* target", [DASHED])
        )
        .with_panel(
            _series(
                "Lag per partition",
                "Records in Kafka not yet committed to the table, per partition (the operator may report "
                "only the most lagging partitions).",
                "short",
                [(f"max by (table, partition) (icefall_lag_records{T})", "{{table}} p{{partition}}")],
            )
        )
        .with_panel(
            _stat(
                "Time within freshness target",
                "Share of the dashboard's time range during which freshness was within target (the SLI of "
                "the IcefallFreshnessBudgetBurn alerts).",
                "percentunit",
                f"avg_over_time(({within})[$__range:1m])",
                "{{table}}",
                width=12,
            )
        )
        .with_panel(
            _stat(
                "Since last commit",
                "Seconds since the last ingestion commit; grows on an idle topic too (see Lag).",
                "s",
                f"time() - max by (table) (icefall_last_commit_timestamp_seconds{T})",
                "{{table}}",
                width=12,
            )
        )
    )


def _ingestion_row() -> db.Row:
    return (
        db.Row("Ingestion")
        .with_panel(_records_panel())
        .with_panel(_bytes_panel())
        .with_panel(_dead_letters_panel())
        .with_panel(_commit_latency_panel())
        .with_panel(_batch_duration_panel())
    )


def _quantile(q: str, histogram: str) -> str:
    """The `q` quantile per table of the histogram `histogram` over the rate interval."""
    return f"histogram_quantile({q}, sum by (table, le) (rate({histogram}_bucket{T}[{RATE}])))"


def _records_panel() -> timeseries.Panel:
    return _series(
        "Records per second",
        "Records read from Kafka and committed to the table (a keyed table writes one row per key "
        "and batch, so written may be below read).",
        "rps",
        [
            (f"sum by (table) (rate(icefall_records_read_total{T}[{RATE}]))", "{{table}} read"),
            (f"sum by (table) (rate(icefall_records_written_total{T}[{RATE}]))", "{{table}} written"),
            (f"sum by (table) (rate(icefall_records_filtered_total{T}[{RATE}]))", "{{table}} filtered"),
        ],
        width=8,
    )


def _bytes_panel() -> timeseries.Panel:
    return _series(
        "Bytes per second",
        "Bytes of Kafka record values read.",
        "Bps",
        [(f"sum by (table) (rate(icefall_read_bytes_total{T}[{RATE}]))", "{{table}}")],
        width=8,
    )


def _dead_letters_panel() -> timeseries.Panel:
    return _series(
        "Dead letters per second",
        "Records routed to the dead-letter table, by kind of reason (each dead-letter row's `error` "
        "column has the full text); refused commits are shown by reason beside it.",
        "rps",
        [
            (
                f"sum by (table, reason) (rate(icefall_records_dead_lettered_total{T}[{RATE}]))",
                "{{table}} {{reason}}",
            ),
            (
                f"sum by (table, reason) (rate(icefall_commits_refused_total{T}[{RATE}]))",
                "{{table}} commit refused: {{reason}}",
            ),
        ],
        width=8,
    )


def _commit_latency_panel() -> timeseries.Panel:
    return _series(
        "Commit latency",
        "Wall time of the table commit (compare-and-swap of main), p50 and p99.",
        "s",
        [
            (_quantile("0.5", "icefall_commit_duration_seconds"), "{{table}} p50"),
            (_quantile("0.99", "icefall_commit_duration_seconds"), "{{table}} p99"),
        ],
    )


def _batch_duration_panel() -> timeseries.Panel:
    return _series(
        "Batch duration and outages",
        "p99 wall time of one batch, read to commit; and 1 while a service ingestion needs is "
        "unreachable (ingestion waits it out).",
        "s",
        [
            (_quantile("0.99", "icefall_batch_duration_seconds"), "{{table}} batch p99"),
            (f"max by (table, service) (icefall_ingest_unavailable{T})", "{{table}} {{service}} down"),
        ],
    )


def _table_row() -> db.Row:
    return (
        db.Row("Table and compaction")
        .with_panel(
            _series(
                "Files and snapshots",
                "Data files in the current snapshot and snapshots retained in the table's metadata.",
                "short",
                [
                    (f"max by (table) (icefall_table_data_files{T})", "{{table}} data files"),
                    (f"max by (table) (icefall_table_snapshots{T})", "{{table}} snapshots"),
                ],
                width=8,
            )
        )
        .with_panel(
            _series(
                "Compaction backlog and replicas",
                "Maintenance work items waiting, and the compaction pods the operator asks for.",
                "short",
                [
                    (f"max by (table) (icefall_maintenance_backlog_items{T})", "{{table}} backlog"),
                    (f"max by (table) (icefall_compaction_replicas{T})", "{{table}} replicas"),
                ],
                width=8,
            )
        )
        .with_panel(
            _series(
                "Maintenance items per second",
                "Maintenance work items run by the compaction pods, by kind and outcome.",
                "ops",
                [
                    (
                        f"sum by (table, kind, outcome) (rate(icefall_maintenance_items_total{T}[{RATE}]))",
                        "{{table}} {{kind}} {{outcome}}",
                    ),
                ],
                width=8,
            )
        )
    )


def _operator_row() -> db.Row:
    return (
        db.Row("Operator")
        .with_panel(
            _series(
                "Reconciles per second",
                "Reconcile passes of StreamingTables by result, and how many replicas reconcile (leaders).",
                "ops",
                [
                    (
                        "sum by (result) (rate(icefall_operator_reconciles_total[$__rate_interval]))",
                        "{{result}}",
                    ),
                    ("sum(icefall_operator_leader)", "leaders"),
                ],
            )
        )
        .with_panel(
            _series(
                "Reconcile duration",
                "p99 wall time of one reconcile pass, observation included.",
                "s",
                [
                    (
                        "histogram_quantile(0.99, sum by (le) "
                        "(rate(icefall_operator_reconcile_duration_seconds_bucket[$__rate_interval])))",
                        "p99",
                    )
                ],
            )
        )
    )


def build() -> model.Dashboard:
    """The dashboard model."""
    builder = (
        db.Dashboard(TITLE)
        .uid(UID)
        .description(
            "Kafka topics into Iceberg and Delta Lake tables: freshness, lag, throughput, commits, compaction"
        )
        .tags(["icefall", "kafka", "iceberg", "delta"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            db.QueryVariable("table")
            .label("Table")
            .datasource(DATASOURCE)
            .query("label_values(icefall_freshness_target_seconds, table)")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_row(_freshness_row())
        .with_row(_ingestion_row())
        .with_row(_table_row())
        .with_row(_operator_row())
    )
    dashboard = builder.build()
    # Grafana shows the panels of an expanded row only when they follow it at the top level (a row's own
    # `panels` are for collapsed rows): lay them out flat, rows expanded, ids in reading order.
    flat: list[model.Panel | model.RowPanel] = []
    for panel in dashboard.panels or []:
        flat.append(panel)
        if isinstance(panel, model.RowPanel):
            flat.extend(panel.panels)
            panel.panels = []
            panel.collapsed = False
    for number, panel in enumerate(flat, start=1):
        panel.id_val = number
    dashboard.panels = flat
    return dashboard


#: PromQL words that look like series names but are not.
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def promql_metric_names(expr: str) -> set[str]:
    """The series names an expression selects: what is left of it without strings, label matchers,
    range and subquery brackets, grouping clauses, numbers, functions and keywords. Enough for the
    expressions Icefall ships (tested); not a PromQL parser."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if not call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def defined_metric_names() -> set[str]:
    """Every series name the code's registries can expose (counters' _total, histograms' _bucket/_sum/_count;
    `_created` series left out: nothing should query them)."""
    import icefall.controller.metrics  # noqa: F401  (registers the operator's metrics)
    from icefall.runtime.metrics import REGISTRY

    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard's JSON: panel targets and query variables."""
    found = [t["expr"] for p in dashboard.get("panels", []) for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"])
            found.append(inner.group(1) if inner else variable["query"])
    return found


def render() -> str:
    """The dashboard as the JSON text checked in under charts/icefall/dashboards/."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
