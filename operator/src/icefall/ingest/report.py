"""What a landed batch reports (`BatchReport`): records, lag and freshness when it landed, seconds per
phase; the pacing figures it teaches the planner; the metrics it publishes.

Guarantees: the lag is measured after the commit (a floor if the broker does not answer then), so a live
table is never called caught up from watermarks a batch planned from. Not guaranteed: the phases of a
pipelined batch add up to its wall time (its commit overlaps the next batch's read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from icefall.api import StreamingTableSpec
from icefall.commit.batch import batch_retention_loss, held_of
from icefall.ingest.planning import Progress
from icefall.plan.batching import update_throughput
from icefall.plan.lag import freshness_seconds, partition_lag
from icefall.plan.table_status import topic_ends
from icefall.runtime import metrics

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icefall.ingest.outcome import Landed
    from icefall.ingest.planning import PlannedBatch, ReadStats
    from icefall.kafka.admin import TopicView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchReport:
    records_read: int
    records_written: int
    records_dead_lettered: int
    seconds: float
    commit_seconds: float
    snapshot_id: int
    offsets: dict[int, int]
    lag: int
    freshness_seconds: float = 0.0  # now - produce time of the newest committed record; 0 when caught up
    bytes_read: int = 0
    data_loss: int = 0  # records lost to retention this batch reports first
    skipped: int = 0  # records lost to retention this batch's commit skipped (added to icefall.lost-records)
    lost_records: int = 0  # the table's icefall.lost-records once this batch landed
    partition_lag: Mapping[int, int] = field(default_factory=dict)  # `lag` per partition
    # Each topic's end offsets by partition when the batch landed, in either form (the route tables' lag
    # is measured against them: `icefall.plan.table_status.destination_status`). Empty: a report of one
    # topic that gives only `offsets` and `partition_lag` (its end is their sum).
    topic_ends: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # Seconds per phase of the batch (plan, stage, write, dead_letters, commit, report): where a batch's
    # fixed cost goes. "write" is the one Spark job that reads, decodes and writes the good rows; "stage"
    # puts the writer's staging branch at main's head (no catalog commit when the last commit left it
    # there) and, for a batch that wrote nothing, stages its empty snapshot.
    phases: Mapping[str, float] = field(default_factory=dict)
    # The dead letters by kind of reason (`icefall.decode.decode.REASON_KINDS`), summing to the above.
    dead_letter_reasons: Mapping[str, int] = field(default_factory=dict)
    # Schema changes the table cannot follow, as last planned (`icefall.decode.schemas`), one per field.
    schema_refused: tuple[str, ...] = ()


class PhaseClock:
    """Seconds per phase of one batch (`BatchReport.phases`), on the monotonic clock."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.ended: float | None = None
        self.phases: dict[str, float] = {}
        self._mark = self.started

    def mark(self, name: str) -> None:
        """The time since the previous mark belongs to phase `name`."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._mark
        self._mark = now

    def mark_stage_and_commit(self, commit_seconds: float) -> None:
        """The time since the previous mark was staging, but its last `commit_seconds` were the commit."""
        now = time.monotonic()
        self.phases["stage"] = self.phases.get("stage", 0.0) + now - self._mark - commit_seconds
        self.phases["commit"] = self.phases.get("commit", 0.0) + commit_seconds
        self._mark = now

    def landed(self, commit_seconds: float, at: float) -> None:
        """A pipelined batch's commit, run on the commit thread, took `commit_seconds` and ended `at`."""
        self.phases["commit"] = self.phases.get("commit", 0.0) + commit_seconds
        self.ended = at
        self._mark = time.monotonic()  # what follows is the report

    def elapsed(self) -> float:
        """From the start to the commit that landed the batch (or now, if that is not known yet)."""
        return (self.ended or time.monotonic()) - self.started


@dataclass(frozen=True)
class WrittenBatch:
    """A batch read and written to its staging branch: what it was planned as, what the read saw, and its
    phase clock."""

    planned: PlannedBatch
    stats: ReadStats
    clock: PhaseClock


class Reporter:
    """Reports landed batches: lag and freshness, the metrics, and the pacing figures (`progress`: this is
    the one object that makes them)."""

    def __init__(self, spec: StreamingTableSpec, label: str, topics: Mapping[str, TopicView]) -> None:
        self.spec = spec
        self.label = label
        self.topics = topics
        self.progress = Progress()
        #: What the table cannot follow now (`icefall.decode.schemas.SchemaFollower.refused`).
        self.schema_refused: Callable[[], tuple[str, ...]] = tuple

    def step_started(self, at: float) -> None:
        """A step (a batch, or a look that found nothing) started `at` (monotonic clock)."""
        self.progress = replace(self.progress, last_batch_started=at)

    def learn_pace(self, written: WrittenBatch, seconds: float) -> None:
        """The pacing figures after a batch of `stats.records` that took `seconds`."""
        progress = self.progress
        measured = progress.batches_measured + (1 if written.stats.records > 0 else 0)
        self.progress = replace(
            progress,
            throughput_rps=update_throughput(
                progress.throughput_rps,
                written.stats.records,
                seconds,
                whole_backlog=written.planned.whole_backlog,
                previous_cold=progress.batches_measured == 1,
            ),
            batches_measured=measured,
            last_batch_seconds=seconds,
            last_batch_records=written.stats.records,
        )

    def report(self, written: WrittenBatch, landed: Landed, table: Table, *, paced: bool) -> BatchReport:
        """After the commit: update the pacing figures, measure lag and freshness, publish the metrics.
        `table`: one whose metadata holds the new snapshot; `paced`: the pacing figures were updated when
        the batch was written (a pipelined batch)."""
        planned, stats, clock = written.planned, written.stats, written.clock
        records_written = added_records(table, landed.snapshot_id) + landed.routed
        seconds = clock.elapsed()
        if not paced:
            self.learn_pace(written, seconds)
        committed = planned.committed
        after = {p.topic: {**held_of(committed, p.topic).offsets, **p.end} for p in planned.parts}
        # The lag when the commit landed, not when the batch was planned: records keep arriving while a
        # batch runs, and a lag of 0 from the old watermarks would call a live table caught up (and let
        # in-process maintenance run) while it is seconds behind. Watermarks are one cheap broker call.
        marks = self._watermarks_after(planned)
        lag = {topic: partition_lag(offsets, marks[topic]) for topic, offsets in after.items()}
        waiting = sum(sum(by_partition.values()) for by_partition in lag.values())
        self.progress = replace(self.progress, backlog_after_last_batch=waiting)
        newest = _newest(committed.max_produce_time_ms, stats.max_produce_ms)
        behind = freshness_seconds(waiting, newest, time.time())
        skipped = batch_retention_loss(committed, planned.batch(stats))
        report = BatchReport(
            records_read=stats.records,
            records_written=records_written,
            records_dead_lettered=landed.dead_letters.rows,
            seconds=seconds,
            commit_seconds=landed.commit_seconds,
            snapshot_id=landed.snapshot_id,
            # A table of several topics: per (topic, partition) in the metrics (`publish_lag`) only.
            offsets={} if planned.by_topic else next(iter(after.values())),
            lag=waiting,
            freshness_seconds=behind or 0.0,
            bytes_read=stats.bytes,
            data_loss=planned.lost,
            skipped=skipped,
            lost_records=committed.lost_records + skipped,
            partition_lag={} if planned.by_topic else next(iter(lag.values())),
            topic_ends=topic_ends(after, lag),
            phases=clock.phases,
            dead_letter_reasons=landed.dead_letters.kinds,
            schema_refused=self.schema_refused(),
        )
        clock.mark("report")
        log.debug(
            "%s: batch of %d records in %.2fs: %s", self.label, stats.records, seconds,
            ", ".join(f"{name} {secs:.2f}s" for name, secs in clock.phases.items()),
        )  # fmt: skip
        self._publish(report, lag)
        return report

    def idle(self, lag: Mapping[str, Mapping[int, int]]) -> None:
        """Nothing to read: the backlog is gone, the lag (per topic and partition) is published."""
        self.progress = replace(self.progress, backlog_after_last_batch=0)
        self.publish_lag(lag)

    def publish_lag(self, lag: Mapping[str, Mapping[int, int]]) -> None:
        publish_lag(self.spec, self.label, lag)

    def _publish(self, report: BatchReport, lag: Mapping[str, Mapping[int, int]]) -> None:
        publish_batch(self.spec, self.label, report, lag)

    def _watermarks_after(self, planned: PlannedBatch) -> dict[str, Mapping[int, tuple[int, int]]]:
        """Current watermarks of each topic; the planned ones if the broker does not answer (the lag is then
        a floor)."""
        try:
            return {part.topic: self.topics[part.topic].watermarks() for part in planned.parts}
        except Exception:
            log.warning("%s: reading watermarks after the commit failed; lag may be low", self.label)
            return {part.topic: part.watermarks for part in planned.parts}


def publish_lag(spec: StreamingTableSpec, label: str, lag: Mapping[str, Mapping[int, int]]) -> None:
    """`icefall_lag_records` per partition: labelled `<partition>`, or `<topic>/<partition>` in a table of
    several topics."""
    by_topic = spec.source.by_topic
    for topic, partitions in lag.items():
        for partition, records in partitions.items():
            where = f"{topic}/{partition}" if by_topic else str(partition)
            metrics.LAG.labels(label, where).set(records)


def publish_batch(
    spec: StreamingTableSpec, label: str, report: BatchReport, lag: Mapping[str, Mapping[int, int]]
) -> None:
    """The metrics of a landed batch of the table `label` (either format), with its lag per topic."""
    # A keyed table writes one row per key and batch, and none for a delete: not "filtered".
    filtered = 0 if spec.key else report.records_read - report.records_written - report.records_dead_lettered
    metrics.RECORDS_READ.labels(label).inc(report.records_read)
    metrics.RECORDS_WRITTEN.labels(label).inc(report.records_written)
    for kind, count in report.dead_letter_reasons.items():
        metrics.RECORDS_DEAD_LETTERED.labels(label, kind).inc(count)
    metrics.RECORDS_FILTERED.labels(label).inc(max(filtered, 0))
    metrics.BYTES_READ.labels(label).inc(report.bytes_read)
    metrics.BATCH_DURATION.labels(label).observe(report.seconds)
    metrics.COMMIT_DURATION.labels(label).observe(report.commit_seconds)
    metrics.FRESHNESS.labels(label).set(report.freshness_seconds)
    metrics.FRESHNESS_TARGET.labels(label).set(spec.freshness.target_seconds)
    metrics.LAST_COMMIT.labels(label).set(time.time())
    publish_lag(spec, label, lag)


def added_records(table: Table, snapshot_id: int) -> int:
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.summary is None:
        return 0
    # pyiceberg's Summary.get ignores its default: an empty snapshot has no "added-records" at all.
    return int(snapshot.summary.get("added-records") or 0)


def _newest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
