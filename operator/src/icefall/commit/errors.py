"""Why a commit was refused. Every refusal leaves `main` and the committed offsets exactly as they were."""

from __future__ import annotations


class CommitError(RuntimeError):
    """Base of every refusal by the commit protocol."""


class StaleHeadError(CommitError):
    """The compare-and-swap lost: `main` is no longer the head the batch was planned from.

    Someone else committed in between. Re-read the committed state and plan again; the staged batch is
    useless (its rows may already be in the table) and should be abandoned.
    """


class MaintenanceConflictError(StaleHeadError):
    """`main` moved only by maintenance commits (compaction, retention, manifest rewrites), yet the batch
    could not be re-staged on top of them: the schema or partition spec changed, the stage is not one plain
    append, or maintenance kept committing. Plan again, as for any StaleHeadError; counted apart, because
    these are the ingestion commits that failed because of maintenance.
    """


class StageExpiredError(StaleHeadError):
    """The batch is too old to commit safely, or a file it names was removed before its commit: orphan
    removal takes files no metadata references once they are older than its window, and a batch's files
    are referenced by nothing until it lands (a writer held past the window, or clocks apart). Plan and
    write the batch again, as for any StaleHeadError; the table never names a file that is gone.
    """


class ClockBehindError(CommitError):
    """This host's clock is behind the table's last update by more than Iceberg tolerates: metadata written
    now would carry a `last-updated-ms` over a minute before its metadata log's last entry, and Iceberg
    Java (Spark, Trino, Flink) refuses to read such a table ("Invalid update timestamp"). Nothing was
    written; wait for the clock to pass the table's last update (it does by itself) and fix the clock."""


class FencedError(CommitError):
    """The writer's lease epoch is below the table's: a newer writer has taken over. Stop writing."""


class OffsetGapError(CommitError):
    """The batch does not start where the table's committed offsets end (a gap or an overlap)."""


class TopicMismatchError(CommitError):
    """The batch comes from another topic than the one this table was filled from."""


class StageError(CommitError):
    """The staging branch is missing, empty, or holds something other than one batch on the planned head."""


class CorruptStateError(CommitError):
    """The table's `icefall.*` properties cannot be read; someone edited them by hand."""


class LayoutChangedError(CommitError):
    """The table's partitioning is not the spec's (a Delta table's partitionColumns never change): the
    batch would write files the table cannot hold. Says both and the fix."""


class ObjectStoreUnreachableError(OSError):
    """A request Icefall sends to an object store itself (a Delta log's conditional create, a listing of its
    tail) got no answer: refused, reset or timed out. An outage, waited out like pyarrow's own failures; an
    OSError, as every other failure of a store is."""
