"""Leases: one active writer per table, and the epoch that fences the ones that lost it.

`Lease` is the interface every backend implements; the rules (who may take a lease, what the epoch becomes)
are the pure functions in `icefall.plan.leases`, so the backends cannot drift apart. This module holds the
local backend used by the embedded default (`icefall run`): a JSON lease file in a state directory, changed
only under an exclusive `fcntl` lock on a sibling lock file, written atomically (temporary file + rename).

A lease gives liveness (writers take turns and do not waste work on conflicts), never safety: a paused
process may wake up believing it still holds a lease that was taken over. Safety comes from the commit
protocol, which refuses commits whose epoch is below the table's (see `icefall.commit`).

Not guaranteed: the file backend works across processes of one machine (or one POSIX file system with
working `flock`), not across machines on NFS.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from icefall.plan.leases import LeaseAction, LeaseRecord, decide, release


class LeaseError(RuntimeError):
    pass


class LeaseTimeoutError(LeaseError):
    """`acquire` gave up: someone else held the lease for the whole timeout."""


class LeaseLostError(LeaseError):
    """`renew` found the lease held by someone else (or at another epoch): stop writing."""


@runtime_checkable
class Lease(Protocol):
    """A named lease held by one identity at a time.

    The identity should be unique per process (pod name plus a random suffix, say); even if it is not, a
    new incarnation never inherits the epoch of an old one.
    """

    @property
    def holder(self) -> str:
        """This side's identity (not necessarily the current holder: see `current`)."""
        ...

    @property
    def epoch(self) -> int | None:
        """The epoch this side holds, or None."""
        ...

    @property
    def expires_at(self) -> float | None:
        """When this side's hold runs out unless renewed (seconds since the Unix epoch), or None."""
        ...

    @property
    def is_held(self) -> bool:
        """True while this side holds the lease and it has not run out by this side's clock."""
        ...

    def acquire(self, timeout: float | None = None) -> int:
        """Wait until the lease is ours (None: forever), and return its epoch; LeaseTimeoutError otherwise."""
        ...

    def renew(self) -> None:
        """Extend our hold; LeaseLostError if it is no longer ours."""
        ...

    def release(self) -> None:
        """Let go, so another holder need not wait for expiry. Idempotent; a lost lease is left alone."""
        ...

    def current(self) -> LeaseRecord | None:
        """The lease as stored now, whoever holds it."""
        ...


class FileLease:
    """The local backend: `<path>` holds the record, `<path>.lock` serialises read-decide-write."""

    def __init__(
        self,
        path: Path,
        holder: str,
        *,
        duration_seconds: float = 15.0,
        poll_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = path
        self._holder = holder
        self._duration = duration_seconds
        self._poll = poll_seconds
        self._clock = clock
        self._sleep = sleep
        self._epoch: int | None = None
        self._expires_at: float | None = None

    @classmethod
    def in_dir(cls, state_dir: Path, name: str, holder: str, **kwargs: Any) -> FileLease:
        return cls(state_dir / f"{name}.lease.json", holder, **kwargs)

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def epoch(self) -> int | None:
        return self._epoch

    @property
    def expires_at(self) -> float | None:
        return self._expires_at

    @property
    def is_held(self) -> bool:
        return self._expires_at is not None and self._clock() < self._expires_at

    def acquire(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            with self._locked():
                now = self._clock()
                decision = decide(
                    self._read(),
                    me=self._holder,
                    my_epoch=self._epoch,
                    now=now,
                    duration_seconds=self._duration,
                )
                if decision.action is not LeaseAction.WAIT:
                    self._write(decision.record)
                    self._hold(decision.record)
                    return decision.record.epoch
            if deadline is not None and now >= deadline:
                holder = decision.record.holder
                raise LeaseTimeoutError(f"lease {self.path.name} is held by {holder!r} (timeout {timeout}s)")
            pause = min(decision.wait_seconds, self._poll)
            if deadline is not None:
                pause = min(pause, deadline - now)
            self._sleep(max(pause, 0.0))

    def renew(self) -> None:
        with self._locked():
            current = self._read()
            decision = decide(
                current,
                me=self._holder,
                my_epoch=self._epoch,
                now=self._clock(),
                duration_seconds=self._duration,
            )
            if self._epoch is None or decision.action is not LeaseAction.RENEW:
                self._epoch = self._expires_at = None
                holder = current.holder if current else None
                raise LeaseLostError(f"lease {self.path.name} is no longer ours (held by {holder!r})")
            self._write(decision.record)
            self._hold(decision.record)

    def release(self) -> None:
        if self._epoch is None:
            return
        with self._locked():
            released = release(self._read(), me=self._holder, epoch=self._epoch)
            if released is not None:
                self._write(released)
        self._epoch = self._expires_at = None

    def current(self) -> LeaseRecord | None:
        with self._locked():
            return self._read()

    def _hold(self, record: LeaseRecord) -> None:
        self._epoch = record.epoch
        self._expires_at = record.expires_at

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The lock lives in its own file: the record file is replaced on every write, which would
        # silently drop a lock taken on it.
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> LeaseRecord | None:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        try:
            return LeaseRecord(
                holder=raw["holder"] or None,
                epoch=int(raw["epoch"]),
                acquire_time=float(raw["acquireTime"]),
                renew_time=float(raw["renewTime"]),
                duration_seconds=float(raw["durationSeconds"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LeaseError(f"lease file {self.path} is not a lease record: {e}") from e

    def _write(self, record: LeaseRecord) -> None:
        body = {
            "holder": record.holder,
            "epoch": record.epoch,
            "acquireTime": record.acquire_time,
            "renewTime": record.renew_time,
            "durationSeconds": record.duration_seconds,
        }
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
