"""The commit protocol and leases — the one place that decides what is in the table (see DESIGN.md here).

Typical use by an ingestion loop holding the table's commit lease:

    epoch = lease.acquire()
    sweep_stages(table)                                   # leftovers of crashed attempts
    stage = prepare_stage(table, stage_branch_name(writer_id, "stage"))  # one branch per writer, reused
    batch = Batch(topic, start=..., end=...)              # start from stage.base.offsets
    ... write the batch's rows to branch `stage.branch` (one append) ...
    commit_staged(table, stage, batch, epoch)             # or a CommitError: nothing committed

A writer that writes the batch's data files itself lands them with `commit_files(table, stage, batch,
epoch, written)` instead: the snapshot and the swap in one catalog commit (`icefall.commit.files`).

Pipelined, the next batch is written while a commit runs: `stage = staged_on(table, stage)`, then
`after = next_stage(stage, batch, epoch)`; commit `stage` on another thread while the next batch is
appended to the same branch, and commit that one with `after` once the first has landed.
"""

from icefall.commit.batch import (
    STAGE_PREFIX,
    Batch,
    CommitOutcome,
    SourceBatch,
    Stage,
    TopicsBatch,
    WrittenFiles,
    next_stage,
    retention_loss,
    stage_branch_name,
    state_after,
)
from icefall.commit.direct import (
    claim_epoch,
    evolve_schema,
    reset_offsets,
)
from icefall.commit.errors import (
    ClockBehindError,
    CommitError,
    CorruptStateError,
    FencedError,
    MaintenanceConflictError,
    OffsetGapError,
    StageError,
    StageExpiredError,
    StaleHeadError,
    TopicMismatchError,
)
from icefall.commit.files import commit_files
from icefall.commit.protocol import (
    abandon_stage,
    commit_staged,
    commit_staged_outcome,
    prepare_stage,
    staged_on,
    sweep_stages,
)
from icefall.commit.state import CommittedState, TopicState, read_committed, state_from_properties

__all__ = [
    "STAGE_PREFIX",
    "Batch",
    "ClockBehindError",
    "CommitError",
    "CommitOutcome",
    "CommittedState",
    "CorruptStateError",
    "FencedError",
    "MaintenanceConflictError",
    "OffsetGapError",
    "SourceBatch",
    "Stage",
    "StageError",
    "StageExpiredError",
    "StaleHeadError",
    "TopicMismatchError",
    "TopicState",
    "TopicsBatch",
    "WrittenFiles",
    "abandon_stage",
    "claim_epoch",
    "commit_files",
    "commit_staged",
    "commit_staged_outcome",
    "evolve_schema",
    "next_stage",
    "prepare_stage",
    "read_committed",
    "reset_offsets",
    "retention_loss",
    "stage_branch_name",
    "staged_on",
    "state_after",
    "state_from_properties",
    "sweep_stages",
]
