"""Which Kafka offsets the next ingestion batch reads, per partition. Pure: no Kafka, no clock.

Inputs are what the caller observed: the next offsets committed in the table (`icefall.offsets`), the
partitions' watermarks from Kafka (low = earliest offset still held, high = next offset to be written),
and the spec's starting position. The output is one `OffsetRange` per partition with records to read
(start inclusive, end exclusive), the offsets to store with the batch's commit, and the anomalies seen.

Rules:
1. A committed partition resumes at its committed offset.
   - If retention already deleted records past it (committed < low), the range starts at `low` and a
     `DataLoss` reports the `low - committed` records that can never be ingested.
   - If the committed offset is beyond the high watermark (the topic was recreated, or an unclean leader
     election truncated the log), nothing is read from that partition and `OffsetAhead` reports it:
     guessing would either skip or duplicate records, so a person must decide.
2. A partition without a committed offset:
   - when the table has no committed offsets at all (its first batch), starts at the starting position:
     `earliest` → low, `latest` → high, `timestamp` → the offset the caller resolved with Kafka's
     offsets-for-times (clamped to [low, high]; a partition with no record at or after the time → high);
   - when the table already has committed offsets, the partition was added to the topic later, so it
     starts at `low`, whatever the starting position: every record in it is newer than the table's start,
     and starting at `latest` would silently skip records written before it was noticed (Spark's Kafka
     source behaves the same). If retention already deleted its first records (`low > 0`), a `DataLoss`
     from offset 0 reports them.
3. A committed partition absent from the watermarks is left alone and carried forward unchanged.
4. Limits: at most `max_records_per_partition` from each partition, and at most `max_records` in total,
   shared by max-min fairness (water-filling): partitions with little backlog get all of it, and the rest
   is split evenly among the others, ties broken by partition id. Empty ranges are omitted.

Counts are offset counts: with transactional producers (control records) or compacted topics a range
may hold fewer records than its width.

What to commit and what to pass next time:
- `OffsetPlan.next_offsets` is what the batch's commit stores: every known partition, including ones
  with nothing to read, so the first commit pins where a `latest` or `timestamp` start began.
- After a successful commit, pass the offsets read back from the table as `committed`. Until then, pass
  `OffsetPlan.positions.starts` of the previous plan: it holds where each partition stands without the
  batch's progress, so a `latest` start does not drift forward while nothing is committed. Never pass
  `next_offsets` of a batch whose commit has not succeeded: that would skip its records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from icefall.api.source import StartingPositionType
from icefall.plan.lag import records_behind

#: What a budget is shared among: partitions, or topics.
K = TypeVar("K", int, str)


class Watermarks(NamedTuple):
    """Kafka watermarks of one partition: `low` is the earliest offset held, `high` the next to be written."""

    low: int
    high: int


@dataclass(frozen=True)
class OffsetRange:
    """Offsets `[start, end)` of one partition to read in this batch (of `topic`; None: the one the caller
    reads)."""

    partition: int
    start: int
    end: int
    topic: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"invalid offset range {self.start}..{self.end} for partition {self.partition}")

    @property
    def records(self) -> int:
        """Offsets in the range: an upper bound on the records it holds."""
        return self.end - self.start


@dataclass(frozen=True)
class DataLoss:
    """Retention deleted `lost` records of `partition` after the committed offset, before they were read."""

    partition: int
    committed: int
    earliest_available: int
    lost: int


@dataclass(frozen=True)
class OffsetAhead:
    """The table has committed past the partition's high watermark; the partition is not read."""

    partition: int
    committed: int
    high: int


@dataclass(frozen=True)
class Positions:
    """Where each partition stands before the batch: its start offset and how far it is behind."""

    starts: Mapping[int, int]
    lag: Mapping[int, int]
    data_loss: tuple[DataLoss, ...] = ()
    offsets_ahead: tuple[OffsetAhead, ...] = ()
    new_partitions: tuple[int, ...] = ()

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())


@dataclass(frozen=True)
class OffsetPlan:
    """The next batch: ranges to read and offsets to commit with it."""

    ranges: tuple[OffsetRange, ...]
    positions: Positions
    next_offsets: Mapping[int, int] = field(default_factory=dict)

    @property
    def total_records(self) -> int:
        return sum(r.records for r in self.ranges)

    @property
    def is_empty(self) -> bool:
        return not self.ranges

    @property
    def data_loss(self) -> tuple[DataLoss, ...]:
        return self.positions.data_loss

    @property
    def offsets_ahead(self) -> tuple[OffsetAhead, ...]:
        return self.positions.offsets_ahead

    @property
    def remaining_lag(self) -> int:
        """Offsets still behind after this batch."""
        return self.positions.total_lag - self.total_records


def resolve_positions(
    committed: Mapping[int, int],
    watermarks: Mapping[int, tuple[int, int]],
    starting: StartingPositionType,
    *,
    timestamp_offsets: Mapping[int, int | None] | None = None,
) -> Positions:
    """Start offset and lag of every partition (rules 1-3 of the module docstring)."""
    _check_inputs(committed, watermarks)
    first_batch = not committed
    starts: dict[int, int] = {}
    lag: dict[int, int] = {}
    losses: list[DataLoss] = []
    ahead: list[OffsetAhead] = []
    new: list[int] = []
    for partition in sorted(watermarks):
        low, high = watermarks[partition]
        if partition in committed:
            position = committed[partition]
            if position < low:
                losses.append(DataLoss(partition, position, low, low - position))
                position = low
            elif position > high:
                ahead.append(OffsetAhead(partition, position, high))
                starts[partition] = position
                lag[partition] = 0
                continue
        else:
            new.append(partition)
            position = _initial(partition, low, high, starting, timestamp_offsets) if first_batch else low
            if not first_batch and low > 0:
                losses.append(DataLoss(partition, 0, low, low))
        starts[partition] = position
        lag[partition] = records_behind(position, low, high)
    for partition, position in committed.items():
        starts.setdefault(partition, position)
    return Positions(
        starts=starts,
        lag=lag,
        data_loss=tuple(losses),
        offsets_ahead=tuple(ahead),
        new_partitions=tuple(new),
    )


def plan_offsets(
    committed: Mapping[int, int],
    watermarks: Mapping[int, tuple[int, int]],
    starting: StartingPositionType,
    *,
    timestamp_offsets: Mapping[int, int | None] | None = None,
    max_records: int | None = None,
    max_records_per_partition: int | None = None,
) -> OffsetPlan:
    """Plan the next batch's offset ranges (see the module docstring for the rules)."""
    for name, limit in (
        ("max_records", max_records),
        ("max_records_per_partition", max_records_per_partition),
    ):
        if limit is not None and limit < 0:
            raise ValueError(f"{name} must not be negative, got {limit}")
    positions = resolve_positions(committed, watermarks, starting, timestamp_offsets=timestamp_offsets)
    available = {
        p: min(lag, max_records_per_partition) if max_records_per_partition is not None else lag
        for p, lag in positions.lag.items()
    }
    take = split_budget(available, max_records) if max_records is not None else available
    ranges = tuple(
        OffsetRange(p, positions.starts[p], positions.starts[p] + n) for p, n in sorted(take.items()) if n > 0
    )
    next_offsets = dict(positions.starts)
    for r in ranges:
        next_offsets[r.partition] = r.end
    return OffsetPlan(ranges=ranges, positions=positions, next_offsets=next_offsets)


def split_budget(available: Mapping[K, int], budget: int) -> dict[K, int]:
    """Share `budget` among partitions by max-min fairness, never giving one more than it has available.

    Partitions are served from the smallest availability up (ties by partition id); each gets the smaller
    of what it has and an even share of what is left, rounded up, so the whole budget is used whenever the
    partitions together have that much.
    """
    if budget < 0:
        raise ValueError(f"budget must not be negative, got {budget}")
    remaining = budget
    share: dict[K, int] = {}
    order = sorted(available, key=lambda p: (available[p], p))
    for index, partition in enumerate(order):
        left = len(order) - index
        fair = -(-remaining // left)  # ceiling division
        give = max(0, min(available[partition], fair))
        share[partition] = give
        remaining -= give
    return share


def spark_offset_options(topic: str, ranges: tuple[OffsetRange, ...]) -> dict[str, str]:
    """`startingOffsets` / `endingOffsets` options for Spark's Kafka batch source, as JSON strings (a range
    without its own topic is of `topic`)."""
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        starting.setdefault(r.topic or topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic or topic, {})[str(r.partition)] = r.end
    return {
        "startingOffsets": json.dumps(starting, separators=(",", ":")),
        "endingOffsets": json.dumps(ending, separators=(",", ":")),
    }


def _initial(
    partition: int,
    low: int,
    high: int,
    starting: StartingPositionType,
    timestamp_offsets: Mapping[int, int | None] | None,
) -> int:
    if starting is StartingPositionType.EARLIEST:
        return low
    if starting is StartingPositionType.LATEST:
        return high
    if timestamp_offsets is None:
        raise ValueError(
            "starting position is a timestamp: resolve it per partition (Kafka offsets_for_times) "
            "and pass timestamp_offsets"
        )
    resolved = timestamp_offsets.get(partition)
    if resolved is None:  # no record at or after the timestamp yet
        return high
    return min(max(resolved, low), high)


def _check_inputs(committed: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]]) -> None:
    for partition, offset in committed.items():
        if partition < 0 or offset < 0:
            raise ValueError(f"invalid committed offset {offset} for partition {partition}")
    for partition, (low, high) in watermarks.items():
        if partition < 0 or not 0 <= low <= high:
            raise ValueError(f"invalid watermarks low={low} high={high} for partition {partition}")


RESET_COMMAND = "icefall reset-offsets"


def source_change(
    topic: str,
    committed_topic_id: str | None,
    topic_id: str,
    offsets_ahead: tuple[OffsetAhead, ...] = (),
) -> str | None:
    """Why the topic can no longer be read from the table's committed offsets, or None if it can.

    A topic whose id changed was deleted and created again: its offsets start over, so resuming at the
    committed ones would skip its first records (or wait for ever). Committed offsets past the end of the
    log mean the same, or a log truncated by an unclean leader election. Either way, guessing would skip
    or duplicate records: ingestion stops until a user resets the offsets, which the table records.
    """
    if committed_topic_id is not None and committed_topic_id != topic_id:
        return (
            f"topic {topic!r} was deleted and created again (its id was {committed_topic_id}, now "
            f"{topic_id}): the table's committed offsets belong to the old topic; nothing was skipped. "
            f"To go on with the new topic, run `{RESET_COMMAND}` (it records the reset in the table)"
        )
    if offsets_ahead:
        detail = ", ".join(
            f"partition {a.partition} committed {a.committed}, end {a.high}" for a in offsets_ahead
        )
        return (
            f"the table has committed offsets past the end of topic {topic!r} ({detail}): the topic was "
            f"recreated or its log truncated; nothing was skipped. To go on from the topic's current "
            f"records, run `{RESET_COMMAND}` (it records the reset in the table)"
        )
    return None
