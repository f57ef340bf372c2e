"""How big the next ingestion batch is, and when it starts. Pure: the clock is an argument.

The freshness target `F` (seconds) bounds how long a record may wait between reaching Kafka and being
queryable. A record waits at most for the next batch to start and then for that batch to finish, so when
the table keeps up, batches start every `F/2` seconds and each takes under `F/2`.

Batch size (`choose_batch_size`), given the backlog `B` (offsets behind), the observed throughput `T`
(records per second of batch wall time, commit included) and the previous batch's duration `d`:
1. `B = 0` → nothing to do (`IDLE`).
2. `T` unknown (first batch, or no records measured yet) → a probe of `min(B, probe_records)` to measure
   throughput without risking a huge first batch (`PROBE`).
3. `B / T <= F/2` → caught up: take the whole backlog; the batch is small and finishes within `F/2`
   (`CAUGHT_UP`).
4. otherwise → behind: freshness is already missed, so take the backlog in as few batches as the pace
   allows, each within a time budget `C = behind_factor * F` (`BEHIND`). At `T` the backlog needs
   `k = ceil(B / (T * C))` such batches, and the batch takes an even share `ceil(B / k)`, so the last one
   is not a small remainder paying a whole fixed cost. A probe is enough to size the next batch: a
   restarted writer goes from its probe straight to batches that drain the backlog, not through a ramp
   of doublings. Two floors: a probe's worth (after a quiet spell `T` learnt from batches of a few
   records is tiny, and a burst would otherwise start from a few records), and twice the previous
   batch's records `n` when that batch took at most `C/2` (`T` counts a batch's fixed cost, so it
   underestimates what a larger batch does per second). Never more than `B`.
Every size is finally capped by `max_records` and is at least 1 when there is a backlog. That cap (with
`max_records_per_partition`) is the memory bound: a pace estimate wrong by a factor `x` makes one batch
take about `x * C` seconds, never more records than the cap.

Throughput (`update_throughput`): an exponentially weighted average of records per second of batch wall
time. A writer's first batch pays a cold start (the JVM's warm-up, the first Spark job's planning), so the
rate of the next batch replaces its estimate instead of averaging with it; a batch that took the whole
backlog (its rate mostly fixed cost) may raise the estimate but never lower it.

Start time (`next_batch_delay`): when behind, the next batch starts as soon as `min_interval_seconds`
have passed since the previous start. Otherwise (caught up or idle) batches start every `I` seconds
(`caught_up_interval`): a record waits for the next start (up to `I`, `I/2` on average) and then for that
batch to run (`d`, the previous batch's duration), so `I = min(F/2, F - 2d)` keeps the average wait
within `F/2` and the longest within `F - d`, and never less than `min_interval_seconds`. A table whose
batches are cheap commits every `F/2` instead of spinning on tiny batches; one whose batches cost more
starts them sooner, as often as back to back when `d >= F/3`. An idle table polls the watermarks at the
same pace.

Not guaranteed: that freshness is met. If one batch's fixed cost (job start, commit) exceeds about `F/3`,
or the topic grows faster than `T`, the table falls behind; `FreshnessMet` reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from icefall.api.spec import BatchSpec

DEFAULT_PROBE_RECORDS = 10_000
DEFAULT_BEHIND_FACTOR = 4.0


class BatchMode(StrEnum):
    IDLE = "Idle"
    PROBE = "Probe"
    CAUGHT_UP = "CaughtUp"
    BEHIND = "Behind"


@dataclass(frozen=True)
class BatchLimits:
    """Bounds on batch size and pacing; `from_spec` takes them from `spec.batch`."""

    max_records: int = 1_000_000
    max_records_per_partition: int | None = None
    min_interval_seconds: float = 1.0
    probe_records: int = DEFAULT_PROBE_RECORDS
    behind_factor: float = DEFAULT_BEHIND_FACTOR

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.probe_records < 1:
            raise ValueError("max_records and probe_records must be at least 1")
        if self.min_interval_seconds < 0 or self.behind_factor < 0.5:
            raise ValueError("min_interval_seconds must be >= 0 and behind_factor >= 0.5")

    @classmethod
    def from_spec(cls, batch: BatchSpec) -> BatchLimits:
        return cls(
            max_records=batch.max_records,
            max_records_per_partition=batch.max_records_per_partition,
            min_interval_seconds=float(batch.min_interval_seconds),
        )


@dataclass(frozen=True)
class BatchSize:
    """The chosen batch: how many records (offsets), why, and how long it is expected to take."""

    records: int
    mode: BatchMode
    expected_seconds: float | None
    reason: str


def is_caught_up(backlog_records: int, throughput_rps: float | None, freshness_target_seconds: float) -> bool:
    """True when the backlog can be drained within half the freshness target (rule 3)."""
    if backlog_records <= 0:
        return True
    if throughput_rps is None or throughput_rps <= 0:
        return False
    return backlog_records / throughput_rps <= freshness_target_seconds / 2


def choose_batch_size(
    *,
    backlog_records: int,
    freshness_target_seconds: float,
    throughput_rps: float | None,
    last_batch_seconds: float | None,
    limits: BatchLimits,
    last_batch_records: int | None = None,
) -> BatchSize:
    """Records to take in the next batch (rules in the module docstring)."""
    _check(backlog_records, freshness_target_seconds)
    half = freshness_target_seconds / 2
    if backlog_records == 0:
        return BatchSize(0, BatchMode.IDLE, None, "no records behind")
    if throughput_rps is None or throughput_rps <= 0:
        records = min(backlog_records, limits.probe_records, limits.max_records)
        return BatchSize(records, BatchMode.PROBE, None, "throughput unknown; probing")
    drain_seconds = backlog_records / throughput_rps
    if drain_seconds <= half:
        records = min(backlog_records, limits.max_records)
        return BatchSize(
            records,
            BatchMode.CAUGHT_UP,
            records / throughput_rps,
            f"backlog drains in {drain_seconds:.1f}s <= {half:.1f}s; taking all of it",
        )
    cap = limits.behind_factor * freshness_target_seconds
    batches = math.ceil(drain_seconds / cap)
    wanted = math.ceil(backlog_records / batches)
    if (
        last_batch_records is not None
        and last_batch_seconds is not None
        and 0 < last_batch_seconds <= cap / 2
    ):
        wanted = max(wanted, 2 * last_batch_records)
    wanted = max(wanted, limits.probe_records)
    records = max(1, min(backlog_records, wanted, limits.max_records))
    return BatchSize(
        records,
        BatchMode.BEHIND,
        records / throughput_rps,
        f"backlog needs {drain_seconds:.1f}s > {half:.1f}s; {batches} batch(es) of at most {cap:.1f}s",
    )


def caught_up_interval(
    freshness_target_seconds: float, last_batch_seconds: float | None, min_interval_seconds: float
) -> float:
    """Seconds between batch starts once caught up: `max(min(F/2, F - 2d), min_interval_seconds)`."""
    interval = freshness_target_seconds / 2
    if last_batch_seconds is not None:
        interval = min(interval, freshness_target_seconds - 2 * last_batch_seconds)
    return max(interval, min_interval_seconds)


def next_batch_delay(
    *,
    now: float,
    last_batch_started_at: float | None,
    backlog_records: int,
    throughput_rps: float | None,
    freshness_target_seconds: float,
    min_interval_seconds: float,
    last_batch_seconds: float | None = None,
) -> float:
    """Seconds to wait before starting the next batch (`now` and `last_batch_started_at` on one clock)."""
    _check(backlog_records, freshness_target_seconds)
    if last_batch_started_at is None:
        return 0.0
    behind = backlog_records > 0 and not is_caught_up(
        backlog_records, throughput_rps, freshness_target_seconds
    )
    cadence = (
        min_interval_seconds
        if behind
        else caught_up_interval(freshness_target_seconds, last_batch_seconds, min_interval_seconds)
    )
    return max(0.0, last_batch_started_at + cadence - now)


def update_throughput(
    previous_rps: float | None,
    records: int,
    seconds: float,
    *,
    weight: float = 0.5,
    whole_backlog: bool = False,
    previous_cold: bool = False,
) -> float | None:
    """Exponentially weighted throughput after a batch of `records` that took `seconds` (wall time).

    Batches with no records or no measurable time leave the estimate unchanged. A batch that took the
    `whole_backlog` was limited by what Kafka held, not by what the writer can do: its rate is mostly its
    fixed cost, so it may raise the estimate but never lower it. Otherwise a few seconds of small caught-up
    batches would teach a rate far below the writer's, and the next burst would be taken in many small
    batches (each paying the fixed cost again) instead of a few large ones. `previous_cold`: the estimate
    so far is the writer's first batch alone, which paid the cold start; this batch's rate replaces it
    (averaged with it, a restarted writer would size its catch-up batches from half its real pace).
    """
    if not 0 < weight <= 1:
        raise ValueError(f"weight must be in (0, 1], got {weight}")
    if records <= 0 or seconds <= 0:
        return previous_rps
    observed = records / seconds
    if previous_rps is None:
        return observed
    if whole_backlog and observed < previous_rps:
        return previous_rps
    if previous_cold:
        return observed
    return weight * observed + (1 - weight) * previous_rps


def _check(backlog_records: int, freshness_target_seconds: float) -> None:
    if backlog_records < 0:
        raise ValueError(f"backlog must not be negative, got {backlog_records}")
    if freshness_target_seconds <= 0:
        raise ValueError(f"freshness target must be positive, got {freshness_target_seconds}")
