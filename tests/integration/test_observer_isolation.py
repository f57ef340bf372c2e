"""One table's endpoints that never answer cannot stall the operator's observer or hold its clients for ever.

A "silent" endpoint is a real TCP server on 127.0.0.1 that accepts every connection and never sends a byte
(a hung catalog or broker), used as a REST catalog's URI, a PostgreSQL catalog's host and Kafka's
bootstrap server. Proves, with it and the `kafka` fixture's real broker:
- the operator's REST catalog client (`CatalogConfig.pyiceberg(request_timeout=...)`) gives up on a silent
  server within its bound, and so does its PostgreSQL client (libpq's connect timeout);
- six tables whose catalog and brokers are silent, observed again and again, never take more than one
  thread each, and every call of `observe` returns within `wait_seconds`; a good table's observation (its
  topic's real watermarks) arrives within `READ_OVERDUE_SECONDS` of first contact, and once the six are
  known slow (their reads came back overdue, as CatalogUnavailable / KafkaUnavailable issues, not hangs),
  the good table's next observations arrive without delay while the six hang again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefall.api import CatalogType, ConditionReason, StreamingTable
from icefall.catalog.config import CatalogConfig
from icefall.controller.observe import READ_OVERDUE_SECONDS, READ_WORKERS, Observed, TableObserver
from icefall.devstack.kafka import KafkaBroker
from icefall.testing.streams import load_manifest, manifest_text, produce

pytestmark = pytest.mark.integration


class Silent:
    """Accepts connections on 127.0.0.1 and never answers; `close` drops them all."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=256)
        self._server.settimeout(0.1)  # so that the accepting thread sees `close`
        self.port = self._server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-endpoint", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = self._server.accept()
                self.accepted.append(connection)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._server.close()
        for connection in self.accepted:
            connection.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    try:
        yield server
    finally:
        server.close()


def test_the_operators_catalog_clients_give_up_on_a_silent_endpoint(silent: Silent) -> None:
    rest = CatalogConfig(name="hung", type=CatalogType.REST, uri=f"http://127.0.0.1:{silent.port}")
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        rest.pyiceberg(request_timeout=1)
    assert time.monotonic() - started < 5

    postgres = CatalogConfig(
        name="hung", type=CatalogType.SQL, uri=f"postgresql://ice@127.0.0.1:{silent.port}/lake",
        secrets={"password": "pw"},
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timeout"):
        postgres.pyiceberg(request_timeout=1)
    assert time.monotonic() - started < 8  # libpq: at least 2 s per attempt


def hostile_table(n: int, port: int, warehouse: Path) -> StreamingTable:
    """A table whose PostgreSQL catalog and Kafka brokers are the silent endpoint (no credential: a table
    the operator reads itself)."""
    catalog = {
        "name": "hung", "type": "sql", "uri": f"postgresql://ice@127.0.0.1:{port}/lake{n}",
        "warehouse": str(warehouse),
    }  # fmt: skip
    text = manifest_text(f"hostile_{n}", "events", f"127.0.0.1:{port}", catalog=catalog)
    return load_manifest(text)


def test_silent_endpoints_of_six_tables_never_delay_a_good_tables_observation(
    silent: Silent, kafka: KafkaBroker, tmp_path: Path
) -> None:
    topic = "it-observer-isolation"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 5)
    good = load_manifest(
        manifest_text(
            "isolated_good", topic, kafka.bootstrap,
            catalog={
                "name": "lake", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                "warehouse": f"{tmp_path}/warehouse",
            },
        )
    )  # fmt: skip
    hostile = {f"hostile-{n}": hostile_table(n, silent.port, tmp_path / "hung") for n in range(6)}
    # The production pool; catalog calls bounded at 1 s (not 10) so that the hung reads come back soon.
    observer = TableObserver(interval=0.5, wait_seconds=0.2, catalog_timeout=1.0)

    slow_calls: list[str] = []

    def observe(uid: str, st: StreamingTable) -> Observed:
        started = time.monotonic()
        observed = observer.observe(uid, st)
        if time.monotonic() - started >= 1.0:
            slow_calls.append(uid)  # observe waited for more than its own read
        return observed

    def reconcile_hostile(stop: threading.Event) -> None:
        """The operator's passes over the six, again and again, beside the good table's."""
        while not stop.is_set():
            for uid, st in hostile.items():
                observe(uid, st)

    def good_shows(high: int, within: float) -> float:
        """Seconds until the good table's observation shows `high`, the six observed all the while."""
        stop = threading.Event()
        others = threading.Thread(target=reconcile_hostile, args=(stop,))
        others.start()
        try:
            started = time.monotonic()
            while (found := observe("good", good)).watermarks != {0: (0, high)}:
                assert time.monotonic() - started < within, (
                    f"the good table's observation never came: {found}"
                )
                time.sleep(0.05)
            return time.monotonic() - started
        finally:
            stop.set()
            others.join(30)

    # First contact: nobody knows yet that six tables hang; they hold the pool for READ_OVERDUE_SECONDS.
    first = good_shows(5, within=READ_OVERDUE_SECONDS + 6)
    assert observer._reads.threads <= len(hostile) + READ_WORKERS

    # The hung reads come back (client timeouts) as issues, not as hangs, and the tables are known slow.
    deadline = time.monotonic() + 60
    for uid, st in hostile.items():
        while not (observed := observe(uid, st)).issues:
            assert time.monotonic() < deadline, f"{uid}'s read never came back"
            time.sleep(0.2)
        reasons = {issue.reason for issue in observed.issues}
        assert reasons <= {ConditionReason.CATALOG_UNAVAILABLE, ConditionReason.KAFKA_UNAVAILABLE}, reasons
        assert observer._reads.is_slow(uid)

    # From now on the hung tables' reads (hanging again) queue apart: the good table's are not delayed.
    produce(kafka, topic, 5, 5)
    later = good_shows(10, within=1.5)  # the refresh interval (0.5 s) and one read
    assert observer._reads.threads <= len(hostile) + READ_WORKERS
    assert not slow_calls, slow_calls
    print(f"\nthe good table's observation: {first:.1f} s at first contact, then {later:.1f} s")
