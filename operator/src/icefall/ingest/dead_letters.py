"""A batch's bad records: committed to the dead-letter table (and produced to the dead-letter topic) before
the batch's main commit, and dropped again if that main commit never lands.

Guarantees: dead letters are committed with the same protocol as the table (a staging branch, a
compare-and-swap with the writer's epoch); a batch whose second read gives another number of bad rows is
refused (StaleHeadError, nothing committed); dead letters past the main table's offsets are removed
(`reconcile`) before the next batch whenever a batch may have left them (the step's
`icefall.ingest.outcome.Cleanup` says when). Not guaranteed: the
dead-letter table never briefly holds rows of a batch whose main commit then failed; the dead-letter topic
is at-least-once (deduplicated downstream by `icefall.dedupe-key`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from icefall.commit import (
    Batch,
    CommittedState,
    SourceBatch,
    StaleHeadError,
    TopicsBatch,
    abandon_stage,
    commit_staged_outcome,
    prepare_stage,
    read_committed,
    rewind_dead_letter_topics,
)
from icefall.commit.batch import held_of
from icefall.ingest.commits import count_restage, dropped_unless_committed
from icefall.ingest.outcome import DeadLettersLanded
from icefall.ingest.writer import append
from icefall.kafka.dead_letters import Source as DeadLetterSource
from icefall.kafka.dead_letters import produce_dead_letters
from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame

    from icefall.api import StreamingTable, StreamingTableSpec
    from icefall.ingest.planning import PlannedBatch
    from icefall.ingest.writer import BatchWriter

log = logging.getLogger(__name__)


def reason_kinds(bad: DataFrame) -> dict[str, int]:
    """How many of the dead-letter rows `bad` (cached: one small job) have each kind of reason, for the
    metrics (`icefall.ingest.decode.REASON_KINDS`)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.ingest.decode import reason_kind

    counted = bad.groupBy(reason_kind(F.col("error")).alias("kind")).count().collect()
    return {row["kind"]: int(row["count"]) for row in counted}


class DeadLetters:
    """One writer's dead letters: the table (None if the spec has none) and the topic (if named)."""

    def __init__(
        self, st: StreamingTable, writer: BatchWriter, table: Table | None, kafka_config: Mapping[str, str]
    ) -> None:
        """`kafka_config`: librdkafka settings of the dead-letter topic's producer (secrets: never logged)."""
        self.spec = st.spec
        self.identifier = st.dead_letter_identifier or ()
        self.label = ".".join(st.table_identifier)
        self.table = table
        self.writer = writer
        self._kafka_config = kafka_config

    def commit(
        self, batch: SourceBatch, planned: PlannedBatch, expected: int, *, branch: str, epoch: int
    ) -> DeadLettersLanded:
        """Read the batch's offsets again and commit its `expected` bad rows (with their error text) to the
        dead-letter table on staging branch `branch`, then produce them to the dead-letter topic (if the
        spec names one); both before the main commit, which must follow: until it lands the dead-letter
        table is ahead of the main table. Returns how many there were, and how many of each kind."""
        bad = self.writer.bad_rows(planned.ranges).persist()
        try:
            dead = self._write(bad, batch, planned.committed, expected, branch=branch, epoch=epoch)
            kinds = reason_kinds(bad)
            if dead and self.spec.dead_letter.topic is not None:
                produce_batch(bad, planned, self.spec, epoch, self._kafka_config)
                failpoint("dlq-topic.after-produce")
        finally:
            bad.unpersist()
        return DeadLettersLanded(dead, kinds)

    def _write(
        self,
        bad: DataFrame,
        batch: SourceBatch,
        committed: CommittedState,
        expected: int,
        *,
        branch: str,
        epoch: int,
    ) -> int:
        """Commit the `expected` rows of `bad` to the dead-letter table; refused (StaleHeadError, nothing
        committed) if reading the offsets again gave another number of bad rows."""
        if expected == 0 or self.table is None:
            return expected
        dlq = self.table
        stage = prepare_stage(dlq, branch, role="dlq")
        ahead = ahead_of(stage.base, committed)
        if ahead:
            # Dead letters of a batch whose main commit never landed (a writer fenced mid-batch, say):
            # writing on top would put their records in the dead-letter table twice.
            abandon_stage(dlq, stage.branch, role="dlq")
            raise StaleHeadError(f"the dead-letter table is ahead of the table at {ahead}; rewind it first")
        dlq_batch = dead_letter_batch(batch, stage.base)
        label = ".".join(self.identifier)
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        observation = Observation()
        observed = bad.observe(observation, F.count(F.lit(1)).alias("rows"))
        with dropped_unless_committed(dlq, stage.branch, label, "dlq"):
            append(observed, self.writer.spark_name(self.identifier, stage.branch), sorted_table=False)
            written = int(observation.get["rows"])
            if written != expected:
                raise StaleHeadError(
                    f"reading the batch again gave {written} bad records, not {expected}; planning again"
                )
            # Dead letters come now and then: a branch left behind would pin old snapshots meanwhile.
            outcome = commit_staged_outcome(dlq, stage, dlq_batch, epoch, keep_branch=False)
        count_restage(label, outcome)
        return expected

    def reconcile(self, main: Table, epoch: int) -> bool:
        """Drop dead-letter rows past the main table's offsets: left by a batch whose main commit failed.

        The delete and the offsets (of every topic) move in one commit of `icefall.commit`
        (`rewind_dead_letter_topics`), refused with FencedError if a newer writer has committed to the
        dead-letter table. Returns whether the dead-letter table was ahead.
        """
        if self.table is None:
            return False
        committed = read_committed(main)
        dead = read_committed(self.table)
        ahead = ahead_of(dead, committed)
        if not ahead:
            return False
        targets = {
            (topic if dead.topics is not None else None): {
                p: held_of(committed, topic).offsets.get(p, 0) for p in partitions
            }
            for topic, partitions in ahead.items()
        }
        log.warning(
            "%s: dropping dead letters of uncommitted batches from %s", self.label, targets.get(None, targets)
        )
        rewind_dead_letter_topics(self.table, targets, epoch)
        return True


def produce_batch(
    bad: DataFrame,
    planned: PlannedBatch,
    spec: StreamingTableSpec,
    epoch: int,
    kafka_config: Mapping[str, str],
) -> int:
    """Send a batch's dead letters `bad` to `spec.deadLetter.topic` (`icefall.kafka.dead_letters`), for an
    Iceberg or a Delta table; how many. Before the table's commit: at least once, deduplicated downstream by
    `icefall.dedupe-key`. Each record's headers name its own topic (several topics: one send per topic)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    topic = spec.dead_letter.topic
    if topic is None:
        return 0
    return sum(
        produce_dead_letters(
            bad.where(F.col("topic") == part.topic) if planned.by_topic else bad,
            bootstrap=spec.source.bootstrap_servers,
            topic=topic,
            source=DeadLetterSource(part.topic, part.topic_id, epoch),
            kafka_config=kafka_config,
        )
        for part in planned.parts
    )


def ahead_of(dead: CommittedState, main: CommittedState) -> dict[str, dict[int, int]]:
    """Per topic, the partitions whose dead-letter offset `dead` is past the main table's `main`."""
    ahead: dict[str, dict[int, int]] = {}
    for topic, held in dead.by_topic().items():
        done = held_of(main, topic).offsets
        past = {p: o for p, o in held.offsets.items() if o > done.get(p, 0)}
        if past:
            ahead[topic] = past
    return ahead


def dead_letter_batch(batch: SourceBatch, dead: CommittedState) -> SourceBatch:
    """The dead-letter table's commit of `batch`: the same ends, each partition from the dead-letter table's
    own offset (batches without bad records leave it alone, so it may start further back)."""
    parts = tuple(
        Batch(
            topic=part.topic,
            start={p: held_of(dead, part.topic).offsets.get(p, s) for p, s in part.start.items()},
            end=dict(part.end),
            max_produce_time_ms=part.max_produce_time_ms,
            topic_id=part.topic_id,
        )
        for part in batch.parts
    )
    return TopicsBatch(parts) if batch.by_topic else parts[0]
