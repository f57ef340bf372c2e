"""Prometheus metrics of the ingestion and maintenance processes (one registry per process).

Names follow Prometheus conventions: `icefall_` prefix, base units (seconds, bytes), `_total` for counters.
Labels are the table (`namespace.name`) and, for lag, the Kafka partition; never anything unbounded.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECORDS_READ = Counter(
    "icefall_records_read_total", "Kafka records read by ingestion.", ["table"], registry=REGISTRY
)
RECORDS_WRITTEN = Counter(
    "icefall_records_written_total", "Records committed to the Iceberg table.", ["table"], registry=REGISTRY
)
RECORDS_DEAD_LETTERED = Counter(
    "icefall_records_dead_lettered_total",
    "Records routed to the dead-letter destination.",
    ["table"],
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
FRESHNESS = Gauge(
    "icefall_freshness_seconds",
    "Seconds between now and the produce time of the newest committed record; 0 when caught up.",
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


def serve(port: int) -> None:
    """Expose /metrics on `port` (0 disables)."""
    if port:
        start_http_server(port, registry=REGISTRY)
