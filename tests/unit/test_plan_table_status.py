"""Status blocks and observations from table facts and Kafka watermarks (`plan.table_status`).

Proves: lag per partition (`plan.lag`) from the watermarks and the committed offsets, summed, capped to
the most lagging partitions; freshness is 0 when caught up and, when behind, the wait of the oldest
waiting record if it was read, else the age of the newest committed produce time; unmeasured without
watermarks or commits; offsets past the
topic's end and unacknowledged retention loss become issues; table figures (files, average size,
compaction and expiry times) come through; an unread table reports nothing rather than a guess. A table
the operator does not read gets all of it from its driver's recent report: lag and freshness, the table's
figures, the compaction backlog, and Kafka or catalog outages. The driver's count of records lost to
retention (`status.writer.lostRecords`, the one data-loss field set) makes the loss known to an operator
that cannot read the table (the count, a DataLoss issue naming the last loss until acknowledged, the
Degraded condition), and never lowers a larger count the operator read itself; with `onDataLoss: Halt`, a
driver that stopped on lost records makes the table not Ingesting and not Ready with reason DataLossHalted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from icefall.api import (
    ConditionReason,
    ConditionStatus,
    ConditionType,
    StreamingTableStatus,
    TableStatus,
    WriterReport,
    streaming_table_from_object,
)
from icefall.plan.conditions import DriverState, Observations, degraded_event, derive_conditions
from icefall.plan.driver import EventType
from icefall.plan.table_status import (
    ANNOTATION_ACKNOWLEDGED_LOSS,
    MAX_PARTITIONS,
    WRITER_REPORT_MAX_AGE_SECONDS,
    TableFacts,
    acknowledged_loss,
    reported_backlog,
    summarize,
    with_writer_loss,
    with_writer_report,
    writer_issues,
)

pytestmark = pytest.mark.unit

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def facts(**changes: object) -> TableFacts:
    values: dict[str, object] = {
        "committed_offsets": {0: 100, 1: 50},
        "max_produce_time_ms": NOW_MS - 7_500,
        "last_commit_ms": NOW_MS - 2_000,
        "last_commit_snapshot_id": 42,
        "data_files": 4,
        "total_file_bytes": 4_000_001,
        "records": 150,
        "snapshots": 9,
    }
    values.update(changes)
    return TableFacts(**values)  # type: ignore[arg-type]


def test_behind_the_topic_freshness_is_the_age_of_the_newest_committed_record() -> None:
    summary = summarize(facts(), {0: (0, 130), 1: (0, 50)}, NOW)
    assert summary.freshness_seconds == pytest.approx(7.5)
    assert summary.lag_records == 30
    assert summary.freshness is not None and summary.freshness.partition_lag == {0: 30, 1: 0}
    assert summary.freshness.snapshot_id == 42
    assert summary.last_commit_time == NOW - timedelta(seconds=2)
    assert summary.issues == ()


def test_behind_the_topic_freshness_is_the_wait_of_the_oldest_waiting_record_when_read() -> None:
    waited = int(NOW.timestamp() * 1000) - 1_500
    summary = summarize(facts(), {0: (0, 130), 1: (0, 50)}, NOW, oldest_waiting_ms=waited)
    assert summary.freshness is not None and summary.freshness.seconds == pytest.approx(1.5)


def test_caught_up_is_fresh_however_old_the_last_record() -> None:
    summary = summarize(facts(max_produce_time_ms=NOW_MS - 3_600_000), {0: (0, 100), 1: (0, 50)}, NOW)
    assert (summary.freshness_seconds, summary.lag_records) == (0.0, 0)


def test_without_watermarks_freshness_and_lag_are_not_guessed() -> None:
    summary = summarize(facts(lost_records=3), None, NOW)
    assert (summary.freshness_seconds, summary.lag_records, summary.freshness) == (None, None, None)
    assert [i.reason for i in summary.issues] == [ConditionReason.DATA_LOSS]  # known from the table alone
    assert summary.table is not None and summary.table.files == 4


def test_records_waiting_and_nothing_committed() -> None:
    summary = summarize(facts(committed_offsets={}, max_produce_time_ms=None), {0: (0, 5)}, NOW)
    assert (summary.freshness_seconds, summary.lag_records, summary.last_commit_time) == (None, 5, None)


def test_an_unread_table_reports_nothing_but_offsets_ahead_need_the_table() -> None:
    summary = summarize(None, {0: (0, 5)}, NOW)
    assert (summary.freshness, summary.table, summary.data_loss_records) == (None, None, None)
    assert summary.lag_records is None


def test_offsets_past_the_topic_end_are_an_issue_naming_the_partition() -> None:
    summary = summarize(facts(committed_offsets={0: 500, 1: 50}), {0: (0, 20), 1: (0, 50)}, NOW)
    (issue,) = summary.issues
    assert issue.reason is ConditionReason.OFFSETS_AHEAD_OF_TOPIC
    assert "0 (committed 500, high 20)" in issue.message
    assert summary.lag_records == 0


def test_retention_loss_is_an_issue_until_acknowledged() -> None:
    lost = facts(lost_records=17)
    (issue,) = summarize(lost, {0: (0, 100), 1: (0, 50)}, NOW).issues
    assert issue.reason is ConditionReason.DATA_LOSS and "17 records" in issue.message
    assert ANNOTATION_ACKNOWLEDGED_LOSS in issue.message
    assert summarize(lost, {0: (0, 100), 1: (0, 50)}, NOW, acknowledged_loss=17).issues == ()
    assert summarize(lost, None, NOW).data_loss_records == 17
    assert acknowledged_loss({ANNOTATION_ACKNOWLEDGED_LOSS: "17"}) == 17
    assert acknowledged_loss({ANNOTATION_ACKNOWLEDGED_LOSS: "lots"}) == 0


def test_table_figures_and_maintenance_times() -> None:
    summary = summarize(
        facts(last_compaction_ms=NOW_MS - 60_000, small_file_ratio=0.25, compaction_backlog=3), None, NOW
    )
    table = summary.table
    assert table is not None
    assert (table.files, table.avg_file_size_bytes, table.snapshots, table.records) == (4, 1_000_000, 9, 150)
    assert table.last_compaction_time == NOW - timedelta(minutes=1)
    assert table.last_expiry_time is None  # unknown unless a maintenance run recorded it
    assert (table.small_file_ratio, table.compaction_backlog) == (0.25, 3)
    # The blocks fit the status model (and so the CRD's schema) with their camelCase names.
    dumped = StreamingTableStatus(freshness=summary.freshness, table=table).model_dump(by_alias=True)
    assert dumped["table"]["smallFileRatio"] == 0.25


def test_the_partition_map_keeps_the_most_lagging() -> None:
    marks = {p: (0, p) for p in range(MAX_PARTITIONS + 10)}
    summary = summarize(facts(committed_offsets={}), marks, NOW)
    assert summary.freshness is not None
    assert sorted(summary.freshness.partition_lag) == list(range(10, MAX_PARTITIONS + 10))
    assert summary.lag_records == sum(range(MAX_PARTITIONS + 10))


def test_a_recreated_topic_is_an_issue_naming_the_reset_command() -> None:
    summary = summarize(facts(committed_offsets={0: 500}, topic_id="old"), {0: (0, 900)}, NOW, topic_id="new")
    (issue,) = summary.issues
    assert issue.reason is ConditionReason.TOPIC_RECREATED
    assert "icefall reset-offsets" in issue.message and "old" in issue.message


def test_the_same_topic_id_or_an_unknown_one_is_no_issue() -> None:
    for stored, current in (("same", "same"), (None, "new"), ("old", None)):
        summary = summarize(
            facts(committed_offsets={0: 5}, topic_id=stored), {0: (0, 9)}, NOW, topic_id=current
        )
        assert summary.issues == ()


# --- the driver's report stands in when the operator cannot measure -----------------------------------------


def report(age_seconds: float, **changes: object) -> WriterReport:
    fields: dict[str, object] = {
        "reported_at": NOW - timedelta(seconds=age_seconds),
        "freshness_seconds": 1.26,
        "lag_records": 12,
        "last_commit_time": NOW - timedelta(seconds=3),
        "snapshot_id": 42,
    }
    return WriterReport.model_validate({**fields, **changes})


def test_a_recent_driver_report_fills_what_the_operator_could_not_measure() -> None:
    unmeasured = summarize(None, None, NOW)  # no credentials: neither the table nor Kafka was read
    assert unmeasured.freshness_seconds is None and unmeasured.lag_records is None
    filled = with_writer_report(unmeasured, report(age_seconds=15), NOW)
    assert filled is not None
    assert (filled.freshness_seconds, filled.lag_records) == (1.26, 12)
    assert filled.last_commit_time == NOW - timedelta(seconds=3)
    assert (
        filled.freshness is not None
        and filled.freshness.seconds == 1.3
        and filled.freshness.snapshot_id == 42
    )
    assert filled.table is None and filled.data_loss_records is None  # only what the driver measured


def test_the_operators_own_measurement_or_an_old_report_wins() -> None:
    measured = summarize(facts(), {0: (0, 100), 1: (0, 50)}, NOW)
    assert measured.freshness_seconds is not None
    assert with_writer_report(measured, report(age_seconds=1), NOW) is None
    unmeasured = summarize(None, None, NOW)
    assert with_writer_report(unmeasured, report(age_seconds=WRITER_REPORT_MAX_AGE_SECONDS + 1), NOW) is None
    assert with_writer_report(unmeasured, None, NOW) is None


def test_a_schema_change_the_table_cannot_follow_degrades_it_with_one_warning_event() -> None:
    refused = [
        "field 'qty': the table has long, writer schema id 3 has string; Iceberg cannot change it (...)"
    ]
    (issue,) = writer_issues(report(age_seconds=5, schema_refused=refused), NOW)
    assert issue.reason is ConditionReason.SCHEMA_CHANGE_REFUSED
    assert issue.message == "the table cannot follow the records' schema: " + refused[0]
    assert writer_issues(report(age_seconds=5), NOW) == []
    assert (
        writer_issues(report(age_seconds=WRITER_REPORT_MAX_AGE_SECONDS + 1, schema_refused=refused), NOW)
        == []
    )

    st = streaming_table_from_object(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders", "generation": 2},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "name": "orders"},
            },
        }
    )
    observed = Observations(driver=DriverState.RUNNING, freshness_seconds=1.0, lag_records=0, issues=(issue,))
    conditions = derive_conditions(observed, st, NOW)
    degraded = next(c for c in conditions if c.type is ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, ConditionReason.SCHEMA_CHANGE_REFUSED)
    event = degraded_event(None, conditions)
    assert event is not None and event.type is EventType.WARNING
    assert event.message == "SchemaChangeRefused: " + issue.message


def test_a_driver_waiting_for_the_registry_is_not_ingesting() -> None:
    (issue,) = writer_issues(report(age_seconds=5, waiting_for="registry"), NOW)
    assert issue.reason is ConditionReason.REGISTRY_UNAVAILABLE and "schema registry" in issue.message
    assert writer_issues(report(age_seconds=5, waiting_for="kafka"), NOW) == []  # the operator probes Kafka
    st = streaming_table_from_object(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders", "generation": 2},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "name": "orders"},
            },
        }
    )
    observed = Observations(driver=DriverState.RUNNING, freshness_seconds=1.0, lag_records=0, issues=(issue,))
    ingesting = next(c for c in derive_conditions(observed, st, NOW) if c.type is ConditionType.INGESTING)
    assert (ingesting.status, ingesting.reason) == (
        ConditionStatus.FALSE,
        ConditionReason.REGISTRY_UNAVAILABLE,
    )


def test_the_drivers_report_stands_in_for_the_table_figures_and_backlog() -> None:
    figures = TableStatus(files=8, avg_file_size_bytes=1000, snapshots=9, records=80, compaction_backlog=3)
    sent = report(age_seconds=5, table=figures, lost_records=4, table_uuid="u-1")
    filled = with_writer_report(summarize(None, None, NOW), sent, NOW)
    assert filled is not None and filled.table == figures
    # Its loss count enters only through with_writer_loss: one place, one field set.
    assert filled.data_loss_records is None and filled.issues == ()
    lost = with_writer_loss(filled, sent, acknowledged=1)
    assert lost.data_loss_records == 4
    (loss,) = [i for i in lost.issues if i.reason is ConditionReason.DATA_LOSS]
    assert "4 records" in loss.message
    assert with_writer_loss(filled, sent, acknowledged=4).issues == ()
    # The operator's own reading of the table wins; lag and freshness still come from the report.
    own = summarize(facts(), None, NOW)
    mixed = with_writer_report(own, sent, NOW)
    assert mixed is not None and mixed.table == own.table and mixed.lag_records == 12

    assert reported_backlog(sent, NOW) == 3
    assert reported_backlog(report(age_seconds=5), NOW) is None  # no table figures in it
    assert reported_backlog(report(age_seconds=WRITER_REPORT_MAX_AGE_SECONDS + 1, table=figures), NOW) is None


def test_outages_the_driver_waits_out_are_issues_when_the_operator_does_not_read_the_table() -> None:
    waiting = report(age_seconds=5, waiting_for="catalog")
    assert writer_issues(waiting, NOW) == []  # its own probe says so
    (issue,) = writer_issues(waiting, NOW, operator_reads=False)
    assert issue.reason is ConditionReason.CATALOG_UNAVAILABLE and "catalog" in issue.message
    (kafka,) = writer_issues(report(age_seconds=5, waiting_for="kafka"), NOW, operator_reads=False)
    assert kafka.reason is ConditionReason.KAFKA_UNAVAILABLE and "Kafka" in kafka.message


# --- records lost to retention, as the driver reports them -------------------------------------------------


def test_the_drivers_count_of_lost_records_needs_no_credentials_of_the_operator() -> None:
    blind = summarize(None, None, NOW)  # the operator read neither the table nor Kafka
    assert blind.data_loss_records is None and blind.issues == ()
    lost = report(age_seconds=3600, lost_records=25, last_loss_time=NOW - timedelta(minutes=5))
    known = with_writer_loss(blind, lost)
    assert known.data_loss_records == 25
    (issue,) = known.issues
    assert issue.reason is ConditionReason.DATA_LOSS
    assert "25 records" in issue.message and "2024-05-01T11:55:00+00:00" in issue.message
    assert f"{ANNOTATION_ACKNOWLEDGED_LOSS}=25" in issue.message
    assert with_writer_loss(blind, lost, acknowledged=25).issues == ()
    assert with_writer_loss(blind, lost, acknowledged=25).data_loss_records == 25
    st = streaming_table_from_object(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders", "namespace": "shop", "generation": 1},
            "spec": {
                "source": {"bootstrapServers": "k:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
            },
        }
    )
    observed = Observations(driver=DriverState.RUNNING, issues=known.issues)
    degraded = {c.type: c for c in derive_conditions(observed, st, NOW)}[ConditionType.DEGRADED]
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, ConditionReason.DATA_LOSS)


def test_the_larger_count_wins_and_no_report_changes_nothing() -> None:
    read = summarize(facts(lost_records=30), {0: (0, 100), 1: (0, 50)}, NOW)
    assert with_writer_loss(read, report(age_seconds=1, lost_records=20)) is read
    newer = with_writer_loss(read, report(age_seconds=1, lost_records=40))
    assert newer.data_loss_records == 40
    assert [i.reason for i in newer.issues] == [ConditionReason.DATA_LOSS]  # one issue, the larger count
    assert "40 records" in newer.issues[0].message
    assert with_writer_loss(read, report(age_seconds=1)) is read  # a driver that has not committed yet
    assert with_writer_loss(read, None) is read
