"""Catch-up after a restart (`plan.batching`, rule 4): a writer that starts on a large backlog probes once,
then takes the rest in batches sized to drain it within `behind_factor x target` at the pace the probe
measured, instead of ramping 10k → 20k → 40k → 80k.

Proves, against real Kafka, Spark and the embedded catalog, with a second `Ingestor` resuming from the
table (what a restarted `icefall run` or ingestion pod does), at a 30 s target (batches of up to 120 s while
behind): the first batch is the 10,000-record probe, and 90,000 waiting records land in at most three
batches, exactly once. The old ramp needed four (10k + 20k + 40k + 20k) unless its probe ran at more than
about 2,000 records/s; this rule needs about 500 records/s once warm. Timing is not asserted. On this
shared 2-core machine, loaded, batches of 10,000 records took 8-22 s (52 s cold).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.batching import DEFAULT_PROBE_RECORDS
from icefall.testing.streams import (
    assert_exactly_once,
    drain,
    manifest_text,
    produce,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration

BACKLOG = 90_000


def test_a_restarted_writer_drains_a_large_backlog_in_few_batches(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "catch_up", "it-catch-up"
    kafka.create_topic(topic, partitions=3)
    text = manifest_text(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    st = load_manifest(text.replace("targetSeconds: 2", "targetSeconds: 30"))
    assert st.spec.freshness.target_seconds == 30
    produce(kafka, topic, 0, 100)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as first:
        assert sum(r.records_read for r in drain(first)) == 100

    produce(kafka, topic, 100, BACKLOG)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as restarted:
        reports = drain(restarted)

    sizes = [r.records_read for r in reports]
    print(f"catch-up of {BACKLOG} records: sizes {sizes}, seconds {[round(r.seconds, 2) for r in reports]}")
    assert sum(sizes) == BACKLOG
    assert sizes[0] == DEFAULT_PROBE_RECORDS, sizes
    assert len(sizes) <= 3, sizes
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)
