"""Tables in Google Cloud Storage (`gs://`) through the one catalog adapter (`icefall.catalog.CatalogConfig`).

Proves, without contacting any server:
- a gs:// warehouse gives Spark GCSFileIO and no S3 settings (no region, no path-style access), and gives
  pyiceberg the warehouse as written; with no credentials at all (GKE's Workload Identity: Google's default
  credential chain) neither side gets a token;
- an emulator's properties (`gcs.service.host`, `gcs.project-id`, `gcs.no-auth`) pass through to both
  sides, and pyiceberg, whose pyarrow GcsFileSystem has no anonymous switch, gets a placeholder token with
  an expiry instead; Spark does not;
- a token given by reference (`gcs.oauth2.token`) reaches both sides, replaces the placeholder, and is
  masked in `repr`; an `io-impl` or `py-io-impl` the spec sets is refused (Icefall's FileIO is fixed);
- pyiceberg opens GCS through `GcsFileIO`, whose GcsFileSystem keeps
  pyiceberg's settings and retries for `RETRY_SECONDS`, not 15 minutes (this fails when pyiceberg's private
  `_initialize_gcs_fs` or pyarrow's reported options move);
- the outage line names the emulator's endpoint as the object store's address, and pyarrow's GCS error for
  an unreachable store (its text as seen with fake-gcs-server stopped) is an object store outage.
Not proved here: that the clients reach a server (tests/integration's postgres-gcs catalog does, on
fake-gcs-server).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig
from icefall.catalog.azure import ADLS_FILE_IO, PY_AZURE_FILE_IO
from icefall.catalog.config import (
    GCS_FILE_IO,
    GCS_NO_AUTH_TOKEN,
    PY_GCS_FILE_IO,
    PY_LOCAL_FILE_IO,
    S3_FILE_IO,
    SPARK_CATALOG,
)
from icefall.catalog.gcs_io import RETRY_SECONDS, GcsFileIO
from icefall.ingest.outages import classify, service_addresses
from icefall.plan.outages import Service

pytestmark = pytest.mark.unit

EMULATOR = {"gcs.service.host": "http://127.0.0.1:4443", "gcs.project-id": "test", "gcs.no-auth": "true"}


def config_for(catalog: dict[str, Any], environ: dict[str, str] | None = None) -> CatalogConfig:
    st = StreamingTable.model_validate(
        {
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop", "catalog": catalog},
            },
        }
    )
    return CatalogConfig.for_table(st.spec, environ=environ or {"PGPASSWORD": "pw"})


def lake(**extra: Any) -> dict[str, Any]:
    return {
        "name": "lake",
        "uri": "postgresql://icefall@db:5432/iceberg",
        "warehouse": "gs://lake/warehouse",
        "secretProperties": {"password": {"env": "PGPASSWORD"}},
        **extra,
    }


def spark_options(config: CatalogConfig) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{config.name}"
    conf = config.spark_conf()
    assert conf[prefix] == SPARK_CATALOG
    return {key.removeprefix(prefix + "."): value for key, value in conf.items() if key != prefix}


def test_a_gs_warehouse_with_the_default_credential_chain() -> None:
    config = config_for(lake())
    assert config.uses_gcs and not config.uses_s3
    props = config.pyiceberg_properties()
    assert props["warehouse"] == "gs://lake/warehouse"
    assert not [key for key in props if key.startswith(("gcs.", "s3.", "client."))]
    options = spark_options(config)
    assert options["io-impl"] == GCS_FILE_IO and options["warehouse"] == "gs://lake/warehouse"
    assert not [key for key in options if key.startswith(("gcs.", "s3.", "client."))]


def test_an_emulator_without_credentials() -> None:
    config = config_for(lake(properties=EMULATOR))
    props = config.pyiceberg_properties()
    assert {key: props[key] for key in EMULATOR} == EMULATOR
    assert props["gcs.oauth2.token"] == GCS_NO_AUTH_TOKEN
    assert int(props["gcs.oauth2.token-expires-at"]) > 4_000_000_000_000  # far in the future (ms)
    options = spark_options(config)
    assert {key: options[key] for key in EMULATOR} == EMULATOR
    assert "gcs.oauth2.token" not in options and options["io-impl"] == GCS_FILE_IO


def test_gcs_properties_alone_mean_gcs_and_a_file_io_is_never_the_specs() -> None:
    catalog = {"name": "lake", "type": "rest", "uri": "https://catalog.example", "properties": EMULATOR}
    assert spark_options(config_for(catalog))["io-impl"] == GCS_FILE_IO
    custom = {**catalog, "properties": {**EMULATOR, "io-impl": "com.example.MyFileIO"}}
    with pytest.raises(ValidationError, match="io-impl: class-valued properties are refused"):
        config_for(custom)


def test_a_token_by_reference_reaches_both_sides_and_stays_masked() -> None:
    catalog = lake(
        properties=EMULATOR,
        secretProperties={"password": {"env": "PGPASSWORD"}, "gcs.oauth2.token": {"env": "GCS_TOKEN"}},
    )
    config = config_for(catalog, {"PGPASSWORD": "pw", "GCS_TOKEN": "ya29.secret-token"})
    assert config.pyiceberg_properties()["gcs.oauth2.token"] == "ya29.secret-token"
    assert "gcs.oauth2.token-expires-at" not in config.pyiceberg_properties()
    assert spark_options(config)["gcs.oauth2.token"] == "ya29.secret-token"
    assert "ya29.secret-token" not in repr(config)


def test_the_outage_line_names_the_emulator() -> None:
    config = config_for(lake(properties=EMULATOR))
    assert service_addresses("k:9092", "t", config)[Service.OBJECT_STORE] == "http://127.0.0.1:4443"


def test_pyiceberg_opens_gcs_with_bounded_retries() -> None:
    props = config_for(lake(properties=EMULATOR)).pyiceberg_properties()
    assert props["py-io-impl"] == PY_GCS_FILE_IO
    filesystem = GcsFileIO(props).fs_by_scheme("gs", "lake")
    options = filesystem.__reduce__()[1][0]
    assert options["retry_time_limit"] == timedelta(seconds=RETRY_SECONDS)
    assert (options["scheme"], options["endpoint_override"]) == ("http", "127.0.0.1:4443")
    assert options["access_token"] == GCS_NO_AUTH_TOKEN
    with pytest.raises(ValidationError, match="py-io-impl: class-valued properties are refused"):
        config_for(lake(properties={**EMULATOR, "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}))
    assert "py-io-impl" not in config_for({**lake(), "warehouse": "s3://lake/w"}).pyiceberg_properties()


def test_pyarrows_gcs_error_for_an_unreachable_store_is_an_object_store_outage() -> None:
    error = OSError(
        "google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of PerformWork() - "
        "CURL error [7]=Could not connect to server error_info={reason=, domain=, metadata={"
        "gcloud-cpp.retry.function=GetObjectMetadata}})"
    )
    found = classify(error)
    assert found is not None and found.service is Service.OBJECT_STORE


@pytest.mark.parametrize(
    ("warehouse", "java_io", "python_io"),
    [
        ("gs://lake/warehouse", GCS_FILE_IO, PY_GCS_FILE_IO),
        ("s3://lake/warehouse", S3_FILE_IO, None),
        ("abfss://lake@acct.dfs.core.windows.net/warehouse", ADLS_FILE_IO, PY_AZURE_FILE_IO),
        ("/var/lib/icefall/warehouse", None, PY_LOCAL_FILE_IO),
    ],
)
def test_each_store_selects_only_its_own_file_io(
    warehouse: str, java_io: str | None, python_io: str | None
) -> None:
    config = config_for(lake(warehouse=warehouse))
    assert (config.uses_gcs, config.uses_s3, config.uses_azure) == (
        warehouse.startswith("gs:"),
        warehouse.startswith("s3:"),
        warehouse.startswith("abfss:"),
    )
    assert spark_options(config).get("io-impl") == java_io
    assert config.pyiceberg_properties().get("py-io-impl") == python_io
