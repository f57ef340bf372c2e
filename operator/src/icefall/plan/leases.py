"""Lease rules, as pure functions shared by every lease backend (local file, Kubernetes Lease).

A lease record says who holds the lease, since when, its epoch, and the times and duration its holder
wrote. The epoch counts changes of holder (Kubernetes' `spec.leaseTransitions`): creating the lease gives
epoch 1, every acquisition by a different holder (or after a release) adds one, renewing keeps it. The
epoch goes into every commit, and the table refuses a commit whose epoch is below the one it already holds.

**Expiry by the observer's clock**, as Kubernetes' own leader election (client-go `leaderelection`) does:
a lease is expired once THIS process has seen its record unchanged for one lease duration, counted on this
process's monotonic clock from the moment it first read the record as it is (`Sighting`). The holder's
`renewTime` and `leaseDurationSeconds` are written for people and tools, never trusted: a holder whose
clock runs hours ahead or behind, or a record written with a huge duration, expires exactly one duration
after its last observed change. The duration is always Icefall's own for that lease (`COMMIT_LEASE_SECONDS`,
`WORK_LEASE_SECONDS`, `lease_seconds`), whatever the record says.

Guarantees: `decide` never hands a lease that is held and was seen changing within the last duration to
someone else, and never lowers the epoch. Not guaranteed: that the holder notices it lost the lease in time.
A paused holder may still believe it holds the lease after a take-over; that is why the epoch, not the
lease, keeps the table safe. A process that starts watching a lease whose holder died waits one full
duration from its first look (the price of not trusting timestamps), unless the holder released it.

`now` is the observer's monotonic clock (seconds); `stamp` is wall-clock time (seconds since the Unix
epoch), only ever written into records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from icefall.plan.names import TableLeases

#: Icefall's duration of a table's commit Lease (and the default of every lease backend).
COMMIT_LEASE_SECONDS = 15
#: Icefall's duration of a table's work Leases and its yield Lease: held by compaction for a rewrite and
#: renewed every third of it.
WORK_LEASE_SECONDS = 60
YIELD_LEASE_SECONDS = WORK_LEASE_SECONDS


def lease_seconds(leases: TableLeases) -> dict[str, int]:
    """Icefall's duration of each Lease of a table that the operator creates (the legacy commit Lease of an
    upgrade is only ever taken and removed, never created)."""
    return {
        leases.commit: COMMIT_LEASE_SECONDS,
        leases.rewrite_yield: YIELD_LEASE_SECONDS,
        **dict.fromkeys(leases.work, WORK_LEASE_SECONDS),
    }


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None  # None once released
    epoch: int
    acquire_time: float  # wall clock of the holder: informative only
    renew_time: float  # wall clock of the holder: informative only, never used to judge expiry
    duration_seconds: float  # as written: informative only, the observer uses Icefall's own duration


@dataclass(frozen=True)
class Sighting:
    """A lease record as this process last read it (None: no lease stored), and `since` when (this process's
    monotonic clock) it has read it unchanged."""

    record: LeaseRecord | None
    since: float

    def unchanged_for(self, now: float) -> float:
        return now - self.since


def sight(previous: Sighting | None, record: LeaseRecord | None, now: float) -> Sighting:
    """What this process knows after reading `record` at `now`: the same sighting if the record is exactly
    the one seen before (nobody wrote it since), else a new one starting now."""
    if previous is not None and previous.record == record:
        return previous
    return Sighting(record, now)


def live_holder(seen: Sighting, now: float, duration_seconds: float) -> str | None:
    """Who holds the lease by this process's observation: the holder, unless the lease was released or has
    not changed for `duration_seconds` (Icefall's duration of this lease)."""
    record = seen.record
    if record is None or record.holder is None or seen.unchanged_for(now) >= duration_seconds:
        return None
    return record.holder


class LeaseAction(StrEnum):
    ACQUIRE = "acquire"  # write `record`: a new holder (me), a new epoch
    RENEW = "renew"  # write `record`: I hold it already, same epoch, later renew time
    WAIT = "wait"  # someone else holds it; look again in `wait_seconds`
    ABSENT = "absent"  # no lease is stored and this side may not create one: wait for whoever creates it


@dataclass(frozen=True)
class LeaseDecision:
    action: LeaseAction
    record: LeaseRecord | None  # the record to write, or (WAIT) the current one; None only when ABSENT
    wait_seconds: float = 0.0


def decide(  # noqa: PLR0913 (keyword-only inputs of one pure rule)
    seen: Sighting,
    *,
    me: str,
    my_epoch: int | None,
    now: float,
    stamp: float,
    duration_seconds: float,
    holder_is_gone: bool = False,
    floor: int = 0,
    may_create: bool = True,
) -> LeaseDecision:
    """What `me` should do about the lease as it was `seen` (see the module doc for the clocks).

    `my_epoch` is the epoch `me` believes it holds (None when it holds nothing). The lease is ours only if
    both holder and epoch match: an earlier incarnation with the same identity (a restarted process) is
    treated like any other holder, so it is waited out and the new incarnation gets a new epoch.
    `duration_seconds`: Icefall's duration of this lease, used to judge expiry and written on every write.
    `holder_is_gone`: the caller KNOWS the current holder can never write again (a local process that
    has exited), so its unexpired lease is taken at once instead of waited out; the epoch still grows.
    `floor`: an epoch already in use elsewhere (the table's `icefall.epoch`): a new holder's epoch is
    max(lease epoch, floor) + 1, so a deleted or reset lease never hands out an epoch the table refuses.
    `may_create`: False where the lease must already exist (Kubernetes: the operator creates each table's
    Leases; pods may not): no stored lease is then ABSENT, not ours to create.
    """
    if not me:
        raise ValueError("a lease holder needs a non-empty identity")
    if duration_seconds <= 0:
        raise ValueError(f"lease duration must be positive, got {duration_seconds}")
    if floor < 0:
        raise ValueError(f"epoch floor must not be negative, got {floor}")
    current = seen.record
    if current is None:
        if not may_create:
            return LeaseDecision(LeaseAction.ABSENT, None)
        return LeaseDecision(LeaseAction.ACQUIRE, LeaseRecord(me, floor + 1, stamp, stamp, duration_seconds))
    if current.holder == me and current.epoch == my_epoch:
        # Still ours, even if it ran out: nobody took it over, so nobody holds a newer epoch.
        return LeaseDecision(
            LeaseAction.RENEW, replace(current, renew_time=stamp, duration_seconds=duration_seconds)
        )
    if live_holder(seen, now, duration_seconds) is None or (holder_is_gone and current.holder != me):
        epoch = max(current.epoch, floor) + 1
        return LeaseDecision(LeaseAction.ACQUIRE, LeaseRecord(me, epoch, stamp, stamp, duration_seconds))
    return LeaseDecision(LeaseAction.WAIT, current, wait_seconds=duration_seconds - seen.unchanged_for(now))


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
