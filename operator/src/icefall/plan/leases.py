"""Lease rules, as pure functions shared by every lease backend (local file, Kubernetes Lease).

A lease record says who holds the lease, since when, until when, and its epoch. The epoch counts changes of
holder (Kubernetes' `spec.leaseTransitions`): creating the lease gives epoch 1, every acquisition by a
different holder (or after a release) adds one, renewing keeps it. The epoch goes into every commit, and the
table refuses a commit whose epoch is below the one it already holds.

Guarantees: `decide` never hands a lease that is held and unexpired to someone else, and never lowers the
epoch. Not guaranteed: that the holder notices it lost the lease in time. A lease is judged expired by the
observer's clock, so a paused or clock-skewed holder may still believe it holds the lease after a take-over;
that is why the epoch, not the lease, keeps the table safe.

Times are seconds since the Unix epoch, as floats.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None  # None once released
    epoch: int
    acquire_time: float
    renew_time: float
    duration_seconds: float

    @property
    def expires_at(self) -> float:
        return self.renew_time + self.duration_seconds

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


class LeaseAction(StrEnum):
    ACQUIRE = "acquire"  # write `record`: a new holder (me), a new epoch
    RENEW = "renew"  # write `record`: I hold it already, same epoch, later renew time
    WAIT = "wait"  # someone else holds it; look again in `wait_seconds`


@dataclass(frozen=True)
class LeaseDecision:
    action: LeaseAction
    record: LeaseRecord  # the record to write, or (WAIT) the current one
    wait_seconds: float = 0.0


def decide(
    current: LeaseRecord | None,
    *,
    me: str,
    my_epoch: int | None,
    now: float,
    duration_seconds: float,
    holder_is_gone: bool = False,
    floor: int = 0,
) -> LeaseDecision:
    """What `me` should do about a lease currently described by `current` (None: no lease yet).

    `my_epoch` is the epoch `me` believes it holds (None when it holds nothing). The lease is ours only if
    both holder and epoch match: an earlier incarnation with the same identity (a restarted process) is
    treated like any other holder, so it is waited out and the new incarnation gets a new epoch.
    `holder_is_gone`: the caller KNOWS the current holder can never write again (a local process that
    has exited), so its unexpired lease is taken at once instead of waited out; the epoch still grows.
    `floor`: an epoch already in use elsewhere (the table's `icefall.epoch`): a new holder's epoch is
    max(lease epoch, floor) + 1, so a deleted or reset lease never hands out an epoch the table refuses.
    """
    if not me:
        raise ValueError("a lease holder needs a non-empty identity")
    if duration_seconds <= 0:
        raise ValueError(f"lease duration must be positive, got {duration_seconds}")
    if floor < 0:
        raise ValueError(f"epoch floor must not be negative, got {floor}")
    if current is None:
        return LeaseDecision(LeaseAction.ACQUIRE, LeaseRecord(me, floor + 1, now, now, duration_seconds))
    if current.holder == me and current.epoch == my_epoch:
        # Still ours, even if it ran out: nobody took it over, so nobody holds a newer epoch.
        return LeaseDecision(
            LeaseAction.RENEW, replace(current, renew_time=now, duration_seconds=duration_seconds)
        )
    if current.holder is None or current.expired(now) or (holder_is_gone and current.holder != me):
        return LeaseDecision(
            LeaseAction.ACQUIRE, LeaseRecord(me, max(current.epoch, floor) + 1, now, now, duration_seconds)
        )
    # A renew time ahead of our clock (skew) never makes us wait longer than one lease duration.
    wait = min(current.expires_at - now, current.duration_seconds)
    return LeaseDecision(LeaseAction.WAIT, current, wait_seconds=wait)


def release(current: LeaseRecord | None, *, me: str, epoch: int) -> LeaseRecord | None:
    """The record to write when `me` lets go of the lease it holds at `epoch`; None if it is not ours."""
    if current is None or current.holder != me or current.epoch != epoch:
        return None
    return replace(current, holder=None)


# A compaction worker whose rewrite keeps losing to a keyed table's batches (each batch adds deletes to the
# files it rewrites, and Iceberg refuses the rewrite) takes the table's yield Lease for its next attempt;
# ingestion waits before starting a batch while that Lease is held, at most YIELD_MAX_WAIT_SECONDS a batch.
YIELD_AFTER_CONFLICTS = 2
YIELD_MAX_WAIT_SECONDS = 60.0


def yield_pending(record: LeaseRecord | None, now: float) -> bool:
    """True while somebody holds the yield Lease and it has not run out (a crashed holder's runs out)."""
    return record is not None and record.holder is not None and not record.expired(now)
