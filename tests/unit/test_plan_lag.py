"""Lag and freshness (`plan.lag`), the one definition every reader of them calls.

Proves: lag per partition is the high watermark minus the table's next offset, never negative, counting a
partition the table has not committed from its low watermark and not counting records retention deleted;
partitions past the topic's end are named and count 0; the total sums the watermarks' partitions only;
freshness is 0 when nothing waits (however old the newest record), the age of the newest committed
record on a fake clock otherwise, never negative for a producer clock ahead of ours, and unmeasured when
nothing committed carries a produce time. Does not prove that callers pass current facts.
"""

from __future__ import annotations

import pytest

from icefall.plan.lag import freshness_seconds, partition_lag, partitions_ahead, records_behind, total_lag

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.0  # a fake clock: epoch seconds
NOW_MS = int(NOW * 1000)


@pytest.mark.parametrize(
    ("next_offset", "low", "high", "lag"),
    [
        (90, 0, 100, 10),  # behind
        (100, 0, 100, 0),  # caught up
        (None, 5, 25, 20),  # never committed: from the low watermark
        (3, 10, 25, 15),  # retention deleted 3..9: not waiting, not lag
        (500, 0, 20, 0),  # past the topic's end (recreated or truncated): never negative
        (None, 7, 7, 0),  # an empty partition
    ],
)
def test_lag_of_one_partition(next_offset: int | None, low: int, high: int, lag: int) -> None:
    assert records_behind(next_offset, low, high) == lag


def test_lag_per_partition_and_total() -> None:
    committed = {0: 90, 2: 10, 3: 500, 9: 4}  # 9: not in the watermarks, not counted
    marks = {0: (0, 100), 1: (5, 25), 2: (0, 10), 3: (0, 20)}
    assert partition_lag(committed, marks) == {0: 10, 1: 20, 2: 0, 3: 0}
    assert total_lag(committed, marks) == 30
    assert partitions_ahead(committed, marks) == [3]
    assert partitions_ahead({}, marks) == []


def test_caught_up_is_fresh_however_old_the_newest_record() -> None:
    assert freshness_seconds(0, NOW_MS - 3_600_000, NOW) == 0.0
    assert freshness_seconds(0, None, NOW) == 0.0


def test_behind_freshness_is_the_age_of_the_newest_committed_record() -> None:
    assert freshness_seconds(30, NOW_MS - 7_500, NOW) == pytest.approx(7.5)
    assert freshness_seconds(30, NOW_MS - 7_500, NOW + 2) == pytest.approx(9.5)  # the clock moves on


def test_behind_freshness_is_the_wait_of_the_oldest_waiting_record_when_read() -> None:
    """After a quiet hour the first new record waited 2 s, not an hour (the newest committed one is old)."""
    hour_old = NOW_MS - 3_600_000
    assert freshness_seconds(3, hour_old, NOW, oldest_waiting_ms=NOW_MS - 2_000) == pytest.approx(2.0)
    assert freshness_seconds(3, None, NOW, oldest_waiting_ms=NOW_MS - 2_000) == pytest.approx(2.0)
    assert freshness_seconds(0, hour_old, NOW, oldest_waiting_ms=NOW_MS - 2_000) == 0.0


def test_a_producer_clock_ahead_of_ours_is_not_negative_freshness() -> None:
    assert freshness_seconds(30, NOW_MS + 5_000, NOW) == 0.0


def test_records_waiting_and_no_produce_time_committed_is_unmeasured() -> None:
    assert freshness_seconds(5, None, NOW) is None
