"""Prometheus metrics of the ingestion and maintenance processes (one registry per process).

Names follow Prometheus conventions: `icefall_` prefix, base units (seconds, bytes), `_total` for counters.
Labels are the table (`namespace.name`) and, for lag, the Kafka partition; never anything unbounded.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from icefall.plan.leases import YIELD_AFTER_CONFLICTS

REGISTRY = CollectorRegistry(auto_describe=True)

RECORDS_READ = Counter(
    "icefall_records_read_total", "Kafka records read by ingestion.", ["table"], registry=REGISTRY
)
RECORDS_WRITTEN = Counter(
    "icefall_records_written_total", "Records committed to the Iceberg table.", ["table"], registry=REGISTRY
)
RECORDS_DEAD_LETTERED = Counter(
    "icefall_records_dead_lettered_total",
    "Records routed to the dead-letter destination, by kind of reason (the first of a record's reasons: "
    "malformed_json, type_mismatch, required_missing, too_large, tombstone, ... see "
    "icefall.decode.decode.REASON_KINDS; the full text is in the dead-letter table's error column).",
    ["table", "reason"],
    registry=REGISTRY,
)
RECORDS_FILTERED = Counter(
    "icefall_records_filtered_total",
    "Valid records dropped by spec.transforms.filter.",
    ["table"],
    registry=REGISTRY,
)
BYTES_READ = Counter(
    "icefall_read_bytes_total", "Bytes of Kafka record values read.", ["table"], registry=REGISTRY
)
BATCH_DURATION = Histogram(
    "icefall_batch_duration_seconds",
    "Wall time of one ingestion batch, read to commit.",
    ["table"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120),
    registry=REGISTRY,
)
COMMIT_DURATION = Histogram(
    "icefall_commit_duration_seconds",
    "Wall time of the table commit (compare-and-swap of main).",
    ["table"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
    registry=REGISTRY,
)
COMMITS_REFUSED = Counter(
    "icefall_commits_refused_total",
    "Commits refused by the protocol, by reason (stale_head, fenced, offset_gap).",
    ["table", "reason"],
    registry=REGISTRY,
)
STAGES_DROPPED = Counter(
    "icefall_ingest_stages_dropped_total",
    "Staging branches dropped because their batch was not committed (a refused or failed commit); the "
    "batch is planned again from the table.",
    ["table"],
    registry=REGISTRY,
)
INGEST_BATCHES_DISCARDED = Counter(
    "icefall_ingest_batches_discarded_total",
    "Batches written while the batch before them was being committed (pipelining) and dropped because "
    "that commit re-staged the batch before over maintenance: planned and read again.",
    ["table"],
    registry=REGISTRY,
)
INGEST_COMMITS_RESTAGED = Counter(
    "icefall_ingest_commits_restaged_total",
    "Ingestion commits that found main moved by maintenance only (compaction, retention, manifest "
    "rewrites) and landed their batch on top of it anyway, in one commit, without re-reading Kafka.",
    ["table"],
    registry=REGISTRY,
)
INGEST_COMMITS_FAILED_BY_MAINTENANCE = Counter(
    "icefall_ingest_commits_failed_by_maintenance_total",
    "Ingestion commits refused because maintenance moved main in a way the batch could not be re-staged "
    "over (schema or partition spec changed, or maintenance kept committing); the batch is planned again. "
    'Also counted in icefall_commits_refused_total{reason="stale_head"}.',
    ["table"],
    registry=REGISTRY,
)
INGEST_YIELD_SECONDS = Counter(
    "icefall_ingest_yield_seconds_total",
    "Seconds a keyed table's ingestion waited before a batch for a rewrite holding the yield Lease.",
    ["table"],
    registry=REGISTRY,
)
INGEST_BATCHES_REWRITTEN = Counter(
    "icefall_ingest_batches_rewritten_total",
    "Batches written again because their records carried a schema id the writer had not met and the "
    "registry has a writer schema for (the first write decoded them as unknown ids; it is never committed).",
    ["table"],
    registry=REGISTRY,
)
SCHEMA_CHANGES = Counter(
    "icefall_schema_changes_total",
    "Schema changes committed to the table because the spec or a writer schema has new or wider fields.",
    ["table"],
    registry=REGISTRY,
)
SCHEMA_CHANGES_REFUSED = Gauge(
    "icefall_schema_changes_refused",
    "Fields whose change the table cannot follow (a type narrowed or changed, ...), as last planned; their "
    "records are ingested as far as their values fit, the rest go to the dead-letter table.",
    ["table"],
    registry=REGISTRY,
)
FRESHNESS = Gauge(
    "icefall_freshness_seconds",
    "Seconds between now and the produce time of the newest committed record; 0 when caught up.",
    ["table"],
    registry=REGISTRY,
)
FRESHNESS_TARGET = Gauge(
    "icefall_freshness_target_seconds",
    "The table's freshness target (spec.freshness.targetSeconds), set beside icefall_freshness_seconds so "
    "alerts and dashboards compare the two without knowing the spec.",
    ["table"],
    registry=REGISTRY,
)
LAST_COMMIT = Gauge(
    "icefall_last_commit_timestamp_seconds",
    "Unix time of the last ingestion commit to the table.",
    ["table"],
    registry=REGISTRY,
)
LAG = Gauge(
    "icefall_lag_records", "Records in Kafka not yet committed, per partition.", ["table", "partition"],
    registry=REGISTRY,
)  # fmt: skip
DATA_LOSS = Counter(
    "icefall_data_loss_records_total",
    "Records deleted by topic retention before ingestion committed them.",
    ["table"],
    registry=REGISTRY,
)
OUTAGES = Counter(
    "icefall_ingest_outages_total",
    "Outages of a service ingestion needs (service: kafka, catalog, object_store, registry, "
    "kube_apiserver), counted when the first attempt fails; ingestion waits them out with capped "
    "exponential backoff and resumes by itself.",
    ["table", "service"],
    registry=REGISTRY,
)
UNAVAILABLE = Gauge(
    "icefall_ingest_unavailable",
    "1 while ingestion cannot reach the service (kafka, catalog, object_store, registry, kube_apiserver), "
    "else 0.",
    ["table", "service"],
    registry=REGISTRY,
)
UNAVAILABLE_RETRIES = Counter(
    "icefall_ingest_unavailable_retries_total",
    "Ingestion attempts that failed because a service was unreachable (each is retried after a backoff).",
    ["table", "service"],
    registry=REGISTRY,
)
LAST_SUCCESS = Gauge(
    "icefall_ingest_last_success_timestamp_seconds",
    "Unix time of the last ingestion attempt that reached every service it needed (a batch or an idle poll).",
    ["table"],
    registry=REGISTRY,
)

MAINTENANCE_ITEMS = Counter(
    "icefall_maintenance_items_total",
    "Maintenance work items run, by kind (CompactPartition, ExpireSnapshots, ...) and outcome "
    "(done, skipped: stale plan, failed).",
    ["table", "kind", "outcome"],
    registry=REGISTRY,
)
MAINTENANCE_ITEM_DURATION = Histogram(
    "icefall_maintenance_item_duration_seconds",
    "Wall time of one maintenance work item, claim to commit.",
    ["table", "kind"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
    registry=REGISTRY,
)
COMPACTION_FILES_REWRITTEN = Counter(
    "icefall_compaction_rewritten_files_total",
    "Data files replaced by compaction and delete application (inputs of committed rewrites).",
    ["table"],
    registry=REGISTRY,
)
COMPACTION_FILES_ADDED = Counter(
    "icefall_compaction_added_files_total",
    "Data files written by committed compaction rewrites.",
    ["table"],
    registry=REGISTRY,
)
COMPACTION_DELETE_FILES_REMOVED = Counter(
    "icefall_compaction_removed_delete_files_total",
    "Position delete files dropped by committed rewrites: their data files were rewritten without the rows.",
    ["table"],
    registry=REGISTRY,
)
COMPACTION_YIELDS = Counter(
    "icefall_compaction_yields_total",
    "Rewrites run while holding the table's yield Lease, after losing to a keyed table's deletes "
    f"{YIELD_AFTER_CONFLICTS} times in a row: ingestion waits for them before its next batch.",
    ["table"],
    registry=REGISTRY,
)
LAST_COMPACTION = Gauge(
    "icefall_last_compaction_timestamp_seconds",
    "Unix time of the last committed compaction rewrite by this process.",
    ["table"],
    registry=REGISTRY,
)
LAST_SNAPSHOT_EXPIRY = Gauge(
    "icefall_last_snapshot_expiry_timestamp_seconds",
    "Unix time of the last snapshot expiry by this process.",
    ["table"],
    registry=REGISTRY,
)
MAINTENANCE_BACKLOG = Gauge(
    "icefall_maintenance_backlog_items",
    "Maintenance work items in the last plan this process made.",
    ["table"],
    registry=REGISTRY,
)


def serve(port: int, *, required: bool = True) -> None:
    """Expose /metrics on `port` (0 disables). A port already taken raises, unless `required` is False (the
    pods: each has a network namespace of its own, so that happens only where pods share the host's, as
    under the e2e tests' local kubelet); then it is logged and the process runs without metrics."""
    if not port:
        return
    try:
        start_http_server(port, registry=REGISTRY)
    except OSError as error:
        if required:
            raise
        logging.getLogger(__name__).warning("metrics not served on port %d: %s", port, error)
