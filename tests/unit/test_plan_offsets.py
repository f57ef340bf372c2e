"""Offset planning never skips or repeats a record it can still read, and reports what it cannot.

Proves: committed partitions resume exactly at the committed offset; retention past the committed offset
yields a `DataLoss` with the lost count and a range from the low watermark; a committed offset beyond the
high watermark is reported, not guessed; the starting position applies only to a table's first batch
(earliest / latest / resolved timestamp, clamped), while partitions added later start at earliest;
limits per partition and per batch are honoured with max-min fair sharing; empty ranges are omitted;
`next_offsets` pins every partition; the Spark options are exact.
"""

from __future__ import annotations

import json

import pytest

from icefall.api import StartingPositionType
from icefall.plan.offsets import (
    DataLoss,
    OffsetAhead,
    OffsetRange,
    Watermarks,
    plan_offsets,
    resolve_positions,
    spark_offset_options,
    split_budget,
)

pytestmark = pytest.mark.unit

EARLIEST = StartingPositionType.EARLIEST
LATEST = StartingPositionType.LATEST
TIMESTAMP = StartingPositionType.TIMESTAMP


def test_resumes_at_committed_offsets_and_omits_empty_ranges() -> None:
    plan = plan_offsets(
        {0: 10, 1: 50, 2: 7}, {0: Watermarks(0, 25), 1: Watermarks(0, 50), 2: (5, 9)}, EARLIEST
    )
    assert plan.ranges == (OffsetRange(0, 10, 25), OffsetRange(2, 7, 9))
    assert plan.next_offsets == {0: 25, 1: 50, 2: 9}
    assert plan.positions.lag == {0: 15, 1: 0, 2: 2}
    assert plan.total_records == 17
    assert plan.remaining_lag == 0
    assert plan.data_loss == () and plan.offsets_ahead == ()


def test_retention_past_committed_offset_is_data_loss() -> None:
    plan = plan_offsets({0: 100, 1: 300}, {0: (250, 400), 1: (200, 400)}, EARLIEST)
    assert plan.data_loss == (DataLoss(partition=0, committed=100, earliest_available=250, lost=150),)
    assert plan.ranges == (OffsetRange(0, 250, 400), OffsetRange(1, 300, 400))
    assert plan.positions.starts == {0: 250, 1: 300}


def test_committed_offset_equal_to_low_watermark_is_not_loss() -> None:
    plan = plan_offsets({0: 250}, {0: (250, 260)}, EARLIEST)
    assert plan.data_loss == ()
    assert plan.ranges == (OffsetRange(0, 250, 260),)


def test_committed_offset_beyond_high_watermark_is_reported_not_guessed() -> None:
    plan = plan_offsets({0: 500, 1: 5}, {0: (0, 20), 1: (0, 8)}, EARLIEST)
    assert plan.offsets_ahead == (OffsetAhead(partition=0, committed=500, high=20),)
    assert plan.ranges == (OffsetRange(1, 5, 8),)
    assert plan.next_offsets[0] == 500  # carried forward untouched


@pytest.mark.parametrize(
    ("starting", "timestamp_offsets", "expected_starts"),
    [
        (EARLIEST, None, {0: 10, 1: 0}),
        (LATEST, None, {0: 40, 1: 30}),
        (TIMESTAMP, {0: 25, 1: None}, {0: 25, 1: 30}),  # no record at/after the time in p1 → its high
        (TIMESTAMP, {0: 3, 1: 99}, {0: 10, 1: 30}),  # clamped into [low, high]
        (TIMESTAMP, {0: 25}, {0: 25, 1: 30}),  # missing partition → high
    ],
)
def test_first_batch_uses_starting_position(
    starting: StartingPositionType,
    timestamp_offsets: dict[int, int | None] | None,
    expected_starts: dict[int, int],
) -> None:
    watermarks = {0: Watermarks(10, 40), 1: Watermarks(0, 30)}
    plan = plan_offsets({}, watermarks, starting, timestamp_offsets=timestamp_offsets)
    assert plan.positions.starts == expected_starts
    assert plan.positions.new_partitions == (0, 1)
    assert plan.ranges == tuple(
        OffsetRange(p, s, watermarks[p].high) for p, s in expected_starts.items() if s < watermarks[p].high
    )
    # The commit pins every partition, including those with nothing to read yet.
    assert set(plan.next_offsets) == {0, 1}


def test_timestamp_start_needs_resolved_offsets() -> None:
    with pytest.raises(ValueError, match="pass timestamp_offsets"):
        plan_offsets({}, {0: (0, 5)}, TIMESTAMP)


def test_partitions_added_later_start_at_earliest_whatever_the_starting_position() -> None:
    for starting in (EARLIEST, LATEST, TIMESTAMP):
        plan = plan_offsets({0: 40}, {0: (0, 40), 1: (0, 12), 2: (3, 3)}, starting)
        assert plan.positions.new_partitions == (1, 2)
        assert plan.ranges == (OffsetRange(1, 0, 12),)
        assert plan.next_offsets == {0: 40, 1: 12, 2: 3}


def test_latest_start_does_not_drift_when_starts_are_passed_back() -> None:
    first = plan_offsets({}, {0: (0, 100)}, LATEST)
    assert first.is_empty and first.positions.starts == {0: 100}
    # Nothing was committed; records arrive; the caller passes back the pinned starts.
    second = plan_offsets(first.positions.starts, {0: (0, 130)}, LATEST)
    assert second.ranges == (OffsetRange(0, 100, 130),)


def test_committed_partition_missing_from_watermarks_is_carried_forward() -> None:
    plan = plan_offsets({0: 5, 7: 42}, {0: (0, 6)}, EARLIEST)
    assert plan.ranges == (OffsetRange(0, 5, 6),)
    assert plan.next_offsets == {0: 6, 7: 42}
    assert 7 not in plan.positions.lag


def test_per_partition_limit() -> None:
    plan = plan_offsets({0: 0, 1: 0}, {0: (0, 1000), 1: (0, 30)}, EARLIEST, max_records_per_partition=100)
    assert plan.ranges == (OffsetRange(0, 0, 100), OffsetRange(1, 0, 30))
    assert plan.remaining_lag == 900


def test_total_limit_is_shared_max_min_fair() -> None:
    plan = plan_offsets(
        {0: 0, 1: 0, 2: 0}, {0: (0, 1000), 1: (0, 10), 2: (0, 1000)}, EARLIEST, max_records=300
    )
    assert plan.ranges == (OffsetRange(0, 0, 145), OffsetRange(1, 0, 10), OffsetRange(2, 0, 145))
    assert plan.total_records == 300


def test_both_limits_together() -> None:
    plan = plan_offsets(
        {}, {p: (0, 1000) for p in range(4)}, EARLIEST, max_records=1000, max_records_per_partition=200
    )
    assert [r.records for r in plan.ranges] == [200, 200, 200, 200]


def test_zero_budget_plans_nothing_but_still_reports() -> None:
    plan = plan_offsets({0: 0}, {0: (5, 10)}, EARLIEST, max_records=0)
    assert plan.is_empty
    assert plan.data_loss == (DataLoss(0, 0, 5, 5),)
    assert plan.next_offsets == {0: 5}


@pytest.mark.parametrize(
    ("available", "budget", "expected"),
    [
        ({0: 10, 1: 10}, 7, {0: 4, 1: 3}),
        ({0: 10, 1: 10, 2: 10}, 10, {0: 4, 1: 3, 2: 3}),
        ({0: 1, 1: 100, 2: 100}, 51, {0: 1, 1: 25, 2: 25}),
        ({0: 5, 1: 5}, 100, {0: 5, 1: 5}),
        ({0: 0, 1: 9}, 4, {0: 0, 1: 4}),
        ({}, 10, {}),
    ],
)
def test_split_budget(available: dict[int, int], budget: int, expected: dict[int, int]) -> None:
    share = split_budget(available, budget)
    assert share == expected
    assert sum(share.values()) == min(budget, sum(available.values()))


def test_split_budget_never_exceeds_budget_or_availability() -> None:
    for budget in range(0, 60):
        available = {0: 3, 1: 17, 2: 0, 3: 25, 4: 8}
        share = split_budget(available, budget)
        assert sum(share.values()) == min(budget, sum(available.values()))
        assert all(0 <= share[p] <= available[p] for p in available)


def test_invalid_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid watermarks"):
        plan_offsets({}, {0: (10, 5)}, EARLIEST)
    with pytest.raises(ValueError, match="invalid committed offset"):
        plan_offsets({0: -1}, {0: (0, 5)}, EARLIEST)
    with pytest.raises(ValueError, match="must not be negative"):
        plan_offsets({}, {0: (0, 5)}, EARLIEST, max_records=-1)


def test_spark_offset_options() -> None:
    options = spark_offset_options("orders", (OffsetRange(0, 10, 25), OffsetRange(3, 7, 9)))
    assert json.loads(options["startingOffsets"]) == {"orders": {"0": 10, "3": 7}}
    assert json.loads(options["endingOffsets"]) == {"orders": {"0": 25, "3": 9}}


def test_resolve_positions_total_lag() -> None:
    positions = resolve_positions({0: 3}, {0: (0, 10), 1: (4, 9)}, EARLIEST)
    assert positions.total_lag == 7 + 5


def test_partition_added_later_with_its_first_records_deleted_is_data_loss() -> None:
    plan = plan_offsets({0: 10}, {0: (0, 10), 1: (7, 12)}, StartingPositionType.LATEST)
    assert plan.ranges == (OffsetRange(1, 7, 12),)
    assert plan.data_loss == (DataLoss(partition=1, committed=0, earliest_available=7, lost=7),)


def test_first_batch_starting_past_deleted_records_is_not_data_loss() -> None:
    plan = plan_offsets({}, {0: (7, 12)}, StartingPositionType.EARLIEST)
    assert plan.data_loss == ()
