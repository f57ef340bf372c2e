"""Topics a pattern selects into one table (`spec.source.topicPattern`), against real Kafka, Spark and the
embedded catalog.

Proves: the two topics a pattern matches fill one table exactly once (malformed records in the dead-letter
table), a topic it does not match is not read; a third matching topic created while the writer runs
(`Ingestor.run`, the loop of `icefall run`) is found in Kafka's topic list and read from offset 0, its
records produced before it was found included; the auditor agrees by content.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport
from icefall.testing.streams import (
    NAMESPACE,
    assert_exactly_once_by_topic,
    manifest_text,
    produce,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration


def test_a_pattern_reads_its_topics_and_one_created_while_running_from_offset_0(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, eu, us, other, asia = (
        "pattern_two",
        "itp-orders-eu",
        "itp-orders-us",
        "itp-payments",
        "itp-orders-asia",
    )
    kafka.create_topic(eu, partitions=2)
    kafka.create_topic(us, partitions=1)
    kafka.create_topic(other, partitions=1)
    bad = {(eu, p, o) for p, o in produce(kafka, eu, 0, 120, bad_every=10)}
    bad |= {(us, p, o) for p, o in produce(kafka, us, 0, 60, bad_every=7)}
    produce(kafka, other, 0, 20)
    text = manifest_text(name, [eu, us], kafka.bootstrap, batch={"minIntervalSeconds": 0})
    text = text.replace(
        f'topics: ["{eu}", "{us}"]',
        'topicPattern: "itp-orders-.*", properties: {"metadata.max.age.ms": "1000"}',
    )
    st = load_manifest(text)
    assert st.spec.source.topic_pattern == "itp-orders-.*"
    table_id = (NAMESPACE, name)
    stop, errors, reports = threading.Event(), [], []

    def committed_topics() -> dict[str, dict[int, int]]:
        if not catalog_config.pyiceberg().table_exists(table_id):
            return {}
        state = read_committed(catalog_config.pyiceberg().load_table(table_id))
        return {t: dict(held.offsets) for t, held in state.by_topic().items()}

    def wait_for(high: dict[str, dict[int, int]], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while committed_topics() != high:
            assert not errors, errors
            assert time.monotonic() < deadline, f"committed {committed_topics()}, expected {high}"
            time.sleep(0.5)

    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:

        def run() -> None:
            try:
                ingestor.run(stop.is_set, lambda r: reports.append(r) if isinstance(r, BatchReport) else None)
            except BaseException as error:
                errors.append(error)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            wait_for({eu: watermarks(kafka, eu), us: watermarks(kafka, us)})
            kafka.create_topic(asia, partitions=1)
            produce(kafka, asia, 0, 30)
            high = {eu: watermarks(kafka, eu), us: watermarks(kafka, us), asia: watermarks(kafka, asia)}
            wait_for(high)
        finally:
            stop.set()
            runner.join(60)
    assert not errors, errors
    assert not runner.is_alive()
    assert_exactly_once_by_topic(
        catalog_config, name, high, bad, bootstrap=kafka.bootstrap, spark=spark, st=st
    )
    state = read_committed(catalog_config.pyiceberg().load_table(table_id))
    assert state.of_topic(asia).start_offsets == {0: 0}
    assert other not in state.by_topic()
