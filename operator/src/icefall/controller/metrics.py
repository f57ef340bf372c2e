"""Prometheus metrics of the operator process, in the one registry `icefall.runtime.metrics` serves.

Names follow Prometheus conventions (`icefall_operator_` prefix for the operator's own work, base units,
`_total` counters). Per-table gauges (from the driver's report in `status.writer`: the operator reads no
table) reuse the ingestion process's names (`icefall_freshness_seconds`, `icefall_lag_records`,
`icefall_freshness_target_seconds`, `icefall_last_commit_timestamp_seconds`,
`icefall_maintenance_backlog_items`) with the same `table` label (`namespace.name`), so one dashboard reads
either.
Labels are bounded: table, partition (capped by `plan.table_status.MAX_PARTITIONS`), result.

Not guaranteed: gauges of a deleted table disappear only when this process removes them (`forget_table`)
or restarts.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

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


def record_table(
    namespace: str,
    name: str,
    summary: Summary,
    compaction_replicas: int,
    freshness_target_seconds: int,
    *,
    acknowledged_loss: int = 0,
) -> None:
    table = f"{namespace}.{name}"
    lost = summary.data_loss_records
    if lost is not None:
        TABLE_LOST_RECORDS.labels(table=table).set(lost)
        TABLE_LOST_UNACKNOWLEDGED.labels(table=table).set(max(lost - acknowledged_loss, 0))
    FRESHNESS_TARGET.labels(table=table).set(freshness_target_seconds)
    if summary.freshness_seconds is not None:
        FRESHNESS.labels(table=table).set(summary.freshness_seconds)
    if summary.last_commit_time is not None:
        LAST_COMMIT.labels(table=table).set(summary.last_commit_time.timestamp())
    if summary.freshness is not None:
        for partition, lag in summary.freshness.partition_lag.items():
            LAG.labels(table=table, partition=str(partition)).set(lag)
    if summary.table is not None:
        TABLE_FILES.labels(table=table).set(summary.table.files)
        TABLE_SNAPSHOTS.labels(table=table).set(summary.table.snapshots)
        if summary.table.compaction_backlog is not None:
            MAINTENANCE_BACKLOG.labels(table=table).set(summary.table.compaction_backlog)
    COMPACTION_REPLICAS.labels(table=table).set(compaction_replicas)


def forget_table(namespace: str, name: str) -> None:
    """Drop the per-table series of a deleted table."""
    table = f"{namespace}.{name}"
    for gauge in (
        FRESHNESS,
        FRESHNESS_TARGET,
        LAST_COMMIT,
        MAINTENANCE_BACKLOG,
        TABLE_FILES,
        TABLE_SNAPSHOTS,
        TABLE_LOST_RECORDS,
        TABLE_LOST_UNACKNOWLEDGED,
        COMPACTION_REPLICAS,
    ):
        with contextlib.suppress(KeyError):  # never reported
            gauge.remove(table)
    for labels in list(LAG._metrics):  # the partitions this table reported
        if labels[0] == table:
            LAG.remove(*labels)
