"""The commit side of a writer: the commit lease and its keeper thread, the epoch, the staging branch, and
the commit of a written batch, here or on the commit thread while the next batch is written on top of it.

Guarantees: nothing is committed without first renewing the lease, at that moment (FencedError when it
was lost; the API server's outage when the lease store cannot be reached, waited out like any other), so
a writer cut off from its lease store stops committing while the lease it last renewed still runs; every
commit is `icefall.commit`'s compare-and-swap with the epoch this writer claimed in the tables, so a stale
writer is refused even when its lease backend failed to notice; a staging branch whose batch did not land
is dropped (or swept later). At most one commit is in flight.
Not decided here: whether a batch is pipelined, and what becomes of the batch on top of a commit that was
re-staged or refused (`icefall.plan.pipelining`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icefall.commit import (
    CommitOutcome,
    FencedError,
    SourceBatch,
    Stage,
    StaleHeadError,
    abandon_stage,
    claim_epoch,
    commit_staged_outcome,
    next_stage,
    prepare_stage,
    read_committed,
    stage_branch_name,
    staged_on,
)
from icefall.commit.lease import Lease, LeaseLostError
from icefall.ingest.outages import classify, log_failure
from icefall.ingest.outcome import Landed
from icefall.runtime import metrics
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icefall.ingest.report import WrittenBatch
    from icefall.runtime.failpoints import TableRole

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews the commit lease in the background, so a long batch or a quiet topic never lets it lapse.

    A lost lease is remembered, and `check()` turns it into FencedError before anything is committed.
    Losing the lease is only about liveness: the epoch in the table refuses a stale writer regardless.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lost: LeaseLostError | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="icefall-lease", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        failing = 0
        while not self._stop.wait(self._interval()):
            try:
                self.renew()
            except LeaseLostError:
                return
            except Exception as error:  # a flaky API server: try again at the next tick, the lease has slack
                failing += 1
                if failing == 1:  # once per outage: the batch loop logs each of its own attempts
                    log_failure(log, error, "renewing the commit lease failed; retrying")
                continue
            if failing:
                log.info("renewed the commit lease again after %d failed attempts", failing)
                failing = 0

    def _interval(self) -> float:
        expires = self.lease.expires_at
        return 0.5 if expires is None else max((expires - time.monotonic()) / 3, 0.5)

    def renew(self) -> None:
        with self._lock:
            if self._lost is not None:
                raise self._lost
            failpoint("lease.renew")
            try:
                self.lease.renew()
            except LeaseLostError as lost:
                self._lost = lost
                raise

    def check(self, label: str) -> None:
        """Raise FencedError if the lease was lost (renewing it now, so the answer is current)."""
        try:
            self.renew()
        except LeaseLostError as lost:
            raise FencedError(f"{label}: this writer lost the commit lease") from lost

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


@dataclass
class InFlight:
    """A written batch whose commit runs on the commit thread while the next batch is read and written on
    top of it. `after` is that next batch's stage."""

    written: WrittenBatch
    table: Table  # the commit thread's own pyiceberg table object
    commit: Future[tuple[CommitOutcome, float, float]]  # outcome, seconds of the commit, when it ended
    after: Stage
    settled: bool = False
    restaged: bool = False


class CommitPipeline:
    """One writer's commits: its lease (kept by a `LeaseKeeper`), epoch, staging branch, and commit thread.

    `start()` takes the lease; `commit()` commits a written batch here; `send()` starts its commit on the
    commit thread (the batch in flight), `land()` waits for it.
    """

    def __init__(self, lease: Lease, *, label: str, writer_id: str, keyed: bool) -> None:
        self.lease = lease
        self.label = label
        self.writer_id = writer_id
        self.keyed = keyed
        self.epoch = 0
        self.keeper: LeaseKeeper | None = None
        self.in_flight: InFlight | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- the lease ------------------------------------------------------------------------------------

    def start(self, tables: list[tuple[Table, TableRole]], lease_timeout: float | None) -> None:
        """Take the commit lease at an epoch this writer claimed in `tables`; keep it renewed."""
        self.epoch = self._acquire_and_claim(tables, lease_timeout)
        self.keeper = LeaseKeeper(self.lease)
        self.keeper.start()
        log.info("%s: writer %s holds the commit lease at epoch %d", self.label, self.writer_id, self.epoch)

    def _acquire_and_claim(
        self, tables: list[tuple[Table, TableRole]], lease_timeout: float | None, attempts: int = 5
    ) -> int:
        """Take the commit lease at an epoch above the tables' and claim it in all of them.

        The floor makes a deleted or reset Lease harmless (its epoch would start again at 1); the claim
        makes the epoch this writer's alone, whatever lease store another writer used, and fences an older
        writer's late dead-letter commit as well as its main one.
        """
        for _ in range(attempts):
            floor = max(read_committed(t).epoch for t, _ in tables)
            epoch = self.lease.acquire(lease_timeout, floor=floor)
            try:
                for table, role in tables:
                    claim_epoch(table, epoch, role=role)
                return epoch
            except FencedError as taken:
                log.warning("%s: %s; taking a newer epoch", self.label, taken)
                self.lease.release()
        raise FencedError(f"{self.label}: could not claim an epoch: other writers kept claiming newer ones")

    def abort_start(self) -> None:
        """A start failed: stop renewing, and give the lease back if it was taken."""
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None
        if self.epoch:
            try:
                self.lease.release()
            except Exception:
                log.warning("%s: giving back the commit lease after a failed start failed", self.label)
            self.epoch = 0

    def check_lease(self) -> None:
        if self.keeper is None:
            raise RuntimeError("call start() first: it takes the commit lease")
        self.keeper.check(self.label)

    def stop(self) -> None:
        """Wait for the commit thread's work, stop renewing the lease (it is still held)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self.keeper is not None:
            self.keeper.stop()

    # -- staging and committing -----------------------------------------------------------------------

    @property
    def stage_branch(self) -> str:
        """This writer's staging branch, in both tables: one per writer and epoch, reused by every batch
        (a commit leaves it at main's new head), so another incarnation never writes to it."""
        return stage_branch_name(f"{self.writer_id}_e{self.epoch}", "stage")

    def stage(self, table: Table, flight: InFlight | None) -> Stage:
        """The stage of the next batch: on top of the batch in flight, or at main's head. The caller has
        just read the table: the branch left by the last commit is normally at main's head already, and
        staging costs no catalog round trip."""
        if flight is not None:
            return flight.after
        return prepare_stage(table, self.stage_branch, role="main", refresh=False)

    def restage(self, table: Table) -> Stage:
        """A fresh stage at `main`'s head for a batch written again (nothing in flight): the branch is
        pointed back, and the snapshot the first write staged goes with it."""
        return prepare_stage(table, self.stage_branch, role="main", refresh=True)

    def drop_stage_if_behind(self, table: Table, head: int | None) -> None:
        """Idle, drop the staging branch if maintenance moved main past it: it would pin the snapshot it
        points at (and the files compaction replaced) until the next batch."""
        ref = table.metadata.refs.get(self.stage_branch)
        if ref is not None and ref.snapshot_id != head:
            abandon_stage(table, self.stage_branch, role="main")

    def commit(
        self, table: Table, stage: Stage, batch: SourceBatch, written: WrittenBatch
    ) -> tuple[int, float]:
        """Commit what is staged on `stage` (an empty snapshot if the batch had nothing to write); returns
        the snapshot id and the seconds of the commit itself."""
        self._stage_if_nothing_written(table, stage, written)
        self.check_lease()
        commit_started = time.monotonic()
        outcome = commit_staged_outcome(table, stage, batch, self.epoch)
        count_restage(self.label, outcome)
        return outcome.snapshot_id, time.monotonic() - commit_started

    def send(self, table: Table, stage: Stage, batch: SourceBatch, written: WrittenBatch) -> None:
        """Start the commit of a written batch on the commit thread (`in_flight`); the next batch goes on
        top of it."""
        self._stage_if_nothing_written(table, stage, written)
        stage = staged_on(table, stage)
        self.check_lease()
        written.clock.mark("stage")
        mine = copy.copy(table)  # the commit thread's own: refreshing it leaves the caller's alone
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="icefall-commit")
        commit = self._executor.submit(self._commit_in_background, mine, stage, batch)
        self.in_flight = InFlight(written, mine, commit, after=next_stage(stage, batch, self.epoch))

    def _commit_in_background(
        self, table: Table, stage: Stage, batch: SourceBatch
    ) -> tuple[CommitOutcome, float, float]:
        started = time.monotonic()
        outcome = commit_staged_outcome(table, stage, batch, self.epoch)
        ended = time.monotonic()
        return outcome, ended - started, ended

    def take_in_flight(self) -> InFlight | None:
        flight, self.in_flight = self.in_flight, None
        return flight

    def land(self, flight: InFlight) -> Landed:
        """Wait for the in-flight batch's commit; its error, if it failed, is raised here."""
        flight.settled = True
        outcome, commit_seconds, ended = flight.commit.result()
        flight.restaged = outcome.restaged
        count_restage(self.label, outcome)
        flight.written.clock.landed(commit_seconds, ended)
        return Landed(outcome.snapshot_id, commit_seconds)

    def settle(self, flight: InFlight) -> None:
        """The step after an in-flight batch failed: still wait for that batch's commit (it may land)."""
        try:
            self.land(flight)
        except Exception as error:
            log.info("%s: the commit of the batch before did not land either (%s)", self.label, error)

    def _stage_if_nothing_written(self, table: Table, stage: Stage, written: WrittenBatch) -> None:
        """Every commit moves main: stage an empty snapshot for a batch that may have written none."""
        # Spark 4.1 with Iceberg 1.11 commits an empty append's own empty snapshot; a batch that read nothing
        # (it only pins its start or skips a retention gap) wrote nothing, and a keyed batch's MERGE may
        # stage nothing (Spark skips a MERGE without changes): `stage_empty` checks the branch then.
        if not written.planned.ranges or self.keyed:
            stage_empty(table, stage.branch, stage.base.snapshot_id)


def count_restage(label: str, outcome: CommitOutcome) -> None:
    if outcome.restaged:
        metrics.INGEST_COMMITS_RESTAGED.labels(label).inc()
        log.info("%s: maintenance committed meanwhile; batch re-staged on top of it", label)


@contextlib.contextmanager
def dropped_unless_committed(table: Table, branch: str, label: str, role: TableRole) -> Iterator[None]:
    """Drop staging branch `branch` if the block raises: its batch did not land (a refused commit, a failed
    write), and a branch left behind would pin its snapshots and files until the next start's sweep.

    A commit that raised but landed has already removed the branch; dropping is then a no-op. A failure to
    drop is logged, never raised over the original error (the next start sweeps what is left).
    """
    try:
        yield
    except BaseException:
        try:
            if abandon_stage(table, branch, role=role):
                metrics.STAGES_DROPPED.labels(label).inc()
        except Exception as error:
            # In an outage the failure is the outage's, logged once by the retry loop, which sweeps later.
            level = logging.INFO if classify(error) is not None else logging.WARNING
            log.log(level, "%s: dropping staging branch %s failed; it is swept later", label, branch)
        raise


def stage_empty(table: Table, branch: str, base: int | None, attempts: int = 5) -> None:
    """Stage an empty snapshot on `branch` (at `base`) for a batch that wrote nothing: every batch moves
    main, so its offsets are committed even with no rows. A branch already one snapshot past `base` (a
    keyed batch's MERGE that did change rows) is left as it is.

    pyiceberg numbers the snapshot from the metadata it just read; a commit landing elsewhere in the table
    meanwhile (maintenance on main) makes the catalog refuse it (CommitFailedException, or ValueError for
    the sequence number) before anything changes, so it is simply tried again from fresh metadata.
    """
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(attempts):
        table.refresh()
        ref = table.metadata.refs.get(branch)
        staged = table.metadata.snapshot_by_id(ref.snapshot_id) if ref is not None else None
        if staged is not None and staged.parent_snapshot_id == base and base is not None:
            return
        if ref is None or ref.snapshot_id != base:
            # Nothing else writes this branch while the batch runs: the stage is gone or not this batch's.
            raise StaleHeadError(f"staging branch {branch} is no longer at {base}; planning again")
        try:
            with table.transaction() as tx, tx.update_snapshot(branch=branch).fast_append():
                pass
        except (CommitFailedException, ValueError) as e:
            log.info("staging an empty batch on %s was refused (%s); trying again", branch, e)
            continue
        failpoint("main.after-ensure-staged")
        return
    raise StaleHeadError(f"could not stage an empty batch on {branch}: the table kept changing")
