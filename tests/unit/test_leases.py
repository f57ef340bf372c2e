"""Lease take-over rules and the local lease file, with a fake clock.

Proves: expiry is judged by the observer's clock, one lease duration after it last saw the record change,
whatever the holder's clock or the duration stored in the record (a holder 400 s ahead or behind, or a huge
`leaseDurationSeconds`, never keeps a dead lease and never loses a live one); a missing lease is ABSENT where
this side may not create it; a held, unexpired lease is never handed to someone else; the epoch starts at 1
and grows by one on every change of holder (expiry take-over, acquisition after release, a restarted
incarnation of the same identity) and never on renewal, and a new holder's epoch is above the table's (the
floor) even when the lease was deleted or reset; the file backend follows those rules across independent
holders, refuses renewal of a lost lease, and lets exactly one of many concurrent contenders win.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from icefall.commit.lease import (
    FileLease,
    Lease,
    LeaseError,
    LeaseLostError,
    LeasePool,
    LeaseTimeoutError,
    SuccessorLease,
    local_holder_exited,
    local_process_holder,
)
from icefall.plan.leases import (
    COMMIT_LEASE_SECONDS,
    WORK_LEASE_SECONDS,
    LeaseAction,
    LeaseRecord,
    Sighting,
    decide,
    lease_seconds,
    live_holder,
    release,
    sight,
)
from icefall.plan.names import TableIdentity, TableLeases

pytestmark = pytest.mark.unit

DURATION = 10.0


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# --- the pure rules --------------------------------------------------------------------------------------


def held(holder: str | None, epoch: int, renewed: float) -> LeaseRecord:
    return LeaseRecord(
        holder, epoch, acquire_time=renewed - 100, renew_time=renewed, duration_seconds=DURATION
    )


def seen(record: LeaseRecord | None, since: float = 100.0) -> Sighting:
    """`record` as this process has seen it, unchanged since `since` (its own monotonic clock)."""
    return Sighting(record, since)


def decide_at(sighting: Sighting, now: float, me: str = "a", my_epoch: int | None = None, **kw: Any) -> Any:
    return decide(sighting, me=me, my_epoch=my_epoch, now=now, stamp=now, duration_seconds=DURATION, **kw)


def test_nobody_holds_it_so_i_acquire_epoch_one() -> None:
    decision = decide(seen(None), me="a", my_epoch=None, now=5.0, stamp=1e9, duration_seconds=DURATION)
    assert decision.action is LeaseAction.ACQUIRE
    assert decision.record == LeaseRecord("a", 1, 1e9, 1e9, DURATION)  # times written: the wall clock


def test_someone_else_holds_it_unexpired_so_i_wait_until_it_runs_out() -> None:
    current = held("b", 4, renewed=100.0)
    decision = decide_at(seen(current, since=100.0), now=103.0)
    assert decision.action is LeaseAction.WAIT
    assert decision.record == current
    assert decision.wait_seconds == pytest.approx(7.0)


def test_an_expired_or_released_lease_is_taken_over_with_the_next_epoch() -> None:
    unchanged = seen(held("b", 4, renewed=100.0), since=100.0)
    decision = decide_at(unchanged, now=110.0)  # exactly one duration without a change
    assert decision.action is LeaseAction.ACQUIRE
    assert decision.record == LeaseRecord("a", 5, 110.0, 110.0, DURATION)

    released = seen(held(None, 4, renewed=100.0), since=100.0)
    decision = decide_at(released, now=100.5)  # released: at once
    assert (decision.action, decision.record and decision.record.epoch) == (LeaseAction.ACQUIRE, 5)


def test_my_own_lease_is_renewed_at_the_same_epoch_even_after_it_ran_out() -> None:
    mine = held("a", 4, renewed=100.0)
    for now in (101.0, 150.0):  # nobody took it over meanwhile, so nobody has a newer epoch
        decision = decide_at(seen(mine), now=now, my_epoch=4)
        assert decision.action is LeaseAction.RENEW
        assert decision.record == LeaseRecord("a", 4, mine.acquire_time, now, DURATION)


def test_a_restarted_incarnation_of_the_same_identity_does_not_inherit_the_epoch() -> None:
    old = seen(held("a", 4, renewed=100.0), since=100.0)
    assert decide_at(old, now=105.0).action is LeaseAction.WAIT
    decision = decide_at(old, now=111.0)
    assert (decision.action, decision.record and decision.record.epoch) == (LeaseAction.ACQUIRE, 5)


@pytest.mark.parametrize("skew", [-400.0, 400.0, -1e9, 1e9])
def test_expiry_is_one_duration_after_the_last_observed_change_whatever_the_holders_clock(
    skew: float,
) -> None:
    """The holder's clock runs `skew` seconds off: its renewTime says nothing to the observer."""
    record = held("b", 4, renewed=100.0 + skew)
    first_look = sight(None, record, now=100.0)
    later = sight(first_look, record, now=105.0)  # read again: unchanged
    assert later == first_look
    assert decide_at(later, now=109.9).action is LeaseAction.WAIT
    assert decide_at(later, now=109.9).wait_seconds == pytest.approx(0.1)
    assert decide_at(later, now=110.0).action is LeaseAction.ACQUIRE
    # The holder renews (with its skewed clock): the observer counts again from the change it saw.
    renewed = sight(later, held("b", 4, renewed=103.0 + skew), now=109.0)
    assert renewed.since == 109.0
    assert decide_at(renewed, now=118.9).action is LeaseAction.WAIT
    assert decide_at(renewed, now=119.0).action is LeaseAction.ACQUIRE


def test_a_huge_lease_duration_is_judged_as_icefalls_own_and_rewritten() -> None:
    forever = LeaseRecord("squatter", 3, 0.0, 4e9, duration_seconds=2**31 - 1)
    sighting = sight(None, forever, now=100.0)
    assert live_holder(sighting, 109.0, DURATION) == "squatter"
    assert live_holder(sighting, 110.0, DURATION) is None
    decision = decide_at(sighting, now=110.0)
    assert decision.action is LeaseAction.ACQUIRE
    assert decision.record is not None and decision.record.duration_seconds == DURATION  # written as ours


def test_a_missing_lease_is_absent_where_this_side_may_not_create_it() -> None:
    decision = decide_at(seen(None), now=100.0, may_create=False)
    assert (decision.action, decision.record) == (LeaseAction.ABSENT, None)
    assert decide_at(seen(None), now=100.0, may_create=True).action is LeaseAction.ACQUIRE


def test_a_holder_known_to_be_gone_is_taken_over_at_once_with_the_next_epoch() -> None:
    record = LeaseRecord("dead", 4, 990.0, 999.0, DURATION)
    taken = decide_at(seen(record, since=999.0), now=1_000.0, me="b", holder_is_gone=True)
    assert taken.action is LeaseAction.ACQUIRE
    assert taken.record is not None and (taken.record.holder, taken.record.epoch) == ("b", 5)
    # Never applied to my own record: renewal stays renewal.
    mine = decide_at(seen(record, since=999.0), now=1_000.0, me="dead", my_epoch=4, holder_is_gone=True)
    assert mine.action is LeaseAction.RENEW


def test_live_holder_and_sightings() -> None:
    assert live_holder(seen(None), 100.0, DURATION) is None
    assert live_holder(seen(held(None, 2, renewed=0.0)), 100.0, DURATION) is None  # released
    assert live_holder(seen(held("b", 2, renewed=0.0), since=95.0), 100.0, DURATION) == "b"
    first = sight(None, None, now=1.0)
    assert sight(first, None, now=2.0) is first  # still no lease: the same sighting
    assert sight(first, held("b", 1, renewed=0.0), now=3.0) == seen(held("b", 1, renewed=0.0), since=3.0)


def test_table_leases_are_created_with_icefalls_durations() -> None:
    leases = TableLeases(TableIdentity("lake", "", "sales", "orders"))
    durations = lease_seconds(leases)
    assert durations[leases.commit] == COMMIT_LEASE_SECONDS
    assert durations[leases.rewrite_yield] == WORK_LEASE_SECONDS
    assert all(durations[name] == WORK_LEASE_SECONDS for name in leases.work)
    assert len(durations) == 2 + len(leases.work)


def test_local_process_holders_tell_when_their_process_exited() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        running = local_process_holder(child.pid)
        assert not local_holder_exited(running)
    finally:
        child.kill()
        child.wait()
    assert local_holder_exited(running)
    me = local_process_holder()
    host, pid_and_start = me.rsplit("/", 1)
    # The same pid with another start time is another process (pid reuse): the holder exited.
    assert local_holder_exited(f"{host}/{pid_and_start.rsplit('-', 1)[0]}-1")
    assert not local_holder_exited(me)
    # Only holders this host can judge: another host's, or a free-form name, are never "exited".
    assert not local_holder_exited(me.replace(socket.gethostname(), "elsewhere", 1))
    assert not local_holder_exited("test-writer")


def test_a_file_lease_held_by_an_exited_local_process_is_taken_without_waiting(tmp_path: Path) -> None:
    clock = FakeClock()
    child = subprocess.Popen(["true"])
    gone = local_process_holder(child.pid)
    child.wait()
    old = FileLease(tmp_path / "l.json", gone, duration_seconds=3600, clock=clock, sleep=clock.sleep)
    old.acquire()
    new = FileLease(tmp_path / "l.json", local_process_holder(), duration_seconds=DURATION, clock=clock)
    assert new.acquire(timeout=0) == 2
    assert clock.slept == []


def test_a_forgotten_file_lease_is_removed_unless_someone_took_it(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "work.lease.json"
    a = FileLease(path, "a", duration_seconds=DURATION, clock=clock)
    a.acquire(timeout=0)
    a.release(forget=True)
    assert not path.exists()
    b = FileLease(path, "b", duration_seconds=DURATION, clock=clock)
    assert b.acquire(timeout=0) == 1  # a new start: work Leases fence nothing

    b.release()
    a.acquire(timeout=0)
    real_delete = a._delete

    def delete_after_b_took_it(version: str | None) -> None:
        b.acquire(timeout=0)  # between a's release and its delete: the delete finds another version
        real_delete(version)

    a._delete = delete_after_b_took_it  # type: ignore[method-assign]
    a.release(forget=True)
    record = b.current()
    assert record is not None and record.holder == "b"


def test_release_only_lets_go_of_my_own_epoch() -> None:
    mine = held("a", 4, renewed=100.0)
    assert release(mine, me="a", epoch=4) == held(None, 4, renewed=100.0)
    assert release(mine, me="a", epoch=3) is None
    assert release(mine, me="b", epoch=4) is None
    assert release(None, me="a", epoch=4) is None


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        decide(seen(None), me="", my_epoch=None, now=0.0, stamp=0.0, duration_seconds=DURATION)
    with pytest.raises(ValueError):
        decide(seen(None), me="a", my_epoch=None, now=0.0, stamp=0.0, duration_seconds=0)


# --- the local file backend ------------------------------------------------------------------------------


def lease(tmp_path: Path, holder: str, clock: FakeClock) -> FileLease:
    return FileLease.in_dir(
        tmp_path, "icefall-orders-commit", holder, duration_seconds=DURATION, clock=clock, sleep=clock.sleep
    )


def test_file_lease_implements_the_protocol(tmp_path: Path) -> None:
    assert isinstance(lease(tmp_path, "a", FakeClock()), Lease)


def test_acquire_renew_release(tmp_path: Path) -> None:
    clock = FakeClock()
    a = lease(tmp_path, "a", clock)
    assert not a.is_held and a.epoch is None and a.current() is None

    assert a.acquire(timeout=0) == 1
    assert a.is_held and a.epoch == 1 and a.expires_at == clock.now + DURATION
    record = a.current()
    assert record is not None and (record.holder, record.epoch) == ("a", 1)

    clock.now += 6
    a.renew()
    assert a.expires_at == clock.now + DURATION
    clock.now += 6
    assert a.is_held  # 12 s after acquiring, 6 s after renewing

    a.release()
    a.release()  # idempotent
    assert not a.is_held and a.epoch is None
    record = a.current()
    assert record is not None and (record.holder, record.epoch) == (None, 1)


def test_two_holders_take_turns_and_each_change_of_holder_bumps_the_epoch(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = lease(tmp_path, "a", clock), lease(tmp_path, "b", clock)

    assert a.acquire(timeout=0) == 1
    with pytest.raises(LeaseTimeoutError, match="held by 'a'"):
        b.acquire(timeout=0)

    clock.now += DURATION + 1  # a stalls past its lease: b takes over
    assert b.acquire(timeout=0) == 2
    assert a.is_held is False
    with pytest.raises(LeaseLostError):
        a.renew()
    assert a.epoch is None

    b.release()  # a released lease is free at once, and still counts as a change of holder
    assert a.acquire(timeout=0) == 3
    assert a.acquire(timeout=0) == 3  # acquiring what you hold renews it


def test_acquire_waits_for_expiry_within_its_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = lease(tmp_path, "a", clock), lease(tmp_path, "b", clock)
    a.acquire()
    start = clock.now

    with pytest.raises(LeaseTimeoutError):
        b.acquire(timeout=3.5)
    assert clock.now == pytest.approx(start + 3.5)

    assert b.acquire(timeout=30) == 2
    assert clock.now == pytest.approx(start + DURATION)
    assert max(clock.slept) <= 1.0  # polls, so a release would be noticed early


def test_a_new_process_with_the_same_identity_waits_and_gets_a_new_epoch(tmp_path: Path) -> None:
    clock = FakeClock()
    old = lease(tmp_path, "pod-0", clock)
    assert old.acquire() == 1
    restarted = lease(tmp_path, "pod-0", clock)
    with pytest.raises(LeaseTimeoutError):
        restarted.acquire(timeout=0)
    clock.now += DURATION
    assert restarted.acquire(timeout=0) == 2
    with pytest.raises(LeaseLostError):
        old.renew()


@pytest.mark.parametrize("holder_skew", [400.0, -400.0])
def test_holders_with_skewed_wall_clocks_take_over_one_duration_after_the_last_change(
    tmp_path: Path, holder_skew: float
) -> None:
    """The holder's wall clock runs 400 s ahead of (or behind) the contender's: while it renews, the
    contender never takes the lease; once it stops, the contender takes it one duration later, not 400 s."""
    clock = FakeClock()

    def at(skew: float, holder: str) -> FileLease:
        return FileLease.in_dir(
            tmp_path, "skewed", holder, duration_seconds=DURATION, clock=clock, sleep=clock.sleep,
            wall_clock=lambda: 1.7e9 + clock.now + skew,
        )  # fmt: skip

    writer, contender = at(holder_skew, "writer"), at(-holder_skew, "contender")
    assert writer.acquire(timeout=0) == 1
    for _ in range(10):  # 40 s of renewals every 4 s
        with pytest.raises(LeaseTimeoutError):
            contender.acquire(timeout=0)
        clock.now += 4
        writer.renew()
    stopped = clock.now  # the writer's last renewal
    assert contender.acquire(timeout=600) == 2
    assert clock.now == pytest.approx(stopped + DURATION)
    with pytest.raises(LeaseLostError):
        writer.renew()


def test_observed_holder_is_judged_by_the_observers_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = lease(tmp_path, "a", clock), lease(tmp_path, "b", clock)
    assert b.observed_holder() is None  # no lease yet
    a.acquire(timeout=0)
    assert b.observed_holder() == "a"
    clock.now += DURATION - 1
    assert b.observed_holder() == "a"
    clock.now += 1
    assert b.observed_holder() is None  # unchanged for a duration: a is gone as far as b knows
    a.renew()
    assert b.observed_holder() == "a"
    a.release()
    assert b.observed_holder() is None


def test_a_lease_pool_keeps_one_object_per_name_so_sightings_last(tmp_path: Path) -> None:
    clock = FakeClock()
    made: list[str] = []

    def make(name: str) -> FileLease:
        made.append(name)
        return named(tmp_path, name, "worker-b", clock)

    pool = LeasePool(make)
    assert named(tmp_path, "work-01", "worker-a", clock).acquire(timeout=0) == 1  # then worker-a dies
    for _ in range(3):  # one try a round, as compaction does: the dead worker's hold runs out
        with pytest.raises(LeaseTimeoutError):
            pool("work-01").acquire(timeout=0)
        clock.now += DURATION / 3
    assert pool("work-01").acquire(timeout=0) == 2
    assert made == ["work-01"]


def test_renewing_a_lease_never_acquired_fails(tmp_path: Path) -> None:
    with pytest.raises(LeaseLostError):
        lease(tmp_path, "a", FakeClock()).renew()


def test_a_corrupt_lease_file_fails_loudly(tmp_path: Path) -> None:
    a = lease(tmp_path, "a", FakeClock())
    a.path.write_text('{"holder": "x"}')
    with pytest.raises(LeaseError, match="not a lease record"):
        a.acquire(timeout=0)


def test_exactly_one_of_many_concurrent_contenders_wins(tmp_path: Path) -> None:
    """Real clock and real flock: 16 threads, each with its own file handle, race for a free lease."""
    contenders = [FileLease.in_dir(tmp_path, "race", f"w{i}", duration_seconds=60) for i in range(16)]
    barrier = threading.Barrier(len(contenders))
    winners: list[int] = []

    def contend(contender: FileLease) -> None:
        barrier.wait()
        with contextlib.suppress(LeaseTimeoutError):
            winners.append(contender.acquire(timeout=0))

    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert winners == [1]
    assert sum(c.is_held for c in contenders) == 1


def test_a_new_holder_starts_above_the_tables_epoch_even_after_the_lease_was_deleted_or_reset() -> None:
    def epoch(decision: Any) -> int:
        assert decision.record is not None
        return int(decision.record.epoch)

    # Deleted: no record at all; the table already holds epoch 7.
    created = decide_at(seen(None), now=5.0, floor=7)
    assert (created.action, epoch(created)) == (LeaseAction.ACQUIRE, 8)
    # Reset below the table's epoch, and released: the next epoch is above both.
    assert epoch(decide_at(seen(held(None, 2, renewed=100.0)), now=101.0, floor=7)) == 8
    # A lease already above the table keeps counting from itself.
    assert epoch(decide_at(seen(held(None, 12, renewed=100.0)), now=101.0, floor=7)) == 13
    # Renewing never moves the epoch.
    mine = decide_at(seen(held("a", 4, renewed=100.0)), now=101.0, my_epoch=4, floor=7)
    assert (mine.action, epoch(mine)) == (LeaseAction.RENEW, 4)


# --- renamed leases: an upgrade waits out the writer of the old name ---------------------------------------


def named(tmp_path: Path, name: str, holder: str, clock: FakeClock) -> FileLease:
    return FileLease.in_dir(tmp_path, name, holder, duration_seconds=DURATION, clock=clock, sleep=clock.sleep)


def successor(tmp_path: Path, holder: str, clock: FakeClock) -> SuccessorLease:
    new, old = named(tmp_path, "new", holder, clock), named(tmp_path, "old", holder, clock)
    return SuccessorLease(new, old, clock=clock)


def test_without_an_old_lease_the_successor_is_the_new_lease_alone(tmp_path: Path) -> None:
    clock = FakeClock()
    lease = successor(tmp_path, "b", clock)
    assert isinstance(lease, Lease)
    assert lease.acquire(timeout=0, floor=4) == 5
    assert lease.is_held and lease.epoch == 5 and lease.holder == "b"
    assert named(tmp_path, "old", "x", clock).current() is None  # never created
    lease.renew()
    lease.release()
    record = lease.current()
    assert record is not None and record.holder is None


def test_a_writer_of_the_old_name_is_waited_out_and_outnumbered(tmp_path: Path) -> None:
    clock = FakeClock()
    old_writer = named(tmp_path, "old", "a", clock)
    assert old_writer.acquire(timeout=0, floor=6) == 7  # an older version's writer, still running
    new_writer = successor(tmp_path, "b", clock)
    with pytest.raises(LeaseTimeoutError, match="held by 'a'"):
        new_writer.acquire(timeout=DURATION / 2)
    assert not new_writer.is_held
    assert named(tmp_path, "new", "x", clock).current() is None  # the new name waits too

    old_writer.release()  # the old version stops
    epoch = new_writer.acquire(timeout=0, floor=3)
    assert epoch > 7  # above every epoch the old name handed out
    assert named(tmp_path, "old", "x", clock).current() is None  # taken, let go and removed
    with pytest.raises(LeaseLostError):
        old_writer.renew()


def test_an_old_lease_that_ran_out_is_taken_over(tmp_path: Path) -> None:
    clock = FakeClock()
    assert named(tmp_path, "old", "a", clock).acquire(timeout=0) == 1
    clock.now += DURATION + 1  # its writer died long ago; the new writer sees its lease for the first time
    start = clock.now
    assert successor(tmp_path, "b", clock).acquire(timeout=30) == 3  # old: epoch 2; new: above it
    assert clock.now == pytest.approx(start + DURATION)  # one duration of no change, by b's own clock
