"""What the Iceberg dead-letter table takes of a batch (`icefall.ingest.dead_letters.dead_letter_take`): the
routes' rule (`icefall.plan.routing.destination_takes`), sparse.

Proves: at the table's offsets it takes the batch as the table commits it (retention gap included); ahead
of the table (a crash after its commit and before the table's) it takes the rest of each partition from
its own offset, its rows below that offset skipped, and nothing (None: no commit) when it holds the whole
batch; behind the table (batches without bad records never commit it) it takes from its own offset and is
never refused, where a route table behind is; a partition or topic it never committed takes the batch's
range; in the topics form its commit is a `TopicsBatch` of the topics it takes.
"""

from __future__ import annotations

import pytest

from icefall.commit import Batch, TopicsBatch
from icefall.commit.state import CommittedState, TopicState
from icefall.ingest.dead_letters import dead_letter_take
from icefall.plan.routing import DestinationBehindError, Take, destination_take

pytestmark = pytest.mark.unit

BATCH = Batch(topic="t", start={0: 10, 1: 10}, end={0: 20, 1: 20}, topic_id="tid", max_produce_time_ms=7)


def held(offsets: dict[int, int]) -> CommittedState:
    return CommittedState(snapshot_id=3, topic="t", topic_id="tid", offsets=offsets)


def test_at_the_tables_offsets_it_takes_the_batch_as_the_table_commits_it() -> None:
    taken = dead_letter_take(BATCH, held({0: 10, 1: 10}), name="dlq")
    assert taken is not None
    commit, takes = taken
    assert commit == Batch(topic="t", start={0: 10, 1: 10}, end={0: 20, 1: 20}, topic_id="tid",
                           max_produce_time_ms=7)  # fmt: skip
    assert takes == {"t": Take({0: 10, 1: 10}, {0: 20, 1: 20})}
    gap = Batch(topic="t", start={0: 10}, end={0: 20}, retention_gaps={0: 4}, topic_id="tid")
    taken = dead_letter_take(gap, held({0: 4}), name="dlq")
    assert taken is not None and taken[0].retention_gaps == {0: 4}  # the table's lost records, its too


def test_ahead_of_the_table_it_skips_what_it_holds_and_is_never_rewound() -> None:
    # A crash after its commit of [10, 15) of partition 0 and all of partition 1; the batch read again.
    taken = dead_letter_take(BATCH, held({0: 15, 1: 20}), name="dlq")
    assert taken is not None
    commit, takes = taken
    assert (dict(commit.start), dict(commit.end)) == ({0: 15}, {0: 20})  # its commit starts at its offset
    assert takes == {"t": Take({0: 15}, {0: 20}, skip_below={0: 15})}  # its rows below 15 are not written
    assert dead_letter_take(BATCH, held({0: 20, 1: 25}), name="dlq") is None  # holds all: no commit


def test_behind_the_table_it_takes_from_its_own_offset_where_a_route_table_is_refused() -> None:
    # Batches without bad records left it at 4 and 10; the table is at 10 on both.
    taken = dead_letter_take(BATCH, held({0: 4, 1: 10}), name="dlq")
    assert taken is not None
    commit, takes = taken
    assert (dict(commit.start), dict(commit.end), dict(commit.retention_gaps)) == (
        {0: 4, 1: 10},
        BATCH.end,
        {},
    )
    assert takes["t"].skip_below == {}  # every bad row of the batch is its
    with pytest.raises(DestinationBehindError, match="partition 0 is committed up to 4"):
        destination_take(BATCH.start, BATCH.end, {}, {0: 4, 1: 10}, name="route")


def test_a_new_dead_letter_table_or_partition_takes_the_batchs_range() -> None:
    for dead in (CommittedState(snapshot_id=0), held({0: 10})):
        taken = dead_letter_take(BATCH, dead, name="dlq")
        assert taken is not None
        assert (dict(taken[0].start), dict(taken[0].end)) == (dict(BATCH.start), dict(BATCH.end))


def test_in_the_topics_form_it_commits_the_topics_it_takes() -> None:
    a = Batch(topic="a", start={0: 5}, end={0: 9}, topic_id="ida")
    b = Batch(topic="b", start={0: 3}, end={0: 6}, topic_id="idb")
    # It holds all of topic a; batches without bad records left it behind on topic b.
    dead = CommittedState(
        snapshot_id=3, topics={"a": TopicState("ida", {0: 9}), "b": TopicState("idb", {0: 1})}
    )
    taken = dead_letter_take(TopicsBatch((a, b)), dead, name="dlq")
    assert taken is not None
    commit, takes = taken
    assert isinstance(commit, TopicsBatch) and [p.topic for p in commit.parts] == ["b"]
    assert (dict(commit.parts[0].start), dict(commit.parts[0].end)) == ({0: 1}, {0: 6})
    assert set(takes) == {"b"}
