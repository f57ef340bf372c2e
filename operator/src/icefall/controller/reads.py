"""Reads of tenants' endpoints (catalogs, brokers) on a pool that one table's slow endpoint cannot stall.

`Reads.submit(key, read)` runs `read()` on a worker thread and returns its Future; the key is the table
(its uid). The rules:
- **One in flight per key.** While a table's read is queued or running, submitting for it again returns
  the same Future: a table never takes a second thread, however often it is reconciled.
- **Overdue reads give their slot back.** `workers` reads run at once; a read running longer than
  `overdue_seconds` no longer counts against that, and a new thread takes the next read. So k tables whose
  endpoints hang (a server that accepts and never answers) hold k threads, not the pool. A thread that
  comes back from an overdue read ends if the pool has enough threads by then.
- **Slow tables queue apart.** A table whose last read was overdue is "slow": its next reads wait in a
  queue of their own, served only after every other table's read and by at most `workers - 1` counted
  threads at once, so one slot always stays for the others. A read of a slow table that comes back in
  time makes it an ordinary table again. The others never queue behind a slow table, and wait at most
  `overdue_seconds` for a slot the first time a table turns out slow.
- **Bounded.** Slow tables' reads start only while there are fewer than `max_threads` threads; past that
  they queue. The other tables' reads always get a thread (at most `workers` counted at once), so even
  `max_threads` hung slow tables starve nobody; threads beyond `max_threads` are then first reads that
  hang, one per table at most. Client timeouts (`icefall.catalog.timeouts`, the Kafka calls' own) bring
  most hung threads back in bounded time; a server that accepts a PostgreSQL query and never answers is
  the exception (libpq has no client-side query timeout), which is why a table holds one thread at most.
  The memory of slow tables is an LRU of `MAX_REMEMBERED` keys.

Callers wait on the Future for as long as they like (the observer: `wait_seconds`) and never for another
table's read. Not guaranteed: fairness within a queue beyond first come, first served.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from icefall.runtime.bounded import LRU

T = TypeVar("T")
MAX_REMEMBERED = 10_000
_RECHECK_SECONDS = 0.5  # idle threads look again this often: overdue reads free slots as time passes


@dataclass(frozen=True)
class _Job:
    key: str
    read: Callable[[], Any]
    future: Future[Any]


@dataclass(frozen=True)
class _Busy:
    since: float
    slow: bool  # a read of a slow table


class Reads:
    def __init__(
        self,
        *,
        workers: int = 4,
        overdue_seconds: float = 15.0,
        max_threads: int = 64,
        clock: Callable[[], float] = time.monotonic,
        name: str = "icefall-read",
    ) -> None:
        if not 1 <= workers <= max_threads:
            raise ValueError(f"need 1 <= workers <= max_threads, got {workers} and {max_threads}")
        self.workers = workers
        self.overdue_seconds = overdue_seconds
        self.max_threads = max_threads
        self._clock = clock
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._slow_queue: deque[_Job] = deque()
        self._slow: LRU[str, bool] = LRU(MAX_REMEMBERED)  # tables whose last read was overdue
        self._pending: dict[str, Future[Any]] = {}  # queued or running, by key
        self._threads: dict[int, _Busy | None] = {}  # thread number -> its read (None: idle)
        self._numbers = 0

    def submit(self, key: str, read: Callable[[], T]) -> Future[T]:
        """`read()`'s Future; the one already queued or running for `key` if there is one."""
        with self._cond:
            future = self._pending.get(key)
            if future is None:
                future = Future()
                self._pending[key] = future
                (self._slow_queue if key in self._slow else self._queue).append(_Job(key, read, future))
            self._start_threads()
            self._cond.notify_all()
            return future

    @property
    def threads(self) -> int:
        with self._cond:
            return len(self._threads)

    def is_slow(self, key: str) -> bool:
        with self._cond:
            return key in self._slow

    # --- under the lock --------------------------------------------------------------------------------

    def _on_time(self, busy: _Busy | None, now: float) -> bool:
        return busy is not None and now - busy.since < self.overdue_seconds

    def _counted(self) -> int:
        """Threads that count against `workers`: idle ones, and those whose read is not overdue."""
        now = self._clock()
        return sum(1 for busy in self._threads.values() if busy is None or self._on_time(busy, now))

    def _slow_room(self) -> int:
        """How many more slow tables' reads may start now (one counted slot stays for the others)."""
        now = self._clock()
        running = sum(1 for busy in self._threads.values() if self._on_time(busy, now) and busy and busy.slow)
        return max(self.workers - 1, 1) - running

    def _runnable(self) -> int:
        return len(self._queue) + min(len(self._slow_queue), max(self._slow_room(), 0))

    def _start_threads(self) -> None:
        wanted = self._runnable() - sum(1 for busy in self._threads.values() if busy is None)
        counted = self._counted()
        while (
            wanted > 0 and counted < self.workers and (self._queue or len(self._threads) < self.max_threads)
        ):
            self._numbers += 1
            number = self._numbers
            self._threads[number] = None
            threading.Thread(
                target=self._work, args=(number,), name=f"{self._name}-{number}", daemon=True
            ).start()
            wanted -= 1
            counted += 1

    def _next(self) -> tuple[_Job, bool] | None:
        if self._queue:
            return self._queue.popleft(), False
        if self._slow_queue and self._slow_room() > 0:
            return self._slow_queue.popleft(), True
        return None

    # --- the worker threads ----------------------------------------------------------------------------

    def _work(self, number: int) -> None:
        while True:
            with self._cond:
                picked = self._next()
                while picked is None:
                    self._cond.wait(_RECHECK_SECONDS)
                    picked = self._next()
                job, slow = picked
                started = self._clock()
                self._threads[number] = _Busy(started, slow)
            _run(job)
            with self._cond:
                self._pending.pop(job.key, None)
                if self._clock() - started >= self.overdue_seconds:
                    self._slow.put(job.key, True)
                else:
                    self._slow.pop(job.key)
                self._threads[number] = None
                if self._counted() > self.workers:  # back from an overdue read: enough threads now
                    del self._threads[number]
                    return


def _run(job: _Job) -> None:
    if not job.future.set_running_or_notify_cancel():
        return
    try:
        job.future.set_result(job.read())
    except BaseException as error:  # the caller gets it from the Future
        job.future.set_exception(error)
