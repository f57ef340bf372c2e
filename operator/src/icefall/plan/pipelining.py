"""Pipelining of ingestion batches: which batch's commit runs on the commit thread while the next batch is
written on top of it, and what becomes of that next batch. Pure: the clock is an argument.

A writer is in one of two states; each step plans, reads and writes one batch, then:

    SERIAL ── written, clean, next batch due ──► IN_FLIGHT     (PIPELINE: commit on the commit thread)
    SERIAL ── written, otherwise ──────────────► SERIAL        (COMMIT: here, dead letters first)
    IN_FLIGHT: the batch is planned from the state the commit below gives the table and appended on top of
    its staged snapshot; then the commit below is waited for, and by how it ended (`Below`):
      LANDED   → as from SERIAL: COMMIT, or PIPELINE again
      RESTAGED → DISCARD: the batch sits on a snapshot that never landed; it is planned again from the table
      REFUSED  → DROP: the batch goes with its branch and the refusal is raised, as without pipelining
    A batch whose records carry a schema id the writer had not met, with a writer schema in the registry
    (`icefall.decode.known_writers`), was decoded without that schema: once the commit below landed (or
    there was none) it is REWRITTEN (its branch moved back, the batch written again with the new writer
    schema), then decided again; below RESTAGED or REFUSED, DISCARD and DROP come first.
    IN_FLIGHT ── nothing to read ─────────────► SERIAL         (the commit below is waited for and reported)
    IN_FLIGHT ── the step fails before waiting for it ─► SERIAL (it is still waited for: it may land;
                                                                 the step's error is raised)

Only a clean batch (no bad records) is pipelined: dead letters are committed before their batch's main
commit, on the writer's thread. A batch is pipelined only when a next batch at least as large is waiting
and the pacing (`plan.batching.next_batch_delay`) would start it at once; with less left, waiting for the
commit lets the next batch take what arrives meanwhile: fewer, larger batches.

Not decided here: whether a commit is refused (`icefall.commit`), and how long the writer waits between
batches when nothing is in flight (`plan.batching`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from icefall.plan.batching import next_batch_delay


class Below(StrEnum):
    """How the commit of the batch below (the one in flight) ended."""

    NONE = "none"  # there was none: the writer was SERIAL
    LANDED = "landed"  # committed as staged
    RESTAGED = "restaged"  # committed, but re-staged over maintenance: another snapshot than staged on
    REFUSED = "refused"  # raised (StaleHeadError, FencedError, an outage): nothing known to have landed


class Action(StrEnum):
    """What a step does with the batch it has just written."""

    COMMIT = "commit"  # commit it here (its dead letters first), then report it
    PIPELINE = "pipeline"  # start its commit on the commit thread; the next step writes on top of it
    DISCARD = "discard"  # drop it with its branch, counted as discarded; plan again from the table
    DROP = "drop"  # drop it with its branch and raise the commit below's error
    REWRITE = "rewrite"  # write it again on a fresh stage: it met a writer schema it was not decoded with


@dataclass(frozen=True)
class Pace:
    """The pacing inputs of the decision: the writer's settings and its throughput so far."""

    pipelined: bool  # `spec.batch.pipelined`, and the caller runs a loop (not one batch at a time)
    freshness_target_seconds: float
    min_interval_seconds: float
    throughput_rps: float | None


@dataclass(frozen=True)
class Written:
    """A batch written to its staging branch, not committed yet."""

    records: int  # offsets it read
    backlog: int  # records waiting in Kafka when it was planned (its own among them)
    bad: int  # bad records (dead letters) among them
    started: float  # when its step started, on the clock `now` is read from
    unseen_writers: bool = False  # it holds records of a writer schema it was not decoded with


def next_is_due(written: Written, pace: Pace, *, now: float) -> bool:
    """Whether a next batch as large as `written` is waiting and the pacing starts it at once."""
    left = written.backlog - written.records
    return left >= max(written.records, 1) and not next_batch_delay(
        now=now,
        last_batch_started_at=written.started,
        backlog_records=left,
        throughput_rps=pace.throughput_rps,
        freshness_target_seconds=pace.freshness_target_seconds,
        min_interval_seconds=pace.min_interval_seconds,
        last_batch_seconds=now - written.started,
    )


def after_write(below: Below, written: Written, pace: Pace, *, now: float) -> Action:
    """What to do with `written`, once the commit below it (if any) ended as `below`."""
    if below is Below.REFUSED:
        return Action.DROP
    if below is Below.RESTAGED:
        return Action.DISCARD
    if written.unseen_writers:
        return Action.REWRITE
    if pace.pipelined and not written.bad and next_is_due(written, pace, now=now):
        return Action.PIPELINE
    return Action.COMMIT
