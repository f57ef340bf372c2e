"""A catalog that never answers cannot hold the driver's table meter for ever.

A "silent" endpoint is a real TCP server on 127.0.0.1 that accepts every connection and never sends a byte
(a hung catalog), used as a REST catalog's URI and a PostgreSQL catalog's host. Proves:
- a bounded REST catalog client (`CatalogConfig.pyiceberg(request_timeout=...)`) gives up on a silent
  server within its bound, and so does a bounded PostgreSQL client (libpq's connect timeout);
- the driver's table meter (`icefall.ingest.table_meter`, what status and compaction scaling come from)
  opens its client with that bound: its reading of a table on a silent catalog fails within it, and its
  thread goes on.
The operator opens no connection to any endpoint a table names at all (tests/integration/
test_operator_trust.py), so no table's endpoint can stall it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from icefall.api import CatalogType, StreamingTable
from icefall.catalog.config import CatalogConfig
from icefall.ingest import table_meter

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


def test_bounded_catalog_clients_give_up_on_a_silent_endpoint(silent: Silent) -> None:
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


def test_the_drivers_table_meter_gives_up_on_a_silent_catalog(
    silent: Silent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_meter, "REQUEST_TIMEOUT_SECONDS", 1.0)  # 10 s in a driver
    st = StreamingTable.model_validate(
        {
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "127.0.0.1:9", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {
                    "namespace": "shop",
                    "catalog": {"name": "hung", "type": "rest", "uri": f"http://127.0.0.1:{silent.port}"},
                },
            },
        }
    )
    meter = table_meter.TableMeter(st, CatalogConfig.for_table(st.spec, environ={}))
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        meter.read_once()
    assert time.monotonic() - started < 5
    assert meter.latest is None
