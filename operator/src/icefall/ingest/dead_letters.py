"""A batch's bad records: committed to the dead-letter table (and produced to the dead-letter topic) before
the batch's main commit.

The dead-letter table is one more destination of the batch (commit/DESIGN.md, "Several destinations of one
batch"): its commit takes what `plan.routing.destination_takes` gives it against its own offsets
(`dead_letter_take`), so after a crash between its commit and the main one it is ahead, and the batch read
again skips what it holds; it is never rewound. It is *sparse*: only batches with bad records commit it, so
it may stand behind the table too, and then takes from its own offset.

Guarantees: dead letters are committed with the same protocol as the table (a staging branch, a
compare-and-swap with the writer's epoch); each bad record is in the dead-letter table once, under the
spec that found it bad; a batch whose second read gives another number of bad rows than its first is
refused (StaleHeadError, nothing committed: the count is taken over the whole second read, before the rows
the dead-letter table holds are filtered out). Not guaranteed: the dead-letter table never holds rows of a
batch whose main commit then failed (it keeps them; the table takes that batch again); with a spec changed
between that failure and the retry, a record of the range it holds is in both tables (bad before, good
now) or in neither (good before, bad now; on the dead-letter topic only); the dead-letter topic is
at-least-once (deduplicated downstream by `icefall.dedupe-key`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from icefall.commit import (
    CommittedState,
    SourceBatch,
    StaleHeadError,
    abandon_stage,
    commit_staged_outcome,
    prepare_stage,
    read_committed,
)
from icefall.commit.batch import held_of
from icefall.ingest.commits import count_restage, dropped_unless_committed
from icefall.ingest.outcome import DeadLettersLanded
from icefall.ingest.routes import destination_batch, taken_filter
from icefall.ingest.writer import append
from icefall.kafka.dead_letters import Source as DeadLetterSource
from icefall.kafka.dead_letters import produce_dead_letters
from icefall.plan.routing import Take, TopicRange, destination_takes
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
    metrics (`icefall.decode.decode.REASON_KINDS`)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.decode.decode import reason_kind

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
        """Read the batch's offsets again and commit its `expected` bad rows (with their error text) that the
        dead-letter table does not hold yet, on staging branch `branch`, then produce all of them to the
        dead-letter topic (if the spec names one); both before the main commit, which must follow. Returns
        how many bad rows the batch has, and how many of each kind."""
        bad = self.writer.bad_rows(planned.ranges).persist()
        try:
            dead = self._write(bad, batch, expected, branch=branch, epoch=epoch)
            kinds = reason_kinds(bad)
            if dead and self.spec.dead_letter.topic is not None:
                produce_batch(bad, planned, self.spec, epoch, self._kafka_config)
                failpoint("dlq-topic.after-produce")
        finally:
            bad.unpersist()
        return DeadLettersLanded(dead, kinds)

    def _write(self, bad: DataFrame, batch: SourceBatch, expected: int, *, branch: str, epoch: int) -> int:
        """Commit the rows of `bad` the dead-letter table does not hold (`dead_letter_take`); refused
        (StaleHeadError, nothing committed) if reading the offsets again gave another number than
        `expected` of bad rows (counted over all of `bad`, the rows it holds included)."""
        if expected == 0 or self.table is None:
            return expected
        dlq, label = self.table, ".".join(self.identifier)
        if dead_letter_take(batch, read_committed(dlq), name=label) is None:
            # A crash after its commit and before the main one: it holds every bad row of the batch (no
            # staging branch made, nothing committed).
            log.warning("%s: the dead-letter table holds the batch's dead letters already", self.label)
            check_count(bad.count(), expected)
            return expected
        stage = prepare_stage(dlq, branch, role="dlq", refresh=False)  # read just now
        taken = dead_letter_take(batch, stage.base, name=label)
        if taken is None:  # committed meanwhile: only by another writer, whose epoch fences this one
            abandon_stage(dlq, stage.branch, role="dlq")
            raise StaleHeadError(f"{label} moved while its dead letters were staged; planning again")
        dlq_batch, takes = taken
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        observation = Observation()
        # Counted before the filter: the count check compares the whole second read with the first.
        observed = bad.observe(observation, F.count(F.lit(1)).alias("rows"))
        kept = observed.where(taken_filter(takes, by_topic=batch.by_topic))
        with dropped_unless_committed(dlq, stage.branch, label, "dlq"):
            append(kept, self.writer.spark_name(self.identifier, stage.branch), sorted_table=False)
            check_count(int(observation.get["rows"]), expected)
            # Dead letters come now and then: a branch left behind would pin old snapshots meanwhile.
            outcome = commit_staged_outcome(dlq, stage, dlq_batch, epoch, keep_branch=False)
        count_restage(label, outcome)
        return expected


def check_count(found: int, expected: int) -> None:
    """Refuse a second read whose number of bad records is not the first's (StaleHeadError, planned again)."""
    if found != expected:
        raise StaleHeadError(
            f"reading the batch again gave {found} bad records, not {expected}; planning again"
        )


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


def dead_letter_take(
    batch: SourceBatch, dead: CommittedState, *, name: str
) -> tuple[SourceBatch, Mapping[str, Take]] | None:
    """The dead-letter table's part of `batch` (the table's) against what it holds (`dead`): its commit and
    its takes by topic (which rows it writes), from `plan.routing.destination_takes` as for any destination,
    sparse (behind the batch's start: from its own offset); None when it holds all of the batch."""
    ranges = [TopicRange(part.topic, part.start, part.end, part.retention_gaps) for part in batch.parts]
    held = {part.topic: held_of(dead, part.topic).offsets for part in batch.parts}
    takes = destination_takes(ranges, held, name=name, by_topic=batch.by_topic, sparse=True)
    if not takes:
        return None
    return destination_batch(batch, takes), takes
