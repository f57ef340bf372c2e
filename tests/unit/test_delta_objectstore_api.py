"""Delta tables on GCS and Azure, what is decided without a store: which `spec.table.location`s the API takes
and what it says of a malformed one (the form to write, per scheme); keyed tables there are refused; two
spellings of one Azure folder are one table; each location gets its store and the cloud SDK's environment
names reach Icefall's clients and delta-rs alike (an emulator's endpoint, a key), secrets kept out of `repr`.
The stores themselves are proven on their emulators (tests/integration/test_delta_objectstores.py).
"""

from __future__ import annotations

import pytest

from icefall.commit.delta_cloud import AzureSettings, AzureStorage, GcsSettings, GcsStorage, azure_parts
from icefall.commit.delta_storage import LocalStorage, S3Storage, is_object_store, storage_for, store_name
from icefall.plan.names import TableIdentity

from .test_delta_commit import problems_of as delta_problems_of

pytestmark = pytest.mark.unit

AZURE = "abfss://lake@shop.dfs.core.windows.net/tables/orders"


def problems_of(location: str, spec_extra: str = "") -> str:
    return delta_problems_of(f', location: "{location}"', spec_extra)


@pytest.mark.parametrize(
    "location",
    [
        "gs://lake/tables/orders",
        "gs://my_lake.eu-1/orders",
        AZURE,
        "abfs://lake@shop.dfs.core.windows.net/orders",
        "abfss://lake-1@devstoreaccount1.dfs.core.windows.net/a/b",
        "abfss://lake@shop.dfs.core.chinacloudapi.cn/orders",
    ],
)
def test_a_delta_table_may_live_on_gcs_or_azure(location: str) -> None:
    assert problems_of(location) == ""
    assert is_object_store(location)


@pytest.mark.parametrize(
    ("location", "says"),
    [
        ("gs://lake", "a GCS location is gs://<bucket>/<folder>"),  # the bucket itself
        ("gs://Lake/orders", "a GCS location is gs://<bucket>/<folder>"),
        ("gs://lake//orders", "a GCS location is gs://<bucket>/<folder>"),
        ("abfss://shop.dfs.core.windows.net/orders", "an Azure location is abfss://<container>@<account>"),
        ("abfss://lake@shop.dfs.core.windows.net", "an Azure location is abfss://<container>@<account>"),
        ("abfss://la--ke@shop.dfs.core.windows.net/o", "a container of 3-63 lowercase letters"),
        ("abfss://lake@Shop_1.dfs.core.windows.net/o", "an account of 3-24 lowercase letters and digits"),
        ("wasbs://lake@shop.blob.core.windows.net/o", "write an Azure location as abfss://"),
        ("az://lake/orders", "gs://<bucket>/<folder> or abfss://<container>@<account>.dfs.core.windows.net"),
    ],
)
def test_a_malformed_object_store_location_is_refused_with_the_form_to_write(
    location: str, says: str
) -> None:
    problems = problems_of(location)
    assert "spec.table.location" in problems and says in problems, problems


def test_keyed_delta_tables_on_gcs_or_azure_are_refused() -> None:
    keyed = "  mode: upsert\n  key: [id]"
    for location in ("gs://lake/orders", AZURE):
        assert "keyed (upsert/cdc) Delta tables on GCS or Azure are not supported yet" in problems_of(
            location, keyed
        )


def test_one_azure_folder_is_one_table_however_spelled() -> None:
    one = TableIdentity.of_delta_folder(AZURE)
    assert TableIdentity.of_delta_folder(AZURE.replace("abfss://", "abfs://") + "/") == one
    assert TableIdentity.of_delta_folder("gs://lake/tables/orders").key != one.key


def test_each_location_gets_its_store() -> None:
    assert isinstance(storage_for("gs://lake/t"), GcsStorage)
    assert isinstance(storage_for(AZURE), AzureStorage)
    assert isinstance(storage_for("s3://lake/t"), S3Storage)
    assert isinstance(storage_for("/data/t"), LocalStorage)
    assert [store_name(x) for x in ("gs://a/b", AZURE, "s3a://a/b", "/a")] == [
        "GCS",
        "Azure",
        "S3",
        "local disk",
    ]
    assert azure_parts(AZURE) == ("lake", "shop", "dfs.core.windows.net", "tables/orders")
    storage = storage_for(AZURE)
    assert (storage.bucket, storage.prefix) == ("lake", "tables/orders")  # type: ignore[attr-defined]


def test_gcs_settings_come_from_googles_emulator_variable() -> None:
    assert GcsSettings.from_env({}) == GcsSettings(emulator=None)
    assert GcsSettings.from_env({}).delta_rs_options() == {}
    emulator = GcsSettings.from_env({"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"})
    assert emulator.emulator == "http://127.0.0.1:4443"
    assert emulator.delta_rs_options() == {
        "google_base_url": "http://127.0.0.1:4443",
        "google_skip_signature": "true",
        "allow_http": "true",
    }


def test_azure_settings_come_from_delta_rs_names_and_hide_the_key() -> None:
    plain = AzureSettings.from_env(AZURE, {})
    assert plain.endpoint == "https://shop.blob.core.windows.net" and plain.key is None
    china = AzureSettings.from_env("abfss://lake@shop.dfs.core.chinacloudapi.cn/o", {})
    assert china.endpoint == "https://shop.blob.core.chinacloudapi.cn"
    env = {
        "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/shop/",
        "AZURE_STORAGE_ACCOUNT_KEY": "c2VjcmV0",
        "AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=x",
    }
    emulator = AzureSettings.from_env(AZURE, env)
    assert (emulator.endpoint, emulator.key, emulator.sas_token) == (
        "http://127.0.0.1:10000/shop",
        "c2VjcmV0",
        "sv=1&sig=x",
    )
    assert "c2VjcmV0" not in repr(emulator) and "sig=x" not in repr(emulator)
    assert emulator.delta_rs_options() == {
        "azure_storage_account_name": "shop",
        "azure_storage_endpoint": "http://127.0.0.1:10000/shop",
        "azure_storage_account_key": "c2VjcmV0",
        "azure_storage_sas_token": "sv=1&sig=x",
        "allow_http": "true",
    }


def test_an_azure_table_without_a_credential_is_refused_at_its_first_commit_naming_the_fix() -> None:
    storage = AzureStorage(AZURE, AzureSettings.from_env(AZURE, {}))
    with pytest.raises(OSError, match="AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN"):
        storage.put_if_absent("_delta_log/00000000000000000000.json", b"{}")
