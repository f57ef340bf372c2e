"""Reads of tenants' endpoints (catalogs, brokers) on a pool that one table's slow endpoint cannot stall.

`Reads.submit(key, read)` runs `read()` on a worker thread and returns its Future; the key is the table
(its uid). The rules:
- **One in flight per key.** While a table's read is queued or running, submitting for it again returns
  the same Future: a table never takes a second thread, however often it is reconciled.
- **Overdue reads give their slot back.** `workers` reads run at once; a read running longer than
  `overdue_seconds` no longer counts against that, and a new thread takes the next table's read. So k
  tables whose endpoints hang (a server that accepts and never answers) hold k threads, not the pool, and
  every other table's read starts at once. A thread that comes back from an overdue read ends if the pool
  has enough threads by then.
- **Bounded.** At most `max_threads` threads in all: past that, reads queue (only that many hung tables at
  once could delay the others). Client timeouts (`icefall.catalog.timeouts`, the Kafka calls' own) bring
  every hung thread back in bounded time.

Callers wait on the Future for as long as they like (the observer: `wait_seconds`) and never for another
table's read. Not guaranteed: fairness of the queue beyond first come, first served.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


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
        self._queue: deque[tuple[str, Callable[[], Any], Future[Any]]] = deque()
        self._pending: dict[str, Future[Any]] = {}  # queued or running, by key
        self._started: dict[int, float | None] = {}  # thread number -> when its read started (None: idle)
        self._numbers = 0

    def submit(self, key: str, read: Callable[[], T]) -> Future[T]:
        """`read()`'s Future; the one already queued or running for `key` if there is one."""
        with self._cond:
            future = self._pending.get(key)
            if future is None:
                future = Future()
                self._pending[key] = future
                self._queue.append((key, read, future))
            self._start_threads()
            self._cond.notify()
            return future

    @property
    def threads(self) -> int:
        with self._cond:
            return len(self._started)

    def _counted(self) -> int:
        """Threads that count against `workers`: idle ones, and those whose read is not overdue."""
        now = self._clock()
        return sum(1 for at in self._started.values() if at is None or now - at < self.overdue_seconds)

    def _start_threads(self) -> None:  # under the lock
        idle = sum(1 for at in self._started.values() if at is None)
        wanted = len(self._queue) - idle
        counted = self._counted()
        while wanted > 0 and counted < self.workers and len(self._started) < self.max_threads:
            self._numbers += 1
            number = self._numbers
            self._started[number] = None
            threading.Thread(
                target=self._work, args=(number,), name=f"{self._name}-{number}", daemon=True
            ).start()
            wanted -= 1
            counted += 1

    def _work(self, number: int) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                key, read, future = self._queue.popleft()
                self._started[number] = self._clock()
            _run(read, future)
            with self._cond:
                self._pending.pop(key, None)
                self._started[number] = None
                if self._counted() > self.workers:  # back from an overdue read: enough threads now
                    del self._started[number]
                    return


def _run(read: Callable[[], Any], future: Future[Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(read())
    except BaseException as error:  # the caller gets it from the Future
        future.set_exception(error)
