"""An authenticating front for the test stack's REST catalog: it checks credentials, the fixture does not.

Iceberg's `RESTCatalogServer` (icefall.devstack.rest_catalog) grants a token for any credential at
`/v1/oauth/tokens` and never looks at `Authorization`. `CatalogAuthProxy` stands in front of it on its own
loopback port and plays the catalog's OAuth2 side as the REST specification describes it:

- `POST /v1/oauth/tokens`, `grant_type=client_credentials`: `client_id` and `client_secret` (form fields, or
  HTTP Basic) must be one of `clients`; a token is issued that expires after `token_ttl` seconds
  (`expires_in`). A wrong pair: 401 `invalid_client`, as an OAuth2 server answers.
- the same endpoint, `grant_type=urn:ietf:params:oauth:grant-type:token-exchange` with a `subject_token`
  it issued and that has not expired: a fresh token (how Iceberg Java refreshes before expiry).
- every other request needs `Authorization: Bearer <token>`, a token it issued and that has not expired or
  one of `static_tokens`; otherwise 401 with an Iceberg `ErrorResponse` (`NotAuthorizedException`). Good
  requests are forwarded to the real server as they are and its answer is returned as it is, except:
- credential vending: with `vended` storage properties (e.g. `s3.access-key-id`, `s3.secret-access-key`),
  a table load or create that asks for them (`X-Iceberg-Access-Delegation: vended-credentials`) gets them
  in the answer's `config`, where Iceberg's clients take a table's FileIO settings from. The same keys for
  every table: a stand-in for a catalog that mints scoped, short-lived ones.

`stats` counts tokens issued by each grant and the requests refused (wrong client, no or unknown token,
expired token), so a test can tell that a refresh happened. Not guaranteed: anything beyond what Iceberg's
clients use (no scopes are checked, no refresh tokens, no JWTs: tokens are opaque). Runs in a thread of
the calling process, on 127.0.0.1 only; `stop()` ends it.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from icefall.devstack.procs import free_port

TOKEN_PATH = "/v1/oauth/tokens"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
# Hop-by-hop headers (RFC 9110 §7.6.1) are the proxy's own business, never forwarded.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}


class CatalogAuthProxy:
    """`start()`, then point clients at `uri` (`oauth2-server-uri` defaults to `<uri>/v1/oauth/tokens`)."""

    def __init__(
        self,
        backend_uri: str,
        clients: Mapping[str, str],
        *,
        token_ttl: float = 3600,
        static_tokens: tuple[str, ...] = (),
        vended: Mapping[str, str] | None = None,
    ) -> None:
        self.backend = urlsplit(backend_uri)
        self.clients = dict(clients)
        self.token_ttl = token_ttl
        self.static_tokens = frozenset(static_tokens)
        self.vended = dict(vended or {})
        self.stats: Counter[str] = Counter()
        self._tokens: dict[str, float] = {}  # token -> expiry (time.monotonic())
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CatalogAuthProxy:
        if self._server is not None:
            return self
        self.port = self.port or free_port()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = _Server(("127.0.0.1", self.port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="catalog-auth", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- tokens ----------------------------------------------------------------------------------------------

    def issue(self, grant: str) -> dict[str, object]:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.monotonic() + self.token_ttl
            self.stats[f"issued.{grant}"] += 1
        return {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": int(self.token_ttl),
            "issued_token_type": ACCESS_TOKEN_TYPE,
        }

    def check(self, token: str) -> str:
        """'' when `token` is good, else why not (unknown, expired)."""
        if token in self.static_tokens:
            return ""
        with self._lock:
            expiry = self._tokens.get(token)
        if expiry is None:
            return "unknown"
        return "expired" if time.monotonic() >= expiry else ""

    def refuse(self, why: str) -> None:
        self.count(f"refused.{why}")

    def count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1


def _delegation(headers: Message) -> bool:
    return "vended-credentials" in (headers.get("X-Iceberg-Access-Delegation") or "")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client closed its keep-alive connection: nothing to report
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    proxy: CatalogAuthProxy
    protocol_version = "HTTP/1.1"  # keep-alive: every answer carries Content-Length

    def log_message(self, format: str, *args: object) -> None:
        pass  # a client's every request would otherwise go to stderr

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self, status: int, payload: object, headers: Mapping[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        sent = {key.lower() for key in (headers or {})}
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "content-type" not in sent:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer has no body: a client would read it as the next answer
            self.wfile.write(data)

    def _not_authorized(self, why: str) -> None:
        self.proxy.refuse(why)
        message = f"Not authorized: {why} bearer token"
        error = {"error": {"message": message, "type": "NotAuthorizedException", "code": 401}}
        self._answer(401, error, {"WWW-Authenticate": 'Bearer error="invalid_token"'})

    def _token_endpoint(self, body: bytes) -> None:
        form = {key: values[0] for key, values in parse_qs(body.decode()).items()}
        grant = form.get("grant_type", "")
        if grant == "client_credentials":
            client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
            basic = self.headers.get("Authorization", "")
            if basic.lower().startswith("basic "):
                decoded = base64.b64decode(basic[6:]).decode()
                client_id, _, secret = (unquote(part) for part in decoded.partition(":"))
            known = self.proxy.clients.get(client_id)
            if known is None or not secrets.compare_digest(known, secret):
                self.proxy.refuse("client")
                self._answer(
                    401,
                    {
                        "error": "invalid_client",
                        "error_description": "unknown client_id or wrong client_secret",
                    },
                )
                return
            self._answer(200, self.proxy.issue("client_credentials"))
        elif grant == TOKEN_EXCHANGE:
            why = self.proxy.check(form.get("subject_token", ""))
            if why:
                self.proxy.refuse(f"exchange.{why}")
                self._answer(401, {"error": "invalid_grant", "error_description": f"{why} subject_token"})
                return
            self._answer(200, self.proxy.issue("token_exchange"))
        else:
            self._answer(400, {"error": "unsupported_grant_type", "error_description": grant or "none"})

    def _forward(self, body: bytes) -> None:
        backend = self.proxy.backend
        connection = http.client.HTTPConnection(backend.hostname or "127.0.0.1", backend.port, timeout=120)
        try:
            # No Accept-Encoding: answers come back as plain JSON, which credential vending edits.
            headers = {
                key: value
                for key, value in self.headers.items()
                if key.lower() not in _HOP
                and key.lower() not in ("authorization", "host", "content-length", "accept-encoding")
            }
            if body or self.command in ("POST", "PUT"):
                headers["Content-Length"] = str(len(body))
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            data = response.read()
            if response.status == 200 and self.proxy.vended and _delegation(self.headers):
                data = self._vend(data)
            passed = {
                key: value
                for key, value in response.getheaders()
                if key.lower() not in _HOP and key.lower() != "content-length"
            }
            self._answer(response.status, data, passed)
        finally:
            connection.close()

    def _vend(self, data: bytes) -> bytes:
        """A table's load/create answer with the vended storage properties in its `config`."""
        try:
            answer = json.loads(data)
        except ValueError:
            return data
        if not isinstance(answer, dict) or "metadata" not in answer:
            return data  # not a LoadTableResult
        answer["config"] = {**(answer.get("config") or {}), **self.proxy.vended}
        self.proxy.count("vended")
        return json.dumps(answer).encode()

    def _handle(self) -> None:
        body = self._body()
        if urlsplit(self.path).path == TOKEN_PATH and self.command == "POST":
            self._token_endpoint(body)
            return
        auth = self.headers.get("Authorization", "")
        if not auth.lower().startswith("bearer "):
            self._not_authorized("no")
            return
        why = self.proxy.check(auth[7:].strip())
        if why:
            self._not_authorized(why)
            return
        self._forward(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle  # noqa: N815 (http.server's names)
