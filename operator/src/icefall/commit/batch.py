"""What a batch commit is made of, and the state it leaves behind: pure values, no catalog access.

`Batch` is the offset range a writer read; `Stage` the staging branch it writes to (named by
`stage_branch_name`), with the committed state it was planned from; `CommitOutcome` what
`commit_staged_outcome` did; `WrittenFiles` the data files a writer holds for a batch (`commit_files`).
`state_after` is the state a batch's commit writes to the table (`icefall.*`, commit/DESIGN.md;
`retention_loss` the records it counts as lost), `check_source` whether a batch continues what the table
holds, and `next_stage` the stage of the writer's next batch while that commit runs (pipelining). The
commit itself is `icefall.commit.protocol`'s (and `icefall.commit.files`').
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from time import monotonic
from typing import TYPE_CHECKING

from icefall.commit.errors import OffsetGapError, TopicMismatchError
from icefall.commit.state import CommittedState, TopicState
from icefall.runtime.failpoints import TableRole

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile

STAGE_PREFIX = "icefall_stage_"


@dataclass(frozen=True)
class Batch:
    """One batch of one topic: `start` is the first offset read per partition, `end` the next one to read.

    Partitions with nothing to read may be listed with `start == end` (to pin where they start). For a
    partition the table knows, `start` must equal its committed offset, unless Kafka's retention deleted
    records past it: then `retention_gaps[p]` must name that committed offset, acknowledging that
    `[retention_gaps[p], start)` can never be ingested. An overlap (start below the committed offset) is
    always refused.
    """

    topic: str
    start: Mapping[int, int]
    end: Mapping[int, int]
    max_event_time_ms: int | None = None
    max_produce_time_ms: int | None = None
    retention_gaps: Mapping[int, int] = field(default_factory=dict)
    topic_id: str | None = None  # Kafka's id of the topic read; refused if the table holds another one
    deleted_keys: str | None = None  # the deleted keys file the commit names (cdc, sequenceBy); None: same

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("a batch needs its topic")
        if set(self.start) != set(self.end):
            raise ValueError(
                f"start and end cover different partitions: {sorted(self.start)} vs {sorted(self.end)}"
            )
        for p, s in self.start.items():
            if p < 0 or s < 0 or self.end[p] < s:
                raise ValueError(f"partition {p}: bad offset range [{s}, {self.end[p]})")
        for p, lost_from in self.retention_gaps.items():
            if p not in self.start or not 0 <= lost_from <= self.start[p]:
                raise ValueError(f"partition {p}: retention gap from {lost_from} does not end at the start")

    @property
    def parts(self) -> tuple[Batch, ...]:
        """The batch of each topic: this one (`TopicsBatch` has several)."""
        return (self,)

    @property
    def by_topic(self) -> bool:
        """Whether its commit keeps the offsets by topic (the topics form): no, the one-topic form."""
        return False


@dataclass(frozen=True)
class TopicsBatch:
    """One batch of several topics (the topics form, `spec.source.topics`): a `Batch` per topic it reads,
    pins or skips a retention gap of, committed together in one commit. The commit keeps the offsets by
    topic (`CommittedState.topics`), and checks each part against what the table holds of its topic."""

    parts: tuple[Batch, ...]
    deleted_keys: str | None = None  # the deleted keys file the commit names (cdc, sequenceBy); None: same

    def __post_init__(self) -> None:
        topics = [part.topic for part in self.parts]
        if len(set(topics)) != len(topics):
            raise ValueError(f"a batch holds each topic once: {sorted(topics)}")
        if any(part.deleted_keys is not None for part in self.parts):
            raise ValueError("the deleted keys file is the batch's, not a topic's")

    @property
    def by_topic(self) -> bool:
        return True

    @property
    def max_event_time_ms(self) -> int | None:
        return _newest_of(part.max_event_time_ms for part in self.parts)

    @property
    def max_produce_time_ms(self) -> int | None:
        return _newest_of(part.max_produce_time_ms for part in self.parts)


#: What one commit lands: a batch of one topic, or of several.
SourceBatch = Batch | TopicsBatch


@dataclass(frozen=True)
class Stage:
    """A staging branch and the committed state it was created from (`base.snapshot_id` is never None).

    `staged` is the snapshot the writer appended, once `staged_on` has recorded it: the commit then lands
    that snapshot even if the writer has stacked its next batch on the branch meanwhile (`next_stage`).
    None: the branch's head is the batch. `prepared_at` (this process's monotonic clock) is when the
    stage was made, before any file of the batch was written: `commit_staged` refuses a batch older than
    `protocol.MAX_STAGE_SECONDS`, whose files orphan removal may have taken.
    """

    branch: str
    base: CommittedState
    table_uuid: uuid.UUID = field(repr=False)
    role: TableRole = "main"  # which table it is, for the failpoints `<role>.after-stage` and on
    staged: int | None = None
    prepared_at: float = field(default_factory=monotonic, compare=False, repr=False)


@dataclass(frozen=True)
class WrittenFiles:
    """The data files a writer wrote for a batch itself and holds, referenced by no snapshot yet
    (`icefall.commit.files.commit_files` lands them), and the schema and partition spec they were written
    with. No files: the batch kept no row of this table."""

    files: tuple[DataFile, ...]
    schema_id: int
    spec_id: int


@dataclass(frozen=True)
class CommitOutcome:
    """What `commit_staged_outcome` did: `snapshot_id` is `main`'s new head.

    `restaged_over` lists the maintenance snapshots (oldest first) that had moved `main` since the stage was
    prepared and that the batch was re-staged on top of; empty when `main` was fast-forwarded to the staged
    snapshot itself.
    """

    snapshot_id: int
    restaged_over: tuple[int, ...] = ()

    @property
    def restaged(self) -> bool:
        return bool(self.restaged_over)


def stage_branch_name(writer_id: str, attempt: int | str) -> str:
    """A branch name unique to a writer and attempt, valid as an unquoted Spark SQL identifier part."""
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", f"{writer_id}_{attempt}").strip("_")
    if not slug:
        raise ValueError("writer id and attempt must not both be empty")
    return STAGE_PREFIX + slug


def state_after(
    committed: CommittedState, batch: SourceBatch, epoch: int, *, snapshot_id: int
) -> CommittedState:
    """The committed state once `batch` lands on top of `committed` as `snapshot_id`."""
    topics = dict(committed.by_topic()) if committed.topics is not None else {}
    for part in batch.parts:
        held = held_of(committed, part.topic)
        topics[part.topic] = TopicState(
            topic_id=part.topic_id or held.topic_id,
            offsets={**held.offsets, **part.end},
            # The first offset read of each partition new to the table: where the audit starts counting.
            start_offsets={
                **{p: start for p, start in part.start.items() if p not in held.offsets},
                **held.start_offsets,
            },
        )
    return replace(
        committed.with_topics(topics, by_topic=batch.by_topic),
        snapshot_id=snapshot_id,
        lost_records=committed.lost_records + batch_retention_loss(committed, batch),
        epoch=epoch,
        max_event_time_ms=_newest(committed.max_event_time_ms, batch.max_event_time_ms),
        max_produce_time_ms=_newest(committed.max_produce_time_ms, batch.max_produce_time_ms),
        deleted_keys=batch.deleted_keys or committed.deleted_keys,
    )


def held_of(committed: CommittedState, topic: str) -> TopicState:
    """What the table holds of `topic`. In the one-topic form: of its one topic, whatever its name (the
    commit refuses a batch of another topic before it gets here)."""
    if committed.topics is None:
        return TopicState(committed.topic_id, committed.offsets, committed.start_offsets)
    return committed.of_topic(topic)


def check_source(committed: CommittedState, batch: SourceBatch) -> None:
    """Refuse a batch of another topic or form, or one that does not start at the committed offsets."""
    if committed.has_offsets and batch.by_topic != (committed.topics is not None):
        held, read = ("one topic", "several topics") if batch.by_topic else ("several topics", "one topic")
        raise TopicMismatchError(
            f"the table holds the offsets of {held}, the batch is of {read} (spec.source.topic and "
            "spec.source.topics do not fill the same table)"
        )
    for part in batch.parts:
        _check_topic(committed, part)


def _check_topic(committed: CommittedState, batch: Batch) -> None:
    """Refuse a batch of one topic that is not the table's, or does not start at its committed offsets."""
    if committed.topics is None and committed.topic is not None and committed.topic != batch.topic:
        raise TopicMismatchError(
            f"the table holds topic {committed.topic!r}, the batch is from {batch.topic!r}"
        )
    held = held_of(committed, batch.topic)
    if None not in (held.topic_id, batch.topic_id) and held.topic_id != batch.topic_id:
        raise TopicMismatchError(
            f"the table holds offsets of topic {batch.topic!r} with id {held.topic_id}, the batch is from "
            f"topic id {batch.topic_id}: the topic was recreated"
        )
    for partition, start in sorted(batch.start.items()):
        done = held.offsets.get(partition)
        expected = batch.retention_gaps.get(partition, start)
        if done is None and held.offsets and expected not in (0, start):
            raise OffsetGapError(
                f"partition {partition} is new to the table: a retention gap before {start} starts at 0, "
                f"not {expected}"
            )
        if done is not None and done != expected:
            raise OffsetGapError(
                f"partition {partition}: the table is committed up to {done}, the batch starts at {start}"
                + (f" after a retention gap from {expected}" if expected != start else "")
            )


def next_stage(stage: Stage, batch: SourceBatch, epoch: int) -> Stage:
    """The stage for the batch after `batch`, on top of `stage.staged`, before `batch` has landed.

    Its base is the state `commit_staged` gives the table by fast-forwarding to the staged snapshot, so
    the next batch can be planned, read and appended to the branch while that commit runs (no catalog
    call here). It lands only on top of exactly that state: if `batch`'s commit fails, or re-stages it as
    another snapshot, the next batch's commit finds `main` elsewhere and is refused (StaleHeadError).
    """
    if stage.staged is None:
        raise ValueError("record the staged snapshot first (staged_on)")
    return Stage(
        branch=stage.branch,
        base=state_after(stage.base, batch, epoch, snapshot_id=stage.staged),
        table_uuid=stage.table_uuid,
        role=stage.role,
    )


def retention_loss(committed: Mapping[int, int], batch: Batch) -> int:
    """Records `batch` skips because Kafka's retention deleted them: the width of its acknowledged gaps.

    `commit_staged` has verified that each gap starts at the committed offset, or at 0 for a partition
    added to the topic after the table's first commit. The first commit of a table loses nothing: where
    it starts is the spec's starting position.
    """
    if not committed:
        return 0
    return sum(batch.start[p] - lost_from for p, lost_from in batch.retention_gaps.items())


def batch_retention_loss(committed: CommittedState, batch: SourceBatch) -> int:
    """`retention_loss` of each topic of `batch`, summed: a topic's first commit loses nothing."""
    return sum(retention_loss(held_of(committed, part.topic).offsets, part) for part in batch.parts)


def _newest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _newest_of(times: Iterable[int | None]) -> int | None:
    newest: int | None = None
    for time in times:
        newest = _newest(newest, time)
    return newest
