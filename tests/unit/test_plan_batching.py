"""Batch sizing follows the freshness target: small and paced when caught up, large when behind.

Proves: no backlog → no batch; unknown throughput → a bounded probe; a backlog drainable within half the
target is taken whole; when behind, batches grow (at most doubling per batch) up to a cap in freshness
targets and never beyond `max_records` or the backlog, and double the previous batch's records when a
throughput average dragged down by fixed cost would grow them slower; the next batch starts every F/2
when caught up and after only `min_interval` when behind (fake clock); throughput estimates are smoothed.
"""

from __future__ import annotations

import pytest

from icefall.api import BatchSpec
from icefall.plan.batching import (
    BatchLimits,
    BatchMode,
    BatchSize,
    caught_up_interval,
    choose_batch_size,
    is_caught_up,
    next_batch_delay,
    update_throughput,
)

pytestmark = pytest.mark.unit

LIMITS = BatchLimits(max_records=1_000_000, probe_records=10_000, behind_factor=4.0)


def size(
    backlog: int,
    rps: float | None,
    last: float | None = None,
    target: float = 10,
    limits: BatchLimits = LIMITS,
) -> BatchSize:
    return choose_batch_size(
        backlog_records=backlog,
        freshness_target_seconds=target,
        throughput_rps=rps,
        last_batch_seconds=last,
        limits=limits,
    )


def test_idle_when_nothing_behind() -> None:
    decision = size(0, 5000)
    assert decision.records == 0 and decision.mode is BatchMode.IDLE


def test_probe_when_throughput_unknown() -> None:
    assert size(1_000_000, None).records == 10_000
    assert size(50, None).records == 50
    assert size(1_000_000, 0.0).mode is BatchMode.PROBE


def test_caught_up_takes_the_whole_small_backlog() -> None:
    # 20k records at 10k/s drain in 2 s <= F/2 = 5 s.
    decision = size(20_000, 10_000)
    assert decision.mode is BatchMode.CAUGHT_UP
    assert decision.records == 20_000
    assert decision.expected_seconds == pytest.approx(2.0)


def test_behind_starts_at_half_the_target() -> None:
    # 1M records at 10k/s need 100 s: behind. No previous batch → budget F/2 = 5 s → 50k.
    decision = size(1_000_000, 10_000)
    assert decision.mode is BatchMode.BEHIND
    assert decision.records == 50_000


def test_behind_batches_grow_at_most_twofold_up_to_the_cap() -> None:
    assert size(10_000_000, 10_000, last=5).records == 100_000  # 2 x 5 s
    assert size(10_000_000, 10_000, last=12).records == 240_000  # 2 x 12 s
    assert size(10_000_000, 10_000, last=100).records == 400_000  # capped at 4 x F = 40 s
    assert size(10_000_000, 10_000, last=1).records == 50_000  # never below F/2


def test_behind_batches_are_bigger_than_caught_up_ones() -> None:
    caught_up = size(30_000, 10_000)
    behind = size(10_000_000, 10_000, last=20)
    assert caught_up.mode is BatchMode.CAUGHT_UP and behind.mode is BatchMode.BEHIND
    assert behind.records > 10 * caught_up.records


def test_limits_bound_every_mode() -> None:
    small = BatchLimits(max_records=1_000, probe_records=5_000)
    assert size(10_000_000, None, limits=small).records == 1_000
    assert size(900, 10_000, limits=small).records == 900
    assert size(10_000_000, 10_000, last=20, limits=small).records == 1_000
    assert size(10_000_000, 0.01, limits=small).records == 1_000  # a probe's worth, capped


def test_backlog_bounds_behind_batches() -> None:
    # 60k at 10k/s: behind (6 s > 5 s) but the budget (10 s) would exceed the backlog.
    decision = size(60_000, 10_000, last=5)
    assert decision.mode is BatchMode.BEHIND
    assert decision.records == 60_000


def test_is_caught_up_boundary() -> None:
    assert is_caught_up(50_000, 10_000, 10)  # exactly F/2
    assert not is_caught_up(50_001, 10_000, 10)
    assert is_caught_up(0, None, 10)
    assert not is_caught_up(1, None, 10)


def delay(
    now: float, last_start: float | None, backlog: int, rps: float | None = 10_000, interval: float = 1
) -> float:
    return next_batch_delay(
        now=now,
        last_batch_started_at=last_start,
        backlog_records=backlog,
        throughput_rps=rps,
        freshness_target_seconds=10,
        min_interval_seconds=interval,
    )


def test_first_batch_starts_immediately() -> None:
    assert delay(100.0, None, 0) == 0.0


def test_caught_up_batches_start_every_half_target() -> None:
    assert delay(now=101.5, last_start=100.0, backlog=1_000) == pytest.approx(3.5)
    assert delay(now=100.0, last_start=100.0, backlog=0) == pytest.approx(5.0)  # idle polls at the same pace
    assert delay(now=107.0, last_start=100.0, backlog=1_000) == 0.0  # the last batch overran


def test_behind_batches_start_after_min_interval_only() -> None:
    assert delay(now=100.25, last_start=100.0, backlog=10_000_000) == pytest.approx(0.75)
    assert delay(now=103.0, last_start=100.0, backlog=10_000_000) == 0.0
    assert delay(now=100.0, last_start=100.0, backlog=10, rps=None) == pytest.approx(1.0)  # unknown rate: go


def test_min_interval_above_half_target_wins() -> None:
    assert delay(now=100.0, last_start=100.0, backlog=10, interval=8) == pytest.approx(8.0)


def test_throughput_estimate_is_smoothed() -> None:
    assert update_throughput(None, 1000, 2.0) == 500
    assert update_throughput(500, 3000, 2.0) == 1000  # halfway between 500 and 1500
    assert update_throughput(500, 0, 2.0) == 500  # empty batches teach nothing
    assert update_throughput(None, 10, 0.0) is None


def test_a_batch_that_took_the_whole_backlog_never_lowers_the_throughput() -> None:
    # Caught up, a batch of 500 records takes 0.8 s, nearly all of it fixed cost: not the writer's rate.
    assert update_throughput(30_000, 500, 0.8, whole_backlog=True) == 30_000
    assert update_throughput(None, 500, 0.8, whole_backlog=True) == 625  # the first estimate is what it is
    assert update_throughput(1_000, 4_000, 1.0, whole_backlog=True) == 2_500  # a faster one still counts
    assert update_throughput(30_000, 500, 0.8) == pytest.approx(15_312.5)  # limited by its size: it does

    # After a drain taught 30,000 rec/s and ten quiet batches, a burst of 200,000 records at F = 10 s is
    # taken in batches of 5 s of work, not from the probe up by doubling.
    rps: float | None = 30_000
    for _ in range(10):
        rps = update_throughput(rps, 500, 0.8, whole_backlog=True)
    size = choose_batch_size(
        backlog_records=200_000,
        freshness_target_seconds=10,
        throughput_rps=rps,
        last_batch_seconds=0.8,
        limits=BatchLimits(),
        last_batch_records=500,
    )
    assert size.mode is BatchMode.BEHIND and size.records == 150_000


def test_limits_from_spec() -> None:
    limits = BatchLimits.from_spec(
        BatchSpec(max_records=5000, max_records_per_partition=100, min_interval_seconds=3)
    )
    assert (limits.max_records, limits.max_records_per_partition, limits.min_interval_seconds) == (
        5000,
        100,
        3.0,
    )


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        size(-1, 10)
    with pytest.raises(ValueError):
        size(1, 10, target=0)
    with pytest.raises(ValueError):
        BatchLimits(max_records=0)


def behind_size(backlog: int, rps: float, last_seconds: float, last_records: int) -> BatchSize:
    return choose_batch_size(
        backlog_records=backlog,
        freshness_target_seconds=10,
        throughput_rps=rps,
        last_batch_seconds=last_seconds,
        limits=LIMITS,
        last_batch_records=last_records,
    )


def test_behind_doubles_the_previous_batch_when_fixed_cost_hides_the_throughput() -> None:
    # Seen live: a 10,000-record first batch took 29.6 s (cold JVM), so T = 338 rec/s although the next
    # batches ran 13,500 records in ~5 s. T * budget alone grew batches by ~1.3x per batch.
    after_slow_start = behind_size(124_000, rps=338, last_seconds=5.2, last_records=13_535)
    assert after_slow_start.mode is BatchMode.BEHIND
    assert after_slow_start.records == 2 * 13_535
    # The throughput rule still wins when it asks for more.
    assert behind_size(1_000_000, rps=20_000, last_seconds=5, last_records=1_000).records == 200_000


def test_behind_doubling_is_bounded_by_backlog_limits_and_slow_batches() -> None:
    assert behind_size(20_000, rps=338, last_seconds=5, last_records=13_535).records == 20_000
    capped = choose_batch_size(
        backlog_records=500_000,
        freshness_target_seconds=10,
        throughput_rps=338,
        last_batch_seconds=5,
        limits=BatchLimits(max_records=25_000),
        last_batch_records=20_000,
    )
    assert capped.records == 25_000
    # A batch that already took more than half the cap (4 x 10 s / 2) is not doubled again.
    slow = behind_size(1_000_000, rps=1_000, last_seconds=21, last_records=30_000)
    assert slow.records == 40_000  # T * cap, not 60,000


def test_caught_up_and_probe_ignore_the_previous_batch_size() -> None:
    assert behind_size(3_000, rps=3_000, last_seconds=2, last_records=9_000).records == 3_000
    probe = choose_batch_size(
        backlog_records=50_000,
        freshness_target_seconds=10,
        throughput_rps=None,
        last_batch_seconds=None,
        limits=LIMITS,
        last_batch_records=40_000,
    )
    assert probe.mode is BatchMode.PROBE and probe.records == 10_000


def test_caught_up_batches_start_sooner_when_batches_take_longer() -> None:
    # F = 3: a 0.5 s batch leaves I = min(1.5, 3 - 1) = 1.5; a 0.9 s batch I = 1.2; a 1.5 s batch runs
    # back to back, held only by min_interval_seconds.
    assert caught_up_interval(3, 0.5, 0.2) == pytest.approx(1.5)
    assert caught_up_interval(3, 0.9, 0.2) == pytest.approx(1.2)
    assert caught_up_interval(3, 1.5, 0.2) == pytest.approx(0.2)
    assert caught_up_interval(3, None, 0.2) == pytest.approx(1.5)  # no batch measured yet
    assert caught_up_interval(10, 2.0, 1.0) == pytest.approx(5.0)  # cheap batches: every F/2
    assert next_batch_delay(
        now=100.9,
        last_batch_started_at=100.0,
        backlog_records=1_000,
        throughput_rps=10_000.0,
        freshness_target_seconds=3,
        min_interval_seconds=0.5,
        last_batch_seconds=0.9,
    ) == pytest.approx(0.3)


def test_a_burst_after_a_quiet_spell_starts_from_a_probe() -> None:
    # Batches of a few records taught T = 20 records/s; 200k records then arrive at once.
    burst = behind_size(200_000, 20.0, last_seconds=0.5, last_records=10)
    assert burst.mode is BatchMode.BEHIND and burst.records == 10_000
