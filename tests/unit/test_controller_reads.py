"""The observer's read pool (`controller.reads.Reads`) and the bounded memories (`runtime.bounded.LRU`).

Proves: a table with a read in flight never takes a second thread (a second submit returns the same
Future); reads past `overdue_seconds` give their slot back, so with every worker stuck on a hung table a
new table's read still runs at once; threads that come back from overdue reads end, leaving `workers`;
a table whose read was overdue is slow: its reads queue apart and never take the last slot, so a good
table's read starts at once beside any number of them, and a read in time makes it ordinary again;
`max_threads` caps slow tables' threads and never starves the others; a read's error reaches its Future.
The LRU keeps at most `max_size` entries, drops the least recently used first and hands each dropped value
to `on_evict`; the operator's per-table memory (`StatusMemory`) is bounded by it and forgets a table that
goes.
Reads block on Events (no sleeping); the overdue clock is a fake one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from icefall.controller.reads import Reads
from icefall.runtime.bounded import LRU

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hang(release: threading.Event, started: threading.Event | None = None) -> Callable[[], str]:
    def read() -> str:
        if started is not None:
            started.set()
        assert release.wait(10)
        return "late"

    return read


def eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "condition not met within 5 s"
        time.sleep(0.01)


def test_hung_tables_keep_one_thread_each_and_never_block_another_tables_read() -> None:
    clock, release = FakeClock(), threading.Event()
    reads = Reads(workers=2, overdue_seconds=10, max_threads=8, clock=clock)
    try:
        started = {name: threading.Event() for name in ("a", "b")}
        a = reads.submit("a", hang(release, started["a"]))
        b = reads.submit("b", hang(release, started["b"]))
        assert started["a"].wait(5) and started["b"].wait(5)
        for _ in range(5):  # reconciled again and again while hung: the same read, no new thread
            assert reads.submit("a", hang(release)) is a
        assert reads.threads == 2

        good = reads.submit("good", lambda: "fresh")
        assert not good.done()  # both workers are busy and not overdue yet: it queues
        clock.now += 10  # a and b are overdue: their slots are given back
        assert reads.submit("other", lambda: "fresh too").result(timeout=5) == "fresh too"
        assert good.result(timeout=5) == "fresh"
        assert reads.threads <= 4

        release.set()
        assert a.result(timeout=5) == b.result(timeout=5) == "late"
        eventually(lambda: reads.threads == 2)  # back from the hung reads: only `workers` stay
        assert reads.is_slow("a") and not reads.is_slow("good")
        assert reads.submit("a", lambda: "new").result(timeout=5) == "new"  # a new read once done
        assert not reads.is_slow("a")  # it came back in time
    finally:
        release.set()


def test_slow_tables_queue_apart_and_never_take_the_last_slot() -> None:
    clock, release = FakeClock(), threading.Event()
    reads = Reads(workers=2, overdue_seconds=10, max_threads=8, clock=clock)
    try:
        slow = [f"slow-{n}" for n in range(4)]
        first = [reads.submit(key, hang(release)) for key in slow[:2]]
        eventually(lambda: all(f.running() for f in first))
        clock.now += 10
        later = [reads.submit(key, hang(release)) for key in slow[2:]]
        eventually(lambda: all(f.running() for f in later))
        clock.now += 10
        release.set()
        assert [f.result(timeout=5) for f in first + later] == ["late"] * 4
        assert all(reads.is_slow(key) for key in slow)  # every one of them came back overdue

        release.clear()
        again = [reads.submit(key, hang(release)) for key in slow]
        eventually(lambda: sum(f.running() for f in again) == 1)  # workers - 1 of them at a time
        assert reads.submit("good", lambda: "fresh").result(timeout=5) == "fresh"  # the kept slot
        assert sum(f.running() for f in again) == 1
        clock.now += 10  # the one running is overdue: the next slow table's read may start
        reads.submit("other", lambda: "fresh").result(timeout=5)
        eventually(lambda: sum(f.running() for f in again) == 2)
    finally:
        release.set()


def test_max_threads_caps_slow_tables_and_never_starves_the_others() -> None:
    clock, release = FakeClock(), threading.Event()
    reads = Reads(workers=1, overdue_seconds=1, max_threads=3, clock=clock)
    try:
        first = []
        for n in range(4):  # first contact: each read hangs, is overdue by the next submit
            future = reads.submit(f"s{n}", hang(release))
            first.append(future)
            eventually(future.running)
            clock.now += 2
        clock.now += 2
        release.set()
        assert [f.result(timeout=5) for f in first] == ["late"] * 4
        eventually(lambda: reads.threads == 1)
        assert all(reads.is_slow(f"s{n}") for n in range(4))

        release.clear()
        again = []
        for n in range(4):  # the same tables, slow now: their reads hang again
            again.append(reads.submit(f"s{n}", hang(release)))
            if n < 3:
                eventually(again[n].running)
            clock.now += 2
        assert reads.threads == 3 and sum(f.running() for f in again) == 3  # the fourth queues
        assert reads.submit("good", lambda: "fresh").result(timeout=5) == "fresh"  # still a thread
        release.set()
        assert [f.result(timeout=5) for f in again] == ["late"] * 4
    finally:
        release.set()


def test_a_reads_error_reaches_its_future_and_the_pool_goes_on() -> None:
    reads = Reads(workers=1)

    def broken() -> str:
        raise ConnectionError("catalog down")

    failed = reads.submit("t", broken)
    with pytest.raises(ConnectionError, match="catalog down"):
        failed.result(timeout=5)
    assert reads.submit("t", lambda: "ok").result(timeout=5) == "ok"


def test_bad_pool_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="workers"):
        Reads(workers=0)
    with pytest.raises(ValueError, match="workers"):
        Reads(workers=5, max_threads=4)


def test_the_lru_keeps_the_most_recent_entries_and_hands_back_what_it_drops() -> None:
    dropped: list[tuple[str, int]] = []
    lru: LRU[str, int] = LRU(2, lambda key, value: dropped.append((key, value)))
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert dropped == [("b", 2)] and list(lru) == ["a", "c"] and len(lru) == 2
    lru.put("a", 10)  # replacing is a use, not a new entry
    lru.put("d", 4)
    assert dropped == [("b", 2), ("c", 3)] and "a" in lru and lru.get("a") == 10
    assert lru.pop("a") == 10 and lru.pop("a") is None and lru.get("zz") is None
    with pytest.raises(ValueError, match="at least one"):
        LRU(0)


def test_the_operators_table_memory_is_bounded_and_forgets_a_table_that_goes() -> None:
    from datetime import UTC, datetime

    from icefall.controller.status import StatusMemory
    from icefall.plan.applying import Applied

    now = datetime(2026, 1, 1, tzinfo=UTC)
    memory = StatusMemory(max_tables=2)
    for uid in ("a", "b", "c"):
        memory.wrote(uid, now)
        memory.did_apply(uid, ("Lease", "x"), Applied("d", now))
    assert memory.last_write("a") is None and memory.applied("a", ("Lease", "x")) is None  # the oldest went
    assert memory.last_write("c") == now and memory.applied("c", ("Lease", "x")) == Applied("d", now)
    memory.forget("c")
    assert memory.last_write("c") is None and memory.applied("c", ("Lease", "x")) is None
