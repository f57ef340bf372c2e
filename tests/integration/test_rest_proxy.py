"""`icefall.catalog.rest_proxy.RestProxy` forwards requests as a REST catalog client sends them, and answers
as the catalog does, except for what Iceberg Java may not see.

The catalog is a small real HTTP server on 127.0.0.1, written here, that records what it receives. Proves:
method, path (under the catalog URI's own path), query, headers (Authorization among them) and body reach
the catalog as sent, over one connection per client connection, and the answer's status, headers and body
come back unchanged when they name no code (HEAD included); a gzip answer that names code comes back
decoded without it; a request outside the proxy's random path is refused (404) and never forwarded; a
catalog that cannot be reached answers 503, a redirect 502 (both as Iceberg's `ErrorResponse`), and a
catalog that does not answer in time 504; `through_proxies` gives rest catalogs only a proxy URI, one per
catalog URI, reused by a later session.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from icefall.api import CatalogType
from icefall.catalog import CatalogConfig
from icefall.catalog.rest_proxy import RestProxy, through_proxies

pytestmark = pytest.mark.integration

BOOM = "com.example.Boom"


@dataclass
class Seen:
    """One request the catalog received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    port: int  # the client's port: one per connection


@dataclass
class Catalog:
    uri: str
    seen: list[Seen] = field(default_factory=list)


@pytest.fixture
def catalog() -> Iterator[Catalog]:
    """A catalog under /api/catalog that echoes requests, answers a gzip config naming code, redirects
    /moved and sleeps on /slow."""
    seen: list[Seen] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(
                Seen(self.command, self.path, dict(self.headers.items()), body, self.client_address[1])
            )
            path = self.path.removeprefix("/api/catalog")
            if path.startswith("/moved"):
                self.send_response(307)
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path.startswith("/slow"):
                time.sleep(1.5)
            headers: dict[str, str] = {"Content-Type": "application/json", "X-Catalog": "yes"}
            if path.startswith("/v1/config"):
                config = {"defaults": {}, "overrides": {"io-impl": BOOM, "prefix": "lake"}}
                data = gzip.compress(json.dumps(config).encode())
                headers["Content-Encoding"] = "gzip"
            else:
                data = json.dumps({"echo": body.decode(), "config": {"s3.region": "eu-west-1"}}).encode()
            self.send_response(201 if self.command == "POST" else 200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = do_DELETE = answer  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Catalog(f"http://127.0.0.1:{server.server_port}/api/catalog", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def proxy(catalog: Catalog) -> Iterator[RestProxy]:
    proxy = RestProxy("lake", catalog.uri, read_timeout=0.5).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def client(uri: str) -> tuple[http.client.HTTPConnection, str]:
    """A keep-alive connection to the proxy at `uri`, and the path prefix of that URI."""
    parts = urlsplit(uri)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10), parts.path


def call(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def test_requests_and_answers_pass_unchanged(catalog: Catalog, proxy: RestProxy) -> None:
    conn, prefix = client(proxy.uri)
    body = json.dumps({"name": "orders"}).encode()
    auth = {"Authorization": "Bearer it-token", "X-Iceberg-Access-Delegation": "vended-credentials"}
    status, headers, answer = call(conn, "POST", f"{prefix}/v1/lake/namespaces/shop/tables?x=1", body, **auth)
    assert status == 201
    assert headers["X-Catalog"] == "yes" and headers["Content-Type"] == "application/json"
    assert json.loads(answer) == {"echo": body.decode(), "config": {"s3.region": "eu-west-1"}}
    status, headers, answer = call(conn, "HEAD", f"{prefix}/v1/lake/namespaces/shop", **auth)
    assert (status, answer) == (200, b"")
    assert int(headers["Content-Length"]) > 0  # the catalog's, not the empty body's
    status, _, _ = call(conn, "DELETE", f"{prefix}/v1/lake/namespaces/shop/tables/orders?purgeRequested=true")
    assert status == 200

    post, head, delete = catalog.seen
    assert (post.method, post.path, post.body) == (
        "POST",
        "/api/catalog/v1/lake/namespaces/shop/tables?x=1",
        body,
    )
    assert post.headers["Authorization"] == "Bearer it-token"
    assert post.headers["X-Iceberg-Access-Delegation"] == "vended-credentials"
    assert post.headers["Host"] == urlsplit(catalog.uri).netloc
    assert (head.method, head.path) == ("HEAD", "/api/catalog/v1/lake/namespaces/shop")
    assert delete.path == "/api/catalog/v1/lake/namespaces/shop/tables/orders?purgeRequested=true"
    assert post.port == head.port == delete.port, "the client's connection was not kept upstream"


def test_a_gzip_answer_loses_what_names_code(
    catalog: Catalog, proxy: RestProxy, caplog: pytest.LogCaptureFixture
) -> None:
    conn, prefix = client(proxy.uri)
    status, headers, answer = call(
        conn, "GET", f"{prefix}/v1/config?warehouse=lake", **{"Accept-Encoding": "gzip"}
    )
    assert status == 200
    assert "Content-Encoding" not in headers
    assert json.loads(answer) == {"defaults": {}, "overrides": {"prefix": "lake"}}
    assert catalog.seen[0].headers["Accept-Encoding"] == "gzip"
    assert "ignored io-impl from the /v1/config answer's overrides" in caplog.text
    assert BOOM not in caplog.text


def test_requests_outside_the_proxys_path_are_refused(catalog: Catalog, proxy: RestProxy) -> None:
    conn, _ = client(proxy.uri)
    status, _, answer = call(conn, "GET", "/v1/config")
    assert status == 404
    assert json.loads(answer)["error"]["code"] == 404
    assert catalog.seen == []


def test_what_the_catalog_cannot_answer_becomes_an_iceberg_error(catalog: Catalog, proxy: RestProxy) -> None:
    conn, prefix = client(proxy.uri)
    status, _, answer = call(conn, "GET", f"{prefix}/moved")
    assert status == 502, answer
    assert "redirect" in json.loads(answer)["error"]["message"]
    status, _, answer = call(conn, "GET", f"{prefix}/slow")
    assert status == 504, answer
    assert json.loads(answer)["error"]["code"] == 504

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    gone = RestProxy("gone", closed).start()
    try:
        conn, prefix = client(gone.uri)
        status, _, answer = call(conn, "GET", f"{prefix}/v1/config")
        assert status == 503
        assert json.loads(answer)["error"]["type"] == "ServiceUnavailableException"
    finally:
        gone.stop()


def test_spark_sessions_reach_rest_catalogs_only_through_a_proxy(catalog: Catalog, tmp_path: Path) -> None:
    rest = CatalogConfig(name="lake", type=CatalogType.REST, uri=catalog.uri)
    sql = CatalogConfig.sqlite(tmp_path / "catalog.db", tmp_path / "warehouse")
    proxied, same_sql = through_proxies([rest, sql])
    assert same_sql == sql
    assert proxied.uri.startswith("http://127.0.0.1:") and proxied.uri != rest.uri
    assert proxied.spark_conf()["spark.sql.catalog.lake.uri"] == proxied.uri
    assert {k: v for k, v in vars(proxied).items() if k != "uri"} == {
        k: v for k, v in vars(rest).items() if k != "uri"
    }
    assert through_proxies([rest])[0].uri == proxied.uri, "a later session got another proxy"
    conn, prefix = client(proxied.uri)
    assert call(conn, "GET", f"{prefix}/v1/namespaces")[0] == 200
    assert catalog.seen[-1].path == "/api/catalog/v1/namespaces"
