"""Writers racing on one table, against real Kafka, Spark and catalog, in process (threads share one Spark).

Proves, each time checking record by record that every produced record is in the table or the dead-letter
table exactly once (and that the auditor agrees):
- two writers started at the same moment on one table (two `FileLease` holders of one lease file) take
  turns: exactly one holds the lease at a time, the other waits in `start`; when the first closes, the
  second takes over at the next epoch and continues where the table stopped;
- a writer paused past its lease after staging a batch (its dead letters committed, its compare-and-swap
  of the main table next) cannot commit once another writer has taken over and committed: the resumed
  commit is refused, and every later `run_batch` raises FencedError, both when it notices the lost lease
  and when its lease backend wrongly says it still holds it (the table's epoch fences it);
- dead letters left ahead of the main table by a crash between the two commits of a batch stay: the batch
  read again (with more records since) puts in the dead-letter table only what it does not hold, and its
  history holds no delete (no rewind); each bad record in it once, each good one in the table once, by
  content;
- dead letters a fenced-out writer tries to commit after the new holder started (before the new holder has
  committed any) are refused by the new holder's epoch claim in the dead-letter table;
- a commit refused because someone else committed in between drops its staging branch at once (counted in
  `icefall_ingest_stages_dropped_total`) instead of leaving it, with its snapshot, until the next start;
- a deleted Lease, or a second lease store, never makes a writer fence itself in a loop nor share an epoch.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.catalog import CatalogConfig
from icefall.commit import FencedError, claim_epoch, read_committed
from icefall.commit.lease import FileLease, LeaseLostError
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport, Ingestor, LeaseKeeper
from icefall.plan.leases import LeaseRecord
from icefall.runtime import failpoints
from icefall.runtime.failpoints import FailpointError
from icefall.testing.streams import (
    assert_exactly_once,
    drain,
    produce,
    streaming_table,
    table_offsets,
    watermarks,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _no_failpoints() -> Any:
    yield
    failpoints.disarm_all()


def tables(config: CatalogConfig, name: str) -> tuple[Any, Any]:
    catalog = config.pyiceberg()
    return catalog.load_table(("it", name)), catalog.load_table(("it", f"{name}_dlq"))


def test_two_writers_started_at_once_take_turns_and_the_second_continues(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-race-start", "race_start"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 120, bad_every=15)
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    lease_file = tmp_path / "commit.lease.json"

    start_together = threading.Barrier(2)
    lock = threading.Lock()
    order: list[str] = []  # holders, in the order they got the lease
    holding: set[str] = set()
    overlaps: list[tuple[str, set[str]]] = []
    first_released = threading.Event()
    second_batch_produced = threading.Event()
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def writer(holder: str) -> None:
        try:
            # Longer than a batch: the lease is renewed once per batch, so a shorter one could run out
            # mid-batch and let the waiting writer in (harmless: the table's epoch fences the first).
            lease = FileLease(lease_file, holder, duration_seconds=60, poll_seconds=0.2)
            ingestor = Ingestor(st, catalog_config, spark, lease, writer_id=holder)
            start_together.wait(30)
            asked = time.monotonic()
            ingestor.start(lease_timeout=120)
            with lock:
                turn = len(order)
                order.append(holder)
                if holding:
                    overlaps.append((holder, set(holding)))
                holding.add(holder)
            result: dict[str, Any] = {"epoch": ingestor.epoch, "asked": asked, "acquired": time.monotonic()}
            try:
                if turn == 1:
                    assert second_batch_produced.wait(120)
                result["reports"] = drain(ingestor)
            finally:
                with lock:
                    holding.discard(holder)
                result["released"] = time.monotonic()
                ingestor.close()  # releases the lease
                if turn == 0:
                    first_released.set()
            results[holder] = result
        except BaseException as error:
            errors.append(error)
            first_released.set()

    threads = [threading.Thread(target=writer, args=(holder,)) for holder in ("writer-a", "writer-b")]
    for thread in threads:
        thread.start()
    assert first_released.wait(300)
    bad |= produce(kafka, topic, 120, 60, bad_every=15)
    second_batch_produced.set()
    for thread in threads:
        thread.join(300)
    if errors:
        raise errors[0]

    first, second = (results[holder] for holder in order)
    assert overlaps == [], f"two writers held the lease at once: {overlaps}"
    assert second["epoch"] == first["epoch"] + 1
    # The second asked as early as the first, and only got the lease once the first let go.
    assert second["asked"] < first["released"] <= second["acquired"]
    first_reports: list[BatchReport] = first["reports"]
    second_reports: list[BatchReport] = second["reports"]
    assert sum(r.records_read for r in first_reports) == 120
    assert sum(r.records_read for r in second_reports) == 60
    table, dead_letters = tables(catalog_config, name)
    assert read_committed(table).epoch == read_committed(dead_letters).epoch == second["epoch"]
    record = FileLease(lease_file, "observer").current()
    assert record is not None and (record.holder, record.epoch) == (None, second["epoch"])
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)


class BlindLease:
    """A lease backend that never notices it lost the lease: only the table's epoch can stop its holder."""

    def __init__(self, epoch: int) -> None:
        self._epoch = epoch

    @property
    def holder(self) -> str:
        return "blind"

    @property
    def epoch(self) -> int | None:
        return self._epoch

    @property
    def expires_at(self) -> float | None:
        return time.monotonic() + 60

    @property
    def is_held(self) -> bool:
        return True

    def acquire(self, timeout: float | None = None, *, floor: int = 0) -> int:
        return self._epoch

    def renew(self) -> None:
        pass

    def release(self, *, forget: bool = False) -> None:
        pass

    def current(self) -> LeaseRecord | None:
        return None

    def observed_holder(self) -> str | None:
        return None


def test_a_writer_paused_past_its_lease_cannot_commit_after_a_takeover(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-race-pause", "race_pause"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 80, bad_every=10)
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    lease_file = tmp_path / "commit.lease.json"
    a = Ingestor(st, catalog_config, spark, FileLease(lease_file, "a", duration_seconds=3), writer_id="a")
    a.start(lease_timeout=10)

    paused, resume = threading.Event(), threading.Event()
    commits_of_a: list[str] = []
    outcome: dict[str, Any] = {}

    def run_a() -> None:
        try:
            outcome["report"] = a.run_batch()
        except BaseException as error:
            outcome["error"] = error

    a_thread = threading.Thread(target=run_a)

    def pause_a(point: str) -> None:
        if threading.current_thread() is a_thread:
            commits_of_a.append(point)
            if len(commits_of_a) == 1:  # the batch's main commit (its dead letters are committed already)
                assert a._keeper is not None
                a._keeper.stop()  # a paused process renews nothing: its lease runs out
                paused.set()
                assert resume.wait(300)

    b = None
    try:
        with failpoints.armed("main.before-commit", pause_a):
            a_thread.start()
            assert paused.wait(300), outcome
            # A passed every check of its main commit and sleeps before the compare-and-swap, with its
            # dead letters committed: the dead-letter table is ahead of the main table.
            table, dead_letters = tables(catalog_config, name)
            assert read_committed(table).offsets == {}
            assert read_committed(dead_letters).offsets == watermarks(kafka, topic)
            assert sum(table_offsets(catalog_config, name)[1].values()) == len(bad)

            # B waits for A's lease to run out, takes over at the next epoch, and commits everything.
            # One lease, one duration: B judges A's lease by its own (3 s after it last saw it change).
            lease_b = FileLease(lease_file, "b", duration_seconds=3, poll_seconds=0.2)
            b = Ingestor(st, catalog_config, spark, lease_b, writer_id="b")
            b.start(lease_timeout=30)
            assert b.epoch == a.epoch + 1
            # B's start dropped A's staging branch and left A's dead letters: B's batch skips them.
            assert read_committed(dead_letters).offsets == watermarks(kafka, topic)
            assert sum(table_offsets(catalog_config, name)[1].values()) == len(bad)
            b_report = b.run_batch()
            assert b_report is not None and b_report.records_read == 80
            head = read_committed(table)

            resume.set()
            a_thread.join(120)
        # Refused: main moved off the head A planned from, and on the re-check A's epoch is below B's.
        assert isinstance(outcome.get("error"), FencedError), outcome
        assert read_committed(table) == head
        assert_exactly_once(catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)

        # A cannot commit anything later: it notices the lost lease ...
        bad |= produce(kafka, topic, 80, 40, bad_every=10)
        with pytest.raises(FencedError) as fenced:
            a.run_batch()
        assert isinstance(fenced.value.__cause__, LeaseLostError)
        # ... and if its lease backend failed to notice, the table's epoch refuses it anyway.
        a.lease = BlindLease(a.epoch)
        a._keeper = LeaseKeeper(a.lease)  # never started: only asked at commit time
        with pytest.raises(FencedError, match="below the table's epoch"):
            a.run_batch()
        assert read_committed(table) == head

        assert sum(r.records_read for r in drain(b)) == 40
        assert read_committed(table).epoch == b.epoch
        assert_exactly_once(catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)
    finally:
        resume.set()
        a.close()
        if b is not None:
            b.close()


def test_dead_letters_left_ahead_by_a_crash_are_skipped_never_rewound(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-race-dlq", "race_dlq"
    kafka.create_topic(topic, partitions=2)
    # Round robin: partition p holds ids p, p+2, ...; ids 0, 5, 10, ... are malformed, in both partitions.
    bad = produce(kafka, topic, 0, 60, bad_every=5, partitions=[0, 1])
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    lease_file = tmp_path / "commit.lease.json"

    crashed = Ingestor(st, catalog_config, spark, FileLease(lease_file, "crashed"), writer_id="crashed")
    crashed.start(lease_timeout=10)
    try:
        # The dead letters are committed; the main commit never runs.
        with failpoints.armed("dlq.after-commit", "raise"), pytest.raises(FailpointError):
            crashed.run_batch()
    finally:
        crashed.close()
    table, dead_letters = tables(catalog_config, name)
    ahead = watermarks(kafka, topic)
    assert read_committed(table).offsets == {}
    assert (read_committed(dead_letters).offsets, read_committed(dead_letters).epoch) == (ahead, 1)
    assert sum(table_offsets(catalog_config, name)[1].values()) == len(bad)

    # More records: the batch read again covers the crashed one's range and more, so the dead-letter table
    # takes part of it (from its own offsets) while its count check sees all of it.
    bad |= produce(kafka, topic, 60, 20, bad_every=5, partitions=[0, 1])
    restarted = Ingestor(st, catalog_config, spark, FileLease(lease_file, "restarted"), writer_id="restarted")
    restarted.start(lease_timeout=10)
    try:
        dead_letters.refresh()
        assert read_committed(dead_letters).offsets == ahead  # the start claimed its epoch, rewound nothing
        reports = drain(restarted)
        assert [r.records_read for r in reports] == [80]  # one batch (a first batch probes up to 10,000)
        assert reports[0].records_dead_lettered == len(bad) == 16  # counted over all of the batch ...
        dead_letters.refresh()
        summary = dead_letters.metadata.current_snapshot().summary
        assert summary is not None and summary["added-records"] == "4"  # ... written: 60, 65, 70, 75 only
        high = watermarks(kafka, topic)
        assert_exactly_once(catalog_config, name, high, bad, bootstrap=kafka.bootstrap, spark=spark, st=st)
        # Its history: the genesis, epoch claims and commits of dead letters, all appends; a rewind would
        # have committed a delete.
        dead_letters.refresh()
        operations = [s.summary.operation.value for s in dead_letters.snapshots() if s.summary is not None]
        assert set(operations) == {"append"}, operations
        assert read_committed(dead_letters).offsets == high
    finally:
        restarted.close()


def test_a_fenced_out_writers_late_dead_letters_are_refused(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """A fenced-out writer tries to commit a batch's dead letters after the new holder started, before the new
    holder has committed anything: the new holder's epoch claim in the dead-letter table refuses them (before
    claims, they landed and the new holder had to notice the dead-letter table ahead of the main one)."""
    topic, name = "it-race-dlq-late", "race_dlq_late"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 40, bad_every=5, partitions=[0, 1])
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    lease_file = tmp_path / "commit.lease.json"
    old = FileLease(lease_file, "old")  # epoch 1: the writer that is about to be fenced out
    old_epoch = old.acquire(timeout=10)
    old.release()
    # The old writer started while it held epoch 1, and still believes it does.
    a = Ingestor(st, catalog_config, spark, BlindLease(old_epoch), writer_id="a")
    a.start()
    b = Ingestor(st, catalog_config, spark, FileLease(lease_file, "b"), writer_id="b")
    b.start(lease_timeout=10)
    assert b.epoch == old_epoch + 1
    try:
        with pytest.raises(FencedError, match="below the table's epoch"):
            a.run_batch()
        table, dead_letters = tables(catalog_config, name)
        assert read_committed(dead_letters).offsets == {} and read_committed(table).offsets == {}
        assert sum(r.records_read for r in drain(b)) == 40
    finally:
        a.close()
        b.close()
    assert read_committed(dead_letters).epoch == b.epoch
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), bad, bootstrap=kafka.bootstrap)


def test_a_refused_commit_drops_its_staging_branch(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    from icefall.commit import STAGE_PREFIX
    from icefall.runtime import metrics

    topic, name = "it-race-stage-drop", "race_stage_drop"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 20)
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    writer = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "w"), writer_id="w")
    writer.start(lease_timeout=10)
    label = f"it.{name}"
    dropped_before = metrics.REGISTRY.get_sample_value(
        "icefall_ingest_stages_dropped_total", {"table": label}
    )
    try:
        drain(writer)
        produce(kafka, topic, 20, 10)
        table, _ = tables(catalog_config, name)
        committed = read_committed(table)

        hits: list[str] = []

        def someone_commits(point: str) -> None:
            # A commit that is not maintenance lands between staging and the compare-and-swap, once: a
            # newer writer's epoch claim.
            hits.append(point)
            if len(hits) == 1:
                claim_epoch(table, committed.epoch + 1)

        with failpoints.armed("main.before-commit", someone_commits), pytest.raises(FencedError):
            writer.run_batch()
        table.refresh()
        assert [ref for ref in table.metadata.refs if ref.startswith(STAGE_PREFIX)] == []
        dropped = metrics.REGISTRY.get_sample_value("icefall_ingest_stages_dropped_total", {"table": label})
        assert (dropped or 0) - (dropped_before or 0) == 1
    finally:
        writer.close()
    successor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "s"), writer_id="s")
    successor.start(lease_timeout=10)
    try:
        drain(successor)
    finally:
        successor.close()
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)


def test_a_deleted_lease_or_a_second_lease_store_never_fences_in_a_loop_nor_shares_an_epoch(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-race-epochs", "race_epochs"
    kafka.create_topic(topic, partitions=1)
    st = streaming_table(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0})
    lease_file = tmp_path / "commit.lease.json"

    def writer(path: Path, holder: str) -> Ingestor:
        ingestor = Ingestor(st, catalog_config, spark, FileLease(path, holder), writer_id=holder)
        ingestor.start(lease_timeout=10)
        return ingestor

    # Three writers one after the other: the table's epoch climbs to 3.
    for i in range(3):
        produce(kafka, topic, i * 10, 10)
        w = writer(lease_file, f"w{i}")
        drain(w)
        w.close()
    table, _ = tables(catalog_config, name)
    assert read_committed(table).epoch == 3

    # The Lease is deleted (a namespace wiped, say): the next writer starts above the table's epoch and
    # commits at once; before, it restarted at epoch 1 and was fenced until restarts climbed past 3.
    lease_file.unlink()
    produce(kafka, topic, 30, 10)
    fresh = writer(lease_file, "fresh")
    assert fresh.epoch == 4
    assert sum(r.records_read for r in drain(fresh)) == 10

    # A second lease store (another operator, a hand-run `icefall run`) would hand out epoch 4 again: the
    # second writer takes 5 instead of sharing 4, and the first writer is fenced. Two writers reading the
    # table's epoch at the same moment could still pick one epoch: the claim in the table refuses the second.
    other_store = tmp_path / "other.lease.json"
    other_store.write_text(
        '{"holder": null, "epoch": 3, "acquireTime": 0, "renewTime": 0, "durationSeconds": 15}'
    )
    second = writer(other_store, "second")
    try:
        assert second.epoch == 5
        produce(kafka, topic, 40, 10)
        with pytest.raises(FencedError):
            fresh.run_batch()
        assert sum(r.records_read for r in drain(second)) == 10
        assert read_committed(table).epoch == 5
        with pytest.raises(FencedError, match="already claimed"):
            claim_epoch(table, 5)
    finally:
        fresh.close()
        second.close()
    assert_exactly_once(catalog_config, name, watermarks(kafka, topic), set(), bootstrap=kafka.bootstrap)
