"""The status merge patch (`controller.status.status_patch`): figures that went away are removed.

A merge patch keeps every key it does not mention, so a partition dropped from the lag map, or a figure that
became unknown (freshness while records wait and nothing is committed), would otherwise stay in status.
"""

from __future__ import annotations

import pytest

from icefall.api import FreshnessStatus, StreamingTableStatus, TableStatus
from icefall.controller.status import status_patch

pytestmark = pytest.mark.unit


def test_gone_partitions_and_unknown_figures_are_sent_as_null() -> None:
    before = StreamingTableStatus(
        freshness=FreshnessStatus(seconds=4.0, lag_records=9, partition_lag={0: 4, 7: 5}),
        table=TableStatus(files=3, small_file_ratio=0.5),
    )
    after = StreamingTableStatus(
        freshness=FreshnessStatus(seconds=None, lag_records=4, partition_lag={0: 4}),
        table=TableStatus(files=3),
    )
    patch = status_patch(before, after)
    assert patch["freshness"]["partitionLag"] == {"0": 4, "7": None}
    assert patch["freshness"]["seconds"] is None
    assert patch["table"]["smallFileRatio"] is None and patch["table"]["files"] == 3
    assert "freshness" not in status_patch(before, StreamingTableStatus())  # unknown block: kept as is
