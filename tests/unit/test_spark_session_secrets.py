"""Which Spark options stay off spark-submit's command line (`icefall.spark.session.launch_and_late_conf`).

Proves: every catalog option whose value holds a secret value, including those derived from one (the JDBC
password of a PostgreSQL catalog, Azure's shared key under its Java name), goes to the set-after-start
part, and no secret value is left anywhere in what the JVM is launched with; options without secrets and
options outside the catalogs stay in the launch. tests/integration/test_catalog_auth.py proves it on a
real run (process command lines) with a REST catalog that refuses requests without the token.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.spark.session import launch_and_late_conf

pytestmark = pytest.mark.unit

PASSWORD, KEY, TOKEN = "pg-pass-1234", "azure-key-5678==", "rest-token-90ab"


def catalog(block: dict[str, Any], environ: dict[str, str]) -> CatalogConfig:
    st = StreamingTable.model_validate(
        {
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "catalog": block},
            },
        }
    )
    return CatalogConfig.for_table(st.spec, environ=environ)


def test_options_carrying_secrets_are_set_after_the_jvm_starts() -> None:
    jdbc = catalog(
        {
            "name": "lake",
            "type": "sql",
            "uri": "postgresql://icefall@db:5432/lake",
            "warehouse": "abfss://data@acct.dfs.core.windows.net/lake",
            "properties": {"adls.account-name": "acct"},
            "secretProperties": {"password": {"env": "PG"}, "adls.account-key": {"env": "KEY"}},
        },
        {"PG": PASSWORD, "KEY": KEY},
    )
    rest = catalog(
        {
            "name": "rest",
            "type": "rest",
            "uri": "https://catalog.example/api",
            "properties": {"prefix": "p"},
            "secretProperties": {"token": {"env": "TOKEN"}},
        },
        {"TOKEN": TOKEN},
    )
    conf = {"spark.master": "local[1]", **jdbc.spark_conf(), **rest.spark_conf()}

    launch, late = launch_and_late_conf(conf, [jdbc, rest])

    assert late == {
        "spark.sql.catalog.lake.jdbc.password": PASSWORD,
        "spark.sql.catalog.lake.adls.account-key": KEY,
        "spark.sql.catalog.lake.adls.auth.shared-key.account.key": KEY,
        "spark.sql.catalog.rest.token": TOKEN,
    }
    assert {**launch, **late} == conf
    text = repr(launch)
    assert not any(secret in text for secret in (PASSWORD, KEY, TOKEN))
    assert launch["spark.sql.catalog.lake.jdbc.user"] == "icefall"
    assert launch["spark.sql.catalog.rest.prefix"] == "p"
    assert launch["spark.master"] == "local[1]"


def test_a_catalog_without_secrets_launches_with_everything() -> None:
    plain = catalog({"name": "lake", "type": "rest", "uri": "http://catalog:8181"}, {})
    conf = {"spark.app.name": "icefall-orders", **plain.spark_conf()}
    assert launch_and_late_conf(conf, [plain]) == (conf, {})
