"""The driver's own reading of its table, for its status report (`status.writer`): the table's figures
(files, records, snapshots, last compaction and expiry), the compaction backlog the compaction pods are
scaled on, the records lost to retention, and the Iceberg `table-uuid` of the table and its dead-letter
table (the only tables `deletionPolicy: Delete` may drop, `icefall purge`). The driver reads with the
table's own credentials from its own pod; the operator, which reads no table itself, shows these figures
and scales compaction from them (`icefall.plan.table_status`).

A routed StreamingTable's meter reads each route's table too (`RouteReading`: its committed offsets, last
commit, newest record, backlog and uuid), from which the report gives each destination's lag and
freshness (`status.writer.tables`, `icefall.plan.table_status.destination_status`); a route table not
created yet is left out. So is each table its dynamic route made (`spec.dynamicRoute`), found in the
catalog by its owner property at each reading (`owned_dynamic_tables`: at most `maxTables`, 100).

`TableMeter` reads on a thread of its own (the backlog reads manifests: never on the batch loop), at most
every `interval` seconds, and every `retry` seconds while the table does not exist yet (the driver creates
it at start). `latest` is the last reading. The thread is `Meter`'s, which a Delta table's meter shares
(`icefall.ingest.delta_meter.DeltaMeter`).

Guarantees: a failed reading never stops ingestion; it is logged (the first of a series with its cause) and
the previous reading stays. The client's connections and requests wait at most `REQUEST_TIMEOUT_SECONDS`
each. Not guaranteed: that the reading is current (it is up to `interval` old).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from icefall.api import StreamingTable, TableStatus
from icefall.compact.measure import compaction_backlog, table_facts
from icefall.compact.view import ManifestCache
from icefall.plan.table_status import TableFacts, table_status

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from icefall.catalog import CatalogConfig

log = logging.getLogger(__name__)

READ_INTERVAL_SECONDS = 30.0
MISSING_RETRY_SECONDS = 5.0
#: How long the meter's catalog client waits to connect and for each answer (`icefall.catalog.timeouts`).
REQUEST_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class RouteReading:
    """One reading of a route's table (`spec.routes`), or of a table the dynamic route made."""

    table: str  # its identifier, dotted
    table_uuid: str
    facts: TableFacts
    dynamic: bool = False  # made by `spec.dynamicRoute`


@dataclass(frozen=True)
class TableReading:
    """One reading of the driver's table (see the module doc)."""

    table_uuid: str
    dead_letter_table_uuid: str | None
    table: TableStatus
    lost_records: int  # the table's icefall.lost-records (status.writer.lostRecords)
    facts: TableFacts = field(default_factory=TableFacts)  # what the figures above came from
    identifier: str = ""  # the table's, dotted ("": not said; then no per-table report)
    routes: tuple[RouteReading, ...] = ()
    dynamic_route: bool = False  # the StreamingTable has one: its tables are the routes marked dynamic


def _facts(table: Table, st: StreamingTable, now_ms: int, cache: ManifestCache | None) -> TableFacts:
    facts = table_facts(table)
    if st.spec.compaction.enabled:
        backlog, ratio = compaction_backlog(table, st, now_ms, cache)
        facts = replace(facts, compaction_backlog=backlog, small_file_ratio=ratio)
    return facts


def read_table(
    catalog: Catalog,
    st: StreamingTable,
    now_ms: int,
    cache: ManifestCache | None = None,
    route_caches: MutableMapping[str, ManifestCache] | None = None,
) -> TableReading | None:
    """The table of `st` and its route tables, static and dynamic, read from `catalog` now (`cache`,
    `route_caches` by dotted identifier: manifests read before, a new table's added); None while the table
    does not exist."""
    from pyiceberg.exceptions import NoSuchTableError

    from icefall.catalog.tables import owned_dynamic_tables

    try:
        table = catalog.load_table(st.table_identifier)
    except NoSuchTableError:
        return None
    facts = _facts(table, st, now_ms, cache)
    dead_letter_uuid = None
    if st.dead_letter_identifier is not None:
        with contextlib.suppress(NoSuchTableError):
            dead_letter_uuid = str(catalog.load_table(st.dead_letter_identifier).metadata.table_uuid)
    routes = []
    for identifier in st.route_identifiers:
        name = ".".join(identifier)
        with contextlib.suppress(NoSuchTableError):
            route = catalog.load_table(identifier)
            found = _facts(route, st, now_ms, (route_caches or {}).get(name))
            routes.append(RouteReading(name, str(route.metadata.table_uuid), found))
    for identifier, dynamic in owned_dynamic_tables(catalog, st):
        name = ".".join(identifier)
        cached = route_caches.setdefault(name, ManifestCache()) if route_caches is not None else None
        found = _facts(dynamic, st, now_ms, cached)
        routes.append(RouteReading(name, str(dynamic.metadata.table_uuid), found, dynamic=True))
    uuid = str(table.metadata.table_uuid)
    return TableReading(
        uuid,
        dead_letter_uuid,
        table_status(facts),
        facts.lost_records,
        facts,
        ".".join(st.table_identifier),
        tuple(routes),
        st.spec.dynamic_route is not None,
    )


class Meter:
    """Reads a table on its own thread (module doc): at most every `interval` seconds, every `retry` seconds
    while there is no table yet. `start` once, `stop` at the end; subclasses say how to read
    (`read_once`: the reading, also kept as `latest`; None while the table does not exist). `TableMeter`
    reads an Iceberg table, `icefall.ingest.delta_meter.DeltaMeter` a Delta table's log."""

    def __init__(
        self, *, interval: float = READ_INTERVAL_SECONDS, retry: float = MISSING_RETRY_SECONDS
    ) -> None:
        self.interval, self.retry = interval, retry
        self._latest: TableReading | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="icefall-table-meter", daemon=True)
        #: Called (on the meter's thread) after each reading that differs from the one before.
        self.on_reading: Callable[[], None] | None = None
        self._failures = 0

    @property
    def latest(self) -> TableReading | None:
        with self._lock:
            return self._latest

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def read_once(self) -> TableReading | None:
        raise NotImplementedError

    def dead_letters_seen(self) -> None:
        """The writer committed dead letters (a dead-letter table may exist now); nothing by default."""

    def _keep(self, reading: TableReading | None) -> TableReading | None:
        if reading is not None:
            with self._lock:
                self._latest = reading
        return reading

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            before = self.latest
            try:
                found = self.read_once()
                if found is not None and found != before and self.on_reading is not None:
                    self.on_reading()
            except Exception as error:  # the report is a courtesy: ingestion goes on
                self._failures += 1
                if self._failures == 1:
                    log.warning("reading the table for the status report failed: %s", error)
                delay = self.interval
                continue
            self._failures = 0
            delay = self.interval if found is not None else self.retry


class TableMeter(Meter):
    """Reads the Iceberg table of `st` through `catalog` (module doc)."""

    def __init__(
        self,
        st: StreamingTable,
        catalog: CatalogConfig,
        *,
        interval: float = READ_INTERVAL_SECONDS,
        retry: float = MISSING_RETRY_SECONDS,
    ) -> None:
        super().__init__(interval=interval, retry=retry)
        self.st, self.catalog_config = st, catalog
        self._client: Catalog | None = None
        self._manifests = ManifestCache()  # manifests never change: each reading reads only new ones
        # A route table's manifests by its dotted name; a dynamic table's added when first read.
        self._route_manifests = {".".join(i): ManifestCache() for i in st.route_identifiers}

    def read_once(self) -> TableReading | None:
        """One reading now (also kept as `latest` when there is one); None while the table is missing."""
        if self._client is None:
            self._client = self.catalog_config.pyiceberg(
                make_folders=False, request_timeout=REQUEST_TIMEOUT_SECONDS
            )
        now_ms = int(time.time() * 1000)
        return self._keep(read_table(self._client, self.st, now_ms, self._manifests, self._route_manifests))
