"""What one step of a writer leaves behind, as values: what each destination table took (`Landed`,
`DeadLettersLanded`) and what must be cleaned before the next batch is planned (`Cleanup`). Each step
returns them with its reports (`icefall.ingest.batches.StepOutcome`); no flag elsewhere says it.

A step that raises returns nothing: the writer then assumes the worst it can have left
(`Cleanup.after_failure`: dead letters committed ahead of a main commit that did not land; after an outage
staging branches too), and the next step cleans that first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Cleanup:
    """What the next step must clean before it plans a batch."""

    #: The dead-letter table may be ahead of the main table (its commit landed, the main one maybe not):
    #: rewound to the main table's offsets (`DeadLetters.reconcile`) before the next batch is written.
    dead_letters: bool = False
    #: An outage may have left staging branches (of both tables): swept before the next batch is planned.
    stages: bool = False

    def after_failure(self, *, outage: bool = False) -> Cleanup:
        """What is left to clean once a step raised: this, plus the dead letters (and the staging branches,
        for an outage) it may have left."""
        return replace(self, dead_letters=True, stages=self.stages or outage)


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
