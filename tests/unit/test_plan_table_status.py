"""Status blocks and observations from the driver's report (`plan.table_status`): the operator reads no
table and no topic itself.

Proves: a recent report gives freshness (rounded), lag and its partition map, the last commit and its
snapshot, the table's figures (fitting the status model); an old report or none gives no figures at all and
says why (not reported yet; how old the last report is); the records lost to retention count whatever the
report's age and are a DataLoss issue naming the last loss until acknowledged (Degraded); a driver's
report of a service it waits out (Kafka, the catalog, the object store, the schema registry) and of schema
changes the table cannot follow are issues while recent; the compaction backlog comes from a recent report
only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from icefall.api import (
    ConditionReason,
    ConditionStatus,
    ConditionType,
    StreamingTable,
    StreamingTableStatus,
    TableStatus,
    WriterReport,
    streaming_table_from_object,
)
from icefall.plan.conditions import DriverState, Observations, degraded_event, derive_conditions
from icefall.plan.driver import EventType
from icefall.plan.table_status import (
    ANNOTATION_ACKNOWLEDGED_LOSS,
    WRITER_REPORT_MAX_AGE_SECONDS,
    acknowledged_loss,
    reported_backlog,
    summarize,
    writer_issues,
)

pytestmark = pytest.mark.unit

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
OLD = WRITER_REPORT_MAX_AGE_SECONDS + 1


def report(age_seconds: float, **changes: object) -> WriterReport:
    fields: dict[str, object] = {
        "reported_at": NOW - timedelta(seconds=age_seconds),
        "freshness_seconds": 1.26,
        "lag_records": 12,
        "partition_lag": [{"partition": 0, "records": 12}, {"partition": 1, "records": 0}],
        "last_commit_time": NOW - timedelta(seconds=3),
        "snapshot_id": 42,
    }
    return WriterReport.model_validate({**fields, **changes})


def table() -> StreamingTable:
    return streaming_table_from_object(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders", "namespace": "shop", "generation": 2},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "name": "orders"},
            },
        }
    )


def test_a_recent_report_gives_freshness_lag_and_the_table_figures() -> None:
    figures = TableStatus(files=8, avg_file_size_bytes=1000, snapshots=9, records=80, compaction_backlog=3)
    summary = summarize(report(age_seconds=15, table=figures), NOW)
    assert (summary.freshness_seconds, summary.lag_records) == (1.26, 12)
    assert summary.last_commit_time == NOW - timedelta(seconds=3)
    freshness = summary.freshness
    assert freshness is not None and (freshness.seconds, freshness.snapshot_id) == (1.3, 42)
    assert (freshness.lag_records, freshness.partition_lag) == (12, {0: 12, 1: 0})
    assert summary.table == figures and summary.unmeasured == "" and summary.issues == ()
    assert summary.data_loss_records is None  # not reported yet: status keeps what it has
    # The blocks fit the status model (and so the CRD's schema) with their camelCase names.
    dumped = StreamingTableStatus(freshness=freshness, table=figures).model_dump(by_alias=True)
    assert dumped["freshness"]["partitionLag"] == {0: 12, 1: 0} and dumped["table"]["files"] == 8


def test_without_a_recent_report_nothing_is_guessed_and_the_note_says_why() -> None:
    for summary, why in (
        (summarize(None, NOW), "it has not reported yet (status.writer)"),
        (summarize(report(age_seconds=OLD), NOW), f"its last report is {OLD:.0f} s old"),
    ):
        assert (summary.freshness, summary.table, summary.freshness_seconds, summary.lag_records) == (
            None, None, None, None,
        )  # fmt: skip
        assert summary.unmeasured.startswith("measured by the table's driver only"), summary.unmeasured
        assert why in summary.unmeasured, summary.unmeasured
    ahead = summarize(report(age_seconds=-OLD), NOW)  # a driver clock far ahead of ours
    assert ahead.freshness is None


def test_lost_records_count_whatever_the_reports_age_until_acknowledged() -> None:
    lost = report(age_seconds=3600, lost_records=25, last_loss_time=NOW - timedelta(minutes=5))
    known = summarize(lost, NOW)
    assert known.data_loss_records == 25 and known.freshness is None
    (issue,) = known.issues
    assert issue.reason is ConditionReason.DATA_LOSS
    assert "25 records" in issue.message and "2024-05-01T11:55:00+00:00" in issue.message
    assert f"{ANNOTATION_ACKNOWLEDGED_LOSS}=25" in issue.message
    acknowledged = summarize(lost, NOW, acknowledged_loss=25)
    assert (acknowledged.data_loss_records, acknowledged.issues) == (25, ())
    assert summarize(report(age_seconds=1), NOW).data_loss_records is None  # nothing committed yet
    assert acknowledged_loss({ANNOTATION_ACKNOWLEDGED_LOSS: "25"}) == 25
    assert acknowledged_loss({ANNOTATION_ACKNOWLEDGED_LOSS: "lots"}) == 0
    observed = Observations(driver=DriverState.RUNNING, issues=known.issues)
    degraded = {c.type: c for c in derive_conditions(observed, table(), NOW)}[ConditionType.DEGRADED]
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, ConditionReason.DATA_LOSS)


def test_a_schema_change_the_table_cannot_follow_degrades_it_with_one_warning_event() -> None:
    refused = [
        "field 'qty': the table has long, writer schema id 3 has string; Iceberg cannot change it (...)"
    ]
    (issue,) = writer_issues(report(age_seconds=5, schema_refused=refused), NOW)
    assert issue.reason is ConditionReason.SCHEMA_CHANGE_REFUSED
    assert issue.message == "the table cannot follow the records' schema: " + refused[0]
    assert writer_issues(report(age_seconds=5), NOW) == []
    assert writer_issues(report(age_seconds=OLD, schema_refused=refused), NOW) == []
    observed = Observations(driver=DriverState.RUNNING, freshness_seconds=1.0, lag_records=0, issues=(issue,))
    conditions = derive_conditions(observed, table(), NOW)
    degraded = next(c for c in conditions if c.type is ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, ConditionReason.SCHEMA_CHANGE_REFUSED)
    event = degraded_event(None, conditions)
    assert event is not None and event.type is EventType.WARNING
    assert event.message == "SchemaChangeRefused: " + issue.message


@pytest.mark.parametrize(
    ("service", "reason", "named"),
    [
        ("registry", ConditionReason.REGISTRY_UNAVAILABLE, "schema registry"),
        ("kafka", ConditionReason.KAFKA_UNAVAILABLE, "Kafka"),
        ("catalog", ConditionReason.CATALOG_UNAVAILABLE, "the catalog"),
        ("object_store", ConditionReason.CATALOG_UNAVAILABLE, "the object store"),
        ("kube_apiserver", ConditionReason.WAITING_FOR_LEASE, "the Kubernetes API server"),
        ("local_disk", ConditionReason.LOCAL_DISK_FULL, "local disk"),
        ("clock", ConditionReason.CLOCK_BEHIND, "clock"),
        ("executors", ConditionReason.EXECUTORS_LOST, "Spark executors"),
    ],
)
def test_a_service_the_driver_waits_out_stops_ingesting(
    service: str, reason: ConditionReason, named: str
) -> None:
    (issue,) = writer_issues(report(age_seconds=5, waiting_for=service), NOW)
    assert issue.reason is reason and named in issue.message
    assert writer_issues(report(age_seconds=OLD, waiting_for=service), NOW) == []
    observed = Observations(driver=DriverState.RUNNING, freshness_seconds=1.0, lag_records=0, issues=(issue,))
    conditions = {c.type: c for c in derive_conditions(observed, table(), NOW)}
    ingesting = conditions[ConditionType.INGESTING]
    assert (ingesting.status, ingesting.reason) == (ConditionStatus.FALSE, reason)


def test_compaction_is_scaled_on_a_recent_reports_backlog_only() -> None:
    figures = TableStatus(files=8, compaction_backlog=3)
    assert reported_backlog(report(age_seconds=5, table=figures), NOW) == 3
    assert reported_backlog(report(age_seconds=5), NOW) is None  # no table figures in it
    assert reported_backlog(report(age_seconds=OLD, table=figures), NOW) is None
    assert reported_backlog(None, NOW) is None
