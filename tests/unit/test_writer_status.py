"""The driver reports lag and freshness into its StreamingTable's status (`icefall.ingest.writer_status`), at
a bounded rate, and a failing API never stops ingestion; each report lists the most lagging partitions (a
list, replaced whole by each report); with a table meter, each report carries its last reading (table-uuids,
figures, backlog), a new reading at once. It reports the table's count of records lost to retention once it
knows it (the larger of its last commit's and its meter's), and when one of its commits last skipped some,
leaving both out of the patch before (so an earlier driver's report stands). Fake clock, recording API."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from icefall.api.status import REPORTED_PARTITIONS
from icefall.controller.kube import Kube
from icefall.ingest.report import BatchReport
from icefall.ingest.writer_status import WriterStatusReporter

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 26, tzinfo=UTC)


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Mapping[str, Any]]] = []
        self.fail = False

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("403 Forbidden")
        self.patches.append((namespace, name, status))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


def batch(lag: int, freshness: float, snapshot: int) -> BatchReport:
    return BatchReport(10, 10, 0, 1.0, 0.1, snapshot, {0: 10}, lag, freshness, partition_lag={0: lag})


def reporter(kube: RecordingKube, clock: Clock) -> WriterStatusReporter:
    return WriterStatusReporter(cast(Kube, kube), "shop", "orders", interval=10, clock=clock, wall=clock.wall)


def test_reports_at_once_then_at_most_every_interval() -> None:
    kube, clock = RecordingKube(), Clock()
    report = reporter(kube, clock)
    report(batch(lag=40, freshness=3.25, snapshot=7))
    clock.now = 4
    report(batch(lag=0, freshness=0.5, snapshot=8))  # within the interval: remembered, not sent
    clock.now = 11
    report(None)  # caught up
    assert [(ns, name) for ns, name, _ in kube.patches] == [("shop", "orders")] * 2
    first, second = (body["writer"] for _, _, body in kube.patches)
    assert first == {
        "reportedAt": "2026-11-26T00:00:00Z",
        "freshnessSeconds": 3.25,
        "lagRecords": 40,
        "partitionLag": [{"partition": 0, "records": 40}],
        "lastCommitTime": "2026-11-26T00:00:00Z",
        "snapshotId": 7,
        "schemaRefused": [],
        "waitingFor": None,
        "lostRecords": 0,
    }
    assert second == {
        "reportedAt": "2026-11-26T00:00:11Z",
        "freshnessSeconds": 0.0,
        "lagRecords": 0,
        # Caught up: each partition of the last batch lags 0 (a list: replaced whole every report).
        "partitionLag": [{"partition": 0, "records": 0}],
        "lastCommitTime": "2026-11-26T00:00:04Z",  # the batch that was not sent still counts
        "snapshotId": 8,
        "schemaRefused": [],
        "waitingFor": None,
        "lostRecords": 0,
    }


def test_before_any_commit_there_is_no_commit_time() -> None:
    kube, clock = RecordingKube(), Clock()
    reporter(kube, clock)(None)
    assert kube.patches[0][2]["writer"] == {
        "reportedAt": "2026-11-26T00:00:00Z",
        "freshnessSeconds": 0.0,
        "lagRecords": 0,
        "partitionLag": [],
        "schemaRefused": [],
        "waitingFor": None,
    }


def test_schema_changes_the_table_cannot_follow_are_reported_until_they_are_gone() -> None:
    kube, clock = RecordingKube(), Clock()
    report = reporter(kube, clock)
    refused = ("field 'qty': the table has long, writer schema id 3 has string; ...",)
    report(replace(batch(lag=0, freshness=0.0, snapshot=1), schema_refused=refused))
    clock.now = 10
    report(None)  # idle: the last batch's verdict stands
    clock.now = 20
    report(batch(lag=0, freshness=0.0, snapshot=2))  # planned again with nothing refused
    assert [body["writer"]["schemaRefused"] for _, _, body in kube.patches] == [list(refused)] * 2 + [[]]


def test_an_outage_is_reported_at_once_when_it_starts_and_ends() -> None:
    kube, clock = RecordingKube(), Clock()
    report = reporter(kube, clock)
    report(batch(lag=5, freshness=2.0, snapshot=3))
    clock.now = 2
    report.waiting("registry")  # no batch lands while it lasts: reported now, not at the interval
    report.waiting("registry")  # the same outage again: within the interval, not sent
    clock.now = 3
    report.waiting(None)
    sent = [body["writer"] for _, _, body in kube.patches]
    assert [w["waitingFor"] for w in sent] == [None, "registry", None]
    assert sent[1]["lagRecords"] == 5 and sent[1]["snapshotId"] == 3  # the last figures stand meanwhile


def test_a_failing_api_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    kube, clock = RecordingKube(), Clock()
    report = reporter(kube, clock)
    kube.fail = True
    with caplog.at_level(logging.INFO):
        for second in (0, 10, 20):
            clock.now = second
            report(batch(lag=1, freshness=1.0, snapshot=1))
        kube.fail = False
        clock.now = 30
        report(None)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "403 Forbidden" in warnings[0].getMessage()
    assert "works again" in caplog.text
    assert len(kube.patches) == 1


def test_each_report_carries_the_meters_last_reading_of_the_table() -> None:
    from icefall.api import TableStatus
    from icefall.ingest.table_meter import TableMeter, TableReading

    class Meter:
        latest: TableReading | None = None

    kube, clock, meter = RecordingKube(), Clock(), Meter()
    report = WriterStatusReporter(
        cast(Kube, kube), "shop", "orders", interval=10, clock=clock, wall=clock.wall,
        meter=cast(TableMeter, meter),
    )  # fmt: skip
    report(batch(lag=1, freshness=1.0, snapshot=7))
    assert "tableUuid" not in kube.patches[-1][2]["writer"]  # nothing read yet
    meter.latest = TableReading("u-1", "u-2", TableStatus(files=3, compaction_backlog=2), 0)
    clock.now = 11
    report(None)
    writer = kube.patches[-1][2]["writer"]
    assert (writer["tableUuid"], writer["deadLetterTableUuid"]) == ("u-1", "u-2")
    assert (writer["table"]["files"], writer["table"]["compactionBacklog"]) == (3, 2)

    # A new reading is reported at once (the meter calls back), an unchanged one waits for the interval.
    sent = len(kube.patches)
    clock.now = 12
    meter.latest = TableReading("u-1", "u-2", TableStatus(files=1, compaction_backlog=0), 0)
    report.table_read()
    assert len(kube.patches) == sent + 1 and kube.patches[-1][2]["writer"]["table"]["files"] == 1
    clock.now = 13
    report.table_read()
    assert len(kube.patches) == sent + 1


def test_records_lost_to_retention_are_reported_with_the_time_of_the_last_skip() -> None:
    kube, clock = RecordingKube(), Clock()
    report = reporter(kube, clock)
    report(None)  # a new driver, nothing committed yet: an earlier report of the loss stays as it is
    assert {"lostRecords", "lastLossTime"}.isdisjoint(kube.patches[-1][2]["writer"])
    clock.now = 10
    report(replace(batch(lag=0, freshness=0.0, snapshot=1), lost_records=40))  # lost before this driver
    assert kube.patches[-1][2]["writer"]["lostRecords"] == 40
    assert "lastLossTime" not in kube.patches[-1][2]["writer"]
    clock.now = 20
    report(replace(batch(lag=0, freshness=0.0, snapshot=2), skipped=15, data_loss=15, lost_records=55))
    clock.now = 30
    report(replace(batch(lag=0, freshness=0.0, snapshot=3), lost_records=55))
    sent = [body["writer"] for _, _, body in kube.patches[-2:]]
    assert [(w["lostRecords"], w["lastLossTime"]) for w in sent] == [
        (55, "2026-11-26T00:00:20Z"),
        (55, "2026-11-26T00:00:20Z"),
    ]


def test_the_meters_count_of_lost_records_feeds_lost_records_before_and_between_commits() -> None:
    """One field set for data loss (`lostRecords`): the meter's reading of icefall.lost-records fills it
    before this driver's first commit, and the larger of the two counts is sent; no other loss field."""
    from icefall.api import TableStatus
    from icefall.ingest.table_meter import TableMeter, TableReading

    class Meter:
        latest: TableReading | None = None

    kube, clock, meter = RecordingKube(), Clock(), Meter()
    report = WriterStatusReporter(
        cast(Kube, kube), "shop", "orders", interval=10, clock=clock, wall=clock.wall,
        meter=cast(TableMeter, meter),
    )  # fmt: skip
    meter.latest = TableReading("u-1", None, TableStatus(files=3), 40)
    report.table_read()  # read before any commit of this driver
    writer = kube.patches[-1][2]["writer"]
    assert writer["lostRecords"] == 40 and "lastLossTime" not in writer
    assert "dataLossRecords" not in writer
    clock.now = 10
    report(replace(batch(lag=0, freshness=0.0, snapshot=1), skipped=15, data_loss=15, lost_records=55))
    writer = kube.patches[-1][2]["writer"]
    assert (writer["lostRecords"], writer["lastLossTime"]) == (55, "2026-11-26T00:00:10Z")
    clock.now = 20
    meter.latest = TableReading("u-1", None, TableStatus(files=4), 55)  # the meter catches up: no change
    report.table_read()
    assert kube.patches[-1][2]["writer"]["lostRecords"] == 55


def test_the_partition_lag_lists_the_most_lagging_partitions() -> None:
    kube, clock = RecordingKube(), Clock()
    lag = {p: p for p in range(REPORTED_PARTITIONS + 10)}  # partition p lags p records
    reporter(kube, clock)(replace(batch(sum(lag.values()), 1.0, 7), partition_lag=lag))
    listed = kube.patches[0][2]["writer"]["partitionLag"]
    assert listed == [{"partition": p, "records": p} for p in range(10, REPORTED_PARTITIONS + 10)]
    assert kube.patches[0][2]["writer"]["lagRecords"] == sum(lag.values())
