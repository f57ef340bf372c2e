"""One step of a writer: plan a batch, write it to a staging branch, then commit it here or hand its commit
to the commit thread, as `plan.pipelining` decides (`ingest/DESIGN.md` tells the whole life).

Guarantees: a batch's branch is dropped unless its commit landed; a batch written on top of a commit in
flight is committed only after that commit landed as staged, and is otherwise dropped (re-staged below:
planned again, counted in `icefall_ingest_batches_discarded_total`; refused below: the refusal is raised);
a step that fails while a commit is in flight still waits for that commit. Dead letters are committed before
their batch; a dead-letter table a failed batch left ahead takes only what it does not hold of the next.
Not done here: pacing between steps and waiting out outages (`icefall.ingest.engine`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from icefall.api import Unrouted
from icefall.commit import (
    FencedError,
    MaintenanceConflictError,
    StaleHeadError,
    abandon_stage,
    evolve_schema,
    read_committed,
    sweep_stages,
)
from icefall.ingest.commits import dropped_unless_committed, stage_empty
from icefall.ingest.outcome import NO_DEAD_LETTERS, NOTHING_TO_CLEAN, Cleanup, Landed
from icefall.ingest.report import PhaseClock, WrittenBatch
from icefall.plan.pipelining import Action, Below, Pace, Written, after_write
from icefall.runtime import metrics

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icefall.api import StreamingTableSpec
    from icefall.catalog.evolution import Evolution
    from icefall.commit import CommittedState, SourceBatch, Stage
    from icefall.decode.schemas import SchemaFollower, Writers
    from icefall.ingest.commits import CommitPipeline, InFlight
    from icefall.ingest.dead_letters import DeadLetters
    from icefall.ingest.planning import PlannedBatch, Planner
    from icefall.ingest.report import BatchReport, Reporter
    from icefall.ingest.routes import RouteStage
    from icefall.ingest.writer import BatchWriter
    from icefall.runtime.failpoints import TableRole

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: the reports of the batches that landed (oldest first: the one that was in flight
    below, then the step's own unless its commit is now in flight) and what is left to clean."""

    reports: tuple[BatchReport, ...] = ()
    left: Cleanup = NOTHING_TO_CLEAN


@dataclass(frozen=True)
class LandedBelow:
    """How the commit in flight below a written batch ended: its report if it landed, its error if not."""

    ended: Below
    reports: tuple[BatchReport, ...]
    refused: Exception | None = None


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
        # What the last step left to clean (`icefall.ingest.outcome`): nothing, once `Ingestor.start` has
        # swept the staging branches.
        self._left = NOTHING_TO_CLEAN

    def step(self, *, pipeline: bool) -> list[BatchReport]:
        """Plan, read, write and commit one batch; the reports of the batches that landed, oldest first
        (the one in flight below it, then this one unless its commit is now in flight).

        The steps, in order: `_plan` (committed state, watermarks, offset ranges; first what the step
        before left to clean), a staging branch of `main` (or the stage on top of the commit in flight),
        `_write` (ONE Spark job: read, decode, write the good rows to the branch, and count records, bytes,
        newest produce time and bad rows on the way), the commit in flight waited for, then by
        `plan.pipelining.after_write`: the dead letters and the compare-and-swap of `main` here, or the
        commit sent to the commit thread (`pipeline` and `spec.batch.pipelined`), or the batch dropped.
        Raises FencedError when this writer lost its lease or a newer writer committed (stop writing),
        StaleHeadError when the table moved under the batch.
        """
        left = self._left  # kept until the step returns its own outcome: a step that raises cleaned nothing
        flight = self.commits.take_in_flight()
        if flight is None:
            outcome = self._step(left, pipeline=pipeline)
        else:
            outcome = self._step_on(flight, left, pipeline=pipeline)
        self._left = outcome.left
        return list(outcome.reports)

    def _step(self, left: Cleanup, *, pipeline: bool) -> StepOutcome:
        """A step with no commit in flight: planned from the table, committed here or sent (PIPELINE)."""
        clock = self._clock()
        committed = read_committed(self.table)  # refreshes the table
        planned, left = self._plan(committed, left)
        if planned is None:
            self.commits.drop_stage_if_behind(self.table, committed.snapshot_id)
            return StepOutcome((), left)
        clock.mark("plan")
        stage = self.commits.stage(self.table, None)
        routing = self.writer.routing
        routes = routing.stage(stage.branch, planned) if routing is not None else []
        with (
            dropped_unless_committed(self.table, stage.branch, self.label, "main"),
            self._routes_dropped(routes),
        ):
            written = self._write(planned, stage, clock, routes)
            action, stage, written, staged = self._decide(Below.NONE, stage, written, pipeline, routes)
            landed = self._commit_or_send(action, stage, written, staged)
        if landed is None:
            return StepOutcome((), left)
        return StepOutcome((self.reporter.report(written, landed, self.table, paced=False),), left)

    def _step_on(self, flight: InFlight, left: Cleanup, *, pipeline: bool) -> StepOutcome:
        """A step on top of the batch in flight: planned from the state its commit gives the table, written
        on its staged snapshot, then decided once that commit ended. A step that fails before waiting for
        it still waits for it (it may land)."""
        try:
            return self._step_on_flight(flight, left, pipeline=pipeline)
        except BaseException:
            if not flight.settled:
                self.commits.settle(flight)
            raise

    def _step_on_flight(self, flight: InFlight, left: Cleanup, *, pipeline: bool) -> StepOutcome:
        clock = self._clock()
        planned, left = self._plan(flight.after.base, left)
        if planned is None:
            return StepOutcome((self.land(flight),), left)
        clock.mark("plan")
        stage = flight.after
        with dropped_unless_committed(self.table, stage.branch, self.label, "main"):
            written = self._write(planned, stage, clock)
            below = self._land_below(flight)
            action, stage, written, _ = self._decide(below.ended, stage, written, pipeline)
            if action is Action.DROP and below.refused is not None:
                raise below.refused  # this batch sits on a commit that did not land: it goes with its branch
            if action is Action.DISCARD:
                log.info("%s: the batch before was re-staged; this one is planned again", self.label)
                metrics.INGEST_BATCHES_DISCARDED.labels(self.label).inc()
                abandon_stage(self.table, stage.branch, role="main")
                return StepOutcome(below.reports, left)
            landed = self._commit_or_send(action, stage, written)
        if landed is None:
            return StepOutcome(below.reports, left)
        report = self.reporter.report(written, landed, self.table, paced=False)
        return StepOutcome((*below.reports, report), left)

    def _clock(self) -> PhaseClock:
        clock = PhaseClock()
        self.reporter.step_started(clock.started)
        return clock

    def _plan(self, committed: CommittedState, left: Cleanup) -> tuple[PlannedBatch | None, Cleanup]:
        """The next batch after `committed` (the table's, or the state the batch in flight gives it), and
        what is still left to clean; None (lag published) when there is nothing to commit. Cleans first
        what `left` names: staging branches an outage left."""
        if left.stages:
            self._sweep_after_outage()
            left = replace(left, stages=False)
        proposal = self.planner.propose(committed, self.reporter.progress)
        if proposal.idle:
            self.reporter.idle(proposal.lag)
            return None, left
        self.commits.check_lease()
        return self.planner.batch(proposal), NOTHING_TO_CLEAN

    def _decide(
        self,
        below: Below,
        stage: Stage,
        written: WrittenBatch,
        pipeline: bool,
        routes: Sequence[RouteStage] = (),
    ) -> tuple[Action, Stage, WrittenBatch, Sequence[RouteStage]]:
        """`plan.pipelining.after_write` on the written batch; a REWRITE is done here (the commit below, if
        any, has landed), and decided again. Returns the action with the batch's stage, write and route
        stages (a routed batch written again is staged again in every route table too)."""
        action = after_write(below, _facts(written), self._pace(pipeline), now=time.monotonic())
        while action is Action.REWRITE:  # once: every id the batch holds is met by then
            stage, written, routes = self._rewrite(written.planned, written.clock)
            action = after_write(below, _facts(written), self._pace(pipeline), now=time.monotonic())
        return action, stage, written, routes

    def _routes_dropped(self, routes: list[RouteStage]) -> AbstractContextManager[None]:
        routing = self.writer.routing
        return routing.dropped_unless_committed(routes) if routing is not None else contextlib.nullcontext()

    def _commit_or_send(
        self, action: Action, stage: Stage, written: WrittenBatch, routes: Sequence[RouteStage] = ()
    ) -> Landed | None:
        """COMMIT: its dead letters, then the batch, here (how it landed); PIPELINE: its commit sent to the
        commit thread (None: it lands in a later step)."""
        batch = written.planned.batch(written.stats)
        if action is Action.PIPELINE:
            self.commits.send(self.table, stage, batch, written)
            # The next batch is sized before this one's report: learn from it now.
            self.reporter.learn_pace(written, written.clock.elapsed())
            return None
        if action is not Action.COMMIT:
            raise AssertionError(f"{self.label}: {action} is not decided here")
        return self._commit_here(written, stage, batch, routes)

    def _write(
        self, planned: PlannedBatch, stage: Stage, clock: PhaseClock, routes: Sequence[RouteStage] = ()
    ) -> WrittenBatch:
        """Read, decode and write the batch to its staging branch (one Spark job; with routes, one read
        and decode cached for every route table's branch too)."""
        if stage.base.by_topic() != planned.committed.by_topic():
            raise StaleHeadError("the table moved between planning and staging")
        clock.mark("stage")
        stats = self.writer.write_good_rows(planned, stage.branch, self.table, self._evolve, routes)
        if planned.ranges:  # what the table cannot follow of this batch's own writer schemas (json: the spec)
            self.schemas.plan(self.table.schema(), stats.writers)
        clock.mark("write")
        self.planner.check_topics_unchanged(planned)
        return WrittenBatch(planned, stats, clock)

    def _rewrite(
        self, planned: PlannedBatch, clock: PhaseClock
    ) -> tuple[Stage, WrittenBatch, Sequence[RouteStage]]:
        """Write the batch again on a fresh stage (the commit below, if any, has landed): its first write
        met writer schemas it was not decoded with (`icefall.decode.known_writers`); that write is dropped
        with the snapshot it staged, and is never committed. Routed: every route table's branch is pointed
        back at its head the same way (`Routing.stage`), and written again."""
        log.info("%s: the batch met new writer schemas; it is written again with them", self.label)
        metrics.INGEST_BATCHES_REWRITTEN.labels(self.label).inc()
        stage = self.commits.restage(self.table)
        routing = self.writer.routing
        routes = routing.stage(stage.branch, planned) if routing is not None else []
        return stage, self._write(planned, stage, clock, routes), routes

    def _evolve(self, writers: Writers | None) -> Schema:
        """Make the table hold the spec's fields and the writer schemas the batch is decoded with
        (`icefall.decode.schemas`) before the batch is written; the table's schema."""
        if self.schemas.evolution(self.table.schema(), writers).changes:
            # Planned again on the metadata each attempt loads.
            evolution = evolve_schema(
                self.table, lambda schema: self.schemas.evolution(schema, writers), self.commits.epoch
            )
            if evolution.changes:
                self.schemas.committed(evolution)
        columns = self.table.schema()
        routing = self.writer.routing
        for i, route_table in enumerate(routing.tables if routing is not None else []):
            # The route tables hold the table's columns (every field it has, whichever writer schema or
            # spec added it, also one a table created or added later never met): the same fields added.
            # A route with its own schema holds that schema's.
            wanted = routing.own.columns(i) if routing is not None and i in routing.own else columns
            if _following(route_table.schema(), wanted).changes:
                evolve_schema(route_table, functools.partial(_following, columns=wanted), self.commits.epoch)
        return columns

    def _land_below(self, flight: InFlight) -> LandedBelow:
        """Wait for the commit in flight below this batch: how it ended, its report, its error."""
        try:
            report = self.land(flight)
        except Exception as refused:
            return LandedBelow(Below.REFUSED, (), refused)
        return LandedBelow(Below.RESTAGED if flight.restaged else Below.LANDED, (report,))

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

    def _commit_here(
        self, written: WrittenBatch, stage: Stage, batch: SourceBatch, routes: Sequence[RouteStage] = ()
    ) -> Landed:
        """Commit the route tables' parts (if any), the batch's dead letters (if any), then the batch, on
        this thread: the table last, so that every other destination stands at or past its offsets."""
        planned, bad, clock = written.planned, written.stats.dead, written.clock
        routing, routed = self.writer.routing, 0
        if routing is not None:
            routed = routing.commit(
                list(routes),
                batch,
                self.commits.epoch,
                self.commits.check_lease,
                deleted_keys=written.stats.routes_deleted_keys,
                files=written.stats.routes_files,
            )
            if routing.unrouted is Unrouted.DEAD_LETTER:  # nothing was written to the table
                stage_empty(self.table, stage.branch, stage.base.snapshot_id)
            clock.mark("routes")
        dead = NO_DEAD_LETTERS
        if bad:
            branch, epoch = self.commits.stage_branch, self.commits.epoch
            dead = self.dead_letters.commit(batch, planned, bad, branch=branch, epoch=epoch)
        clock.mark("dead_letters")
        snapshot_id, commit_seconds = self.commits.commit(self.table, stage, batch, written)
        clock.mark_stage_and_commit(commit_seconds)
        return Landed(snapshot_id, commit_seconds, dead, routed)

    def _pace(self, pipeline: bool) -> Pace:
        return Pace(
            # A routed table commits every destination before it reads the next batch.
            pipelined=pipeline and self.spec.batch.pipelined and not self.spec.routed,
            freshness_target_seconds=self.spec.freshness.target_seconds,
            min_interval_seconds=float(self.spec.batch.min_interval_seconds),
            throughput_rps=self.reporter.progress.throughput_rps,
        )

    # -- after a failed step --------------------------------------------------------------------------

    def refused(self, refused: StaleHeadError | FencedError) -> None:
        """A commit was refused: count it (the dead letters it may have left stay: the next batch's
        dead-letter commit skips them)."""
        reason = "fenced" if isinstance(refused, FencedError) else "stale_head"
        metrics.COMMITS_REFUSED.labels(self.label, reason).inc()
        if isinstance(refused, MaintenanceConflictError):
            metrics.INGEST_COMMITS_FAILED_BY_MAINTENANCE.labels(self.label).inc()

    def outage(self) -> None:
        """A step stopped anywhere in an outage: staging branches may be left too, and are swept before the
        next batch is planned."""
        self._left = self._left.after_failure(outage=True)

    def _sweep_after_outage(self) -> None:
        """Drop the staging branches an outage left (this writer holds the lease: no batch of another writer
        is in flight), so they do not pin files until the next start."""
        routed = self.writer.routing.tables if self.writer.routing is not None else []
        # (The dead-letter table's sweep passes the `main.` failpoint here, as it always did.)
        tables: list[tuple[Table | None, TableRole]] = [
            (self.table, "main"),
            (self.dead_letters.table, "main"),
        ]
        for table, role in [*tables, *((t, "route") for t in routed)]:
            if table is not None:
                dropped = sweep_stages(table, role=role)
                if dropped:
                    metrics.STAGES_DROPPED.labels(".".join(table.name())).inc(len(dropped))
                    log.info("%s: dropped staging branches left by the outage: %s", self.label, dropped)


def _following(schema: Schema, columns: Schema) -> Evolution:
    """What a route table (`schema`) must change to hold the table's `columns`."""
    from icefall.catalog.evolution import plan_evolution
    from icefall.decode.schemas import OWN_COLUMNS

    return plan_evolution(
        schema, columns, source="the table's columns", relax_required=True, last=OWN_COLUMNS
    )


def _facts(written: WrittenBatch) -> Written:
    """What `plan.pipelining` needs to know of a written batch."""
    planned = written.planned
    stats = written.stats
    return Written(planned.records, planned.backlog, stats.dead, written.clock.started, stats.unseen_writers)
