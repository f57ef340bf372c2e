"""Pipelining (`ingest.batches`, `spec.batch.pipelined`): while a backlog lasts, the next batch is planned
from the state the in-flight commit gives the table, read and appended to the staging branch on top of the
batch being committed, while that commit runs on the commit thread.

Proves, against real Kafka, Spark and the embedded catalog, with `Ingestor.run` (as `icefall run` and the
ingestion pods use it):
- each commit on the commit thread finds the next batch already on the branch above its own (the reads and
  writes really overlap the commits; with `pipelined: false` no commit runs there), `main` takes the batches
  one snapshot each, in order, and the table holds each record exactly once, by content;
- a commit in flight that is refused drops the batch written on top of it: both are planned again, and
  nothing is lost or doubled;
- a commit in flight that is re-staged over maintenance (a rewrite of the table's files) lands, and the
  batch written on top of its staged snapshot is dropped and planned again (it could never land).
Kills of `icefall run` at the commit points while batches are pipelined: test_failpoint_kills.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyiceberg.table.snapshots import ancestors_of
from pyspark.sql import SparkSession

from icefall.catalog import CatalogConfig
from icefall.commit import STAGE_PREFIX, StaleHeadError
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport, Ingestor
from icefall.runtime import failpoints, metrics
from icefall.testing.streams import (
    assert_exactly_once,
    produce,
    started_ingestor,
    streaming_table,
    watermarks,
)

pytestmark = pytest.mark.integration

RECORDS = 1_200
BATCH = {"maxRecords": 150, "minIntervalSeconds": 0}


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def run_until_caught_up(ingestor: Ingestor) -> list[BatchReport]:
    """`Ingestor.run` until a step finds nothing to read; the reports of the batches that landed."""
    reports: list[BatchReport] = []
    idle = threading.Event()

    def on_batch(report: BatchReport | None) -> None:
        if report is None:
            idle.set()
        else:
            reports.append(report)

    ingestor.run(idle.is_set, on_batch)
    return reports


def on_commit_thread() -> bool:
    return threading.current_thread().name.startswith("icefall-commit")


def next_batch_stacked(config: CatalogConfig, name: str, timeout: float = 60.0) -> bool:
    """Wait until the writer's branch holds a batch above one that is not on `main` yet: the next batch
    appended on top of the one about to be committed. False if that does not happen within `timeout`."""
    table = config.pyiceberg().load_table(("it", name))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = table.refresh().metadata
        on_main = {s.snapshot_id for s in ancestors_of(meta.current_snapshot(), meta)}
        for ref_name, ref in meta.refs.items():
            head = meta.snapshot_by_id(ref.snapshot_id)
            if not ref_name.startswith(STAGE_PREFIX) or head is None:
                continue
            if head.snapshot_id not in on_main and head.parent_snapshot_id not in on_main:
                return True
        time.sleep(0.05)
    return False


def counter(name: str, label: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, {"table": f"it.{label}", **labels}) or 0.0


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_backlog_is_read_and_written_while_the_batch_before_is_committed(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path, pipelined: bool
) -> None:
    name = f"pipelined_{str(pipelined).lower()}"
    topic = f"it-{name}"
    kafka.create_topic(topic, partitions=3)
    produce(kafka, topic, 0, RECORDS)
    st = streaming_table(name, topic, kafka.bootstrap, batch={**BATCH, "pipelined": pipelined})
    stacked: list[bool] = []

    def hold_until_stacked(point: str) -> None:
        if on_commit_thread():
            stacked.append(next_batch_stacked(catalog_config, name))

    with (
        failpoints.armed("main.before-commit", hold_until_stacked),
        started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor,
    ):
        reports = run_until_caught_up(ingestor)

    assert sum(r.records_read for r in reports) == RECORDS
    assert len(reports) >= 6
    if pipelined:
        # All but the last batch or so are committed on the commit thread, each with the next batch
        # already written on top of it.
        assert len(stacked) >= len(reports) - 2 and all(stacked), stacked
    else:
        assert stacked == []
    table = catalog_config.pyiceberg().load_table(("it", name))
    meta = table.metadata
    lineage = [s.snapshot_id for s in ancestors_of(meta.current_snapshot(), meta)]
    landed = [r.snapshot_id for r in reports]
    assert lineage[: len(landed)] == landed[::-1]  # one snapshot per batch, in order
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)


def fail_second_commit_in_flight(
    config: CatalogConfig, name: str, act: Callable[[], None]
) -> Callable[[str], None]:
    """A failpoint action: on the commit thread's second commit, once the next batch is on top, `act`."""
    seen: list[str] = []

    def action(point: str) -> None:
        if not on_commit_thread():
            return
        seen.append(point)
        if len(seen) == 2:
            assert next_batch_stacked(config, name), "the next batch was not written on top"
            act()

    return action


def test_a_refused_commit_in_flight_drops_the_batch_written_on_top(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "pipelined_refused", "it-pipelined-refused"
    kafka.create_topic(topic, partitions=3)
    bad = produce(kafka, topic, 0, RECORDS, bad_every=301)  # batches with bad rows commit in line
    st = streaming_table(name, topic, kafka.bootstrap, batch=BATCH)
    refused_before = counter("icefall_commits_refused_total", name, reason="stale_head")

    def refuse() -> None:
        raise StaleHeadError("injected: another writer committed")

    action = fail_second_commit_in_flight(catalog_config, name, refuse)
    with (
        failpoints.armed("main.before-commit", action),
        started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor,
    ):
        reports = run_until_caught_up(ingestor)

    assert counter("icefall_commits_refused_total", name, reason="stale_head") == refused_before + 1
    # The refused batch and the one on top of it were read again: every record is committed once.
    assert sum(r.records_read for r in reports) == RECORDS
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)
    table = catalog_config.pyiceberg().load_table(("it", name))
    on_main = {s.snapshot_id for s in ancestors_of(table.metadata.current_snapshot(), table.metadata)}
    leftovers = [n for n, r in table.metadata.refs.items() if n != "main" and r.snapshot_id not in on_main]
    assert leftovers == []


def test_a_commit_in_flight_restaged_over_maintenance_drops_the_batch_on_top(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "pipelined_restaged", "it-pipelined-restaged"
    kafka.create_topic(topic, partitions=3)
    produce(kafka, topic, 0, RECORDS)
    st = streaming_table(name, topic, kafka.bootstrap, batch=BATCH)
    restaged_before = counter("icefall_ingest_commits_restaged_total", name)
    discarded_before = counter("icefall_ingest_batches_discarded_total", name)

    def rewrite() -> None:
        """Maintenance on main: Spark compacts every file (a `replace`), the rows unchanged."""
        options = "map('rewrite-all', 'true')"
        ident = f"it.{name}"
        spark.sql(
            f"CALL {catalog_config.name}.system.rewrite_data_files(table => '{ident}', options => {options})"
        )

    action = fail_second_commit_in_flight(catalog_config, name, rewrite)
    with (
        failpoints.armed("main.after-stage", action),
        started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor,
    ):
        reports = run_until_caught_up(ingestor)

    assert counter("icefall_ingest_commits_restaged_total", name) == restaged_before + 1
    assert counter("icefall_ingest_batches_discarded_total", name) == discarded_before + 1
    assert sum(r.records_read for r in reports) == RECORDS
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)
