"""Tables in Azure storage: `spec.table.catalog` with an `abfss://` warehouse, mapped for both clients, and
the paths orphan removal lists. No server is contacted.

Proves:
- an `abfss://` warehouse (or `adls.*` properties) gives pyiceberg `py-io-impl` Icefall's AzureFileIO and
  Spark `io-impl` ADLSFileIO, the shared key under Java's names (from a Secret reference, masked in
  `repr`), and the emulator's endpoint as `adls.connection-string.<account host>` (path-style for a
  loopback authority, host-style otherwise); given Java names win (a FileIO is never given: Icefall's is
  fixed); S3 tables are unchanged; both key
  options match Spark's redaction pattern;
- without a key (Azure's default credential chain, e.g. workload identity) no key property is set;
- an account key in plain `properties` is refused as secret-looking;
- AzureFileIO hands pyarrow `<container>/<path>` for abfs(s)/wasb(s) locations and parses every other
  location as pyiceberg does (a pyiceberg upgrade that moves `parse_location` fails here);
- the Azure example of docs/catalogs.md maps as it says;
- the orphan listing's path mapping turns `abfss://c@host/p` into `c/p` and back, exactly.
Not proved here: that the clients reach Azurite (tests/integration do, with real servers).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.catalog.azure import ADLS_FILE_IO, PY_AZURE_FILE_IO, java_properties, split_location
from icefall.catalog.azure_io import AzureFileIO
from icefall.spark.session import REDACTION_REGEX

pytestmark = pytest.mark.unit

HOST = "acct.dfs.core.windows.net"
WAREHOUSE = f"abfss://lake@{HOST}/warehouse"


def table_with(catalog: dict[str, Any]) -> StreamingTable:
    return StreamingTable.model_validate(
        {
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "catalog": catalog},
            },
        }
    )


def azure_catalog(**properties: str) -> dict[str, Any]:
    return {
        "name": "lake",
        "type": "sql",
        "uri": "postgresql://icefall@db:5432/catalog",
        "warehouse": WAREHOUSE,
        "properties": {"adls.account-name": "acct", **properties},
        "secretProperties": {"adls.account-key": {"env": "ADLS_KEY"}, "password": {"env": "PG"}},
    }


def spark_options(config: CatalogConfig) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{config.name}."
    return {k.removeprefix(prefix): v for k, v in config.spark_conf().items() if k.startswith(prefix)}


def test_emulator_maps_to_both_clients() -> None:
    st = table_with(
        azure_catalog(**{"adls.dfs-storage-authority": "127.0.0.1:10000", "adls.dfs-storage-scheme": "http"})
    )
    config = CatalogConfig.for_table(st.spec, environ={"ADLS_KEY": "k3y==", "PG": "pw"})
    assert config.uses_azure and not config.uses_s3
    assert "k3y==" not in repr(config)
    py = config.pyiceberg_properties()
    assert py["py-io-impl"] == PY_AZURE_FILE_IO
    assert py["adls.account-key"] == "k3y=="
    assert py["warehouse"] == WAREHOUSE
    spark = spark_options(config)
    assert spark["io-impl"] == ADLS_FILE_IO
    assert spark["warehouse"] == WAREHOUSE
    assert spark["adls.auth.shared-key.account.name"] == "acct"
    assert spark["adls.auth.shared-key.account.key"] == "k3y=="
    assert spark[f"adls.connection-string.{HOST}"] == "http://127.0.0.1:10000/acct"
    assert "client.region" not in spark and "s3.path-style-access" not in spark
    # Spark shows option values in its UI, logs and plans unless their names match the redaction pattern.
    assert {k for k, v in spark.items() if "k3y==" in v} == {
        "adls.account-key",
        "adls.auth.shared-key.account.key",
    }
    assert all(
        re.search(REDACTION_REGEX, key) for key in ("adls.account-key", "adls.auth.shared-key.account.key")
    )


def test_host_style_authority_and_given_java_names_win() -> None:
    props = {"adls.account-name": "acct", "adls.dfs-storage-authority": "dfs.core.chinacloudapi.cn"}
    assert java_properties(props, WAREHOUSE)[f"adls.connection-string.{HOST}"] == (
        "https://acct.dfs.core.chinacloudapi.cn"
    )
    with pytest.raises(ValidationError, match="io-impl: class-valued properties are refused"):
        table_with(azure_catalog(**{"io-impl": "my.FileIO"}))


def test_default_credential_chain_needs_no_key() -> None:
    catalog = azure_catalog()
    catalog["properties"] = {}
    catalog["secretProperties"] = {"password": {"env": "PG"}}
    config = CatalogConfig.for_table(table_with(catalog).spec, environ={"PG": "pw"})
    assert config.uses_azure
    spark = spark_options(config)
    assert spark["io-impl"] == ADLS_FILE_IO
    assert not [key for key in spark if key.startswith("adls.")]


def test_account_key_in_plain_properties_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"adls\.account-key looks secret"):
        table_with(azure_catalog(**{"adls.account-key": "inline"}))


@pytest.mark.parametrize(
    ("location", "inner"),
    [
        (f"abfss://lake@{HOST}/wh/t/data/a.parquet", "lake/wh/t/data/a.parquet"),
        (f"abfs://lake@{HOST}/wh", "lake/wh"),
        ("wasbs://lake@acct.blob.core.windows.net/wh/m.avro", "lake/wh/m.avro"),
    ],
)
def test_azure_file_io_paths(location: str, inner: str) -> None:
    scheme, netloc, path = AzureFileIO.parse_location(location)
    written_scheme, _, rest = location.partition("://")
    assert (scheme, netloc, path) == (written_scheme, rest.partition("/")[0], inner)
    prefix, listed = split_location(location)
    assert listed == inner
    assert prefix + listed.partition("/")[2] == location


def test_the_documented_example_maps_as_documented() -> None:
    catalogs = (Path(__file__).resolve().parents[2] / "docs" / "catalogs.md").read_text()
    section = catalogs.split("**sql on PostgreSQL, files in Azure storage**", 1)[1]
    block = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", section, re.S)[0])["catalog"]
    config = CatalogConfig.for_table(
        table_with(block).spec,
        environ={"ICEFALL_CATALOG_PASSWORD": "pw", "ICEFALL_CATALOG_ADLS_ACCOUNT_KEY": "k3y"},
    )
    spark = spark_options(config)
    assert (spark["io-impl"], spark["adls.auth.shared-key.account.key"]) == (ADLS_FILE_IO, "k3y")
    assert not [key for key in spark if key.startswith("adls.connection-string.")]  # Azure's own endpoint
    assert config.pyiceberg_properties()["py-io-impl"] == PY_AZURE_FILE_IO


def test_other_locations_parse_as_pyiceberg_does() -> None:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    for location in ("s3://bucket/a/b.parquet", "file:///tmp/x", "/tmp/y", "gs://b/k"):
        assert AzureFileIO.parse_location(location) == PyArrowFileIO.parse_location(location)


def test_an_unreachable_store_is_an_object_store_outage_named_by_its_endpoint() -> None:
    from icefall.ingest.outages import classify, service_addresses
    from icefall.plan.outages import Service

    error = OSError(  # pyarrow's words with Azurite stopped (tests/integration/test_outages.py)
        "GetProperties failed for 'http://127.0.0.1:39911/devstoreaccount1/lake/x.metadata.json'. Cannot "
        "initialise an ObjectInputFile without knowing the file size. Azure Error: [] Fail to get a new "
        "connection for: http://127.0.0.1:39911. Could not connect to server"
    )
    found = classify(error)
    assert found is not None and found.service is Service.OBJECT_STORE
    st = table_with(azure_catalog(**{"adls.dfs-storage-authority": "127.0.0.1:39911"}))
    config = CatalogConfig.for_table(st.spec, environ={"ADLS_KEY": "k3y==", "PG": "pw"})
    assert service_addresses("kafka:9092", "orders", config)[Service.OBJECT_STORE] == "127.0.0.1:39911"
