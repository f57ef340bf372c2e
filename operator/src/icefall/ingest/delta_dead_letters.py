"""The dead-letter table of a Delta table (`spec.table.format: delta`): a second Delta table beside it
(`dead_letter_location`: the table's folder's sibling named as `spec.deadLetter.table.name`, default
`<table>_dlq`), filled exactly once by the same commit protocol (`icefall.commit.delta`).

A batch with bad records reads its offsets again (`BatchWriter.bad_rows`: the records that do not decode,
with their error text) and commits them to the dead-letter table, with the batch's offsets in its own
`icefall.*` state, BEFORE the table's commit. A crash between the two leaves the dead-letter table ahead
of the table; the batch is then read again from the table's offsets, and the dead-letter table takes only
what it does not hold (`icefall.ingest.dead_letters.dead_letter_take`, the Iceberg dead-letter table's: each
partition from its own offset, never below; nothing when it holds the whole batch) — the rule of route
tables (commit/DESIGN.md, "Several destinations of one batch"), so no rewind is needed.

With `spec.deadLetter.topic` the same second read is then sent to the topic (`produce_batch`, as for an
Iceberg table), all of the batch's bad records whatever the dead-letter table took (a crash after its
commit and before the send would otherwise lose them), still before the table's commit; a table whose
dead-letter table is disabled sends them to the topic only.

Guarantees: each bad record is in the dead-letter table once (its rows and offsets move in one Delta
commit, planned from the offsets it holds); a writer whose epoch a newer one claimed cannot commit to it
(the epoch is claimed in it at start); a second read giving another number of bad records than the first
commits nothing to it (StaleHeadError: the batch is planned again); the table commits a batch only once
the dead-letter topic acknowledged as many bad records as the first read found. Not guaranteed: the
dead-letter table never briefly holds the records of a batch whose table commit then failed (it holds
them; the table gets them again with the next batch, without its bad ones twice); the dead-letter topic
is at least once, as an Iceberg table's (`icefall.kafka.dead_letters`): a crash between its send and the
table's commit sends the batch's bad records again, with the same `icefall.dedupe-key`.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from icefall.commit.batch import SourceBatch
from icefall.commit.delta import DeltaLog, claim_epoch, commit_batch, create_table, moved_into
from icefall.commit.delta_storage import is_object_store, local_path
from icefall.ingest.dead_letters import check_count, dead_letter_take, produce_batch, reason_kinds
from icefall.ingest.outcome import DeadLettersLanded
from icefall.ingest.routes import taken_filter
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from icefall.api import StreamingTable
    from icefall.ingest.planning import PlannedBatch
    from icefall.ingest.writer import BatchWriter

STAGING_DIR = "_icefall_staging"


def dead_letter_location(st: StreamingTable, location: str) -> str | None:
    """Where the dead-letter table of the Delta table at `location` lives (None: the spec has none)."""
    identifier = st.dead_letter_identifier
    if identifier is None:
        return None
    if is_object_store(location):
        return f"{location.rstrip('/').rsplit('/', 1)[0]}/{identifier[-1]}"
    return str(local_path(location).parent / identifier[-1])


class DeltaDeadLetters:
    """One writer's dead letters (module doc): the dead-letter table at `location` (None: the spec has none)
    and the topic (if the spec names one). `start(epoch)` once, then `commit` per batch."""

    def __init__(self, writer: BatchWriter, location: str | None, kafka_config: Mapping[str, str]) -> None:
        """`kafka_config`: librdkafka settings of the dead-letter topic's producer (secrets: never logged)."""
        self.writer = writer
        self.log = DeltaLog(location) if location is not None else None
        self._kafka_config = kafka_config

    def start(self, epoch: int) -> None:
        """Create the dead-letter table (the columns of bad rows) if needed, claim `epoch` in it, drop the
        staging folders a crashed writer left."""
        from icefall.decode.decode import bad_rows

        if self.log is None:
            return
        decoded = self.writer.decoders.with_errors.decode(self.writer.empty_source(), None)
        schema = bad_rows(decoded, by_topic=self.writer.spec.source.by_topic).schema.json()
        create_table(self.log, schema, epoch, role="dlq")
        claim_epoch(self.log, epoch, role="dlq")
        shutil.rmtree(self.log.staging_root(STAGING_DIR), ignore_errors=True)

    def commit(
        self, batch: SourceBatch, planned: PlannedBatch, expected: int, epoch: int
    ) -> DeadLettersLanded:
        """Read the batch's bad records again; commit the `expected` ones the dead-letter table does not hold
        yet, then send all of them to the dead-letter topic; both before the table's commit, which must
        follow. The batch's dead letters, by kind of reason. StaleHeadError (the table's commit must not
        follow) if the second read found another number (then nothing went to the dead-letter table)."""
        spec = self.writer.spec
        bad = self.writer.bad_rows(planned.ranges).persist()  # one Kafka read for the table and the topic
        try:
            if self.log is not None:
                self._commit_table(self.log, bad, batch, expected, epoch)
            if spec.dead_letter.topic is not None:
                sent = produce_batch(bad, planned, spec, epoch, self._kafka_config)
                check_count(sent, expected)
                failpoint("dlq-topic.after-produce")
            return DeadLettersLanded(expected, reason_kinds(bad))
        finally:
            bad.unpersist()

    def _commit_table(
        self, log: DeltaLog, bad: DataFrame, batch: SourceBatch, expected: int, epoch: int
    ) -> None:
        """Commit the rows of `bad` that the dead-letter table `log` does not hold yet (none: nothing is
        committed)."""
        planned_on = log.snapshot()
        taken = dead_letter_take(batch, planned_on.committed, name=log.location)
        if taken is None:  # it holds the whole batch (a crash after its commit and before the table's)
            found = bad.count()
            check_count(found, expected)
            return
        take, takes = taken
        staging = log.staging_root(STAGING_DIR) / uuid.uuid4().hex
        try:
            found = self._write(bad, taken_filter(takes, by_topic=take.by_topic), staging)
            check_count(found, expected)
            files = moved_into(staging, log, planned_on.metadata)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        commit_batch(log, planned_on, take, epoch, files, role="dlq")
        failpoint("dlq.after-commit")

    def _write(self, bad: DataFrame, kept: Column, staging: Path) -> int:
        """Write the rows of `bad` that `kept` holds into `staging`; how many bad rows `bad` held (counted
        before the filter)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        observation = Observation()
        observed = bad.observe(observation, F.count(F.lit(1)).alias("rows"))
        observed.where(kept).write.parquet(str(staging))
        return int(observation.get["rows"])
