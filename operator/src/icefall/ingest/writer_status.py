"""The driver's report into its own StreamingTable's status (`status.writer`): lag and freshness as
ingestion measured them for its last batch, and the records lost to retention (the table's count, and when
a commit of this driver last skipped some), so a table whose driver runs is always measured and its data
loss shown, whatever the operator can read (it may hold none of the table's credentials;
`icefall.plan.table_status`). What this driver has not learnt yet (the count before its first commit, a
loss time) is left out of the patch, so an earlier driver's report of it stays.

At most one PATCH every `interval` seconds, the first at once; a failed PATCH is logged (the first one with
its cause) and never stops ingestion. While an outage is waited out no batch lands, so `waiting(service)`
(the `Outages` listener) reports the service the driver is waiting for at once when it changes, and at the
same pace while it lasts. The driver's Role may patch only its own StreamingTable's status
(`icefall.plan.rbac`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icefall.api import WriterReport

if TYPE_CHECKING:
    from icefall.controller.kube import Kube
    from icefall.ingest.report import BatchReport

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
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.interval, self._clock, self._wall = interval, clock, wall
        self._sent_at: float | None = None
        self._last_commit: datetime | None = None
        self._snapshot_id: int | None = None
        self._schema_refused: tuple[str, ...] = ()
        self._waiting_for: str | None = None
        self._lost_records: int | None = None
        self._last_loss: datetime | None = None
        self._last: BatchReport | None = None
        self._failures = 0

    def __call__(self, report: BatchReport | None) -> None:
        """A batch landed (`report`), or none was due (None: caught up, nothing waits)."""
        if report is not None:
            self._last_commit, self._snapshot_id = self._wall(), report.snapshot_id
            self._schema_refused = report.schema_refused
            self._lost_records = report.lost_records
            if report.skipped:
                self._last_loss = self._last_commit
        self._last = report
        self._report(force=False)

    def waiting(self, service: object | None) -> None:
        """The driver is waiting out `service` (an `icefall.plan.outages.Service`), or no longer (None)."""
        name = str(service) if service is not None else None
        changed = name != self._waiting_for
        self._waiting_for = name
        self._report(force=changed)

    def _report(self, *, force: bool) -> None:
        now = self._clock()
        if not force and self._sent_at is not None and now - self._sent_at < self.interval:
            return
        self._sent_at = now
        last = self._last
        measured = WriterReport(
            reported_at=self._wall(),
            freshness_seconds=max(last.freshness_seconds, 0.0) if last is not None else 0.0,
            lag_records=max(last.lag, 0) if last is not None else 0,
            last_commit_time=self._last_commit,
            snapshot_id=self._snapshot_id,
            waiting_for=self._waiting_for,
            schema_refused=[message[:1000] for message in self._schema_refused[:20]],
            lost_records=self._lost_records,
            last_loss_time=self._last_loss,
        )
        self._send(measured)

    def _send(self, measured: WriterReport) -> None:
        # A merge patch: a list is replaced whole, so an empty one clears what an earlier report said.
        body = {"writer": measured.model_dump(mode="json", by_alias=True, exclude_none=True)}
        body["writer"].setdefault("waitingFor", None)  # a merge patch: null removes the field
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
