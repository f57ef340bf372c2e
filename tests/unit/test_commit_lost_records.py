"""`icefall.lost-records`: the count of records Kafka's retention deleted before they were ingested.

Proves the property math: a batch adds the width of the retention gaps it acknowledges, on partitions the
table has committed and on partitions added to the topic later whose first records are gone, never in the
table's first commit; the count round-trips through the table properties, is omitted while 0 (tables
that never lost anything keep their properties unchanged), and a corrupt value is refused.
"""

from __future__ import annotations

import pytest

from icefall.commit import Batch, CommittedState, CorruptStateError, state_from_properties
from icefall.commit.batch import retention_loss
from icefall.commit.state import LOST_RECORDS

pytestmark = pytest.mark.unit


def test_a_batch_loses_the_width_of_its_acknowledged_gaps() -> None:
    batch = Batch("t", start={0: 35, 1: 20, 2: 60}, end={0: 50, 1: 50, 2: 60}, retention_gaps={0: 20, 2: 50})
    assert retention_loss({0: 20, 1: 20, 2: 50}, batch) == 15 + 10


def test_a_batch_without_gaps_loses_nothing() -> None:
    assert retention_loss({0: 5}, Batch("t", start={0: 5}, end={0: 9})) == 0


def test_a_partition_added_later_whose_first_records_are_gone_counts_them() -> None:
    batch = Batch("t", start={0: 5, 3: 10}, end={0: 5, 3: 12}, retention_gaps={3: 0})
    assert retention_loss({0: 5}, batch) == 10


def test_the_first_commit_of_a_table_loses_nothing() -> None:
    batch = Batch("t", start={3: 10}, end={3: 12}, retention_gaps={3: 0})
    assert retention_loss({}, batch) == 0


def test_the_count_round_trips_through_the_properties() -> None:
    state = CommittedState(snapshot_id=7, topic="t", offsets={0: 50}, epoch=2, lost_records=25)
    properties = state.to_properties()
    assert properties[LOST_RECORDS] == "25"
    assert state_from_properties(properties, 7) == state


def test_nothing_lost_writes_no_property_and_reads_as_zero() -> None:
    properties = CommittedState(snapshot_id=1, topic="t", offsets={0: 1}, epoch=1).to_properties()
    assert LOST_RECORDS not in properties
    assert state_from_properties(properties, 1).lost_records == 0


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_corrupt_count_is_refused(value: str) -> None:
    with pytest.raises(CorruptStateError):
        state_from_properties({LOST_RECORDS: value}, None)
