"""Catalog properties reach the REST catalog server as the `CATALOG_*` variables it maps back to them.

Proves: the mapping is the inverse of the server's (`__` → `-`, `_` → `.`, lower case) for the properties
the stack passes (JDBC, S3FileIO, region), and a property it could not carry is refused before any start.
Does not start the server (the integration tests in test_stack_catalogs.py do).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icefall.devstack.rest_catalog import RESTCatalogServer, catalog_env

pytestmark = pytest.mark.unit


def server_mapping(env: dict[str, str]) -> dict[str, str]:
    """What RESTCatalogServer (RCKUtils.environmentCatalogConfig) does with the variables, in Python."""
    return {
        name.removeprefix("CATALOG_").replace("__", "-").replace("_", ".").lower(): value
        for name, value in env.items()
    }


def test_properties_round_trip_through_the_servers_mapping() -> None:
    properties = {
        "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "uri": "jdbc:postgresql://127.0.0.1:5432/icefall",
        "jdbc.user": "icefall",
        "jdbc.password": "secret_with_underscores_in_the_value",
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.path-style-access": "true",
        "s3.access-key-id": "key",
        "s3.secret-access-key": "secret",
        "client.region": "us-east-1",
        "rest.port": "8181",
    }
    env = catalog_env(properties)
    assert env["CATALOG_S3_ACCESS__KEY__ID"] == "key"
    assert env["CATALOG_IO__IMPL"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert server_mapping(env) == properties


@pytest.mark.parametrize("key", ["s3.sse_type", "Client.Region"])
def test_a_property_the_variables_cannot_carry_is_refused_before_start(key: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be passed"):
        RESTCatalogServer(tmp_path, properties={key: "x"})
