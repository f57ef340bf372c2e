"""The maintenance loop: read the table → plan → claim one item with a work Lease → run it → repeat.

`MaintenanceRunner.step()` does one round and runs at most one item: it loads the table, reads its
`TableView`, plans with `plan_maintenance(view, policy, now_ms)` (the clock is injectable: tests move it
forward instead of waiting out the orphan safety window), and walks the plan in order, claiming each item
with the work Lease `TableLeases.work_for(work_key(item))` (`acquire(timeout=0)`: an item another worker
holds is skipped, not waited for) until one is claimed; that one is run by `icefall.compact.worker.run_item`
while a background thread renews its Lease, then the Lease is released (and kept: the pool of work Leases
is fixed, and in a cluster the operator creates them, `icefall.plan.lease_objects`). One lease object per
name for the runner's life (`LeasePool`): a worker that died holding a work Lease is seen unchanged round
after round and taken over one lease duration after its last renewal. `run(should_stop)` repeats steps,
sleeping `idle_seconds` when there was nothing to claim, until `should_stop()` — the compaction pods' loop
(`icefall compact`). `EmbeddedMaintenance` runs `step()` in `icefall run`, on a thread of its own beside
the ingestion batches (their Spark jobs share the cores through Spark's FAIR scheduler), so a rewrite never
delays a batch's start or commit.

Guarantees:
- Two workers never run the same item at once while their Leases work (keys: plan/maintenance.py
  `work_key`); table-wide items (expiry, orphans, manifests, retention) are one per table at a time.
  Correctness does not rest on the Lease: a rewrite of files already rewritten fails Iceberg's validation.
- A failed item never stops the loop: it is counted (metrics), logged, and planned again next round.
- The loop never takes the table's commit Lease: ingestion holds it for its whole life, and taking it would
  fence the writer. A maintenance commit that lands between an ingestion batch's stage and commit is
  absorbed by the commit protocol: the batch is re-staged on the new head (commit/DESIGN.md), neither
  re-planned nor duplicated.
- A rewrite cannot starve on a hot keyed table: each keyed batch adds position deletes to the files it
  touches, and Iceberg refuses a rewrite whose input files got new deletes after they were read. After
  `YIELD_AFTER_CONFLICTS` such refusals in a row, the item's next attempt runs holding the table's yield
  Lease (`TableLeases.rewrite_yield`); the keyed table's ingestion does not start a batch while it is held (at
  most `YIELD_MAX_WAIT_SECONDS` per batch), so that attempt, or the one right after the batch that was
  already in flight, commits. The price is one pause of ingestion for the length of a rewrite.

`EmbeddedMaintenance` runs a step only when `interval_seconds` have passed since the last one and ingestion
is not behind (the last batch left no lag, or its freshness is within half the target), so maintenance
never starves the freshness target; each step runs at most one item, bounded by the policy's
`max_bytes_per_task`. A runner reads only the manifests written since its last round (`ManifestCache`).

A routed StreamingTable writes several tables (`StreamingTable.destination_identifiers`); `TablesRunner`
tidies them all from the same process: one `MaintenanceRunner` per table (each with its own work and yield
Leases, `icefall.plan.names.destination_leases`), and each round runs at most one item of one table, the
tables taking turns (a round starts at the table after the one that ran last), so a busy table cannot
starve the others. Why one set of pods for all the tables, not a Deployment per table: what compaction
costs is the work (the backlog), not the number of tables, and most tables of a routed topic are tidy at
any time. The pods scale on the summed backlog of every table (`plan.table_status.reported_backlog`, at
most `spec.compaction.maxReplicas`); N pods share the tables' items through the work Leases, and a
StreamingTable of 65 tables costs no pod while they are all tidy. The price: one Spark session holds the
catalog clients of every table, and each round plans each table until one has work (a catalog read per
table; `ManifestCache` keeps manifests read once).

The tables a dynamic route creates (`spec.dynamicRoute`) take their turns after the static ones
(`DynamicRunners`): found in the catalog by their owner property (`dynamic_route_identifiers`) at start
and again every `DYNAMIC_REFRESH_SECONDS`, since the driver creates them while compaction runs. Their
names are not known in advance, so they share one set of Leases, the dynamic route's own identity
(`icefall.plan.names.dynamic_route_leases`, which the Role names); an item takes the work Lease of its
table and key (compact/DESIGN.md).

Not guaranteed: fairness between items of one table (the plan's order decides: retention, the hottest
partitions, manifests, expiry, orphans), or that a step's plan is current when its item runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from icefall.catalog import CatalogConfig
from icefall.commit.lease import Lease, LeaseError, LeasePool, LeaseTimeoutError
from icefall.compact.view import ManifestCache, read_table_view
from icefall.compact.worker import ItemResult, is_delete_conflict, kind_of, run_item, table_label
from icefall.ingest.outages import log_failure
from icefall.plan.delta_maintenance import DeltaPodItem
from icefall.plan.leases import WORK_LEASE_SECONDS, YIELD_AFTER_CONFLICTS
from icefall.plan.maintenance import plan_maintenance, policy_from_spec, work_key
from icefall.plan.maintenance_items import MIB, ApplyDeletes, CompactPartition, MaintenancePolicy, WorkItem
from icefall.plan.names import TableLeases, destination_leases, dynamic_route_leases, table_leases
from icefall.runtime import metrics
from icefall.spark.session import jvm_stopped

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from icefall.api.spec import StreamingTable

log = logging.getLogger(__name__)

LeaseFactory = Callable[[str], Lease]
EMBEDDED_MAX_BYTES_PER_ITEM = 256 * MIB
MAINTENANCE_POOL = "maintenance"  # the Spark scheduler pool of in-process maintenance
#: How often compaction looks for the tables a dynamic route created since (`DynamicRunners`).
DYNAMIC_REFRESH_SECONDS = 60.0


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class StepResult:
    """One round: how many items the plan had, which one ran (if any), and how it went."""

    planned: int
    item: WorkItem | DeltaPodItem | None = None  # None: nothing ran (`ran`), so the loop pauses
    result: ItemResult | None = None
    error: str | None = None
    busy: int = 0  # items skipped because another worker holds their Lease
    table: str = ""  # the table the item is of (`table_label`)

    @property
    def ran(self) -> bool:
        return self.item is not None


class ItemRunner(Protocol):
    def __call__(
        self, spark: SparkSession, catalog: CatalogConfig, identifier: Sequence[str], item: WorkItem
    ) -> ItemResult: ...


@contextmanager
def claimed(lease: Lease, lease_seconds: float) -> Iterator[bool]:
    """A work Lease taken at once and renewed while the body runs, then let go (True), or False when another
    worker holds it. Both compaction loops claim their items so (`Maintenance.step`, Delta's pods)."""
    try:
        lease.acquire(timeout=0)
    except LeaseTimeoutError:
        yield False
        return
    try:
        with Renewer(lease, max(lease_seconds / 3, 0.5)):
            yield True
    finally:
        try:
            lease.release()
        except Exception:  # it runs out by itself
            log.warning("releasing a work lease failed", exc_info=True)


class Renewer:
    """Renews a held Lease every third of its duration until stopped (a long rewrite keeps its claim)."""

    def __init__(self, lease: Lease, period: float) -> None:
        self._lease = lease
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="icefall-work-lease", daemon=True)

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._lease.renew()
            except LeaseError:
                log.warning("lost a work lease while running its item; the commit stays safe")
                return
            except Exception:  # a flaky API server: the lease has slack, try again
                log.warning("renewing a work lease failed; retrying", exc_info=True)


class Rounds:
    """What repeats `step()`: one table's runner, or every table's (`TablesRunner`)."""

    label: str
    spark: SparkSession

    def step(self, now_ms: int | None = None) -> StepResult:
        raise NotImplementedError

    def run(
        self,
        should_stop: Callable[[], bool],
        *,
        idle_seconds: float = 30.0,
        wait: Callable[[float], object] | None = None,
        on_step: Callable[[StepResult], None] | None = None,
    ) -> None:
        """Repeat `step()` until `should_stop()`; sleep `idle_seconds` after a round with nothing run, and
        back off (up to `idle_seconds`) after failures. `wait(seconds)` sleeps and may return early."""
        pause = wait or time.sleep
        failures = 0
        while not should_stop():
            try:
                outcome = self.step()
            except Exception as error:  # the catalog or storage did not answer: try again later
                log_failure(log, error, "%s: planning maintenance failed", self.label)
                outcome = StepResult(0, error="planning failed")
            if on_step is not None:
                on_step(outcome)
            if should_stop():
                break
            if outcome.error is not None:
                failures += 1
                pause(min(idle_seconds, 2.0 * failures))
            else:
                failures = 0
                if not outcome.ran:
                    pause(idle_seconds)


class MaintenanceRunner(Rounds):
    """Plan and run maintenance for one table (module doc)."""

    def __init__(  # noqa: PLR0913 (keyword-only settings)
        self,
        spark: SparkSession,
        catalog: CatalogConfig,
        identifier: Sequence[str],
        policy: MaintenancePolicy,
        leases: LeaseFactory,
        *,
        table_leases: TableLeases,
        clock_ms: Callable[[], int] = wall_clock_ms,
        list_storage: bool = True,
        lease_seconds: float = WORK_LEASE_SECONDS,
        runner: ItemRunner = run_item,
        work_scope: str = "",
    ) -> None:
        """`work_scope`: put before each item's key when choosing its work Lease (a dynamic route's tables
        share one pool: their items' Leases are chosen by table and key)."""
        self.spark = spark
        self.work_scope = work_scope
        self.catalog = catalog
        self.identifier = tuple(identifier)
        self.policy = policy
        self.leases = LeasePool(leases)
        self.table_leases = table_leases
        self.clock_ms = clock_ms
        self.list_storage = list_storage
        self.lease_seconds = lease_seconds
        self.runner = runner
        self.label = table_label(self.identifier)
        self.manifests = ManifestCache()  # a round reads only the manifests written since the last one
        self.conflicts: dict[str, int] = {}  # work key -> rewrites refused in a row for deletes meanwhile

    def plan(self, now_ms: int | None = None) -> tuple[WorkItem, ...]:
        table = self.catalog.pyiceberg().load_table(self.identifier)
        view = read_table_view(table, list_storage=self.list_storage, cache=self.manifests)
        work = plan_maintenance(view, self.policy, self.clock_ms() if now_ms is None else now_ms)
        metrics.MAINTENANCE_BACKLOG.labels(self.label).set(len(work))
        return work

    def step(self, now_ms: int | None = None) -> StepResult:
        """One round (module doc): at most one item run. Errors of the item are returned, not raised."""
        work = self.plan(now_ms)
        busy = 0
        for item in work:
            key = work_key(item)
            lease = self.leases(self.table_leases.work_for(self.work_scope + key))
            with claimed(lease, self.lease_seconds) as held:
                if not held:
                    busy += 1
                    continue
                try:
                    result = self._run_claimed(item, key)
                except Exception as error:  # counted and logged by run_item; planned again next round
                    if jvm_stopped(self.spark, error):  # being stopped: nothing to report but that
                        log.info("%s: %s stopped with Spark's JVM", self.label, kind_of(item))
                        return StepResult(len(work), item, None, "Spark's JVM stopped", busy)
                    if is_delete_conflict(error):  # expected beside a keyed table's MERGEs: no traceback
                        log.info(
                            "%s: %s lost to ingestion's deletes (%d in a row); planned again",
                            self.label, kind_of(item), self.conflicts.get(key, 0),
                        )  # fmt: skip
                    else:
                        log_failure(log, error, "%s: %s failed", self.label, kind_of(item))
                    return StepResult(len(work), item, None, f"{type(error).__name__}: {error}", busy)
            return StepResult(len(work), item, result, None, busy)
        return StepResult(len(work), busy=busy)

    def _run_claimed(self, item: WorkItem, key: str) -> ItemResult:
        """Run a claimed item. A rewrite that lost to a keyed table's deletes `YIELD_AFTER_CONFLICTS` times
        in a row runs holding the table's yield Lease (ingestion waits before its next batch), and once
        more if the batch that was in flight when the Lease was taken still beat it."""
        if not isinstance(item, CompactPartition | ApplyDeletes) or self.conflicts.get(key, 0) < (
            YIELD_AFTER_CONFLICTS
        ):
            return self._run_counting_conflicts(item, key)
        barrier = self.leases(self.table_leases.rewrite_yield)
        try:
            barrier.acquire(timeout=0)
        except LeaseTimeoutError:  # another worker's rewrite holds it: try without
            return self._run_counting_conflicts(item, key)
        log.info(
            "%s: %s lost to ingestion's deletes %d times in a row; ingestion waits for this attempt",
            self.label,
            kind_of(item),
            self.conflicts[key],
        )
        metrics.COMPACTION_YIELDS.labels(self.label).inc()
        try:
            with Renewer(barrier, max(self.lease_seconds / 3, 0.5)):
                try:
                    return self._run_counting_conflicts(item, key)
                except Exception as error:
                    if not is_delete_conflict(error):
                        raise
                    return self._run_counting_conflicts(item, key)
        finally:
            try:
                barrier.release()
            except Exception:  # it runs out by itself
                log.warning("releasing the yield lease failed", exc_info=True)

    def _run_counting_conflicts(self, item: WorkItem, key: str) -> ItemResult:
        try:
            result = self.runner(self.spark, self.catalog, self.identifier, item)
        except Exception as error:
            if is_delete_conflict(error):
                self.conflicts[key] = self.conflicts.get(key, 0) + 1
            raise
        self.conflicts.pop(key, None)
        return result


class DynamicRunners:
    """A runner per table a dynamic route made (`find`: their identifiers, from the catalog by their owner
    property; `make`: a table's runner), found again at most every `refresh_seconds`: the driver creates
    tables while compaction runs. A table no longer found loses its runner; a failed search keeps the
    last list (logged)."""

    def __init__(
        self,
        find: Callable[[], Sequence[tuple[str, ...]]],
        make: Callable[[tuple[str, ...]], MaintenanceRunner],
        *,
        refresh_seconds: float = DYNAMIC_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._find, self._make = find, make
        self.refresh_seconds, self._clock = refresh_seconds, clock
        self._runners: dict[tuple[str, ...], MaintenanceRunner] = {}
        self._found_at: float | None = None

    def current(self) -> list[MaintenanceRunner]:
        now = self._clock()
        if self._found_at is None or now - self._found_at >= self.refresh_seconds:
            self._found_at = now
            try:
                found = [tuple(i) for i in self._find()]
            except Exception as error:  # the catalog did not answer: the tables known stay
                log_failure(log, error, "finding the dynamic route's tables failed")
            else:
                self._runners = {i: self._runners.get(i) or self._make(i) for i in found}
        return list(self._runners.values())


class TablesRunner(Rounds):
    """Maintenance of every table a StreamingTable writes, in one process, the tables taking turns (module
    doc). Each round plans the tables from the one after the last that ran an item, and runs the first
    item it can claim; a table whose planning fails is logged and passed over. `dynamic`: the tables a
    dynamic route made, after the static ones."""

    def __init__(self, runners: Sequence[MaintenanceRunner], dynamic: DynamicRunners | None = None) -> None:
        if not runners:
            raise ValueError("no table to maintain")
        self.runners = list(runners)
        self.dynamic = dynamic
        self.spark = self.runners[0].spark
        self.label = f"{self.runners[0].label} and {len(self.runners) - 1} route tables"
        if dynamic is not None:
            self.label += " and its dynamic route's tables"
        self._next = 0

    def step(self, now_ms: int | None = None) -> StepResult:
        planned = busy = failed = 0
        runners = list(self.runners)
        if self.dynamic is not None:
            runners += self.dynamic.current()
        count = len(runners)
        for offset in range(count):
            index = (self._next + offset) % count
            runner = runners[index]
            try:
                outcome = runner.step(now_ms)
            except Exception as error:  # one table's catalog or storage trouble: the others go on
                log_failure(log, error, "%s: planning maintenance failed", runner.label)
                failed += 1
                continue
            planned, busy = planned + outcome.planned, busy + outcome.busy
            if outcome.ran:
                self._next = (index + 1) % count
                return replace(outcome, planned=planned, busy=busy, table=runner.label)
        return StepResult(planned, busy=busy, error="planning failed" if failed == count else None)


class BatchLike(Protocol):
    @property
    def lag(self) -> int: ...

    @property
    def freshness_seconds(self) -> float: ...


class EmbeddedMaintenance:
    """In-process maintenance beside ingestion (module doc). `between_batches(report)` runs a step now if one
    is due (None: an idle poll). `start()` moves the steps to a thread of their own: then `offer(report)`
    after every batch hands over the latest report and returns at once, and `stop()` waits for the item in
    flight."""

    def __init__(
        self,
        runner: Rounds,
        *,
        interval_seconds: float,
        freshness_target_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.interval_seconds = interval_seconds
        self.freshness_target_seconds = freshness_target_seconds
        self.clock = clock
        self._last: float | None = None
        self.steps: list[StepResult] = []
        self._latest: BatchLike | None = None
        self._offered = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self, report: BatchLike | None) -> bool:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_seconds:
            return False
        if report is None:
            return True
        return report.lag == 0 or report.freshness_seconds < self.freshness_target_seconds / 2

    def between_batches(self, report: BatchLike | None) -> StepResult | None:
        if not self.due(report):
            return None
        self._last = self.clock()
        try:
            outcome = self.runner.step()
        except Exception as error:
            log_failure(log, error, "%s: in-process maintenance failed", self.runner.label)
            return None
        if outcome.ran:
            self.steps.append(outcome)
        return outcome

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="icefall-maintenance", daemon=True)
        self._thread.start()

    def offer(self, report: BatchLike | None) -> None:
        self._latest = report
        self._offered.set()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread once its item in flight is done; False if it still runs after `timeout`."""
        self._stopping.set()
        self._offered.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _loop(self) -> None:
        # Spark's FAIR scheduler (set by `icefall run`) then shares the cores between this pool and the
        # ingestion batches instead of queueing a batch's tasks behind a rewrite's.
        if self.runner.spark is not None:
            self.runner.spark.sparkContext.setLocalProperty("spark.scheduler.pool", MAINTENANCE_POOL)
        while True:
            self._offered.wait()
            if self._stopping.is_set():
                return
            self._offered.clear()
            self.between_batches(self._latest)


# ------------------------------------------------------------------------------------------ entry points


def file_leases(lease_dir: Path, holder: str | None = None) -> LeaseFactory:
    """Work Leases as files in `lease_dir` (the embedded default and local `icefall compact -f`)."""
    from icefall.commit.lease import FileLease, local_process_holder

    identity = holder or local_process_holder()
    return lambda name: FileLease.in_dir(lease_dir, name, identity, duration_seconds=WORK_LEASE_SECONDS)


def runner_for(
    st: StreamingTable,
    catalog: CatalogConfig,
    spark: SparkSession,
    leases: LeaseFactory,
    *,
    clock_ms: Callable[[], int] = wall_clock_ms,
    policy: MaintenancePolicy | None = None,
) -> MaintenanceRunner:
    """The runner of `st`'s table with `policy_from_spec(st.spec)` (or `policy`)."""
    return MaintenanceRunner(
        spark,
        catalog,
        st.table_identifier,
        policy or policy_from_spec(st.spec),
        leases,
        table_leases=table_leases(st),
        clock_ms=clock_ms,
    )


def tables_runner(
    st: StreamingTable,
    catalog: CatalogConfig,
    spark: SparkSession,
    leases: LeaseFactory,
    *,
    policy: MaintenancePolicy | None = None,
) -> Rounds:
    """The runner of every table `st` writes (module doc): `runner_for` its table when it has no routes,
    else a `TablesRunner` of one runner per table, each with that table's own Leases, and of the tables
    its dynamic route made, under the Leases they share (`dynamic_route_leases`)."""
    if not st.spec.routed:
        return runner_for(st, catalog, spark, leases, policy=policy)
    chosen = policy or policy_from_spec(st.spec)
    runners = [
        MaintenanceRunner(spark, catalog, identifier, chosen, leases, table_leases=names)
        for identifier, names in zip(st.destination_identifiers, destination_leases(st), strict=True)
    ]
    shared = dynamic_route_leases(st)
    if shared is None:
        return TablesRunner(runners)

    def find() -> list[tuple[str, ...]]:
        from icefall.catalog.tables import dynamic_route_identifiers

        return dynamic_route_identifiers(catalog.pyiceberg(), st)

    def make(identifier: tuple[str, ...]) -> MaintenanceRunner:
        scope = ".".join(identifier) + "/"  # one pool for all: an item's Lease by its table and key
        return MaintenanceRunner(
            spark, catalog, identifier, chosen, leases, table_leases=shared, work_scope=scope
        )

    return TablesRunner(runners, DynamicRunners(find, make))


def embedded_maintenance(
    st: StreamingTable, catalog: CatalogConfig, spark: SparkSession, lease_dir: Path
) -> EmbeddedMaintenance:
    """`icefall run`'s in-process maintenance: one item per pause, `spec.compaction.embeddedIntervalSeconds`
    apart; an item rewrites at most 256 MiB so a pause stays short."""
    policy = policy_from_spec(st.spec)
    policy = replace(policy, max_bytes_per_task=min(policy.max_bytes_per_task, EMBEDDED_MAX_BYTES_PER_ITEM))
    return EmbeddedMaintenance(
        tables_runner(st, catalog, spark, file_leases(lease_dir), policy=policy),
        interval_seconds=st.spec.compaction.embedded_interval_seconds,
        freshness_target_seconds=st.spec.freshness.target_seconds,
    )


def serve(
    runner: Rounds, *, once: bool = False, idle_seconds: float = 30.0, spark: SparkSession | None = None
) -> int:
    """The compaction pods' loop until SIGTERM/SIGINT (the item in flight finishes first): 0 on a clean
    stop. With `once`, one round: 0 if it ran an item or had nothing to do, 1 if the item failed. 1 also
    when `spark`'s JVM exits on its own (the kernel's OOM killer, a crash): no item could run again in this
    process, so it ends and its container is restarted (a pod's status then says why, e.g. OOMKilled)."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def report(outcome: StepResult) -> None:
        label = outcome.table or runner.label
        if outcome.item is None:
            print(f"[compact] {runner.label}: {outcome.planned} items planned, none to claim", flush=True)
        elif outcome.result is not None:
            result = outcome.result
            print(
                f"[compact] {label}: {result.kind} {result.outcome.value}: {result.detail} "
                f"({result.seconds:.1f}s)",
                flush=True,
            )
        else:
            print(f"[compact] {label}: {kind_of(outcome.item)} failed: {outcome.error}", flush=True)

    if once:
        outcome = runner.step()
        report(outcome)
        return 1 if outcome.error else 0

    def jvm_exited() -> bool:
        return spark is not None and not stop.is_set() and jvm_stopped(spark)

    runner.run(
        lambda: stop.is_set() or jvm_exited(), idle_seconds=idle_seconds, wait=stop.wait, on_step=report
    )
    if jvm_exited():
        print(
            f"[compact] {runner.label}: Spark's JVM exited by itself; exiting so this container restarts",
            flush=True,
        )
        return 1
    print(f"[compact] {runner.label}: stopped", flush=True)
    return 0
