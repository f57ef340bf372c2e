"""`plan.offsets.source_change`: when the committed offsets no longer point into the topic.

Proves: a changed topic id (deleted and created again) and committed offsets past the topic's end each stop
ingestion with a message naming the way out (`icefall reset-offsets`); the same id, or a table from before
topic ids were stored, does not; the committed state round-trips the topic id through the properties.
"""

from __future__ import annotations

import pytest

from icefall.commit import CommittedState, state_from_properties
from icefall.commit.state import TOPIC_ID
from icefall.plan.offsets import OffsetAhead, source_change

pytestmark = pytest.mark.unit


def test_a_new_topic_id_is_a_recreated_topic() -> None:
    message = source_change("orders", "AAA", "BBB")
    assert message is not None
    assert "deleted and created again" in message and "AAA" in message and "BBB" in message
    assert "icefall reset-offsets" in message


def test_offsets_past_the_end_are_a_truncated_or_recreated_topic() -> None:
    message = source_change("orders", "AAA", "AAA", (OffsetAhead(partition=2, committed=90, high=10),))
    assert message is not None
    assert "partition 2 committed 90, end 10" in message and "icefall reset-offsets" in message


@pytest.mark.parametrize("stored", ["AAA", None])
def test_the_same_topic_or_a_table_without_an_id_goes_on(stored: str | None) -> None:
    assert source_change("orders", stored, "AAA") is None


def test_the_topic_id_round_trips_through_the_properties() -> None:
    state = CommittedState(snapshot_id=3, topic="orders", topic_id="AAA", offsets={0: 5}, epoch=1)
    properties = state.to_properties()
    assert properties[TOPIC_ID] == "AAA"
    assert state_from_properties(properties, 3) == state
    assert TOPIC_ID not in CommittedState(snapshot_id=3, topic="orders", offsets={0: 5}).to_properties()
