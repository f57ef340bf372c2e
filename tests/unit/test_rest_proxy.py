"""What Spark's catalog client sees of a REST catalog's answers (`icefall.catalog.rest_proxy.confine_answer`).

Proves: a `/v1/config` answer loses, from `defaults` and `overrides`, the keys that name code (`io-impl`,
`metrics-reporter-impl`, a custom `rest.auth.type`, `client.factory`, ...), values that are not text, and
the keys that would send Iceberg Java past the proxy (`uri`, `rest.client.proxy.*`); a table answer loses
them from its `config` and each `storage-credentials[].config`, and a credential-refresh endpoint on another
server, while one under the catalog's own URI is made relative; a table's `metadata.properties` lose the
keys that name code and keep everything else; what is kept is unchanged and nothing is dropped from an
answer that names no code; each dropped key is reported with where it came from, never its value.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.catalog.rest_proxy import Dropped, confine_answer

pytestmark = pytest.mark.unit

CATALOG = "https://catalog.example.com/api/catalog"
BOOM = "com.example.Boom"
CREDENTIALS = "v1/lake/namespaces/shop/tables/orders/credentials"


def dropped_keys(dropped: list[Dropped]) -> set[tuple[str, str]]:
    return {(each.key, each.source) for each in dropped}


def test_a_config_answer_loses_what_names_code_or_leaves_the_proxy() -> None:
    answer = {
        "defaults": {"warehouse": "s3://lake", "metrics-reporter-impl": BOOM, "cache-enabled": True},
        "overrides": {
            "prefix": "lake",
            "io-impl": BOOM,
            "rest.auth.type": BOOM,
            "client.factory": BOOM,
            "hadoop.fs.s3a.impl": BOOM,
            "uri": "https://elsewhere.example.com",
            "rest.client.proxy.hostname": "proxy.example.com",
            "header.X-Tenant": "shop",
        },
        "endpoints": ["GET /v1/{prefix}/namespaces"],
    }
    kept, dropped = confine_answer(answer, CATALOG)
    assert kept == {
        "defaults": {"warehouse": "s3://lake"},
        "overrides": {"prefix": "lake", "header.X-Tenant": "shop"},
        "endpoints": ["GET /v1/{prefix}/namespaces"],
    }
    defaults, overrides = "the /v1/config answer's defaults", "the /v1/config answer's overrides"
    assert dropped_keys(dropped) == {
        ("metrics-reporter-impl", defaults),
        ("cache-enabled", defaults),
        *((key, overrides) for key in ("io-impl", "rest.auth.type", "client.factory", "hadoop.fs.s3a.impl")),
        ("uri", overrides),
        ("rest.client.proxy.hostname", overrides),
    }
    assert not any(BOOM in f"{each}" for each in dropped), "a value reported"
    assert answer["overrides"]["io-impl"] == BOOM, "the parsed answer itself was changed"


def test_a_built_in_auth_scheme_is_kept() -> None:
    kept, dropped = confine_answer({"overrides": {"rest.auth.type": "oauth2"}}, CATALOG)
    assert kept == {"overrides": {"rest.auth.type": "oauth2"}}
    assert dropped == []


PLAIN_PROPERTIES = {
    "write.format.default": "parquet",
    "s3.write.storage-class": "STANDARD_IA",
    "icefall.offsets": '{"0": 10}',
}


def table_answer(properties: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "metadata-location": "s3://lake/shop/orders/metadata/00001.metadata.json",
        "metadata": {
            "format-version": 2,
            "location": "s3://lake/shop/orders",
            "properties": properties,
            "snapshots": [],
        },
        **extra,
    }


def test_a_table_answer_loses_code_from_its_config_credentials_and_properties() -> None:
    code = {"write.location-provider.impl": BOOM, "write.py-location-provider.impl": BOOM}
    answer = table_answer(
        {**code, **PLAIN_PROPERTIES},
        config={
            "io-impl": BOOM,
            "s3.retry-strategy-impl": BOOM,
            "s3.access-key-id": "AKIA",
            "uri": "https://elsewhere.example.com",
            "client.refresh-credentials-endpoint": f"{CATALOG}/{CREDENTIALS}",
            "gcs.oauth2.refresh-credentials-endpoint": "https://elsewhere.example.com/creds",
            "adls.refresh-credentials-endpoint": CREDENTIALS,
        },
        **{
            "storage-credentials": [
                {"prefix": "s3://lake/", "config": {"s3.session-token": "t", "client.factory": BOOM}},
                {"prefix": "s3://other/"},
            ]
        },
    )
    kept, dropped = confine_answer(answer, CATALOG + "/")
    assert kept["config"] == {
        "s3.access-key-id": "AKIA",
        # under the catalog's own URI: relative, resolved against the proxy by Iceberg Java
        "client.refresh-credentials-endpoint": CREDENTIALS,
        "adls.refresh-credentials-endpoint": CREDENTIALS,
    }
    assert kept["storage-credentials"] == [
        {"prefix": "s3://lake/", "config": {"s3.session-token": "t"}},
        {"prefix": "s3://other/"},
    ]
    assert kept["metadata"]["properties"] == PLAIN_PROPERTIES
    assert {k: v for k, v in kept["metadata"].items() if k != "properties"} == {
        k: v for k, v in answer["metadata"].items() if k != "properties"
    }
    assert kept["metadata-location"] == answer["metadata-location"]
    config, credentials = "a table answer's config", "a table answer's storage credentials"
    properties = "a table's metadata properties"
    assert dropped_keys(dropped) == {
        ("io-impl", config),
        ("s3.retry-strategy-impl", config),
        ("uri", config),
        ("gcs.oauth2.refresh-credentials-endpoint", config),
        ("client.factory", credentials),
        ("write.location-provider.impl", properties),
        ("write.py-location-provider.impl", properties),
    }


@pytest.mark.parametrize(
    "answer",
    [
        table_answer(PLAIN_PROPERTIES, config={"s3.access-key-id": "AKIA"}),
        {"defaults": {"warehouse": "lake"}, "overrides": {}},
        {"access_token": "t", "token_type": "bearer", "expires_in": 3600},
        {"error": {"message": "no such table", "type": "NoSuchTableException", "code": 404}},
        ["not", "an", "object"],
        "text",
    ],
    ids=["table", "config", "token", "error", "list", "text"],
)
def test_an_answer_that_names_no_code_is_kept_as_it_is(answer: Any) -> None:
    kept, dropped = confine_answer(answer, CATALOG)
    assert kept == answer
    assert dropped == []
