"""Lease take-over rules and the local lease file, with a fake clock.

Proves: a held, unexpired lease is never handed to someone else; the epoch starts at 1 and grows by one on
every change of holder (expiry take-over, acquisition after release, a restarted incarnation of the same
identity) and never on renewal, and a new holder's epoch is above the table's (the floor) even when the
lease was deleted or reset; the file backend follows those rules across independent holders, refuses
renewal of a lost lease, and lets exactly one of many concurrent contenders win.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from icefall.commit.lease import (
    FileLease,
    Lease,
    LeaseError,
    LeaseLostError,
    LeaseTimeoutError,
    SuccessorLease,
    local_holder_exited,
    local_process_holder,
)
from icefall.plan.leases import LeaseAction, LeaseRecord, decide, release

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


def test_nobody_holds_it_so_i_acquire_epoch_one() -> None:
    decision = decide(None, me="a", my_epoch=None, now=5.0, duration_seconds=DURATION)
    assert decision.action is LeaseAction.ACQUIRE
    assert decision.record == LeaseRecord("a", 1, 5.0, 5.0, DURATION)


def test_someone_else_holds_it_unexpired_so_i_wait_until_it_runs_out() -> None:
    current = held("b", 4, renewed=100.0)
    decision = decide(current, me="a", my_epoch=None, now=103.0, duration_seconds=DURATION)
    assert decision.action is LeaseAction.WAIT
    assert decision.record == current
    assert decision.wait_seconds == pytest.approx(7.0)


def test_an_expired_or_released_lease_is_taken_over_with_the_next_epoch() -> None:
    expired = held("b", 4, renewed=100.0)
    decision = decide(
        expired, me="a", my_epoch=None, now=110.0, duration_seconds=DURATION
    )  # exactly at expiry
    assert decision.action is LeaseAction.ACQUIRE
    assert decision.record == LeaseRecord("a", 5, 110.0, 110.0, DURATION)

    released = held(None, 4, renewed=100.0)
    decision = decide(released, me="a", my_epoch=None, now=101.0, duration_seconds=DURATION)
    assert (decision.action, decision.record.epoch) == (LeaseAction.ACQUIRE, 5)


def test_my_own_lease_is_renewed_at_the_same_epoch_even_after_it_ran_out() -> None:
    mine = held("a", 4, renewed=100.0)
    for now in (101.0, 150.0):  # nobody took it over meanwhile, so nobody has a newer epoch
        decision = decide(mine, me="a", my_epoch=4, now=now, duration_seconds=DURATION)
        assert decision.action is LeaseAction.RENEW
        assert decision.record == LeaseRecord("a", 4, mine.acquire_time, now, DURATION)


def test_a_restarted_incarnation_of_the_same_identity_does_not_inherit_the_epoch() -> None:
    old = held("a", 4, renewed=100.0)
    assert decide(old, me="a", my_epoch=None, now=105.0, duration_seconds=DURATION).action is LeaseAction.WAIT
    decision = decide(old, me="a", my_epoch=None, now=111.0, duration_seconds=DURATION)
    assert (decision.action, decision.record.epoch) == (LeaseAction.ACQUIRE, 5)


def test_clock_skew_never_makes_a_contender_wait_more_than_one_duration() -> None:
    from_the_future = held("b", 1, renewed=500.0)
    decision = decide(from_the_future, me="a", my_epoch=None, now=100.0, duration_seconds=DURATION)
    assert decision.action is LeaseAction.WAIT
    assert decision.wait_seconds == DURATION


def test_a_holder_known_to_be_gone_is_taken_over_at_once_with_the_next_epoch() -> None:
    held = LeaseRecord("dead", 4, 990.0, 999.0, DURATION)
    taken = decide(held, me="b", my_epoch=None, now=1_000.0, duration_seconds=DURATION, holder_is_gone=True)
    assert taken.action is LeaseAction.ACQUIRE
    assert (taken.record.holder, taken.record.epoch) == ("b", 5)
    # Never applied to my own record: renewal stays renewal.
    mine = decide(held, me="dead", my_epoch=4, now=1_000.0, duration_seconds=DURATION, holder_is_gone=True)
    assert mine.action is LeaseAction.RENEW


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
        decide(None, me="", my_epoch=None, now=0.0, duration_seconds=DURATION)
    with pytest.raises(ValueError):
        decide(None, me="a", my_epoch=None, now=0.0, duration_seconds=0)


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
    # Deleted: no record at all; the table already holds epoch 7.
    created = decide(None, me="a", my_epoch=None, now=5.0, duration_seconds=DURATION, floor=7)
    assert (created.action, created.record.epoch) == (LeaseAction.ACQUIRE, 8)
    # Reset below the table's epoch, and released: the next epoch is above both.
    reset = held(None, 2, renewed=100.0)
    taken = decide(reset, me="a", my_epoch=None, now=101.0, duration_seconds=DURATION, floor=7)
    assert taken.record.epoch == 8
    # A lease already above the table keeps counting from itself.
    ahead = decide(
        held(None, 12, renewed=100.0), me="a", my_epoch=None, now=101.0, duration_seconds=DURATION, floor=7
    )
    assert ahead.record.epoch == 13
    # Renewing never moves the epoch.
    mine = decide(
        held("a", 4, renewed=100.0), me="a", my_epoch=4, now=101.0, duration_seconds=DURATION, floor=7
    )
    assert (mine.action, mine.record.epoch) == (LeaseAction.RENEW, 4)


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
    clock.now += DURATION + 1  # its writer died
    assert successor(tmp_path, "b", clock).acquire(timeout=0) == 3  # old: epoch 2; new: above it
