"""Lag and freshness: how far a table is behind its topic. Pure: the clock is an argument.

The one definition of both; ingestion (batch sizing, `BatchReport` and so the driver's report that the
operator's status and metrics show, `icefall_lag_records`), `icefall status` and the offset planner
(`plan.offsets`) all call these functions.

Rules:
- Lag of a partition = records Kafka still holds that the table has not committed:
  `high - max(next, low)`, where `next` is the table's next offset for the partition (the low watermark
  when the table has none). Never negative: a committed offset past the high watermark (a recreated or
  truncated topic, reported as an issue by its callers) counts 0. Records retention deleted before they
  were read count 0 too: they cannot be read any more, so nothing waits for them (they are data loss,
  counted in `icefall.lost-records` by the commit that skips them).
- Lag of the table = the sum over the partitions of the watermarks; a committed partition the watermarks
  do not list is not counted.
- Freshness = 0 when the lag is 0 (an idle topic is not stale); otherwise how long the oldest record not yet
  in the table has waited: the seconds between now and its produce time, at least 0 (a producer clock ahead of
  ours). A caller that did not read that record's time passes the produce time of the newest committed record
  instead: an upper bound, too high by however long the topic was idle before the waiting records came (after
  a quiet minute, the first new record would read as a minute stale). `icefall status` reads the oldest
  waiting record (`TopicView.oldest_waiting_ms`); ingestion, right after its own commit, passes the bound:
  there the waiting records follow the ones it just committed, so the bound is close. None (unmeasured) when
  records wait and neither time is known.

Not guaranteed: that the inputs are current (they are as old as the reads), or that freshness is exact
for records produced with timestamps from a skewed producer clock.
"""

from __future__ import annotations

from collections.abc import Mapping


def records_behind(next_offset: int | None, low: int, high: int) -> int:
    """Lag of one partition with watermarks `low`/`high` whose next offset to commit is `next_offset`
    (None: the table has none for it)."""
    position = low if next_offset is None else max(next_offset, low)
    return max(high - position, 0)


def partition_lag(committed: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Lag per partition of `watermarks` (`{partition: (low, high)}`), the table at `committed` offsets."""
    return {
        partition: records_behind(committed.get(partition), low, high)
        for partition, (low, high) in sorted(watermarks.items())
    }


def total_lag(committed: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]]) -> int:
    """Lag of the table: the sum of `partition_lag`."""
    return sum(partition_lag(committed, watermarks).values())


def partitions_ahead(committed: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]]) -> list[int]:
    """Partitions whose committed offset is past the high watermark (their lag counts 0)."""
    return [p for p, (_, high) in sorted(watermarks.items()) if committed.get(p, 0) > high]


def freshness_seconds(
    lag_records: int, newest_produce_ms: int | None, now: float, *, oldest_waiting_ms: int | None = None
) -> float | None:
    """Seconds the table is behind at `now` (epoch seconds), given its lag, the produce time (epoch
    milliseconds) of the oldest record waiting if read, else that of its newest committed record; None
    when unmeasured (module docstring)."""
    if lag_records <= 0:
        return 0.0
    since = oldest_waiting_ms if oldest_waiting_ms is not None else newest_produce_ms
    if since is None:
        return None
    return max(now - since / 1000, 0.0)
