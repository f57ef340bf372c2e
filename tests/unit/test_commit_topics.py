"""The committed state of a table of several topics (`spec.source.topics`), and of one topic unchanged.

Proves: a table written by the one-topic form reads and writes exactly the properties it always had; the
topics form keeps offsets, start offsets and topic ids by topic, and a version that knows only the
one-topic form refuses its offsets instead of reading topics as partitions; each topic of a batch is
checked against what the table holds of that topic (offsets, id, retention gaps), and the two forms never
fill one table; a topic new to a table of several topics loses nothing by starting late.
"""

from __future__ import annotations

import pytest

from icefall.commit import (
    Batch,
    CommittedState,
    CorruptStateError,
    OffsetGapError,
    TopicMismatchError,
    TopicsBatch,
    TopicState,
    state_after,
    state_from_properties,
)
from icefall.commit.batch import check_source
from icefall.commit.state import (
    SchemaChange,
    decode_offsets,
    schema_change_at,
    schema_changes,
    with_schema_change,
)

pytestmark = pytest.mark.unit

#: What a one-topic table holds after some batches, as the versions before the topics form wrote it.
ONE_TOPIC = {
    "icefall.offsets": '{"0":12,"1":7}',
    "icefall.epoch": "3",
    "icefall.topic": "orders",
    "icefall.topic-id": "AAAAAAAAAAAAAAAAAAAAAA",
    "icefall.start-offsets": '{"0":0,"1":0}',
    "icefall.max-produce-time-ms": "1700000000000",
    "icefall.lost-records": "2",
}


def test_a_one_topic_table_reads_and_writes_the_properties_it_always_had() -> None:
    state = state_from_properties(ONE_TOPIC, snapshot_id=5)
    assert state.topics is None
    assert (state.topic, state.offsets, state.start_offsets) == ("orders", {0: 12, 1: 7}, {0: 0, 1: 0})
    assert state.to_properties() == ONE_TOPIC
    batch = Batch("orders", start={0: 12, 1: 7}, end={0: 20, 1: 7}, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    after = state_after(state, batch, epoch=3, snapshot_id=6)
    assert after.to_properties() == {**ONE_TOPIC, "icefall.offsets": '{"0":20,"1":7}'}
    assert after.by_topic() == {"orders": TopicState("AAAAAAAAAAAAAAAAAAAAAA", {0: 20, 1: 7}, {0: 0, 1: 0})}


def two_topics(**ends: dict[int, int]) -> TopicsBatch:
    return TopicsBatch(
        tuple(
            Batch(topic, start=dict.fromkeys(end, 0), end=end, topic_id=f"id-{topic}", max_produce_time_ms=n)
            for n, (topic, end) in enumerate(sorted(ends.items()))
        )
    )


def test_the_topics_form_keeps_offsets_start_offsets_and_ids_by_topic() -> None:
    first = state_after(
        CommittedState(snapshot_id=1), two_topics(eu={0: 4, 1: 2}, us={0: 3}), 1, snapshot_id=2
    )
    properties = first.to_properties()
    assert properties["icefall.offsets"] == '{"eu":{"0":4,"1":2},"us":{"0":3}}'
    assert properties["icefall.start-offsets"] == '{"eu":{"0":0,"1":0},"us":{"0":0}}'
    assert properties["icefall.topic-id"] == '{"eu":"id-eu","us":"id-us"}'
    assert "icefall.topic" not in properties
    assert properties["icefall.max-produce-time-ms"] == "1"
    assert state_from_properties(properties, snapshot_id=2) == first
    # The next batch reads one topic only: the other keeps its offsets.
    us = Batch("us", start={0: 3}, end={0: 9}, topic_id="id-us")
    second = state_after(first, TopicsBatch((us,)), 1, snapshot_id=3)
    assert second.of_topic("us").offsets == {0: 9}
    assert second.of_topic("eu") == first.of_topic("eu")
    assert second.of_topic("us").start_offsets == {0: 0}


def test_a_version_of_one_topic_refuses_the_offsets_of_several() -> None:
    properties = state_after(
        CommittedState(snapshot_id=1), two_topics(a={0: 1}), 1, snapshot_id=2
    ).to_properties()
    with pytest.raises(CorruptStateError):
        decode_offsets(properties["icefall.offsets"])


def test_each_topic_of_a_batch_is_checked_against_what_the_table_holds_of_it() -> None:
    held = state_after(CommittedState(snapshot_id=1), two_topics(a={0: 5}, b={0: 2}), 1, snapshot_id=2)
    check_source(held, TopicsBatch((Batch("a", {0: 5}, {0: 6}, topic_id="id-a"),)))
    with pytest.raises(OffsetGapError, match="committed up to 2"):
        check_source(held, TopicsBatch((Batch("a", {0: 5}, {0: 6}), Batch("b", {0: 1}, {0: 4}))))
    with pytest.raises(TopicMismatchError, match="recreated"):
        check_source(held, TopicsBatch((Batch("b", {0: 2}, {0: 4}, topic_id="another"),)))
    # A topic new to the table starts anywhere: it was not read before.
    check_source(held, TopicsBatch((Batch("c", {0: 40}, {0: 41}),)))


def test_the_two_forms_never_fill_one_table() -> None:
    one = state_from_properties(ONE_TOPIC, snapshot_id=5)
    with pytest.raises(TopicMismatchError, match="one topic"):
        check_source(one, TopicsBatch((Batch("orders", {0: 12}, {0: 13}),)))
    several = state_after(CommittedState(snapshot_id=1), two_topics(a={0: 5}), 1, snapshot_id=2)
    with pytest.raises(TopicMismatchError, match="several topics"):
        check_source(several, Batch("a", {0: 5}, {0: 6}))


def test_a_topic_new_to_a_table_loses_nothing_and_a_gap_of_a_known_one_is_counted() -> None:
    held = state_after(CommittedState(snapshot_id=1), two_topics(a={0: 5}), 1, snapshot_id=2)
    batch = TopicsBatch((Batch("a", {0: 9}, {0: 10}, retention_gaps={0: 5}), Batch("b", {0: 30}, {0: 31})))
    after = state_after(held, batch, 1, snapshot_id=3)
    assert after.lost_records == 4
    assert after.of_topic("b").start_offsets == {0: 30}


def test_schema_changes_of_a_table_of_several_topics_record_the_offsets_of_each() -> None:
    held = state_after(CommittedState(snapshot_id=1), two_topics(a={0: 5}, b={1: 2}), 1, snapshot_id=2)
    text = with_schema_change({}, schema_change_at(4, held))
    (change,) = schema_changes({"icefall.schema-changes": text})
    assert change == SchemaChange(4, {}, {"a": {0: 5}, "b": {1: 2}})
    assert change.offsets_of("b") == {1: 2}
    one = with_schema_change({}, schema_change_at(2, state_from_properties(ONE_TOPIC, 5)))
    assert one == '[{"schema-id":2,"offsets":{"0":12,"1":7}}]'  # as the one-topic form always wrote it
