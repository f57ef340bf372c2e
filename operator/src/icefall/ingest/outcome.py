"""What one step of a writer leaves behind, as values: what each destination table took (`Landed`,
`DeadLettersLanded`) and what must be cleaned before the next batch is planned (`Cleanup`). Each step
returns them with its reports (`icefall.ingest.batches.StepOutcome`); no flag elsewhere says it.

A step that raises returns nothing: the writer then assumes the worst it can have left
(`Cleanup.after_failure`: after an outage, staging branches), and the next step cleans that first. Dead
letters committed ahead of a main commit that did not land need no cleaning: the dead-letter table is a
destination that skips what it holds (`icefall.ingest.dead_letters`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Cleanup:
    """What the next step must clean before it plans a batch."""

    #: An outage may have left staging branches (of both tables): swept before the next batch is planned.
    stages: bool = False

    def after_failure(self, *, outage: bool = False) -> Cleanup:
        """What is left to clean once a step raised: this, plus the staging branches an outage may have
        left."""
        return replace(self, stages=self.stages or outage)


NOTHING_TO_CLEAN = Cleanup()


@dataclass(frozen=True)
class DeadLettersLanded:
    """The dead-letter destination of one batch: what its commit (before the main one) took."""

    rows: int = 0  # bad records of the batch (in the dead-letter table, if the spec has one)
    kinds: Mapping[str, int] = field(default_factory=dict)  # those by kind of reason


NO_DEAD_LETTERS = DeadLettersLanded()


@dataclass(frozen=True)
class Landed:
    """The main destination of one batch: how its commit landed, its dead letters and its routes' rows."""

    snapshot_id: int
    commit_seconds: float
    dead_letters: DeadLettersLanded = NO_DEAD_LETTERS
    routed: int = 0  # rows the route tables' commits added (`spec.routes`), before the main one
