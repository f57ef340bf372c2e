"""`icefall run` and the driver pod's `icefall ingest`: the commit Lease they take, the loop that runs
the Ingestor until it is told to stop, the line per batch, and the exit codes a supervisor can act on.
`icefall.cli` parses the command line and builds the pieces (Spark, the catalog, the Leases).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from icefall.commit.lease import Lease
    from icefall.plan.names import TableLeases

T = TypeVar("T")

# Exit codes of `icefall run` / `icefall ingest` a supervisor can act on (1: failure, 2: usage).
EXIT_LEASE = 3  # another writer holds or took the table
EXIT_SOURCE_CHANGED = 4  # the topic was recreated or truncated: `icefall reset-offsets` first
EXIT_DATA_LOSS = 5  # retention deleted records and spec.source.onDataLoss is Halt (icefall.cli says which)


def stop_on_signals() -> Any:
    """An Event set by SIGINT/SIGTERM: the process finishes what it is doing and stops."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def commit_lease(lease: Callable[[str], Lease], names: TableLeases) -> Lease:
    """The table's commit Lease (`names`: its `TableLeases`), taken after the commit Lease of versions
    before identity-keyed names while one exists (an upgrade: `SuccessorLease`)."""
    from icefall.commit.lease import SuccessorLease

    if names.legacy_commit is None:
        return lease(names.commit)
    return SuccessorLease(lease(names.commit), lease(names.legacy_commit))


class RunProgress:
    """`icefall run`'s batch callback: a line per batch, a note now and then while caught up, and the stop
    conditions of `args` (`--until-caught-up`, `--max-seconds`); `also` (the driver's status report) and
    `maintenance` (offered every batch's report) are called after it."""

    def __init__(
        self, args: argparse.Namespace, stop: Any, *, maintenance: Any = None, also: Any = None
    ) -> None:
        self.args, self.stop, self.maintenance, self.also = args, stop, maintenance, also
        self.started = self.last_commit = self.last_idle_note = time.monotonic()
        self.totals = {"read": 0, "written": 0, "dead": 0, "batches": 0}

    def should_stop(self) -> bool:
        if self.args.max_seconds and time.monotonic() - self.started > self.args.max_seconds:
            self.stop.set()
        return bool(self.stop.is_set())

    def __call__(self, report: Any) -> None:
        if report is not None:
            self._landed(report)
        elif self.args.until_caught_up:
            self.stop.set()
        elif time.monotonic() - self.last_commit > 30 and time.monotonic() - self.last_idle_note > 30:
            self.last_idle_note = time.monotonic()
            since = (
                f"{time.monotonic() - self.last_commit:.0f}s ago" if self.totals["batches"] else "none yet"
            )
            print(f"[run] caught up, waiting for records; last commit {since}", flush=True)
        self.should_stop()
        if self.also is not None:
            self.also(report)
        if self.maintenance is not None and not self.stop.is_set():
            self.maintenance.offer(report)

    def _landed(self, report: Any) -> None:
        totals = self.totals
        totals["read"] += report.records_read
        totals["written"] += report.records_written
        totals["dead"] += report.records_dead_lettered
        totals["batches"] += 1
        self.last_commit = time.monotonic()
        rate = report.records_read / report.seconds if report.seconds else 0.0
        print(
            f"[run] batch {totals['batches']}: {report.records_read} read, {report.records_written} "
            f"written, {report.records_dead_lettered} to DLQ in {report.seconds:.1f}s ({rate:,.0f} rec/s, "
            f"commit {report.commit_seconds * 1000:.0f} ms) | lag {report.lag} | freshness "
            f"{report.freshness_seconds:.1f}s | snapshot {report.snapshot_id}"
            + "".join(f" | {name} {secs:.2f}s" for name, secs in report.phases.items()),
            flush=True,
        )
        if report.data_loss:
            print(f"[run] DATA LOSS: {report.data_loss} records were deleted by retention first", flush=True)

    def summary(self) -> str:
        totals = self.totals
        return (
            f"[run] stopped after {time.monotonic() - self.started:.1f}s: {totals['batches']} commits, "
            f"{totals['read']} read, {totals['written']} written, {totals['dead']} to the dead-letter table"
        )


def ingest_until_stopped(  # noqa: PLR0913 (the pieces of one run)
    st: Any,
    catalog: Any,
    spark: Any,
    lease: Any,
    args: argparse.Namespace,
    *,
    maintenance: Any = None,
    stop: Any = None,
    yield_to: Any = None,
    report_to: Any = None,
) -> int:
    """Run the Ingestor until SIGINT/SIGTERM (the batch in flight finishes) or the `args` limits say so.
    `maintenance` (an EmbeddedMaintenance on its own thread), if given, is offered every batch's report and
    stopped, after its item in flight, before Spark; `report_to` gets every batch's report too (the
    driver's status report). Kafka, the catalog, the object store or the schema registry unreachable, at
    start or later, is waited out (`icefall.ingest.outages`)."""
    from icefall.commands.common import outages_for
    from icefall.ingest.engine import Ingestor

    progress = RunProgress(
        args, stop if stop is not None else stop_on_signals(), maintenance=maintenance, also=report_to
    )
    ingestor = None
    # The driver's status report says which service it is waiting out (no batch lands meanwhile).
    waiting = getattr(report_to, "waiting", None)
    try:
        # An Avro table without an inline schema asks the registry for its columns here.
        at_start = outages_for(st, catalog)
        at_start.listener = waiting
        ingestor = made_when_reachable(
            lambda: Ingestor(st, catalog, spark, lease, yield_to=yield_to), at_start, progress.should_stop
        )
        if ingestor is not None:
            ingestor.outages.listener = waiting
        code = 1 if ingestor is None else run_ingestor(ingestor, progress, args)
    finally:
        if ingestor is not None:
            ingestor.close()
        if maintenance is not None and not maintenance.stop(timeout=1):
            print("[run] waiting for the maintenance item in flight to finish ...", flush=True)
            maintenance.stop()
        stop_spark(spark)
    print(progress.summary(), flush=True)
    return code


def ingest_delta_until_stopped(
    st: Any,
    location: str,
    spark: Any,
    lease: Any,
    args: argparse.Namespace,
    *,
    stop: Any = None,
    maintenance: Any = None,
    report_to: Any = None,
) -> int:
    """`ingest_until_stopped` for a Delta table (`icefall.ingest.delta_sink.DeltaIngestor`); `maintenance`
    and `report_to` (the driver pod's status report) as there."""
    from icefall.catalog.delta_schema import DeltaSchemaRefusedError
    from icefall.ingest.delta_sink import BadRecordsHaltedError, DeltaIngestor, delta_services
    from icefall.ingest.outages import Outages

    progress = RunProgress(
        args, stop if stop is not None else stop_on_signals(), maintenance=maintenance, also=report_to
    )
    ingestor = None
    waiting = getattr(report_to, "waiting", None)  # the service waited out, in the driver's status
    try:
        # A registry format without an inline schema asks the registry for its columns here.
        at_start = Outages(".".join(st.table_identifier), delta_services(st.spec, location))
        at_start.listener = waiting
        ingestor = made_when_reachable(
            lambda: DeltaIngestor(st, spark, lease, location=location), at_start, progress.should_stop
        )
        if ingestor is not None:
            ingestor.outages.listener = waiting
        code = 1 if ingestor is None else run_ingestor(ingestor, progress, args)
    except (BadRecordsHaltedError, DeltaSchemaRefusedError) as halted:
        print(f"[run] stopping: {halted}", flush=True)
        code = 1
    finally:
        if ingestor is not None:
            ingestor.close()
        if maintenance is not None and not maintenance.stop(timeout=1):
            print("[run] waiting for the maintenance item in flight to finish ...", flush=True)
            maintenance.stop()
        stop_spark(spark)
    print(progress.summary(), flush=True)
    return code


def made_when_reachable(make: Callable[[], T], outages: Any, should_stop: Callable[[], bool]) -> T | None:
    """`make()`, called again after each outage (`outages`: an `icefall.ingest.outages.Outages`) until it
    gets through; None when `should_stop()` first. Any other error is raised."""
    made: list[T] = []
    if outages.retrying(lambda: made.append(make()), should_stop):
        return made[0]
    return None


def run_ingestor(ingestor: Any, progress: RunProgress, args: argparse.Namespace) -> int:
    """Start and run `ingestor`; the exit code, with what stopped it said in one line."""
    from icefall.commit import FencedError
    from icefall.commit.lease import LeaseTimeoutError
    from icefall.ingest.engine import SourceChangedError
    from icefall.runtime.failpoints import last_words

    def start() -> None:
        ingestor.start(lease_timeout=args.lease_timeout)

    try:
        if ingestor.outages.retrying(start, progress.should_stop):
            ingestor.run(progress.should_stop, progress)
    except LeaseTimeoutError as waited:
        print(f"[run] could not take this table's commit lease: {waited}", flush=True)  # held, or missing
        return EXIT_LEASE
    except FencedError as fenced:
        print(f"[run] stopping: a newer writer took over this table ({fenced})", flush=True)
        return EXIT_LEASE
    except SourceChangedError as changed:
        print(f"[run] stopping: {changed}", flush=True)
        # In a pod, the operator shows it as the table's condition (plan.conditions.driver_refusal).
        last_words(f"{changed.reason.value}: {changed}")
        return EXIT_SOURCE_CHANGED
    if ingestor.outages.state.ongoing:
        service = ingestor.outages.state.service
        print(
            f"[run] stopped while {service.display_name if service else 'a service'} was unreachable "
            f"({ingestor.outages.state.failures} failed attempts)",
            flush=True,
        )
        return 1
    return 0


def stop_spark(spark: Any) -> None:
    """Stop the Spark session; a JVM already gone is not an error: a SIGTERM sent to the whole process
    group (a supervisor stopping the group, `kill -- -PGID`) ends the JVM at once, beside this process's
    orderly stop. Everything committed is in the table; nothing else was pending."""
    import logging

    from py4j.protocol import Py4JError

    from icefall.spark.session import jvm_stopped

    gone = "[icefall] Spark's JVM had already stopped (the signal reached it too)"
    if jvm_stopped(spark):
        print(gone, flush=True)
        return
    logging.disable(logging.ERROR)  # py4j logs a traceback of its own before raising
    try:
        spark.stop()
    except (Py4JError, OSError):
        print(gone, flush=True)
    finally:
        logging.disable(logging.NOTSET)
