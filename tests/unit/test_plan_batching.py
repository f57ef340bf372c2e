"""Batch sizing follows the freshness target: small and paced when caught up, large when behind.

Proves: no backlog → no batch; unknown throughput → a bounded probe; a backlog drainable within half the
target is taken whole; when behind, the backlog is taken in the fewest even batches that each fit a cap in
freshness targets at the measured pace (straight after a probe, no ramp), never beyond `max_records` or
the backlog, and double the previous batch's records when a throughput average dragged down by fixed
cost would grow them slower; a restarted writer on a fake clock catches up in fewer batches than the old
ramp; the rate after a cold first batch replaces it; the next batch starts every F/2
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


def test_behind_drains_the_backlog_in_the_fewest_batches_within_the_cap() -> None:
    # 1M records at 10k/s need 100 s: behind. Batches of at most 4 x F = 40 s: three, of an even share.
    decision = size(1_000_000, 10_000)
    assert decision.mode is BatchMode.BEHIND
    assert decision.records == 333_334
    assert decision.expected_seconds == pytest.approx(33.3334)
    # The first batch after a probe is as large: no ramp through the previous batch's duration.
    assert size(1_000_000, 10_000, last=1).records == 333_334
    assert size(10_000_000, 10_000, last=100).records == 400_000  # 25 batches of the cap, 40 s each
    assert size(390_000, 10_000, last=5).records == 390_000  # 39 s: one batch


def test_behind_batches_never_take_much_longer_than_the_cap_at_the_measured_pace() -> None:
    for backlog in (60_001, 123_457, 999_999, 5_000_000):
        for rps in (1_000.0, 4_500.0, 25_000.0):
            decision = size(backlog, rps, target=3)
            if decision.mode is BatchMode.BEHIND and decision.records > LIMITS.probe_records:
                assert decision.expected_seconds is not None and decision.expected_seconds <= 12.0 + 1e-3


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


def test_the_rate_after_a_cold_first_batch_replaces_it() -> None:
    # The probe of a fresh JVM: 10k in 3.5 s; the next batch runs 32k in 4.2 s.
    assert update_throughput(2_857, 32_000, 4.0, previous_cold=True) == 8_000
    # A caught-up batch limited by its size still never lowers it.
    assert update_throughput(2_857, 50, 0.5, whole_backlog=True, previous_cold=True) == 2_857
    assert update_throughput(2_857, 500, 0.1, whole_backlog=True, previous_cold=True) == 5_000


def test_a_batch_that_took_the_whole_backlog_never_lowers_the_throughput() -> None:
    # Caught up, a batch of 500 records takes 0.8 s, nearly all of it fixed cost: not the writer's rate.
    assert update_throughput(30_000, 500, 0.8, whole_backlog=True) == 30_000
    assert update_throughput(None, 500, 0.8, whole_backlog=True) == 625  # the first estimate is what it is
    assert update_throughput(1_000, 4_000, 1.0, whole_backlog=True) == 2_500  # a faster one still counts
    assert update_throughput(30_000, 500, 0.8) == pytest.approx(15_312.5)  # limited by its size: it does

    # After a drain taught 30,000 rec/s and ten quiet batches, a burst of 200,000 records at F = 10 s is
    # taken whole (about 7 s of work), not from the probe up by doubling.
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
    assert size.mode is BatchMode.BEHIND and size.records == 200_000


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
    # The throughput rule still wins when it asks for more: 50 s of work, two batches of 25 s.
    assert behind_size(1_000_000, rps=20_000, last_seconds=5, last_records=1_000).records == 500_000


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


def catch_up(
    backlog: int, *, fixed: float, cold: float, rate: float, arrivals: float, target: float
) -> list[int]:
    """A restarted writer on a fake clock: each batch of n records takes `fixed + n / rate` seconds (the
    first one `cold` more); `arrivals` records per second reach Kafka meanwhile. The batch sizes until
    the backlog drains within half the target."""
    rps: float | None = None
    last_seconds: float | None = None
    last_records: int | None = None
    sizes: list[int] = []
    while not is_caught_up(backlog, rps, target) and len(sizes) < 50:
        decision = choose_batch_size(
            backlog_records=backlog,
            freshness_target_seconds=target,
            throughput_rps=rps,
            last_batch_seconds=last_seconds,
            limits=LIMITS,
            last_batch_records=last_records,
        )
        seconds = fixed + decision.records / rate + (cold if not sizes else 0.0)
        rps = update_throughput(
            rps, decision.records, seconds, whole_backlog=decision.records >= backlog,
            previous_cold=len(sizes) == 1,
        )  # fmt: skip
        sizes.append(decision.records)
        backlog = backlog - decision.records + int(arrivals * seconds)
        last_seconds, last_records = seconds, decision.records
    return sizes


def test_a_restarted_writer_catches_up_from_its_probe_without_a_ramp() -> None:
    # Issue #34's numbers: 170k waiting at F = 3 s, a writer measured near 4,500 rec/s on small batches
    # (fixed cost 1 s, 10k records/s of work) with 1.5 s more for a cold JVM, 1,000 records/s arriving.
    sizes = catch_up(170_000, fixed=1.0, cold=1.5, rate=10_000, arrivals=1_000, target=3)
    assert sizes[0] == 10_000  # the probe
    assert sizes[1] > 20_000  # not the doubling of the old ramp (10k, 20k, 40k, 80k, ...)
    assert len(sizes) <= 4, sizes
    # (The old ramp: 10k, 20k, 40k, 80k, 40.5k.) Ten times the backlog: from the third batch on, batches
    # of about the cap's worth (12 s at the measured pace, ~100k), never more than max_records.
    big = catch_up(1_700_000, fixed=1.0, cold=1.5, rate=10_000, arrivals=1_000, target=3)
    assert big[2] >= 90_000 and max(big) <= 12 * 10_000
    assert len(big) <= 21, big
