"""Read a StreamingTable's Iceberg table (pyiceberg) and its topic's watermarks (confluent-kafka).

`TableObserver.observe` returns `Observed`: `TableFacts` from the table's metadata (no data is read), the
high/low watermarks per partition, the produce time of the oldest record the table has not committed (the
first record past the committed offset of each partition that lags: what freshness is measured from),
issues for what could not be read (CatalogUnavailable, KafkaUnavailable, with the client's error text;
CatalogCredentialsRefused, KafkaCredentialsRefused when the service answered and refused the credentials,
with the fields to check). Turning the facts into status is `icefall.plan.table_status`.

No credential lending: the operator holds no table credential and lends none of its own. A table whose
spec references any (`secretKeyRef` or `{env: NAME}`, in its source, registry or catalog), or whose catalog
or files the clients would reach with the operator's own identity (a REST catalog, an object store), is not
read at all (`plan.table_status.not_read_by_operator`): `observe` returns an `unmeasured` note and its
driver, which holds the table's credentials, reports instead (`status.writer`).
The clients of the tables it does read resolve references from `NO_CREDENTIALS`, never from this process's
environment (`ICEFALL_CATALOG_*`, `ICEFALL_KAFKA_*` or any other variable set there).

Rate: one read per table per `interval` seconds (the last result is served in between), and the
compaction backlog (which reads manifests, `icefall.compact.view.read_table_view`) at most every
`backlog_interval` seconds. A change of the catalog or source spec reads again at once. Reads run on a
small thread pool, one at a time per table, where a read that hangs gives its slot back after
`READ_OVERDUE_SECONDS` (`controller.reads.Reads`): a few tables whose endpoints hang never delay the others'
reads. A reconcile waits at most `wait_seconds` for its own table's read and otherwise goes on with the
previous result; it never waits for another table's. Every client has a timeout (catalog requests and
connections `CATALOG_TIMEOUT_SECONDS`, Kafka calls `KAFKA_TIMEOUT_SECONDS`), so a hung thread comes back.
Memory is bounded: the last observation of at most `MAX_TABLES` tables and at most `MAX_CATALOGS` catalog
clients are kept (least recently used go first; a deleted table's observation is forgotten at once).

Guarantees: never raises for an unreachable or misconfigured catalog or broker; messages never contain a
credential (the values the spec references are masked out of every error text). Not guaranteed: that the
result is current: with a slow catalog or broker it is as old as the last read that finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from icefall.api import ConditionReason, StreamingTable
from icefall.catalog import (
    CatalogConfig,
    CatalogConfigError,
    CatalogCredentialsRefusedError,
    MissingCredentialError,
)
from icefall.catalog.refusal import refusal
from icefall.commit.errors import CorruptStateError
from icefall.compact.measure import LAST_EXPIRY_PROPERTY, compaction_backlog, table_facts
from icefall.controller.reads import Reads
from icefall.plan.conditions import Issue
from icefall.plan.table_status import TableFacts, not_read_by_operator
from icefall.runtime.bounded import LRU

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

KAFKA_TIMEOUT_SECONDS = 5.0
#: Where the operator's observer finds a table's credential references: nowhere. The operator holds no
#: table credential (a table that references one is measured by its driver: `not_read_by_operator`), and
#: its own environment is never a fallback for a reference.
NO_CREDENTIALS: Mapping[str, str] = MappingProxyType({})
__all__ = [
    "LAST_EXPIRY_PROPERTY",
    "NO_CREDENTIALS",
    "Observed",
    "TableObserver",
    "compaction_backlog",
    "table_facts",
]
#: How long a catalog client waits to connect and for each answer (REST, PostgreSQL, object store).
CATALOG_TIMEOUT_SECONDS = 10.0
#: A read running this long no longer holds one of the pool's `READ_WORKERS` slots.
READ_OVERDUE_SECONDS = 2.0
READ_WORKERS = 4
READ_MAX_THREADS = 64
MAX_TABLES = 10_000
MAX_CATALOGS = 64


@dataclass(frozen=True)
class Observed:
    facts: TableFacts | None = None  # None: not read (no catalog, table missing, or an error)
    watermarks: Mapping[int, tuple[int, int]] | None = None
    topic_id: str | None = None  # Kafka's id of the topic; None: not read
    #: Produce time (epoch ms) of the oldest record the table has not committed; None: none waits, or not read
    oldest_waiting_ms: int | None = None
    issues: tuple[Issue, ...] = ()
    unmeasured: str = ""
    backlog: int | None = None  # compaction work items; None: not measured


def _mask(text: str, secrets: list[str]) -> str:
    for value in secrets:
        if value:
            text = text.replace(value, "***")
    return text


def _observer_reads() -> Reads:
    return Reads(
        workers=READ_WORKERS,
        overdue_seconds=READ_OVERDUE_SECONDS,
        max_threads=READ_MAX_THREADS,
        name="icefall-observe",
    )


def _close_catalog(_: str, catalog: Catalog) -> None:
    """Let go of an evicted catalog client's connections (a sql catalog's pool, a REST session)."""
    try:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        session = getattr(catalog, "_session", None)
        if session is not None:
            session.close()
    except Exception:  # closing is best effort: the garbage collector closes the rest
        log.debug("closing an evicted catalog client failed", exc_info=True)


@dataclass
class _Entry:
    key: str
    at: float
    observed: Observed
    backlog_at: float | None = None
    backlog: tuple[int, float | None] | None = None


@dataclass
class TableObserver:
    """Observes tables at a bounded rate (see the module doc). Thread-safe; one per operator process."""

    interval: float = 5.0
    backlog_interval: float = 30.0
    wait_seconds: float = 1.0
    environ: Mapping[str, str] = field(default_factory=lambda: NO_CREDENTIALS)  # see NO_CREDENTIALS
    clock: Callable[[], float] = time.monotonic
    catalog_timeout: float = CATALOG_TIMEOUT_SECONDS
    _cache: LRU[str, _Entry] = field(default_factory=lambda: LRU(MAX_TABLES))
    _catalogs: LRU[str, Catalog] = field(default_factory=lambda: LRU(MAX_CATALOGS, _close_catalog))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reads: Reads = field(default_factory=_observer_reads)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._cache.pop(uid)

    def observe(self, uid: str, st: StreamingTable) -> Observed:
        """The latest observation: a fresh read if one finishes within `wait_seconds`, else the last one
        (a slow catalog or broker never holds a reconcile for longer than that). A table that references
        a credential is not read at all: its note says the driver measures it."""
        if why := not_read_by_operator(st.spec):
            return Observed(unmeasured=why)
        key = (
            st.spec.table.model_dump_json()
            + st.spec.source.model_dump_json()
            + st.spec.compaction.model_dump_json()
        )
        with self._lock:
            entry = self._cache.get(uid)
            current = entry if entry is not None and entry.key == key else None
            if current is not None and self.clock() - current.at < self.interval:
                return current.observed
        # The read already in flight for this table if there is one: never a second thread per table.
        running = self._reads.submit(uid, lambda: self._refresh(uid, key, st, current))
        try:
            return running.result(timeout=self.wait_seconds)
        except FutureTimeout:
            if current is not None:
                return current.observed
            return Observed(unmeasured="reading the table and the topic for the first time")

    def _refresh(self, uid: str, key: str, st: StreamingTable, previous: _Entry | None) -> Observed:
        observed, backlog_at, backlog = self._read(st, self.clock(), previous)
        with self._lock:
            self._cache.put(uid, _Entry(key, self.clock(), observed, backlog_at, backlog))
        return observed

    def _read(
        self, st: StreamingTable, now: float, previous: _Entry | None
    ) -> tuple[Observed, float | None, tuple[int, float | None] | None]:
        issues: list[Issue] = []
        notes: list[str] = []
        facts: TableFacts | None = None
        backlog_at = previous.backlog_at if previous else None
        backlog = previous.backlog if previous else None
        table = self._load_table(st, issues, notes)
        if table is not None:
            try:
                facts = table_facts(table)
            except CorruptStateError as error:
                issues.append(
                    Issue(ConditionReason.CATALOG_UNAVAILABLE, f"the table's icefall.* state: {error}")
                )
        if table is not None and facts is not None and st.spec.compaction.enabled:
            if backlog_at is None or now - backlog_at >= self.backlog_interval:
                try:
                    backlog = compaction_backlog(table, st, int(time.time() * 1000))
                except Exception as error:  # a planner or manifest read failure must not stop status
                    log.warning("measuring the compaction backlog of %s failed: %s", st.metadata.name, error)
                    backlog = None
                backlog_at = now
            if backlog is not None:
                facts = replace(facts, compaction_backlog=backlog[0], small_file_ratio=backlog[1])
        committed = facts.committed_offsets if facts is not None else None
        watermarks, topic_id, oldest_waiting_ms = self._watermarks(st, committed, issues, notes)
        observed = Observed(
            facts=facts,
            watermarks=watermarks,
            topic_id=topic_id,
            oldest_waiting_ms=oldest_waiting_ms,
            issues=tuple(issues),
            unmeasured="; ".join(notes),
            backlog=backlog[0] if backlog is not None and facts is not None else None,
        )
        return observed, backlog_at, backlog

    def _load_table(self, st: StreamingTable, issues: list[Issue], notes: list[str]) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        if st.spec.table.catalog is None:
            return None
        config: CatalogConfig | None = None
        try:
            config = CatalogConfig.for_table(st.spec, environ=self.environ)
            # One client per catalog configuration (a sql catalog holds a connection pool).
            catalog = self._catalog(config)
            return catalog.load_table(st.table_identifier)
        except MissingCredentialError as error:
            notes.append(f"{error}; the operator cannot measure the table")
        except NoSuchTableError:
            notes.append(
                f"the table {'.'.join(st.table_identifier)} does not exist yet (the driver creates it)"
            )
        except Exception as error:  # any client error: a condition, never a crash
            refused = refusal(error)
            if refused is not None and config is not None:
                if not isinstance(error, CatalogCredentialsRefusedError):
                    refused = str(CatalogCredentialsRefusedError.of(config, refused))
                issues.append(Issue(ConditionReason.CATALOG_CREDENTIALS_REFUSED, config.mask(refused)))
                return None
            text = f"{type(error).__name__}: {error}"
            if config is not None:
                text = config.mask(text)
            elif not isinstance(error, CatalogConfigError):  # its messages never carry a value
                text = type(error).__name__
            issues.append(
                Issue(
                    ConditionReason.CATALOG_UNAVAILABLE,
                    f"cannot read the table {'.'.join(st.table_identifier)} from catalog "
                    f"{st.spec.table.catalog.name!r}: {text}",
                )
            )
        return None

    def _catalog(self, config: CatalogConfig) -> Catalog:
        """The client of `config` (one per catalog configuration: a sql catalog holds a connection pool),
        every call of it bounded by `catalog_timeout`."""
        with self._lock:
            catalog = self._catalogs.get(config.key())
        if catalog is None:
            catalog = config.pyiceberg(make_folders=False, request_timeout=self.catalog_timeout)
            with self._lock:
                self._catalogs.put(config.key(), catalog)
        return catalog

    def _watermarks(
        self, st: StreamingTable, committed: Mapping[int, int] | None, issues: list[Issue], notes: list[str]
    ) -> tuple[dict[int, tuple[int, int]] | None, str | None, int | None]:
        """The topic's watermarks and id, and the produce time of the oldest record past the `committed`
        offsets (None: nothing waits, or unknown); (None, None, None) when Kafka could not be read."""
        from icefall.kafka.admin import KafkaCredentialsRefusedError, TopicView
        from icefall.kafka.security import MissingSecretError, librdkafka_config

        source = st.spec.source
        if source.topic is None:
            notes.append(
                "the operator does not measure the lag of a table of several topics yet "
                "(spec.source.topics); its driver publishes it (icefall_lag_records, "
                "icefall_freshness_seconds)"
            )
            return None, None, None
        try:
            config = librdkafka_config(source.security, self.environ)
        except MissingSecretError as error:
            notes.append(f"{error}; the operator cannot read the topic's watermarks")
            return None, None, None
        secrets = [v for k, v in config.items() if k not in ("security.protocol", "sasl.mechanism")]
        try:
            # Errors reach the status as KafkaUnavailable; librdkafka's own log would repeat them forever.
            client = {**config, "socket.timeout.ms": 5000, "log_level": 0}
            with TopicView(source.bootstrap_servers, source.topic, client) as topic:
                marks = topic.watermarks(timeout=KAFKA_TIMEOUT_SECONDS, total=KAFKA_TIMEOUT_SECONDS * 2)
                topic_id = topic.topic_id(KAFKA_TIMEOUT_SECONDS)
                # Before the first commit the table's freshness is unmeasured anyway.
                oldest = (
                    topic.oldest_waiting_ms(committed, marks, KAFKA_TIMEOUT_SECONDS) if committed else None
                )
                return marks, topic_id, oldest
        except Exception as error:  # any client error: a condition, never a crash
            text = _mask(f"{type(error).__name__}: {error}", secrets)
            if isinstance(error, KafkaCredentialsRefusedError):  # names the fields to fix
                issues.append(Issue(ConditionReason.KAFKA_CREDENTIALS_REFUSED, _mask(str(error), secrets)))
                return None, None, None
            issues.append(
                Issue(
                    ConditionReason.KAFKA_UNAVAILABLE,
                    f"cannot read the watermarks of topic {source.topic!r} at "
                    f"{source.bootstrap_servers}: {text}",
                )
            )
        return None, None, None
