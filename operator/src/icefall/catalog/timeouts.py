"""Bounds on how long a catalog client waits for an endpoint a table names (`CatalogConfig.pyiceberg(
request_timeout=...)`, which the driver's table meter uses: `icefall.ingest.table_meter`).

pyiceberg's clients wait for ever by default: its REST catalog's `requests` session sets no timeout, its
SQL catalog's engine none for PostgreSQL, and its S3 FileIOs none unless `s3.*-timeout` is set. With a
bound of `seconds`:
- REST: every request of the catalog's sessions (the `/v1/config` fetch, the OAuth token, every call)
  waits at most `seconds` to connect and `seconds` for each read of the answer (`bounded_session`);
- PostgreSQL: libpq's `connect_timeout` and `tcp_user_timeout`, and the server-side `statement_timeout`,
  set in the SQLAlchemy URL (`bounded_postgres_url`);
- object store: `s3.connect-timeout` and `s3.request-timeout` (pyiceberg's pyarrow and fsspec FileIOs), at
  most `seconds` even where the spec sets more (`bounded_properties`). GCS is bounded already
  (`icefall.catalog.gcs_io`).

Not guaranteed: a bound on a whole call. A server that answers one byte at a time resets a read timeout at
each byte.
A REST server's `/v1/config` overrides and table `config` reach the FileIO's properties after these bounds
are set (pyiceberg merges them), so a hostile server may lift the object-store timeouts for its own table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from requests import Session

_S3_TIMEOUTS = ("s3.connect-timeout", "s3.request-timeout")


def bounded_session(session: Session, seconds: float) -> Session:
    """`session`, whose requests that name no timeout wait at most `seconds` to connect and per read."""
    request = session.request

    def timed(method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = (seconds, seconds)
        return request(method, url, *args, **kwargs)

    setattr(session, "request", timed)  # noqa: B010 (an instance attribute shadows the method)
    return session


def bounded_rest_catalog(base: Any, seconds: float) -> Any:
    """A subclass of pyiceberg's REST catalog class `base` whose every session is `bounded_session`."""

    class Bounded(base):  # type: ignore[misc]
        def _create_session(self) -> Session:
            return bounded_session(super()._create_session(), seconds)

    return Bounded


def bounded_postgres_url(url: str, seconds: float) -> str:
    """A SQLAlchemy/libpq PostgreSQL URL with connect, TCP and statement timeouts of at most `seconds`."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    given = _number(query.get("connect_timeout"), seconds)
    query["connect_timeout"] = str(max(math.ceil(min(given, seconds)), 1))  # libpq: whole seconds
    millis = str(int(seconds * 1000))
    query["tcp_user_timeout"] = millis
    options = query.get("options", "")
    query["options"] = f"{options} -c statement_timeout={millis}".strip()  # the last setting wins
    return urlunsplit(parts._replace(query=urlencode(query)))


def bounded_properties(props: Mapping[str, str], seconds: float) -> dict[str, str]:
    """pyiceberg catalog properties with the object-store timeouts bounded by `seconds`."""
    bounded = dict(props)
    for key in _S3_TIMEOUTS:
        bounded[key] = str(float(min(_number(bounded.get(key), seconds), seconds)))
    return bounded


def _number(text: str | None, default: float) -> float:
    try:
        value = float(text) if text is not None else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default
