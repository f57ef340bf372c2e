"""Leases: one active writer per table, and the epoch that fences the ones that lost it.

`Lease` is the interface every backend implements; the rules (who may take a lease, what the epoch becomes)
are the pure functions in `icefall.plan.leases`, so the backends cannot drift apart. `StoredLease` is the one
acquire / renew / release loop; a backend only supplies a versioned read and a conditional write
(compare-and-swap), and every write is conditional on the version read: a lost race means "read again and
decide again", never a blind overwrite. This module holds the local backend used by the embedded default
(`icefall run`): a JSON lease file in a state directory, compared and replaced under an exclusive `fcntl`
lock on a sibling lock file, written atomically (temporary file + rename). The Kubernetes backend is
`icefall.commit.kube_lease.KubernetesLease`.

A lease gives liveness (writers take turns and do not waste work on conflicts), never safety: a paused
process may wake up believing it still holds a lease that was taken over. Safety comes from the commit
protocol, which refuses commits whose epoch is below the table's (see `icefall.commit`).

Time: every judgement (is it expired, is my hold still good) is made on this process's own clock (`clock`,
`time.monotonic` by default) from when it last saw the record change (`icefall.plan.leases.Sighting`); the
wall clock (`wall_clock`) only stamps the times written into records. A `StoredLease` object remembers its
sighting, so keep one object per lease name for as long as the lease is watched (`LeasePool`).

A lease held by a local process that has exited is taken at once rather than waited out, when the holder
is named by `local_process_holder()` (host, pid and the process's start time, so a reused pid is not
mistaken for the holder): a killed `icefall run` restarts without waiting for its own old lease. The epoch
still grows, so the exited holder is fenced as usual (it cannot commit anyway).

Not guaranteed: the file backend works across processes of one machine (or one POSIX file system with
working `flock`), not across machines on NFS.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from icefall.plan.leases import (
    COMMIT_LEASE_SECONDS,
    LeaseAction,
    LeaseDecision,
    LeaseRecord,
    Sighting,
    decide,
    live_holder,
    release,
    sight,
)

log = logging.getLogger(__name__)


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
        """When this side's hold runs out unless renewed, on this side's clock (`time.monotonic` unless a
        test gives another), or None."""
        ...

    @property
    def is_held(self) -> bool:
        """True while this side holds the lease and it has not run out by this side's clock."""
        ...

    def acquire(self, timeout: float | None = None, *, floor: int = 0) -> int:
        """Wait until the lease is ours (None: forever), and return its epoch; LeaseTimeoutError otherwise.

        A new hold's epoch is above both the lease's last epoch and `floor` (the table's epoch)."""
        ...

    def renew(self) -> None:
        """Extend our hold; LeaseLostError if it is no longer ours."""
        ...

    def release(self, *, forget: bool = False) -> None:
        """Let go, so another holder need not wait for expiry. Idempotent; a lost lease is left alone.

        `forget`: then also remove the stored lease if nobody took it meanwhile, so a name nobody will use
        again does not linger (the old name of a renamed lease, `SuccessorLease`). Never for a lease
        someone else created for this side (a table's Leases: the operator's children).
        """
        ...

    def current(self) -> LeaseRecord | None:
        """The lease as stored now, whoever holds it."""
        ...

    def observed_holder(self) -> str | None:
        """Who holds the lease now by this side's observation (None: nobody, released, or unchanged for a
        whole lease duration: see `icefall.plan.leases.live_holder`). Reads the stored lease."""
        ...


VersionT = TypeVar("VersionT")

_LOCAL_HOLDER = re.compile(r"^(?P<host>.+)/pid-(?P<pid>\d+)-(?P<start>\d+)$")


def _process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def local_process_holder(pid: int | None = None) -> str:
    """A holder identity `<host>/pid-<pid>-<start ticks>` that lets a file lease tell when it exited."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/pid-{pid}-{_process_start(pid) or 0}"


def local_holder_exited(holder: str) -> bool:
    """True only when `holder` names a process of this host (`local_process_holder`) that no longer runs."""
    match = _LOCAL_HOLDER.match(holder)
    if match is None or match["host"] != socket.gethostname():
        return False
    return _process_start(int(match["pid"])) != int(match["start"])


class StoredLease(ABC, Generic[VersionT]):
    """The acquire / renew / release loop, shared by every backend; a backend stores the record.

    A backend supplies `_read`, returning the stored record with an opaque version, and `_write`, which
    stores a record only if the stored version is still the one read (False otherwise: someone else wrote
    first). Every change is read → `decide` → conditional write; a conflict sends the loop back to reading,
    so two contenders can never both believe they won, and nothing is ever written blindly.
    """

    def __init__(
        self,
        holder: str,
        *,
        duration_seconds: float = COMMIT_LEASE_SECONDS,
        poll_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._holder = holder
        self._duration = float(duration_seconds)
        self._poll = poll_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._epoch: int | None = None
        self._expires_at: float | None = None
        self._seen: Sighting | None = None

    # --- what a backend supplies ---------------------------------------------------------------------

    @abstractmethod
    def _label(self) -> str:
        """The lease's name in messages."""

    @abstractmethod
    def _read(self) -> tuple[LeaseRecord | None, VersionT]:
        """The stored record (None: no lease stored yet) and the version to pass to `_write`."""

    @abstractmethod
    def _write(self, record: LeaseRecord, version: VersionT) -> bool:
        """Store `record` if the stored lease is still at `version`; False (nothing written) if not."""

    def _holder_is_gone(self, holder: str) -> bool:
        """True if `holder` can be known never to write again; backends that cannot know say False."""
        return False

    def _may_create(self) -> bool:
        """False where a missing lease must be left to whoever creates it (`_missing` says who)."""
        return True

    def _missing(self) -> str:
        """Why a missing lease is waited for rather than created (backends that never create it)."""
        return "this backend does not create leases"

    @abstractmethod
    def _delete(self, version: VersionT) -> None:
        """Remove the stored lease if it is still at `version`; nothing if it changed or is gone."""

    # --- the Lease interface -------------------------------------------------------------------------

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

    def acquire(self, timeout: float | None = None, *, floor: int = 0) -> int:
        deadline = None if timeout is None else self._clock() + timeout
        said_missing = False
        while True:
            decision, _, now = self._decide_and_write(_writes, floor)
            if decision.record is not None and decision.action in (LeaseAction.ACQUIRE, LeaseAction.RENEW):
                self._hold(decision.record, now)
                return decision.record.epoch
            if decision.action is LeaseAction.ABSENT and not said_missing:
                log.warning("lease %s does not exist: waiting for it (%s)", self._label(), self._missing())
                said_missing = True
            if deadline is not None and now >= deadline:
                if decision.record is None:
                    raise LeaseTimeoutError(
                        f"lease {self._label()} does not exist ({self._missing()}; timeout {timeout}s)"
                    )
                holder = decision.record.holder
                raise LeaseTimeoutError(f"lease {self._label()} is held by {holder!r} (timeout {timeout}s)")
            pause = min(decision.wait_seconds, self._poll) if decision.record is not None else self._poll
            if deadline is not None:
                pause = min(pause, deadline - now)
            self._sleep(max(pause, 0.0))

    def renew(self) -> None:
        def ours(decision: LeaseDecision) -> bool:
            return self._epoch is not None and decision.action is LeaseAction.RENEW

        decision, current, now = self._decide_and_write(ours)
        if not ours(decision) or decision.record is None:
            self._epoch = self._expires_at = None
            if current is None:
                raise LeaseLostError(f"lease {self._label()} is no longer ours (it was deleted)")
            raise LeaseLostError(f"lease {self._label()} is no longer ours (held by {current.holder!r})")
        self._hold(decision.record, now)

    def release(self, *, forget: bool = False) -> None:
        if self._epoch is None:
            return
        while True:
            current, version = self._look()
            released = release(current, me=self._holder, epoch=self._epoch)
            if released is None or self._write(released, version):
                break
        self._epoch = self._expires_at = None
        if forget and released is not None:
            current, version = self._look()
            if current is not None and current.holder is None:  # nobody took it since
                self._delete(version)

    def current(self) -> LeaseRecord | None:
        return self._look()[0]

    def observed_holder(self) -> str | None:
        self._look()
        assert self._seen is not None
        return live_holder(self._seen, self._clock(), self._duration)

    # --- the loop ------------------------------------------------------------------------------------

    def _decide_and_write(
        self, write_if: Callable[[LeaseDecision], bool], floor: int = 0
    ) -> tuple[LeaseDecision, LeaseRecord | None, float]:
        """Read, decide, and store the decision's record if `write_if` wants it, conditionally on the
        version read. Returns the decision (written, or not wanted), the record it was made on, and the
        time it was made at. A lost write means someone else wrote in between: read and decide again."""
        while True:
            current, version = self._look()
            now = self._clock()
            assert self._seen is not None
            gone = current is not None and current.holder is not None and self._holder_is_gone(current.holder)
            decision = decide(
                self._seen,
                me=self._holder,
                my_epoch=self._epoch,
                now=now,
                stamp=self._wall_clock(),
                duration_seconds=self._duration,
                holder_is_gone=gone,
                floor=floor,
                may_create=self._may_create(),
            )
            if decision.record is None or not write_if(decision):
                return decision, current, now
            if self._write(decision.record, version):
                self._seen = Sighting(decision.record, now)
                return decision, current, now

    def _look(self) -> tuple[LeaseRecord | None, VersionT]:
        """`_read`, remembering since when the record has been seen unchanged (`plan.leases.sight`)."""
        current, version = self._read()
        self._seen = sight(self._seen, current, self._clock())
        return current, version

    def _hold(self, record: LeaseRecord, now: float) -> None:
        """Ours from `now` (read before the write, so others, who see the write later, judge it later)."""
        self._epoch = record.epoch
        self._expires_at = now + self._duration


def _writes(decision: LeaseDecision) -> bool:
    return decision.action in (LeaseAction.ACQUIRE, LeaseAction.RENEW)


class FileLease(StoredLease[str | None]):
    """The local backend: `<path>` holds the record; `<path>.lock` serialises each compare-and-replace.

    The version of the record is the file's exact text (None when there is no file).
    """

    def __init__(self, path: Path, holder: str, **settings: Any) -> None:
        """`settings`: those of `StoredLease` (duration_seconds, poll_seconds, clock, wall_clock, sleep)."""
        super().__init__(holder, **settings)
        self.path = path

    @classmethod
    def in_dir(cls, state_dir: Path, name: str, holder: str, **kwargs: Any) -> FileLease:
        return cls(state_dir / f"{name}.lease.json", holder, **kwargs)

    def _label(self) -> str:
        return self.path.name

    def _holder_is_gone(self, holder: str) -> bool:
        return local_holder_exited(holder)

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

    def _text(self) -> str | None:
        try:
            return self.path.read_text()
        except FileNotFoundError:
            return None

    def _read(self) -> tuple[LeaseRecord | None, str | None]:
        with self._locked():
            text = self._text()
        if text is None:
            return None, None
        try:
            raw = json.loads(text)
            record = LeaseRecord(
                holder=raw["holder"] or None,
                epoch=int(raw["epoch"]),
                acquire_time=float(raw["acquireTime"]),
                renew_time=float(raw["renewTime"]),
                duration_seconds=float(raw["durationSeconds"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LeaseError(f"lease file {self.path} is not a lease record: {e}") from e
        return record, text

    def _delete(self, version: str | None) -> None:
        # The lock file stays: another process may be waiting on it, and a new one would not exclude it.
        with self._locked():
            if version is not None and self._text() == version:
                self.path.unlink()

    def _write(self, record: LeaseRecord, version: str | None) -> bool:
        body = {
            "holder": record.holder,
            "epoch": record.epoch,
            "acquireTime": record.acquire_time,
            "renewTime": record.renew_time,
            "durationSeconds": record.duration_seconds,
        }
        with self._locked():
            if self._text() != version:
                return False
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
        return True


class SuccessorLease:
    """A Lease renamed in a later version: `lease`, after waiting out whoever holds `predecessor`.

    `acquire` first takes `predecessor` if it exists (an older version's writer may hold it: wait for it to
    stop or run out), then `lease` at an epoch above both, then lets go of `predecessor` and removes it, so
    once every writer is upgraded the old name is gone and is never waited on again. Everything else is
    `lease`'s. An old writer that starts afterwards runs beside this one until the table's epoch fences one
    of them (`icefall.commit`): safety never rests on the lease.
    """

    def __init__(
        self, lease: Lease, predecessor: Lease, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lease = lease
        self.predecessor = predecessor
        self._clock = clock

    @property
    def holder(self) -> str:
        return self.lease.holder

    @property
    def epoch(self) -> int | None:
        return self.lease.epoch

    @property
    def expires_at(self) -> float | None:
        return self.lease.expires_at

    @property
    def is_held(self) -> bool:
        return self.lease.is_held

    def acquire(self, timeout: float | None = None, *, floor: int = 0) -> int:
        if self.predecessor.current() is None:
            return self.lease.acquire(timeout, floor=floor)
        started = self._clock()
        before = self.predecessor.acquire(timeout, floor=floor)
        try:
            left = None if timeout is None else max(timeout - (self._clock() - started), 0.0)
            return self.lease.acquire(left, floor=max(floor, before))
        finally:
            self.predecessor.release(forget=True)

    def renew(self) -> None:
        self.lease.renew()

    def release(self, *, forget: bool = False) -> None:
        self.lease.release(forget=forget)

    def current(self) -> LeaseRecord | None:
        return self.lease.current()

    def observed_holder(self) -> str | None:
        return self.lease.observed_holder()


class LeasePool:
    """One lease object per name, made by `make(name)` on first use. A lease object remembers since when it
    has seen its record unchanged, so a name looked at again and again (a work Lease tried every round) must
    be the same object, or a dead holder's lease would look freshly renewed at every look. A table's lease
    names are a fixed set (`icefall.plan.names.TableLeases`), so the pool stays small."""

    def __init__(self, make: Callable[[str], Lease]) -> None:
        self._make = make
        self._leases: dict[str, Lease] = {}

    def __call__(self, name: str) -> Lease:
        if name not in self._leases:
            self._leases[name] = self._make(name)
        return self._leases[name]
