"""The operator's per-table series (`icefall.controller.metrics`), which the chart's alerts read.

Proves: each condition is one series of value 1 labelled with its type, status and reason, and a condition
whose reason or status changed drops its old series (an alert never fires on a reason that is gone); a
figure the pass did not measure disappears instead of keeping its last value (freshness, last commit, a
partition's lag, the table's files), while the lost-records count follows the count status keeps; the
driver restart counter exists at 0 from the first pass (so `increase()` sees the first restart) and is
removed with every other series of a deleted table.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from icefall.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    FreshnessStatus,
    TableStatus,
)
from icefall.controller.metrics import count_driver_restart, forget_table, record_conditions, record_table
from icefall.plan.table_status import Summary
from icefall.runtime.metrics import REGISTRY

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def sample(name: str, table: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"table": table, **labels})


def condition(kind: ConditionType, status: ConditionStatus, reason: ConditionReason) -> Condition:
    return Condition(type=kind, status=status, reason=reason, last_transition_time=NOW)


def measured(lag: dict[int, int]) -> Summary:
    freshness = FreshnessStatus(seconds=4.0, lag_records=sum(lag.values()), partition_lag=lag)
    table = TableStatus(files=7, snapshots=3, compaction_backlog=2)
    return Summary(freshness, table, 0, 4.0, sum(lag.values()), NOW)


UNMEASURED = Summary(None, None, None, None, None, None)


def test_each_condition_is_one_series_and_a_changed_reason_drops_the_old_one() -> None:
    table = "shop.cond"
    degraded = condition(ConditionType.DEGRADED, ConditionStatus.TRUE, ConditionReason.SCHEMA_CHANGE_REFUSED)
    ready = condition(ConditionType.READY, ConditionStatus.FALSE, ConditionReason.SCHEMA_CHANGE_REFUSED)
    record_conditions("shop", "cond", [degraded, ready])
    refused = {"type": "Degraded", "status": "True", "reason": "SchemaChangeRefused"}
    assert sample("icefall_table_condition", table, **refused) == 1
    not_ready = {"type": "Ready", "status": "False", "reason": "SchemaChangeRefused"}
    assert sample("icefall_table_condition", table, **not_ready) == 1
    healthy = condition(ConditionType.DEGRADED, ConditionStatus.FALSE, ConditionReason.HEALTHY)
    record_conditions("shop", "cond", [healthy])
    assert sample("icefall_table_condition", table, **refused) is None
    assert sample("icefall_table_condition", table, **not_ready) is None
    assert sample("icefall_table_condition", table, type="Degraded", status="False", reason="Healthy") == 1
    forget_table("shop", "cond")
    assert sample("icefall_table_condition", table, type="Degraded", status="False", reason="Healthy") is None


def test_figures_the_pass_did_not_measure_disappear() -> None:
    table = "shop.gone"
    record_table("shop", "gone", measured({0: 5, 1: 6}), 1, 60)
    assert sample("icefall_freshness_seconds", table) == 4.0
    assert sample("icefall_lag_records", table, partition="1") == 6
    assert sample("icefall_table_data_files", table) == 7
    assert sample("icefall_last_commit_timestamp_seconds", table) == NOW.timestamp()
    record_table("shop", "gone", measured({0: 5}), 1, 60)  # partition 1 no longer reported
    assert sample("icefall_lag_records", table, partition="1") is None
    assert sample("icefall_lag_records", table, partition="0") == 5
    record_table("shop", "gone", UNMEASURED, 1, 60)  # e.g. the catalog and Kafka cannot be read
    for name in (
        "icefall_freshness_seconds",
        "icefall_last_commit_timestamp_seconds",
        "icefall_table_data_files",
        "icefall_table_snapshots",
        "icefall_maintenance_backlog_items",
    ):
        assert sample(name, table) is None, name
    assert sample("icefall_lag_records", table, partition="0") is None
    # What does not depend on a measurement stays.
    assert sample("icefall_freshness_target_seconds", table) == 60
    assert sample("icefall_compaction_replicas", table) == 1


def test_lost_records_follow_the_count_status_keeps_while_the_table_cannot_be_read() -> None:
    table = "shop.kept"
    record_table("shop", "kept", UNMEASURED, 1, 60, acknowledged_loss=5, stored_loss=20)
    assert sample("icefall_table_lost_records", table) == 20
    assert sample("icefall_table_lost_records_unacknowledged", table) == 15
    record_table("shop", "kept", UNMEASURED, 1, 60)  # never counted anywhere: unknown, not 0
    assert sample("icefall_table_lost_records", table) is None
    assert sample("icefall_table_lost_records_unacknowledged", table) is None


def test_driver_restarts_start_at_zero_and_go_with_the_table() -> None:
    table = "shop.restarts"
    record_table("shop", "restarts", UNMEASURED, 1, 60)
    assert sample("icefall_driver_restarts_total", table) == 0
    count_driver_restart("shop", "restarts")
    count_driver_restart("shop", "restarts")
    assert sample("icefall_driver_restarts_total", table) == 2
    record_table("shop", "restarts", UNMEASURED, 1, 60)  # a pass does not reset it
    assert sample("icefall_driver_restarts_total", table) == 2
    forget_table("shop", "restarts")
    assert sample("icefall_driver_restarts_total", table) is None
    assert sample("icefall_freshness_target_seconds", table) is None
