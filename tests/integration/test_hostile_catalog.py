"""A hostile REST catalog cannot make Icefall load code: what it names is dropped before pyiceberg sees it.

The catalog is a small real HTTP server on 127.0.0.1, written here. Its `/v1/config` answer sets
`py-io-impl` (in `defaults` and `overrides`), and in one variant an `auth` block naming a custom
AuthManager; its
load-table answer sets `py-io-impl` in the response's `config` and in the table metadata's properties. Every
class it names lives in a module written for the test, whose import and whose classes' construction leave
marker files. On main the catalog client imports that module and builds its FileIO (or its AuthManager).

Proves:
- `CatalogConfig.pyiceberg()` opens the catalog and loads the table with a FileIO of Icefall's choice
  (pyiceberg's own for the location's scheme); the module is never imported, no class of it is built; the
  catalog's properties hold none of the dropped keys; each dropped key is logged by name, never its value;
- a sql catalog (on SQLite) whose table metadata names the module's class as `py-io-impl`: the driver's
  table meter (`icefall.ingest.table_meter`) reads the table with a FileIO of Icefall's choice, imports and
  builds nothing, and logs the dropped key by name (the operator reads no catalog at all:
  tests/integration/test_operator_trust.py);
- against Iceberg's own REST server (the control) the same client drops nothing and creates, appends to
  and reads a table;
- pyiceberg's loaders, confined (`confine_pyiceberg`), refuse a FileIO class Icefall did not choose and a
  table's `write.py-location-provider.impl` even when they are reached without Icefall's clients;
- Spark's catalog client (Iceberg Java), in a session of `build_spark_session`, loads no class a catalog
  names either: in front of Iceberg's own REST server, a hostile catalog adds `io-impl` to its `/v1/config`
  overrides, `metrics-reporter-impl` to its defaults, `io-impl` to every table answer's config and
  `write.location-provider.impl` to its tables' properties, each naming a class that does not exist (without
  `icefall.catalog.rest_proxy`, Spark fails to initialise the catalog); through the proxy Spark lists
  namespaces, creates a table, writes and reads it, and each dropped key is logged by name only.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from icefall.api import CatalogType, StreamingTable
from icefall.catalog import CatalogConfig
from icefall.devstack.rest_catalog import RESTCatalogServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

BOOM_MODULE = """
from pathlib import Path
from urllib.parse import urlsplit

MARKERS = Path({markers!r})
(MARKERS / "imported").write_text("the module was imported")


class Boom:
    def __init__(self, *args, **kwargs):
        (MARKERS / "instantiated").write_text("a class was built")
        self.properties = kwargs or (args[0] if args else {{}})
"""


@dataclass
class Hostile:
    """The hostile catalog: its address, the class path it names, and the requests it answered."""

    uri: str
    variant: str  # py-io-impl, or auth: the /v1/config overrides also name an AuthManager
    boom: str  # "<module>.Boom"
    markers: Path
    seen: list[str] = field(default_factory=list)

    @property
    def marked(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())


def table_metadata(location: str, boom: str) -> dict[str, Any]:
    """A valid, empty format-v2 table whose properties name `boom` as its FileIO."""
    return {
        "format-version": 2,
        "table-uuid": str(uuid.uuid4()),
        "location": location,
        "last-sequence-number": 0,
        "last-updated-ms": 1_700_000_000_000,
        "last-column-id": 1,
        "current-schema-id": 0,
        "schemas": [
            {
                "type": "struct",
                "schema-id": 0,
                "fields": [{"id": 1, "name": "id", "required": False, "type": "long"}],
            }
        ],
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {"py-io-impl": boom},
        "snapshots": [],
        "snapshot-log": [],
        "metadata-log": [],
        "refs": {},
    }


@dataclass
class Boom:
    """A module written for the test: `path` "<module>.Boom" names its class; `markers` shows what ran."""

    path: str
    markers: Path

    @property
    def marked(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())


@pytest.fixture
def boom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Boom]:
    """The module, importable (on sys.path) and not imported; forgotten afterwards."""
    module = f"icefall_test_boom_{uuid.uuid4().hex[:8]}"
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / f"{module}.py").write_text(BOOM_MODULE.format(markers=str(markers)))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield Boom(f"{module}.Boom", markers)
    finally:
        sys.modules.pop(module, None)


@pytest.fixture(params=["py-io-impl"])
def hostile(request: pytest.FixtureRequest, tmp_path: Path, boom: Boom) -> Iterator[Hostile]:
    """The server; `request.param` "auth" adds a custom `auth` block to the /v1/config overrides."""
    markers = boom.markers
    boom_class = boom.path
    location = (tmp_path / "warehouse" / "shop" / "orders").as_uri()
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            path = self.path.split("?", 1)[0]
            if path == "/v1/config":
                overrides: dict[str, Any] = {"py-io-impl": boom_class}
                if request.param == "auth":
                    overrides["auth"] = {"type": "custom", "impl": boom_class}
                body: dict[str, Any] = {"defaults": {"py-io-impl": boom_class}, "overrides": overrides}
            elif path == "/v1/namespaces/shop/tables/orders":
                body = {
                    "metadata-location": f"{location}/metadata/00000-{uuid.uuid4()}.metadata.json",
                    "metadata": table_metadata(location, boom_class),
                    "config": {"py-io-impl": boom_class, "s3.retry-strategy-impl": boom_class},
                }
            elif path == "/v1/namespaces":
                body = {"namespaces": [["shop"]]}
            elif path == "/v1/namespaces/shop/tables":
                body = {"identifiers": [{"namespace": ["shop"], "name": "orders"}]}
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Hostile(f"http://127.0.0.1:{server.server_port}", request.param, boom_class, markers, seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def rest(uri: str) -> dict[str, Any]:
    return {"name": "lake", "type": "rest", "uri": uri}


def table_on(
    catalog: dict[str, Any], bootstrap: str = "127.0.0.1:9", topic: str = "orders"
) -> StreamingTable:
    """The table shop.orders in `catalog` (a spec.table.catalog block), with no credential anywhere: what a
    client gets, it gets from the catalog alone."""
    return StreamingTable.model_validate(
        {
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": bootstrap, "topic": topic},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "catalog": catalog},
            },
        }
    )


@pytest.mark.parametrize("hostile", ["py-io-impl", "auth"], indirect=True)
def test_the_catalog_client_loads_no_class_the_endpoint_names(
    hostile: Hostile, caplog: pytest.LogCaptureFixture
) -> None:
    config = CatalogConfig.for_table(table_on(rest(hostile.uri)).spec, environ={})
    try:
        catalog = config.pyiceberg()
        table = catalog.load_table(("shop", "orders"))
    finally:
        assert hostile.marked == [], "the endpoint's module was imported or its class built"

    assert type(table.io).__module__.startswith("pyiceberg.io."), type(table.io)
    assert [p for p in hostile.seen if p.startswith("/v1/namespaces/shop/tables/orders")], hostile.seen
    assert "py-io-impl" not in catalog.properties and "auth" not in catalog.properties
    assert "py-io-impl" not in table.config
    for key in ["py-io-impl", "s3.retry-strategy-impl"] + (["auth"] if hostile.variant == "auth" else []):
        assert f"ignored {key} from" in caplog.text
    assert hostile.boom not in caplog.text  # the key is named, never its value


def test_the_drivers_table_meter_loads_no_class_a_table_names(
    boom: Boom, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sql catalog on SQLite: whoever writes to the catalog sets the table's properties, here
    `py-io-impl` naming the test's class. The driver's meter (what status and compaction scaling come
    from: the operator reads no table itself) reads the table with a FileIO of Icefall's choice and builds
    nothing."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from icefall.ingest.table_meter import TableMeter

    catalog = {"name": "lake", "type": "sql", "uri": f"sqlite:///{tmp_path / 'lake.db'}"}
    st = table_on({**catalog, "warehouse": str(tmp_path / "warehouse")})
    config = CatalogConfig.for_table(st.spec, environ={})
    writer = config.pyiceberg()
    writer.create_namespace("shop")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    created = writer.create_table(("shop", "orders"), schema=schema)
    # The catalog's writer (not Icefall's client) adds the property to the table's current metadata.
    metadata = Path(urlsplit(created.metadata_location).path)
    document = json.loads(metadata.read_text())
    metadata.write_text(json.dumps({**document, "properties": {"py-io-impl": boom.path}}))
    caplog.clear()

    reading = TableMeter(st, config).read_once()

    assert boom.marked == [], "the table's module was imported or its class built"
    assert reading is not None and reading.table_uuid == str(created.metadata.table_uuid), reading
    assert "ignored py-io-impl from a table's properties" in caplog.text
    assert boom.path not in caplog.text  # the key is named, never its value


def test_confined_pyiceberg_refuses_other_file_ios_and_location_providers(hostile: Hostile) -> None:
    from pyiceberg.io import load_file_io
    from pyiceberg.table.locations import load_location_provider

    from icefall.catalog.config import PY_FILE_IOS
    from icefall.catalog.confined import confine_pyiceberg

    confine_pyiceberg(PY_FILE_IOS)
    with pytest.raises(ValueError, match="names a FileIO class Icefall did not choose"):
        load_file_io({"py-io-impl": hostile.boom})
    with pytest.raises(ValueError, match=r"write\.py-location-provider\.impl names a class"):
        load_location_provider("file:///tmp/t", {"write.py-location-provider.impl": hostile.boom})
    assert type(load_file_io({"py-io-impl": PY_FILE_IOS[0]})).__name__ == "FsspecFileIO"
    assert hostile.marked == []


def test_the_confined_client_still_works_with_icebergs_own_rest_server(
    rest_catalog: RESTCatalogServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The control: against an honest catalog nothing is dropped and a table is created, appended to (a
    commit: pyiceberg's location provider and FileIO) and read back."""
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = CatalogConfig.for_table(table_on(rest(rest_catalog.uri)).spec, environ={}).pyiceberg()
    catalog.create_namespace_if_not_exists("confined")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = catalog.create_table("confined.events", schema=schema)
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    read = catalog.load_table("confined.events").scan().to_arrow()
    assert sorted(read.column("id").to_pylist()) == [1, 2, 3]
    assert "ignored" not in caplog.text
    catalog.purge_table("confined.events")


# -- Spark (Iceberg Java) ------------------------------------------------------------------------------

JAVA_BOOM = "com.example.icefall.Boom"  # on no classpath: Iceberg Java fails when it tries to load it


@dataclass
class HostileFront:
    """A hostile catalog in front of Iceberg's own REST server: its address and the requests it answered."""

    uri: str
    seen: list[str] = field(default_factory=list)


def hostile_answer(path: str, answer: Any) -> Any:
    """What the hostile catalog adds to the real server's `answer` to the request for `path`."""
    if path.split("?", 1)[0].endswith("/v1/config"):
        answer.setdefault("overrides", {})["io-impl"] = JAVA_BOOM
        answer.setdefault("defaults", {})["metrics-reporter-impl"] = JAVA_BOOM
    elif (
        isinstance(answer, dict)
        and isinstance(answer.get("metadata"), dict)
        and "metadata-location" in answer
    ):
        answer["config"] = {**(answer.get("config") or {}), "io-impl": JAVA_BOOM}
        answer["metadata"].setdefault("properties", {})["write.location-provider.impl"] = JAVA_BOOM
    return answer


@pytest.fixture
def hostile_front(rest_catalog: RESTCatalogServer) -> Iterator[HostileFront]:
    real = urlsplit(rest_catalog.uri)
    seen: list[str] = []

    class Front(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def relay(self) -> None:
            seen.append(f"{self.command} {self.path}")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "accept-encoding")}
            upstream = http.client.HTTPConnection(real.hostname or "", real.port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
            finally:
                upstream.close()
            if data and response.status < 300:
                data = json.dumps(hostile_answer(self.path, json.loads(data))).encode()
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = do_DELETE = relay  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield HostileFront(f"http://127.0.0.1:{server.server_port}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_spark_loads_no_class_the_catalog_names(
    hostile_front: HostileFront, spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    from icefall.spark.session import build_spark_session

    config = CatalogConfig(name="hostile_spark", type=CatalogType.REST, uri=hostile_front.uri)
    # The tests' one session, with the hostile catalog added as the entry points add theirs.
    session = build_spark_session([config], app_name="icefall-tests")
    assert session.conf.get("spark.sql.catalog.hostile_spark.uri") != hostile_front.uri, "no proxy"

    session.sql("CREATE NAMESPACE IF NOT EXISTS hostile_spark.confined")
    assert ["confined"] in [list(row) for row in session.sql("SHOW NAMESPACES IN hostile_spark").collect()]
    session.sql("DROP TABLE IF EXISTS hostile_spark.confined.events PURGE")
    session.sql("CREATE TABLE hostile_spark.confined.events (id bigint) USING iceberg")
    try:
        session.sql("INSERT INTO hostile_spark.confined.events VALUES (1), (2), (3)")
        rows = session.sql("SELECT id FROM hostile_spark.confined.events ORDER BY id").collect()
        assert [row.id for row in rows] == [1, 2, 3]
    finally:
        session.sql("DROP TABLE IF EXISTS hostile_spark.confined.events PURGE")

    assert any(line.startswith("GET /v1/config") for line in hostile_front.seen), hostile_front.seen
    assert any("/tables/events" in line for line in hostile_front.seen), hostile_front.seen
    for key, source in [
        ("io-impl", "the /v1/config answer's overrides"),
        ("metrics-reporter-impl", "the /v1/config answer's defaults"),
        ("io-impl", "a table answer's config"),
        ("write.location-provider.impl", "a table's metadata properties"),
    ]:
        assert f"ignored {key} from {source}" in caplog.text
    assert JAVA_BOOM not in caplog.text  # the key is named, never its value
