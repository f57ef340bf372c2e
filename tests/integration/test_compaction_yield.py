"""Compaction on a hot keyed table, against real Kafka, Spark and the SQLite catalog.

Proves: while ingestion of an upsert table commits a batch every second, each adding position deletes to
the file a delete-application rewrite is working on, the rewrite is refused for the new deletes (counted
per item), and after `YIELD_AFTER_CONFLICTS` refusals its next attempt holds the table's yield Lease,
ingestion waits for it before its next batch, and the rewrite lands: the deleted rows are gone from
the data files with their delete files, and the table still holds exactly the last change per key
(`audit_keyed`, by content), while every produced change is ingested.

Does not prove: the wait bound (`YIELD_MAX_WAIT_SECONDS`; unit-tested rules only), several compaction
workers contending for the yield Lease, or Kubernetes Leases (the same `Lease` interface, file-backed here).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from icefall.audit import audit_keyed
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.compact.runner import file_leases, runner_for
from icefall.compact.view import read_table_view
from icefall.compact.worker import Outcome
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.leases import YIELD_AFTER_CONFLICTS, YIELD_LEASE_SECONDS
from icefall.plan.maintenance_items import ApplyDeletes, MaintenancePolicy
from icefall.plan.names import table_leases
from icefall.plan.table_view import FileContent
from icefall.runtime import failpoints, metrics
from icefall.testing.streams import drain, keyed_table, send_changes, started_ingestor

pytestmark = pytest.mark.integration

KEYS = 2_000


def test_a_rewrite_that_keeps_losing_to_keyed_batches_gets_ingestion_to_wait_for_it(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic = "it-compaction-yield"
    kafka.create_topic(topic, partitions=1)
    st = keyed_table("compaction_yield", topic, kafka.bootstrap)
    label = "it.compaction_yield"
    leases = tmp_path / "leases"
    yield_to = FileLease.in_dir(
        leases, table_leases(st).rewrite_yield, "ingestor", duration_seconds=YIELD_LEASE_SECONDS
    )
    # Only delete application is due (no small-file compaction), from 1 % of a file's rows deleted.
    policy = MaintenancePolicy(min_files_to_compact=1000, deleted_fraction_threshold=0.01)
    runner = runner_for(st, catalog_config, spark, file_leases(leases, "compactor"), policy=policy)
    yields = metrics.COMPACTION_YIELDS.labels(label)._value.get()
    waited = metrics.INGEST_YIELD_SECONDS.labels(label)._value.get()

    with started_ingestor(
        st, catalog_config, spark, tmp_path / "commit.lease", yield_to=yield_to
    ) as ingestor:
        send_changes(kafka, topic, [(0, k, {"id": k, "status": "v0"}) for k in range(KEYS)])
        drain(ingestor)  # one data file with every key
        stop = threading.Event()
        produced = [0]

        def produce() -> None:  # updates of random keys, most of them still in the first file
            rng = random.Random(7)
            while not stop.wait(0.2):
                keys = rng.sample(range(KEYS), 20)
                send_changes(kafka, topic, [(0, k, {"id": k, "status": f"u{produced[0]}"}) for k in keys])
                produced[0] += 1

        producer = threading.Thread(target=produce, daemon=True)
        ingestion = threading.Thread(target=ingestor.run, args=(stop.is_set, lambda _: None), daemon=True)
        producer.start()
        ingestion.start()
        outcomes = []
        try:
            # Each rewrite spends 10 s between reading its files and committing: batches land in between
            # unless ingestion waits.
            deadline = time.monotonic() + 240
            with failpoints.armed("main.mid-rewrite", "sleep:10"):
                while len(outcomes) < YIELD_AFTER_CONFLICTS + 3 and time.monotonic() < deadline:
                    step = runner.step()
                    if step.item is None:  # no batch of updates committed yet
                        time.sleep(0.5)
                        continue
                    assert isinstance(step.item, ApplyDeletes), step
                    outcomes.append(step.error or step.result.outcome.value)  # type: ignore[union-attr]
                    if step.result is not None and step.result.outcome is Outcome.DONE:
                        break
        finally:
            stop.set()
            producer.join(30)
            ingestion.join(60)
        assert not ingestion.is_alive() and not producer.is_alive()
        assert produced[0] > 0
        drain(ingestor)

    assert outcomes[-1] == Outcome.DONE.value, outcomes
    refused = outcomes[:-1]
    assert len(refused) >= YIELD_AFTER_CONFLICTS and all("found new" in o for o in refused), outcomes
    assert metrics.COMPACTION_YIELDS.labels(label)._value.get() == yields + 1
    assert metrics.INGEST_YIELD_SECONDS.labels(label)._value.get() > waited  # ingestion did wait

    view = read_table_view(
        catalog_config.pyiceberg().load_table(("it", "compaction_yield")), list_storage=False
    )
    data = [f for f in view.files if f.content is FileContent.DATA]
    assert all(f.record_count < KEYS for f in data), "the first file was rewritten without its deleted rows"
    report = audit_keyed(spark, st, catalog_config.pyiceberg(), catalog_config.name)
    assert report.ok, report.render()
