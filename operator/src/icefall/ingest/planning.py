"""What the next batch reads: offset ranges planned from the table's committed state and the watermarks.

Guarantees: a topic deleted and created again (another topic id) or truncated below the committed offsets
raises SourceChangedError instead of skipping or re-reading records; records lost to topic retention are
logged at ERROR once, counted in `icefall_data_loss_records_total`, and committed by the batch that skips
them, unless `spec.source.onDataLoss` is Halt: then DataLossHaltedError is raised before anything is read
or committed, naming the partitions, the lost offsets and the fix. A table's first batch pins where it
starts. Nothing here writes: the sizes come from
`plan.batching`, the ranges from `plan.offsets`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from icefall.api import ConditionReason, OnDataLoss, StreamingTableSpec
from icefall.api.source import StartingPositionType
from icefall.commit import Batch, CommittedState, SourceBatch, TopicsBatch, WrittenFiles
from icefall.commit.batch import held_of
from icefall.plan.batching import BatchLimits, choose_batch_size
from icefall.plan.lag import total_lag
from icefall.plan.offsets import (
    DataLoss,
    OffsetPlan,
    OffsetRange,
    plan_offsets,
    source_change,
    split_budget,
)
from icefall.runtime import metrics

if TYPE_CHECKING:
    from icefall.kafka.admin import TopicView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadStats:
    """What the read of a batch saw: records, bytes of their values, newest produce time, bad records."""

    records: int
    bytes: int
    max_produce_ms: int | None
    bad: int
    deleted_keys: str | None = None  # cdc with sequenceBy: the deleted keys file the commit names
    #: A registry format: the writer schemas of the batch's value schema ids (None: not one).
    writers: Mapping[int, str | None] | None = None
    #: It holds records of a writer schema it was not decoded with: to be written again (REWRITE).
    unseen_writers: bool = False
    #: Good records no route takes, dead letters with `spec.unrouted: DeadLetter` (`icefall.ingest.routes`).
    unrouted: int = 0
    #: Keyed routes, cdc with sequenceBy: the deleted keys file each route table's MERGE stored, by its
    #: staging target (`Routing.write`), for its commit to name.
    routes_deleted_keys: Mapping[str, str] = field(default_factory=dict)
    #: The data files the driver wrote for each route table whose rows it collected, by its staging target
    #: (`Routing.write`), landed by its commit (`icefall.commit.files`).
    routes_files: Mapping[str, WrittenFiles] = field(default_factory=dict)

    @property
    def dead(self) -> int:
        """The batch's dead letters: bad records, and unrouted ones sent there."""
        return self.bad + self.unrouted

    @classmethod
    def of(
        cls, records: Any, value_bytes: Any, newest: Any, bad: Any, deleted_keys: str | None = None
    ) -> ReadStats:
        """From Spark's aggregates: counts, a sum (None over no rows), a max timestamp (None or datetime)."""
        return cls(
            records=int(records or 0),
            bytes=int(value_bytes or 0),
            max_produce_ms=int(newest.timestamp() * 1000) if newest is not None else None,
            bad=int(bad or 0),
            deleted_keys=deleted_keys,
        )


NOTHING_READ = ReadStats(records=0, bytes=0, max_produce_ms=None, bad=0)


class SourceChangedError(RuntimeError):
    """The topic was recreated or its log truncated: the committed offsets no longer point into it.

    Nothing was skipped or committed. Ingestion stops until a user resets the offsets
    (`icefall reset-offsets`), which records the reset in the table. `recreated`: the topic's id changed
    (else committed offsets are past its end); a driver's last words name it (`TopicRecreated` or
    `OffsetsAheadOfTopic`), which the operator shows as the table's condition.
    """

    def __init__(self, message: str, *, recreated: bool) -> None:
        super().__init__(message)
        self.recreated = recreated

    @property
    def reason(self) -> ConditionReason:
        """The condition reason this stands for."""
        return ConditionReason.TOPIC_RECREATED if self.recreated else ConditionReason.OFFSETS_AHEAD_OF_TOPIC


class DataLossHaltedError(RuntimeError):
    """Retention deleted records before they were ingested and `spec.source.onDataLoss` is Halt: nothing
    was skipped or committed. Its message is one line: the partitions, the lost offsets, the fix."""

    @classmethod
    def of(cls, topic: str, losses: tuple[DataLoss, ...]) -> DataLossHaltedError:
        where = ", ".join(
            f"partition {loss.partition} offsets {loss.committed}..{loss.earliest_available - 1} "
            f"({loss.lost} records)"
            for loss in sorted(losses, key=lambda loss: loss.partition)
        )
        return cls(
            f"topic {topic!r}: {where} were deleted by Kafka's retention before they were ingested; "
            "ingestion halted without skipping them (spec.source.onDataLoss: Halt). Raise the topic's "
            "retention (retention.ms, retention.bytes) so it does not happen again; to go on without these "
            "records, set spec.source.onDataLoss: Continue (the skip is counted in icefall.lost-records)"
        )


@dataclass(frozen=True)
class Progress:
    """The writer's pacing figures: what the last batches took. A value: `ingest.report.Reporter` makes
    each new one (the only writer), the planner and the loop's pacing read them."""

    throughput_rps: float | None = None
    last_batch_seconds: float | None = None
    last_batch_records: int | None = None
    last_batch_started: float | None = None  # time.monotonic()
    backlog_after_last_batch: int = 0
    batches_measured: int = 0  # batches with records whose pace was learnt (the first one ran cold)


@dataclass(frozen=True)
class PlannedTopic:
    """What a planned batch does with one topic: what to read of it and the offset range to commit."""

    topic: str
    topic_id: str | None
    watermarks: Mapping[int, tuple[int, int]]
    ranges: tuple[OffsetRange, ...]  # what to read (may be empty: the topic only pins or skips)
    start: dict[int, int]  # the commit's offset range per partition (ranges, plus pinned and skipped ones)
    end: dict[int, int]
    gaps: dict[int, int]  # retention gaps the commit acknowledges

    def batch(self, stats: ReadStats) -> Batch:
        return Batch(
            topic=self.topic,
            start=self.start,
            end=self.end,
            max_produce_time_ms=stats.max_produce_ms,
            retention_gaps=self.gaps,
            topic_id=self.topic_id,
        )


@dataclass(frozen=True)
class PlannedBatch:
    """A batch planned from the table's committed state and the watermarks, before anything is read: a
    part per topic (one in the one-topic form)."""

    committed: CommittedState
    parts: tuple[PlannedTopic, ...]
    by_topic: bool  # the topics form (`spec.source.topics`): its commit keeps offsets by topic
    lost: int  # records lost to retention first reported by this batch
    backlog: int  # records waiting in Kafka when it was planned (this batch's among them)

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
        """What to read, of every topic (each range names its topic)."""
        return tuple(r for part in self.parts for r in part.ranges)

    @property
    def records(self) -> int:
        return sum(r.records for r in self.ranges)

    @property
    def whole_backlog(self) -> bool:
        """The batch takes everything Kafka held when it was planned."""
        return self.records >= self.backlog

    def batch(self, stats: ReadStats) -> SourceBatch:
        """The batch to commit: the one topic's, or a `TopicsBatch` of every topic it reads, pins or skips."""
        if not self.by_topic:
            (part,) = self.parts
            return replace(part.batch(stats), deleted_keys=stats.deleted_keys)
        parts = tuple(part.batch(stats) for part in self.parts if part.start)
        return TopicsBatch(parts, deleted_keys=stats.deleted_keys)


@dataclass(frozen=True)
class TopicProposal:
    """The offsets plan of one topic for a next batch."""

    topic: str
    topic_id: str
    watermarks: Mapping[int, tuple[int, int]]
    plan: OffsetPlan
    pin_start: bool  # the topic's first commit pins where it starts (`latest` would otherwise drift)

    @property
    def idle(self) -> bool:
        """Nothing to read, no retention gap to commit, no start to pin."""
        return self.plan.is_empty and not self.plan.data_loss and not self.pin_start


@dataclass(frozen=True)
class Proposal:
    """The offsets plan of a next batch, before it is known to be worth a commit (`idle`)."""

    committed: CommittedState
    backlog: int
    parts: tuple[TopicProposal, ...]

    @property
    def idle(self) -> bool:
        """Nothing to read, no retention gap to commit, no start to pin, in any topic: no batch."""
        return all(part.idle for part in self.parts)

    @property
    def lag(self) -> dict[str, Mapping[int, int]]:
        """The lag per topic and partition before the batch."""
        return {part.topic: part.plan.positions.lag for part in self.parts}


@dataclass
class Planner:
    """Plans one writer's batches from the table's committed state, Kafka's watermarks and the pacing.

    `topics`: a view of each topic read (`spec.source.topic_names`). A topic new to a table that already
    holds offsets of another starts at its earliest record, like a partition added later (nothing skipped);
    a table's first batch starts every topic at `spec.source.startingPosition`. The batch's size is shared
    among the topics by their backlogs (max-min fairness, `plan.offsets.split_budget`).
    """

    spec: StreamingTableSpec
    label: str
    topics: Mapping[str, TopicView]
    _losses_seen: set[tuple[str, int, int]] = field(default_factory=set, init=False, repr=False)

    def propose(self, committed: CommittedState, progress: Progress) -> Proposal:
        """Read the watermarks, choose the batch size (from the pacing figures `progress`) and plan the
        offset ranges after `committed`. Raises SourceChangedError if a topic is not the one the offsets
        were committed on, DataLossHaltedError for a loss with `onDataLoss: Halt`."""
        ids, marks = self._observe()
        lags = {t: total_lag(held_of(committed, t).offsets, marks[t]) for t in ids}
        backlog = sum(lags.values())
        size = choose_batch_size(
            backlog_records=backlog,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            throughput_rps=progress.throughput_rps,
            last_batch_seconds=progress.last_batch_seconds,
            limits=BatchLimits.from_spec(self.spec.batch),
            last_batch_records=progress.last_batch_records,
        )
        shares = split_budget(lags, size.records) if len(ids) > 1 else {t: size.records for t in lags}
        parts = tuple(
            self._propose_topic(committed, topic, ids[topic], marks[topic], shares[topic]) for topic in ids
        )
        return Proposal(committed, backlog, parts)

    def _observe(self) -> tuple[dict[str, str], dict[str, Mapping[int, tuple[int, int]]]]:
        """Each topic's id and watermarks; a pattern's topics listed again first when due (`TopicSet`), and
        one deleted since left out (not an error: it no longer matches)."""
        from icefall.kafka.admin import TopicNotFoundError
        from icefall.kafka.topic_set import TopicSet

        found = self.topics if isinstance(self.topics, TopicSet) and self.topics.pattern else None
        if found is not None:
            found.refresh()
        ids: dict[str, str] = {}
        marks: dict[str, Mapping[int, tuple[int, int]]] = {}
        for topic, view in list(self.topics.items()):
            try:
                ids[topic], marks[topic] = view.topic_id(), view.watermarks()
            except TopicNotFoundError:
                if found is None:
                    raise
                found.gone(topic)
                ids.pop(topic, None)
        return ids, marks

    def _propose_topic(
        self,
        committed: CommittedState,
        topic: str,
        topic_id: str,
        watermarks: Mapping[int, tuple[int, int]],
        max_records: int,
    ) -> TopicProposal:
        held = held_of(committed, topic)
        position = self.spec.source.starting_position
        starting = position.type if not committed.has_offsets else StartingPositionType.EARLIEST
        timestamp_offsets = None
        if position.timestamp_ms is not None and not committed.has_offsets:
            timestamp_offsets = dict(self.topics[topic].offsets_for_time(position.timestamp_ms))
        plan = plan_offsets(
            held.offsets,
            watermarks,
            starting,
            timestamp_offsets=timestamp_offsets,
            max_records=max_records,
            max_records_per_partition=self.spec.batch.max_records_per_partition,
        )
        problem = source_change(topic, held.topic_id, topic_id, plan.offsets_ahead)
        if problem is not None:
            recreated = held.topic_id not in (None, topic_id)
            raise SourceChangedError(f"{self.label}: {problem}", recreated=recreated)
        if plan.data_loss and self.spec.source.on_data_loss is OnDataLoss.HALT:
            raise DataLossHaltedError.of(topic, plan.data_loss)
        pin_start = not held.offsets and bool(plan.positions.starts)
        return TopicProposal(topic, topic_id, watermarks, plan, pin_start)

    def batch(self, proposal: Proposal) -> PlannedBatch:
        """The batch of a proposal that is not idle; reports the retention losses it is first to see."""
        parts = tuple(self._planned_topic(part) for part in proposal.parts)
        lost = sum(self._report_data_loss(part.topic, part.plan) for part in proposal.parts)
        return PlannedBatch(
            committed=proposal.committed,
            parts=parts,
            by_topic=self.spec.source.by_topic,
            lost=lost,
            backlog=proposal.backlog,
        )

    @staticmethod
    def _planned_topic(proposal: TopicProposal) -> PlannedTopic:
        plan = proposal.plan
        start = {r.partition: r.start for r in plan.ranges}
        end = {r.partition: r.end for r in plan.ranges}
        # A partition retention emptied past its committed offset is committed at its low watermark even
        # with nothing to read, so the loss lands in the table (icefall.lost-records) with this batch.
        for loss in plan.data_loss:
            start.setdefault(loss.partition, loss.earliest_available)
            end.setdefault(loss.partition, loss.earliest_available)
        if proposal.pin_start:
            for partition, offset in plan.positions.starts.items():
                start.setdefault(partition, offset)
                end.setdefault(partition, offset)
        return PlannedTopic(
            topic=proposal.topic,
            topic_id=proposal.topic_id,
            watermarks=proposal.watermarks,
            ranges=tuple(replace(r, topic=proposal.topic) for r in plan.ranges),
            start=start,
            end=end,
            gaps={d.partition: d.committed for d in plan.data_loss},
        )

    def check_topics_unchanged(self, planned: PlannedBatch) -> None:
        """The records are read: were they read from the topics the offsets were planned on?"""
        for part in planned.parts:
            if self.topics[part.topic].topic_id() != part.topic_id:
                raise SourceChangedError(
                    f"{self.label}: topic {part.topic!r} was recreated "
                    "while a batch was read; the batch is not committed",
                    recreated=True,
                )

    def _report_data_loss(self, topic: str, plan: OffsetPlan) -> int:
        lost = 0
        where = f"topic {topic} " if self.spec.source.by_topic else ""
        for loss in plan.data_loss:
            key = (topic, loss.partition, loss.committed)
            if key in self._losses_seen:
                continue
            self._losses_seen.add(key)
            lost += loss.lost
            metrics.DATA_LOSS.labels(self.label).inc(loss.lost)
            log.error(
                "%s: DATA LOSS: %spartition %d: records %d..%d were deleted by topic retention before they "
                "were ingested; continuing from %d",
                self.label, where, loss.partition, loss.committed, loss.earliest_available - 1,
                loss.earliest_available,
            )  # fmt: skip
        return lost
