"""The operator's gauges of records lost to retention (`icefall.controller.metrics`), which the chart's
IcefallDataLost alert reads: the table's count, and the part of it above the acknowledged count; both
absent while the count is unknown, and removed with the table."""

from __future__ import annotations

import pytest

from icefall.controller.metrics import forget_table, record_table
from icefall.plan.table_status import Summary
from icefall.runtime.metrics import REGISTRY

pytestmark = pytest.mark.unit


def sample(name: str, table: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"table": table})


def summary(lost: int | None) -> Summary:
    return Summary(None, None, lost, None, None, None)


def test_lost_records_and_the_unacknowledged_part_are_exported_per_table() -> None:
    record_table("shop", "lossy", summary(25), 1, 60, acknowledged_loss=10)
    assert sample("icefall_table_lost_records", "shop.lossy") == 25
    assert sample("icefall_table_lost_records_unacknowledged", "shop.lossy") == 15
    record_table("shop", "lossy", summary(25), 1, 60, acknowledged_loss=30)
    assert sample("icefall_table_lost_records_unacknowledged", "shop.lossy") == 0
    record_table("shop", "unread", summary(None), 1, 60)
    assert sample("icefall_table_lost_records", "shop.unread") is None  # unknown is not 0
    forget_table("shop", "lossy")
    assert sample("icefall_table_lost_records", "shop.lossy") is None
    assert sample("icefall_table_lost_records_unacknowledged", "shop.lossy") is None
