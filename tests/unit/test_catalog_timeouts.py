"""The bounds a catalog client gets (`icefall.catalog.timeouts`; the driver's table meter's), as properties
and URLs.

Proves: a PostgreSQL URL gets libpq's connect_timeout (whole seconds, never above the bound, a smaller one
kept), tcp_user_timeout and a statement_timeout appended to the user's own `options`; the object store's
connect and request timeouts are set, never above the bound (a spec's larger, malformed or infinite value
is replaced, a smaller one kept); `CatalogConfig.pyiceberg(request_timeout=...)` bounds exactly what it
opens (a client without it is left as pyiceberg makes it).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from icefall.api import CatalogType
from icefall.catalog.config import CatalogConfig, _bounded
from icefall.catalog.timeouts import bounded_postgres_url, bounded_properties

pytestmark = pytest.mark.unit


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_a_postgres_url_gets_connect_tcp_and_statement_timeouts() -> None:
    url = bounded_postgres_url("postgresql+psycopg2://u:p@db.example:5432/lake", 10)
    assert url.startswith("postgresql+psycopg2://u:p@db.example:5432/lake?")
    assert query(url) == {
        "connect_timeout": ["10"],
        "tcp_user_timeout": ["10000"],
        "options": ["-c statement_timeout=10000"],
    }
    mine = bounded_postgres_url(
        "postgresql+psycopg2://u@db/lake?connect_timeout=3600&options=-c%20search_path%3Dice&sslmode=require",
        2.5,
    )
    assert query(mine) == {
        "connect_timeout": ["3"],  # whole seconds, rounded up
        "tcp_user_timeout": ["2500"],
        "options": ["-c search_path=ice -c statement_timeout=2500"],
        "sslmode": ["require"],
    }
    assert query(bounded_postgres_url("postgresql://db/lake?connect_timeout=2", 10))["connect_timeout"] == [
        "2"
    ]


@pytest.mark.parametrize(
    ("given", "kept"), [(None, "10.0"), ("3", "3.0"), ("99999", "10.0"), ("inf", "10.0"), ("soon", "10.0")]
)
def test_object_store_timeouts_are_set_and_never_above_the_bound(given: str | None, kept: str) -> None:
    props = {"s3.endpoint": "http://minio:9000"}
    if given is not None:
        props["s3.request-timeout"] = given
    bounded = bounded_properties(props, 10)
    assert bounded["s3.request-timeout"] == kept
    assert bounded["s3.connect-timeout"] == "10.0"
    assert bounded["s3.endpoint"] == "http://minio:9000"
    assert "s3.connect-timeout" not in props  # the input is not changed


def test_only_the_bounded_client_is_bounded() -> None:
    config = CatalogConfig(
        name="lake", type=CatalogType.SQL, uri="postgresql://ice@db:5432/lake", secrets={"password": "pw"}
    )
    plain = config.pyiceberg_properties()
    assert "connect_timeout" not in plain["uri"] and "s3.request-timeout" not in plain
    bounded = _bounded(plain, 7)
    assert query(bounded["uri"])["connect_timeout"] == ["7"]
    assert bounded["s3.request-timeout"] == "7.0"
    sqlite = CatalogConfig(name="lake", type=CatalogType.SQL, uri="sqlite:////tmp/c.db")
    assert _bounded(sqlite.pyiceberg_properties(), 7)["uri"] == "sqlite:////tmp/c.db"
