"""Prometheus metrics of the operator process, in the one registry `icefall.runtime.metrics` serves.

Names follow Prometheus conventions (`icefall_operator_` prefix for the operator's own work, base units,
`_total` counters). Per-table gauges (from the driver's report in `status.writer`: the operator reads no
table) reuse the ingestion process's names (`icefall_freshness_seconds`, `icefall_lag_records`,
`icefall_freshness_target_seconds`, `icefall_last_commit_timestamp_seconds`,
`icefall_maintenance_backlog_items`) with the same `table` label (`namespace.name`), so one dashboard reads
either.
Labels are bounded: table, partition (capped by `plan.table_status.MAX_PARTITIONS`), result, and a
condition's type, status and reason (closed enums of `icefall.api`). The table is one label,
`namespace.name`, never a `namespace` label: Prometheus' scrape config sets `namespace` to the operator
pod's own, which would rename ours to `exported_namespace`.

Guarantees: each pass exports what it measured and removes what it did not (`record_table`): a figure
the pass has no value for (a table or topic that cannot be read, a driver that stopped reporting)
disappears instead of keeping its last value, and a condition whose status or reason changed drops its
old series, so an alert never fires on a figure that is gone. The exception is the count of records lost
to retention, which follows `status.dataLossRecords` (kept while the table cannot be read), so the
IcefallDataLost alert does not resolve during a catalog outage. `forget_table` removes every series of a
deleted table. Not guaranteed: that a table deleted while no operator ran loses its series before this
process restarts (no delete event reaches it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from icefall.api import Condition
from icefall.plan.table_status import Summary
from icefall.runtime.metrics import (
    FRESHNESS,
    FRESHNESS_TARGET,
    LAG,
    LAST_COMMIT,
    MAINTENANCE_BACKLOG,
    REGISTRY,
)

RECONCILES = Counter(
    "icefall_operator_reconciles_total",
    "Reconcile passes of StreamingTables, by result (ok, error).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "icefall_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass (observation included).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
LEADER = Gauge(
    "icefall_operator_leader",
    "1 while this operator process reconciles: it holds the leader Lease, or runs without leader election.",
    registry=REGISTRY,
)
TABLE_FILES = Gauge(
    "icefall_table_data_files", "Data files in the table's current snapshot.", ["table"], registry=REGISTRY
)
TABLE_SNAPSHOTS = Gauge(
    "icefall_table_snapshots", "Snapshots retained in the table's metadata.", ["table"], registry=REGISTRY
)
TABLE_LOST_RECORDS = Gauge(
    "icefall_table_lost_records",
    "Records Kafka's retention deleted before they were ingested, over the table's life "
    "(icefall.lost-records, as the table's driver reported it).",
    ["table"],
    registry=REGISTRY,
)
TABLE_LOST_UNACKNOWLEDGED = Gauge(
    "icefall_table_lost_records_unacknowledged",
    "Of icefall_table_lost_records, those above the count acknowledged with the StreamingTable's "
    "icefall.dev/acknowledged-data-loss annotation (the IcefallDataLost alert fires while it is above 0).",
    ["table"],
    registry=REGISTRY,
)
COMPACTION_REPLICAS = Gauge(
    "icefall_compaction_replicas",
    "Compaction pods the operator asks for (the Deployment's replicas).",
    ["table"],
    registry=REGISTRY,
)


TABLE_CONDITION = Gauge(
    "icefall_table_condition",
    "1 for each condition of a StreamingTable as the operator derived it last (type Ready, Ingesting, "
    "FreshnessMet, Degraded, Compacting; status True, False, Unknown; its reason). A condition whose status "
    "or reason changes drops its old series. The IcefallTableDegraded and IcefallSchemaChangeRefused alerts "
    "read it.",
    ["table", "type", "status", "reason"],
    registry=REGISTRY,
)
DRIVER_RESTARTS = Counter(
    "icefall_driver_restarts_total",
    "Ingestion driver pods the operator created again after the previous one failed or exited (the pods "
    "use restartPolicy Never: the kubelet never restarts them, so a container restart count stays 0). A "
    "driver stopped for a new spec, a resume or a restart annotation is not counted. The "
    "IcefallDriverRestarting alert reads it.",
    ["table"],
    registry=REGISTRY,
)

#: Gauges set from one pass's figures: removed for a table when the pass has no value for them.
_MEASURED = (FRESHNESS, LAST_COMMIT, MAINTENANCE_BACKLOG, TABLE_FILES, TABLE_SNAPSHOTS)
#: Every per-table series with the table as its only label.
_PER_TABLE = (
    *_MEASURED,
    FRESHNESS_TARGET,
    TABLE_LOST_RECORDS,
    TABLE_LOST_UNACKNOWLEDGED,
    COMPACTION_REPLICAS,
    DRIVER_RESTARTS,
)


class _Exported:
    """Per table, the label values of the series with more labels than the table (lag per partition, one
    per condition) this process exports, so that a pass can remove those it no longer reports without
    scanning every table's series."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[Gauge, str], set[tuple[str, ...]]] = {}

    def replace(self, gauge: Gauge, table: str, now: dict[tuple[str, ...], float]) -> None:
        """Set `gauge`'s series of `table` to `now` (label values after the table -> value); remove the
        ones exported before and not in `now`."""
        key = (gauge, table)
        with self._lock:
            before = self._series.get(key, set())
            if now:
                self._series[key] = set(now)
            else:
                self._series.pop(key, None)
        for labels in before - set(now):
            with contextlib.suppress(KeyError):
                gauge.remove(table, *labels)
        for labels, value in now.items():
            gauge.labels(table, *labels).set(value)

    def forget(self, gauge: Gauge, table: str) -> None:
        self.replace(gauge, table, {})


_EXPORTED = _Exported()


def table_label(namespace: str, name: str) -> str:
    return f"{namespace}.{name}"


def _set(gauge: Gauge, table: str, value: float | None) -> None:
    """`value`, or no series at all when the pass has none."""
    if value is None:
        with contextlib.suppress(KeyError):  # never reported
            gauge.remove(table)
    else:
        gauge.labels(table=table).set(value)


def record_table(
    namespace: str,
    name: str,
    summary: Summary,
    compaction_replicas: int,
    freshness_target_seconds: int,
    *,
    acknowledged_loss: int = 0,
    stored_loss: int | None = None,
    conditions: Iterable[Condition] | None = None,
) -> None:
    """Export one pass's figures of a table and remove those it has none for (module docstring).
    `stored_loss`: the lost-records count status keeps (stands in when the summary has none);
    `conditions`: the conditions the pass derived (None: leave the condition series as they are)."""
    table = table_label(namespace, name)
    lost = summary.data_loss_records if summary.data_loss_records is not None else stored_loss
    _set(TABLE_LOST_RECORDS, table, lost)
    _set(TABLE_LOST_UNACKNOWLEDGED, table, None if lost is None else max(lost - acknowledged_loss, 0))
    FRESHNESS_TARGET.labels(table=table).set(freshness_target_seconds)
    _set(FRESHNESS, table, summary.freshness_seconds)
    last_commit = summary.last_commit_time
    _set(LAST_COMMIT, table, last_commit.timestamp() if last_commit is not None else None)
    lag = summary.freshness.partition_lag if summary.freshness is not None else {}
    _EXPORTED.replace(LAG, table, {(str(p),): float(n) for p, n in lag.items()})
    figures = summary.table
    _set(TABLE_FILES, table, figures.files if figures is not None else None)
    _set(TABLE_SNAPSHOTS, table, figures.snapshots if figures is not None else None)
    _set(MAINTENANCE_BACKLOG, table, figures.compaction_backlog if figures is not None else None)
    COMPACTION_REPLICAS.labels(table=table).set(compaction_replicas)
    DRIVER_RESTARTS.labels(table=table).inc(0)  # from 0, so that increase() sees the first restart
    if conditions is not None:
        record_conditions(namespace, name, conditions)


def record_conditions(namespace: str, name: str, conditions: Iterable[Condition]) -> None:
    """One series per condition, value 1; the series of conditions gone or changed are removed."""
    now: dict[tuple[str, ...], float] = {(str(c.type), str(c.status), str(c.reason)): 1.0 for c in conditions}
    _EXPORTED.replace(TABLE_CONDITION, table_label(namespace, name), now)


def count_driver_restart(namespace: str, name: str) -> None:
    DRIVER_RESTARTS.labels(table=table_label(namespace, name)).inc()


def forget_table(namespace: str, name: str) -> None:
    """Drop the per-table series of a deleted table."""
    table = table_label(namespace, name)
    for metric in _PER_TABLE:
        with contextlib.suppress(KeyError):  # never reported
            metric.remove(table)
    _EXPORTED.forget(LAG, table)
    _EXPORTED.forget(TABLE_CONDITION, table)
