"""One step of a writer: plan a batch, write it to a staging branch, then commit it here or hand its commit
to the commit thread, as `plan.pipelining` decides (`ingest/DESIGN.md` tells the whole life).

Guarantees: a batch's branch is dropped unless its commit landed; a batch written on top of a commit in
flight is committed only after that commit landed as staged, and is otherwise dropped (re-staged below:
planned again, counted in `icefall_ingest_batches_discarded_total`; refused below: the refusal is raised);
a step that fails while a commit is in flight still waits for that commit. Dead letters are committed before
their batch, and reconciled before the next batch whenever a batch or an outage may have left them ahead.
Not done here: pacing between steps and waiting out outages (`icefall.ingest.engine`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from icefall.commit import (
    FencedError,
    MaintenanceConflictError,
    StaleHeadError,
    abandon_stage,
    evolve_schema,
    read_committed,
    sweep_stages,
)
from icefall.ingest.commits import dropped_unless_committed
from icefall.ingest.report import Landed, PhaseClock, WrittenBatch
from icefall.plan.pipelining import Action, Below, Pace, Written, after_write
from icefall.runtime import metrics

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icefall.api import StreamingTableSpec
    from icefall.commit import Batch, Stage
    from icefall.ingest.commits import CommitPipeline, InFlight
    from icefall.ingest.dead_letters import DeadLetters
    from icefall.ingest.planning import PlannedBatch, Planner
    from icefall.ingest.report import BatchReport, Reporter
    from icefall.ingest.schemas import SchemaFollower, Writers
    from icefall.ingest.writer import BatchWriter

log = logging.getLogger(__name__)


class Batches:
    """Steps one writer's batches through its parts, on the tables `start` made ready."""

    def __init__(
        self,
        spec: StreamingTableSpec,
        table: Table,
        *,
        writer: BatchWriter,
        planner: Planner,
        reporter: Reporter,
        commits: CommitPipeline,
        dead_letters: DeadLetters,
        schemas: SchemaFollower,
    ) -> None:
        self.spec = spec
        self.table = table
        self.schemas = schemas
        self.label = planner.label
        self.writer = writer
        self.planner = planner
        self.reporter = reporter
        self.commits = commits
        self.dead_letters = dead_letters
        self._sweep_pending = False  # an outage may have left staging branches: drop them first

    def step(self, *, pipeline: bool) -> list[BatchReport]:
        """Plan, read, write and commit one batch; the reports of the batches that landed, oldest first
        (the one in flight below it, then this one unless its commit is now in flight).

        The steps, in order: `_plan` (committed state, watermarks, offset ranges), a staging branch of
        `main` (or the stage on top of the commit in flight), `_write` (ONE Spark job: read, decode, write the
        good rows to the branch, and count records, bytes, newest produce time and bad rows on the way), the
        commit in flight waited for, then by `plan.pipelining.after_write`: the dead letters and the
        compare-and-swap of `main` here, or the commit sent to the commit thread (`pipeline` and
        `spec.batch.pipelined`), or the batch dropped. Raises FencedError when this writer lost its lease or
        a newer writer committed (stop writing), StaleHeadError when the table moved under the batch.
        """
        flight = self.commits.take_in_flight()
        try:
            return self._step_on(flight, pipeline=pipeline)
        except BaseException:
            if flight is not None and not flight.settled:
                self.commits.settle(flight)
            raise

    def _step_on(self, flight: InFlight | None, *, pipeline: bool) -> list[BatchReport]:
        clock = PhaseClock()
        self.planner.progress.last_batch_started = clock.started
        planned = self._plan(flight)
        if planned is None:
            return [self.land(flight)] if flight is not None else []
        clock.mark("plan")
        stage = self.commits.stage(self.table, flight)
        with dropped_unless_committed(self.table, stage.branch, self.label, "main"):
            written = self._write(planned, stage, clock)
            below, reports, refused = self._land_below(flight)
            action = after_write(below, _facts(written), self._pace(pipeline), now=time.monotonic())
            while action is Action.REWRITE:  # once: every id the batch holds is met by then
                stage, written = self._rewrite(planned, clock)
                action = after_write(below, _facts(written), self._pace(pipeline), now=time.monotonic())
            if action is Action.DROP and refused is not None:
                raise refused
            if action is Action.DISCARD:
                log.info("%s: the batch before was re-staged; this one is planned again", self.label)
                metrics.INGEST_BATCHES_DISCARDED.labels(self.label).inc()
                abandon_stage(self.table, stage.branch, role="main")
                return reports
            batch = planned.batch(self.spec.source.topic, written.stats)
            if action is Action.PIPELINE:
                self.commits.send(self.table, stage, batch, written)
                # The next batch is sized before this one's report: learn from it now.
                self.reporter.learn_pace(written, clock.elapsed())
                return reports
            landed = self._commit_here(written, stage, batch)
        self.dead_letters.dirty = False  # main caught up with the dead letters just committed
        return [*reports, self.reporter.report(written, landed, self.table, paced=False)]

    def _plan(self, flight: InFlight | None) -> PlannedBatch | None:
        """The next batch, planned from the state the batch in flight gives the table, or from the table;
        None (lag published) when there is nothing to commit. Reconciles the dead-letter table first when
        a batch may have left it ahead."""
        after = flight.after.base if flight is not None else None
        committed = after if after is not None else read_committed(self.table)  # refreshes the table
        if self._sweep_pending:
            self._sweep_after_outage()
        proposal = self.planner.propose(committed)
        if proposal.idle:
            self.reporter.idle(proposal.plan.positions.lag)
            if after is None:
                self.commits.drop_stage_if_behind(self.table, committed.snapshot_id)
            return None
        self.commits.check_lease()
        if self.dead_letters.dirty:
            self.dead_letters.reconcile(self.table, self.commits.epoch)
        return self.planner.batch(proposal)

    def _write(self, planned: PlannedBatch, stage: Stage, clock: PhaseClock) -> WrittenBatch:
        """Read, decode and write the batch to its staging branch (one Spark job)."""
        if stage.base.offsets != planned.committed.offsets:
            raise StaleHeadError("the table moved between planning and staging")
        clock.mark("stage")
        stats = self.writer.write_good_rows(planned, stage.branch, self.table, self._evolve)
        if planned.ranges:  # what the table cannot follow of this batch's own writer schemas (json: the spec)
            self.schemas.plan(self.table.schema(), stats.writers)
        clock.mark("write")
        self.planner.check_topic_unchanged(planned.topic_id)
        return WrittenBatch(planned, stats, clock)

    def _rewrite(self, planned: PlannedBatch, clock: PhaseClock) -> tuple[Stage, WrittenBatch]:
        """Write the batch again on a fresh stage (the commit below, if any, has landed): its first write
        met writer schemas it was not decoded with (`icefall.ingest.known_writers`); that write is dropped
        with the snapshot it staged, and is never committed."""
        log.info("%s: the batch met new writer schemas; it is written again with them", self.label)
        metrics.INGEST_BATCHES_REWRITTEN.labels(self.label).inc()
        stage = self.commits.restage(self.table)
        return stage, self._write(planned, stage, clock)

    def _evolve(self, writers: Writers | None) -> Schema:
        """Make the table hold the spec's fields and the writer schemas the batch is decoded with
        (`icefall.ingest.schemas`) before the batch is written; the table's schema."""
        if self.schemas.evolution(self.table.schema(), writers).changes:
            # Planned again on the metadata each attempt loads.
            evolution = evolve_schema(
                self.table, lambda schema: self.schemas.evolution(schema, writers), self.commits.epoch
            )
            if evolution.changes:
                self.schemas.committed(evolution)
        return self.table.schema()

    def _land_below(self, flight: InFlight | None) -> tuple[Below, list[BatchReport], Exception | None]:
        """Wait for the commit in flight below this batch, if any: how it ended, its report, its error."""
        if flight is None:
            return Below.NONE, [], None
        try:
            report = self.land(flight)
        except Exception as refused:
            return Below.REFUSED, [], refused
        return (Below.RESTAGED if flight.restaged else Below.LANDED), [report], None

    def land(self, flight: InFlight) -> BatchReport:
        """Wait for the in-flight batch's commit and report it; its error, if it failed, is raised here."""
        landed = self.commits.land(flight)
        return self.reporter.report(flight.written, landed, flight.table, paced=True)

    def land_at_stop(self) -> BatchReport | None:
        """Stopping: wait for the batch still in flight, if any, and its report; a refused one is counted
        and logged, not raised."""
        flight = self.commits.take_in_flight()
        if flight is None:
            return None
        try:
            return self.land(flight)
        except StaleHeadError as refused:
            self.refused(refused)
            log.warning("%s: the last batch's commit was refused (%s)", self.label, refused)
            return None

    def _commit_here(self, written: WrittenBatch, stage: Stage, batch: Batch) -> Landed:
        """Commit the batch's dead letters (if any), then the batch, on this thread."""
        planned, bad, clock = written.planned, written.stats.bad, written.clock
        dead, kinds = 0, dict[str, int]()
        if bad:
            branch, epoch = self.commits.stage_branch, self.commits.epoch
            dead, kinds = self.dead_letters.commit(batch, planned, bad, branch=branch, epoch=epoch)
        clock.mark("dead_letters")
        snapshot_id, commit_seconds = self.commits.commit(self.table, stage, batch, written)
        clock.mark_stage_and_commit(commit_seconds)
        return Landed(snapshot_id, commit_seconds, dead, kinds)

    def _pace(self, pipeline: bool) -> Pace:
        return Pace(
            pipelined=pipeline and self.spec.batch.pipelined,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            min_interval_seconds=float(self.spec.batch.min_interval_seconds),
            throughput_rps=self.planner.progress.throughput_rps,
        )

    # -- after a failed step --------------------------------------------------------------------------

    def refused(self, refused: StaleHeadError | FencedError) -> None:
        """A commit was refused: count it; the dead-letter table may be ahead of main."""
        reason = "fenced" if isinstance(refused, FencedError) else "stale_head"
        metrics.COMMITS_REFUSED.labels(self.label, reason).inc()
        if isinstance(refused, MaintenanceConflictError):
            metrics.INGEST_COMMITS_FAILED_BY_MAINTENANCE.labels(self.label).inc()
        self.dead_letters.dirty = True

    def outage(self) -> None:
        """A step stopped anywhere in an outage: a staging branch or dead letters of an uncommitted batch
        may be left, and are cleaned before the next batch is planned."""
        self.dead_letters.dirty = True
        self._sweep_pending = True

    def _sweep_after_outage(self) -> None:
        """Drop the staging branches an outage left (this writer holds the lease: no batch of another writer
        is in flight), so they do not pin files until the next start."""
        for table in (self.table, self.dead_letters.table):
            if table is not None:
                dropped = sweep_stages(table)
                if dropped:
                    metrics.STAGES_DROPPED.labels(".".join(table.name())).inc(len(dropped))
                    log.info("%s: dropped staging branches left by the outage: %s", self.label, dropped)
        self._sweep_pending = False


def _facts(written: WrittenBatch) -> Written:
    """What `plan.pipelining` needs to know of a written batch."""
    planned = written.planned
    stats = written.stats
    return Written(planned.records, planned.backlog, stats.bad, written.clock.started, stats.unseen_writers)
