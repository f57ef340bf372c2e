"""A confining HTTP proxy between Spark's Iceberg REST client (Iceberg Java) and a REST catalog.

Iceberg Java merges a REST catalog's `/v1/config` answer (`defaults`, `overrides`) into its catalog
properties and a table answer's `config` and `storage-credentials` into the table's FileIO properties, and
loads the classes they name (`io-impl`, `metrics-reporter-impl`, `client.factory`, a custom
`rest.auth.type`, ...). `build_spark_session` therefore points each rest catalog's Spark `uri` at a
`RestProxy` of its own process (`through_proxies`), which forwards every request (method, path, query,
headers with Authorization, body) to the catalog's real URI and returns the answer after `confine_answer`:
- `defaults` and `overrides` of a `/v1/config` answer, a table (or view) answer's `config` and each of its
  `storage-credentials[].config` lose every key that names code (`icefall.api.code_properties`, the
  predicate `icefall.catalog.confined` applies to pyiceberg) and every value that is not text;
- the same maps lose the keys that would send Iceberg Java past the proxy: `uri`, `rest.client.proxy.*`,
  and a `*refresh-credentials-endpoint` naming another server (one under the catalog's own URI is made
  relative, so the FileIO's credential refreshes come through the proxy too);
- a table answer's `metadata.properties` lose the keys that name code (`write.location-provider.impl`,
  which Spark loads on every write; pyiceberg refuses its own, `icefall.catalog.confined`).
Each dropped key is logged once per proxy: its name and where it came from, never its value.

Where: the proxy listens where Spark's driver does (`spark.driver.host`: 127.0.0.1 for a local master, the
pod's address for Spark on Kubernetes, whose executors' FileIOs call the catalog's credential and signing
endpoints), on an ephemeral port, under a random path that only the session's conf carries (a request
without it gets 404). One proxy per catalog URI and address in a process, reused by later sessions: Spark
keeps one session per JVM, and a catalog it made keeps the URI it was made with. Its threads are daemons;
it closes at exit.

Upstream: http or https, verified with the system's trust store (what the JVM of Icefall's image trusts),
with connect and read timeouts (the catalog's `rest.client.connection-timeout-ms` and
`rest.client.socket-timeout-ms` when set). What Iceberg Java then sees: a catalog that cannot be reached
answers 503, a timeout 504, a redirect or an answer over `MAX_BODY_BYTES` 502, each as Iceberg's
`ErrorResponse` (a catalog outage to ingestion; on a commit, Iceberg's "state unknown").

Not guaranteed: what Iceberg Java fetches from elsewhere (an `oauth2-server-uri` or `s3.signer.uri` on
another server: tokens and signatures, no properties); a catalog reached through an HTTP proxy
(`rest.client.proxy.*` set in the spec: Iceberg Java would send the proxy's own URI there); table
properties of a sql (JDBC) catalog, whose metadata files Spark reads itself.
"""

from __future__ import annotations

import atexit
import dataclasses
import gzip
import http.client
import json
import logging
import secrets
import select
import socket
import socketserver
import ssl
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from icefall.api import CatalogType
from icefall.api.code_properties import code_property_problem
from icefall.catalog.config import CatalogConfig

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MAX_BODY_BYTES = 512 * 1024 * 1024  # a table's metadata JSON: tens of MiB for thousands of snapshots
CONNECT_TIMEOUT_SECONDS = 30.0
READ_TIMEOUT_SECONDS = 300.0  # a commit of large metadata may take minutes
IDLE_SECONDS = 120.0  # a client connection idle this long is closed (Iceberg Java reconnects)
_TIMEOUT_KEYS = ("rest.client.connection-timeout-ms", "rest.client.socket-timeout-ms")
# Headers that describe one hop, not the request or answer (RFC 9110 7.6.1), and those set per hop here.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_DECODABLE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "x-gzip": gzip.decompress,
    "deflate": zlib.decompress,
}


# -- what Iceberg Java may see (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class Dropped:
    """A key `confine_answer` removed: its name, where it came from, why (never its value)."""

    key: str
    source: str
    why: str


def confine_answer(answer: Any, catalog_uri: str) -> tuple[Any, list[Dropped]]:
    """`answer` (a catalog's parsed JSON) without what the module doc says Iceberg Java may not see, and
    what was dropped. `catalog_uri`: the catalog's real URI (endpoints under it are made relative)."""
    if not isinstance(answer, dict):
        return answer, []
    dropped: list[Dropped] = []
    kept = dict(answer)
    for field in ("defaults", "overrides"):
        if isinstance(kept.get(field), dict):
            kept[field] = _clean(kept[field], f"the /v1/config answer's {field}", catalog_uri, dropped)
    if isinstance(kept.get("config"), dict):
        kept["config"] = _clean(kept["config"], "a table answer's config", catalog_uri, dropped)
    if isinstance(kept.get("storage-credentials"), list):
        source = "a table answer's storage credentials"
        kept["storage-credentials"] = [
            {**each, "config": _clean(each["config"], source, catalog_uri, dropped)}
            if isinstance(each, dict) and isinstance(each.get("config"), dict)
            else each
            for each in kept["storage-credentials"]
        ]
    metadata = kept.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("properties"), dict):
        properties = {}
        for key, value in metadata["properties"].items():
            if code_property_problem(key, value if isinstance(value, str) else None) is None:
                properties[key] = value
            else:
                dropped.append(Dropped(key, "a table's metadata properties", "it names code to load"))
        kept["metadata"] = {**metadata, "properties": properties}
    return kept, dropped


def _clean(
    properties: Mapping[str, Any], source: str, catalog_uri: str, dropped: list[Dropped]
) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, given in properties.items():
        why, value = _verdict(key, given, catalog_uri)
        if why is None:
            kept[key] = value
        else:
            dropped.append(Dropped(key, source, why))
    return kept


def _verdict(key: str, value: Any, catalog_uri: str) -> tuple[str | None, Any]:
    """Why the property is dropped (None: kept), and the value to keep."""
    if not isinstance(value, str):
        return "its value is not text", value
    if code_property_problem(key, value) is not None:
        return "it names code to load", value
    return _past_the_proxy(key, value, catalog_uri)


def _past_the_proxy(key: str, value: str, catalog_uri: str) -> tuple[str | None, str]:
    """Why the property would send Iceberg Java's requests past the proxy (or None), and its value."""
    lowered = key.lower()
    if lowered == "uri" or lowered.startswith("rest.client.proxy."):
        return "it would send Spark's catalog requests past Icefall's catalog proxy", value
    if lowered.endswith("refresh-credentials-endpoint") and value.startswith(("http://", "https://")):
        base = catalog_uri.rstrip("/") + "/"
        if value.startswith(base):
            return None, value.removeprefix(base)  # resolved against the FileIO's `uri`: the proxy
        return "it names another server than the catalog, past Icefall's catalog proxy", value
    return None, value


# -- the proxy ------------------------------------------------------------------------------------------


class RestProxy:
    """One catalog's proxy (module doc). `uri` is what Iceberg Java is given instead of `upstream`."""

    def __init__(
        self,
        catalog: str,
        upstream: str,
        host: str = LOOPBACK,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = READ_TIMEOUT_SECONDS,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"spec.table.catalog.uri: {upstream!r} is not an http(s) URL")
        self.catalog = catalog
        self.upstream = upstream
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.secret = secrets.token_urlsafe(16)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None  # the system's store
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, 0), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None
        name = f"[{host}]" if ":" in host else host
        self.uri = f"http://{name}:{self._server.server_address[1]}/{self.secret}"

    def start(self) -> RestProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.2,),  # how soon `stop` is noticed
            name=f"rest-proxy {self.catalog}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def confined(self, body: bytes) -> bytes | None:
        """`body` re-encoded without what Iceberg Java may not see, or None when it keeps it all."""
        try:
            answer = json.loads(body)
        except ValueError:
            return None  # not JSON: no properties in it that Iceberg Java reads
        kept, dropped = confine_answer(answer, self.upstream)
        for each in dropped:
            self._log(each)
        return json.dumps(kept).encode() if dropped else None

    def _log(self, dropped: Dropped) -> None:
        with self._lock:
            if (dropped.key, dropped.source) in self._logged:
                return
            self._logged.add((dropped.key, dropped.source))
        log.warning(
            "catalog %r (Spark): ignored %s from %s: %s, and Icefall never loads code a table or an endpoint "
            "names",
            self.catalog,
            dropped.key,
            dropped.source,
            dropped.why,
        )

    def connect(self) -> http.client.HTTPConnection:
        """A new connection to the catalog, connected, with the read timeout set."""
        parts = urlsplit(self.upstream)
        conn: http.client.HTTPConnection
        if self._tls is not None:  # certificates and host names checked, as the JVM does
            conn = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.connect_timeout, context=self._tls
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self.connect_timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self.read_timeout)
        return conn


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: RestProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        # One line, not socketserver's traceback on stderr: mostly a client that went away mid-answer.
        error = sys.exc_info()[1]
        log.info("catalog %r: Icefall's catalog proxy lost a request: %r", self.proxy.catalog, error)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: no reverse DNS lookup of the address
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Server6(_Server):
    address_family = socket.AF_INET6


class _UpstreamError(Exception):
    """The catalog could not answer: the status and message Iceberg Java gets instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    """One client connection: its requests go over one upstream connection of its own, reused."""

    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS
    upstream: http.client.HTTPConnection | None = None

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def do_PATCH(self) -> None:
        self._forward()

    def _forward(self) -> None:
        proxy = self.server.proxy
        prefix = f"/{proxy.secret}"
        if self.path != prefix and not self.path.startswith((prefix + "/", prefix + "?")):
            self._error(404, "not a path of this catalog proxy")
            return
        path = (urlsplit(proxy.upstream).path.rstrip("/") + self.path.removeprefix(prefix)) or "/"
        try:
            body = self._request_body()
            status, reason, headers, answer = self._exchange(path, body)
        except _UpstreamError as error:
            self._error(error.status, str(error))
            return
        self.send_response_only(status, reason)
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    def _exchange(self, path: str, body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send the request upstream; the answer's status, reason, headers and body for Iceberg Java."""
        proxy = self.server.proxy
        headers = {key: value for key, value in self.headers.items() if key.lower() not in _HOP}
        accepted = [e.strip() for e in headers.pop("Accept-Encoding", "").split(",") if e.strip()]
        decodable = [e for e in accepted if e.split(";")[0].strip().lower() in _DECODABLE]
        headers["Accept-Encoding"] = ", ".join(decodable) or "identity"  # only what this proxy can read
        response = self._send(path, body, headers)
        try:
            if 300 <= response.status < 400:
                raise _UpstreamError(
                    502,
                    f"the catalog at {proxy.upstream} answered {response.status} (a redirect): Icefall's "
                    "catalog proxy follows none; set spec.table.catalog.uri to where the catalog answers",
                )
            answer = self._read(response)
        except _UpstreamError:
            self._drop_upstream()  # the rest of the answer is still on the connection
            raise
        except TimeoutError as error:
            self._drop_upstream()
            raise _UpstreamError(
                504, f"the catalog at {proxy.upstream} did not answer in time: {error}"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            self._drop_upstream()
            raise _UpstreamError(
                502, f"the catalog at {proxy.upstream} broke off its answer: {error}"
            ) from None
        finally:
            if response.will_close:
                self._drop_upstream()
        out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        confined = proxy.confined(self._decoded(answer, encoding)) if answer else None
        if confined is not None:
            answer = confined
            out = [(k, v) for k, v in out if k.lower() != "content-encoding"]
        length = response.getheader("Content-Length") if self.command == "HEAD" else str(len(answer))
        if length is not None:
            out.append(("Content-Length", length))
        return response.status, response.reason, out, answer

    def _send(self, path: str, body: bytes | None, headers: dict[str, str]) -> http.client.HTTPResponse:
        proxy = self.server.proxy
        reused = self.upstream is not None and _alive(self.upstream)
        if not reused:
            self._drop_upstream()
        while True:
            if self.upstream is None:
                try:
                    self.upstream = proxy.connect()
                except OSError as error:  # refused, no route, timed out, TLS refused: nothing was sent
                    raise _UpstreamError(
                        503, f"the catalog at {proxy.upstream} cannot be reached: {error}"
                    ) from None
            try:
                self.upstream.request(self.command, path, body=body, headers=headers)
                return self.upstream.getresponse()
            except TimeoutError as error:
                self._drop_upstream()
                raise _UpstreamError(
                    504, f"the catalog at {proxy.upstream} did not answer in time: {error}"
                ) from None
            except (OSError, http.client.HTTPException) as error:
                self._drop_upstream()
                # A reused connection the catalog closed meanwhile: once more on a new one when repeating the
                # request is harmless (a POST may have been received: its outcome stays unknown).
                if reused and self.command in _IDEMPOTENT:
                    reused = False
                    continue
                raise _UpstreamError(502, f"the catalog at {proxy.upstream} broke off: {error}") from None

    def _request_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked_body()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise _UpstreamError(413, f"a request body over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length) if length else None

    def _chunked_body(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = int(self.rfile.readline(65537).split(b";", 1)[0].strip() or b"0", 16)
            if chunk == 0:
                while self.rfile.readline(65537).strip():  # trailers
                    pass
                return b"".join(parts)
            size += chunk
            if size > MAX_BODY_BYTES:
                raise _UpstreamError(413, f"a request body over {MAX_BODY_BYTES} bytes")
            parts.append(self.rfile.read(chunk))
            self.rfile.readline(3)  # the CRLF after the chunk

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        answer = response.read(MAX_BODY_BYTES + 1)
        if len(answer) > MAX_BODY_BYTES:
            raise _UpstreamError(502, f"the catalog's answer is over {MAX_BODY_BYTES} bytes")
        return answer

    def _decoded(self, answer: bytes, encoding: str) -> bytes:
        if encoding in ("identity", ""):
            return answer
        if encoding not in _DECODABLE:
            raise _UpstreamError(
                502, f"the catalog's answer is in an encoding this proxy cannot read: {encoding}"
            )
        try:
            return _DECODABLE[encoding](answer)
        except (OSError, zlib.error, EOFError) as error:
            raise _UpstreamError(502, f"the catalog's {encoding} answer cannot be decoded: {error}") from None

    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _error(self, status: int, message: str) -> None:
        """Iceberg's `ErrorResponse`, which Iceberg Java turns into its own exceptions."""
        types = {
            404: "NoSuchEndpointException",
            413: "BadRequestException",
            503: "ServiceUnavailableException",
        }
        error = {"message": message, "type": types.get(status, "ServiceFailureException"), "code": status}
        data = json.dumps({"error": error}).encode()
        self.close_connection = True  # the request's body may be unread: this connection is done
        self.send_response_only(status)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def finish(self) -> None:
        self._drop_upstream()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # nothing is logged per request (their headers carry tokens)


def _alive(conn: http.client.HTTPConnection) -> bool:
    """The connection is open and the catalog has sent nothing since the last answer (not even its close)."""
    if conn.sock is None:
        return False
    readable, _, _ = select.select([conn.sock], [], [], 0)
    return not readable


# -- the processes' proxies -----------------------------------------------------------------------------

_proxies: dict[tuple[str, str, float, float], RestProxy] = {}
_proxies_lock = threading.Lock()


def through_proxies(catalogs: Iterable[CatalogConfig], host: str = LOOPBACK) -> list[CatalogConfig]:
    """`catalogs`, each rest catalog's `uri` replaced by its proxy's on `host` (started on first use and
    kept for the process: module doc); the others as they are."""
    return [
        _through_proxy(catalog, host) if catalog.type is CatalogType.REST else catalog for catalog in catalogs
    ]


def _through_proxy(catalog: CatalogConfig, host: str) -> CatalogConfig:
    connect, read = (
        _seconds(catalog.properties.get(key), default)
        for key, default in zip(_TIMEOUT_KEYS, (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS), strict=True)
    )
    key = (catalog.uri, host, connect, read)
    with _proxies_lock:
        proxy = _proxies.get(key)
        if proxy is None:
            if not _proxies:
                atexit.register(_stop_all)
            proxy = RestProxy(
                catalog.name, catalog.uri, host, connect_timeout=connect, read_timeout=read
            ).start()
            _proxies[key] = proxy
    return dataclasses.replace(catalog, uri=proxy.uri)


def _seconds(milliseconds: str | None, default: float) -> float:
    try:
        return int(milliseconds) / 1000 if milliseconds else default
    except ValueError:
        return default


def _stop_all() -> None:
    with _proxies_lock:
        for proxy in _proxies.values():
            proxy.stop()
        _proxies.clear()
