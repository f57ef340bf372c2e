"""The driver's report into its own StreamingTable's status (`status.writer`): lag (in all and for the most
lagging partitions) and freshness as ingestion measured them for its last batch, and the records lost to
retention (the table's count, and when a commit of this driver last skipped some). The operator reads no
table and no topic itself, so this report is where status, metrics and compaction scaling come from
(`icefall.plan.table_status`). The count is the larger of what this driver's last commit left in the table
and its meter's last reading of the table (so it is known before this driver's first commit); what this
driver has not learnt yet (the count before either, a loss time) is left out of the patch, so an earlier
driver's report of it stays. The meter is an Iceberg table's `TableMeter` or a Delta table's `DeltaMeter`
(`icefall.ingest.delta_meter`), which names no table-uuid: `deletionPolicy: Delete` keeps a Delta table.

At most one PATCH every `interval` seconds, the first at once; a failed PATCH is logged (the first one with
its cause) and never stops ingestion. While an outage is waited out no batch lands, so `waiting(service)`
(the `Outages` listener) reports the service the driver is waiting for at once when it changes, and at the
same pace while it lasts. With a `TableMeter`, each report also carries the meter's last reading of the
table: its figures and compaction backlog (what the operator shows, and scales compaction on) and the
table-uuids `deletionPolicy: Delete` is judged by; a new reading is reported at once, from the meter's
thread (a lock keeps the two callers' reports whole). With the meter's reading, `tables` lists each table
the driver writes (spec.table, then each route's), its lag from its own committed offsets against each
topic's end at the last batch, summed over every topic and partition it reads (caught up: spec.table's
offsets are the end), its freshness, last commit
and uuid (`icefall.plan.table_status.destination_status`), the tables its dynamic route made included
(at most `MAX_STATUS_TABLES` in all: spec.table and the most lagging), and `dynamicTables` counts those.
The driver's Role may patch only its own
StreamingTable's status (`icefall.plan.rbac`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icefall.api import DestinationStatus, PartitionLag, WriterReport
from icefall.api.status import REPORTED_PARTITIONS
from icefall.plan.table_status import bounded_tables, destination_status, topic_ends

if TYPE_CHECKING:
    from icefall.controller.kube import Kube
    from icefall.ingest.report import BatchReport
    from icefall.ingest.table_meter import Meter, TableReading

log = logging.getLogger(__name__)

REPORT_INTERVAL_SECONDS = 10.0


class WriterStatusReporter:
    """An `Ingestor.run` batch callback that reports to `namespace/name`'s status (module doc)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        *,
        interval: float = REPORT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        meter: Meter | None = None,
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.meter = meter
        if meter is not None:
            meter.on_reading = self.table_read  # a new reading of the table is reported at once
        self._lock = threading.Lock()  # the batch loop and the meter's thread both report
        self._sent_reading: TableReading | None = None
        self.interval, self._clock, self._wall = interval, clock, wall
        self._sent_at: float | None = None
        self._last_commit: datetime | None = None
        self._snapshot_id: int | None = None
        self._schema_refused: tuple[str, ...] = ()
        self._waiting_for: str | None = None
        self._lost_records: int | None = None
        self._last_loss: datetime | None = None
        self._last: BatchReport | None = None
        self._partitions: tuple[int, ...] = ()  # of the last batch: caught up, each of them lags 0
        self._failures = 0

    def __call__(self, report: BatchReport | None) -> None:
        """A batch landed (`report`), or none was due (None: caught up, nothing waits)."""
        if report is not None:
            self._last_commit, self._snapshot_id = self._wall(), report.snapshot_id
            self._schema_refused = report.schema_refused
            self._lost_records = report.lost_records
            if report.skipped:
                self._last_loss = self._last_commit
            self._partitions = tuple(report.partition_lag)
            if report.records_dead_lettered and self.meter is not None:
                self.meter.dead_letters_seen()
        self._last = report
        self._report(force=False)

    def waiting(self, service: object | None) -> None:
        """The driver is waiting out `service` (an `icefall.plan.outages.Service`), or no longer (None)."""
        name = str(service) if service is not None else None
        changed = name != self._waiting_for
        self._waiting_for = name
        self._report(force=changed)

    def table_read(self) -> None:
        """The meter read the table: report at once when the reading differs from the last one sent."""
        reading = self.meter.latest if self.meter is not None else None
        self._report(force=reading is not None and reading != self._sent_reading)

    def _report(self, *, force: bool) -> None:
        with self._lock:
            now = self._clock()
            if not force and self._sent_at is not None and now - self._sent_at < self.interval:
                return
            self._sent_at = now
            self._send(self._measured())

    def _measured(self) -> WriterReport:
        last = self._last
        reading = self.meter.latest if self.meter is not None else None
        self._sent_reading = reading
        return WriterReport(
            reported_at=self._wall(),
            freshness_seconds=max(last.freshness_seconds, 0.0) if last is not None else 0.0,
            lag_records=max(last.lag, 0) if last is not None else 0,
            partition_lag=_most_lagging(
                last.partition_lag if last is not None else dict.fromkeys(self._partitions, 0)
            ),
            last_commit_time=self._last_commit,
            snapshot_id=self._snapshot_id,
            waiting_for=self._waiting_for,
            schema_refused=[message[:1000] for message in self._schema_refused[:20]],
            # One count, two sources: neither goes down, so the larger is the newer.
            lost_records=_larger(self._lost_records, reading.lost_records if reading is not None else None),
            last_loss_time=self._last_loss,
            table_uuid=(reading.table_uuid or None) if reading is not None else None,  # Delta: its log's id
            dead_letter_table_uuid=reading.dead_letter_table_uuid if reading is not None else None,
            table=reading.table if reading is not None else None,
            tables=self._tables(reading),
            dynamic_tables=_dynamic_count(reading),
        )

    def _tables(self, reading: TableReading | None) -> list[DestinationStatus]:
        """Each table the driver writes (module doc); none before the meter's first reading."""
        if reading is None or not reading.identifier:
            return []
        last = self._last
        freshness = round(max(last.freshness_seconds, 0.0), 1) if last is not None else 0.0
        main = DestinationStatus(
            table=reading.identifier,
            lag_records=max(last.lag, 0) if last is not None else 0,
            freshness_seconds=freshness,
            last_commit_time=self._last_commit or _time(reading.facts.last_commit_ms),
            snapshot_id=self._snapshot_id or reading.facts.last_commit_snapshot_id,
            compaction_backlog=reading.table.compaction_backlog,
            table_uuid=reading.table_uuid or None,
        )
        held = reading.facts.offsets_by_topic
        end = _ends(last, held)
        now_ms = int(self._wall().timestamp() * 1000)
        routes = [
            destination_status(
                route.table, route.facts, table_uuid=route.table_uuid, end=end,
                table_offsets=held, table_freshness=freshness, now_ms=now_ms,
            )
            for route in reading.routes
        ]  # fmt: skip
        return bounded_tables([main, *routes])

    def _send(self, measured: WriterReport) -> None:
        # A merge patch: a list is replaced whole, so an empty one clears what an earlier report said.
        body = {"writer": measured.model_dump(mode="json", by_alias=True, exclude_none=True)}
        body["writer"].setdefault("waitingFor", None)  # a merge patch: null removes the field
        if not body["writer"].get("tables"):
            body["writer"].pop("tables", None)  # no meter reading yet: nothing to say (or clear)
        try:
            self.kube.patch_status(self.namespace, self.name, body)
        except Exception as error:  # the status is a courtesy: ingestion goes on
            self._failures += 1
            if self._failures == 1:
                log.warning("reporting to %s/%s's status failed: %s", self.namespace, self.name, error)
            return
        if self._failures:
            log.info("reporting to %s/%s's status works again", self.namespace, self.name)
            self._failures = 0


def _ends(last: BatchReport | None, held: Mapping[str, Mapping[int, int]]) -> Mapping[str, Mapping[int, int]]:
    """Each topic's end at the last batch, by partition; caught up (no batch due), spec.table's offsets
    (`held`). A report of one topic without `topic_ends` (the Delta sink's) names no topic: its end is
    that of the one topic spec.table holds."""
    if last is None:
        return held
    if last.topic_ends:
        return last.topic_ends
    one = next(iter(held), "")
    return topic_ends({one: last.offsets}, {one: last.partition_lag})


def _dynamic_count(reading: TableReading | None) -> int | None:
    """How many tables the dynamic route made, in `reading` (None: no reading yet, or no dynamic route)."""
    if reading is None or not reading.dynamic_route:
        return None
    return sum(route.dynamic for route in reading.routes)


def _most_lagging(lag: Mapping[int, int]) -> list[PartitionLag]:
    """The `REPORTED_PARTITIONS` most lagging partitions of `lag`, by partition."""
    top = sorted(lag, key=lambda p: (-lag[p], p))[:REPORTED_PARTITIONS]
    return [PartitionLag(partition=p, records=max(lag[p], 0)) for p in sorted(top)]


def _larger(a: int | None, b: int | None) -> int | None:
    """The larger of two counts, either unknown (None)."""
    return b if a is None else a if b is None else max(a, b)


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
