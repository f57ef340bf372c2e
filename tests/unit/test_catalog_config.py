"""The one catalog adapter (`icefall.catalog.CatalogConfig`): `spec.table.catalog` to pyiceberg properties and
Spark conf, for each catalog type, with secrets from the environment. No server is contacted.

Proves:
- the embedded default is the SQLite catalog and local warehouse it always was, byte for byte, with
  fsspec's FileIO for pyiceberg: a table is created, committed and reloaded without importing pyarrow;
- sql on SQLite and on PostgreSQL, and rest with S3 storage, map to the pyiceberg and Spark settings of
  the same catalog (JdbcCatalog / RestCatalog, user and password, prefix, OAuth2 credential, token,
  headers, S3FileIO, endpoint, region, path-style access, `cache-enabled=false`);
- `secretKeyRef` secrets are read from the variables the operator's pods get (the names
  `plan.env.secret_env_vars` gives), `env` secrets from the named variable; a missing or empty one
  raises an error naming the field and the variable, never a value;
- secret values are masked in `repr`, in `mask()`ed text (also URL-quoted), and never in error messages;
- properties that would contradict the spec's own fields, and unsupported databases, are refused naming
  the field; a FileIO the spec names (`io-impl`) is refused, Icefall's choice is fixed;
- the catalog examples of docs/catalogs.md are valid manifests and map as it says, and it names the embedded
  default as it is;
- the operator's client (`make_folders=False`) never creates a missing SQLite folder;
- SigV4 signing settings pass through to both clients, and a catalog with no key properties gets none
  (workload identity: the SDKs' default chains).
Not proved here: that the clients connect (the integration tests run real catalogs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

import icefall
from icefall.api import StreamingTable
from icefall.catalog import CatalogConfig, CatalogConfigError, MissingCredentialError
from icefall.catalog.config import JDBC_CATALOG, PY_LOCAL_FILE_IO, S3_FILE_IO, SPARK_CATALOG
from icefall.plan.env import secret_env_vars

pytestmark = pytest.mark.unit


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


def secret(key: str, name: str = "catalog-creds") -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key}}


def spark_options(config: CatalogConfig) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{config.name}"
    conf = config.spark_conf()
    assert conf[prefix] == SPARK_CATALOG
    return {key.removeprefix(prefix + "."): value for key, value in conf.items() if key != prefix}


def test_the_embedded_default_is_sqlite_and_a_local_warehouse(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path / "state")
    assert config.name == "icefall"
    assert config.database == tmp_path / "state" / "catalog.db"
    assert config.pyiceberg_properties() == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/state/catalog.db",
        "warehouse": f"file://{tmp_path}/state/warehouse",
        "py-io-impl": PY_LOCAL_FILE_IO,
    }
    assert spark_options(config) == {
        "catalog-impl": JDBC_CATALOG,
        "uri": f"jdbc:sqlite:{tmp_path}/state/catalog.db",
        "warehouse": f"file://{tmp_path}/state/warehouse",
        "cache-enabled": "false",
        "jdbc.busy_timeout": "30000",
    }
    st = table_with({"name": "x", "uri": "sqlite:////x.db", "warehouse": "/w"})
    no_catalog = st.spec.model_copy(update={"table": st.spec.table.model_copy(update={"catalog": None})})
    assert CatalogConfig.for_table(no_catalog, state_dir=tmp_path / "state") == config
    with pytest.raises(CatalogConfigError, match=r"spec\.table\.catalog is not set"):
        CatalogConfig.for_table(no_catalog)


def test_sql_on_sqlite_resolves_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    st = table_with({"name": "lake", "uri": "sqlite:///rel/catalog.db", "warehouse": "wh"})
    config = CatalogConfig.for_table(st.spec, environ={})
    assert config.pyiceberg_properties() == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/rel/catalog.db",
        "warehouse": f"file://{tmp_path}/wh",
        "py-io-impl": PY_LOCAL_FILE_IO,
    }
    assert spark_options(config)["uri"] == f"jdbc:sqlite:{tmp_path}/rel/catalog.db"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # resolved once: a later change of folder changes nothing
    assert config.database == tmp_path / "rel" / "catalog.db"
    absolute = table_with({"name": "lake", "uri": "jdbc:sqlite:/data/c.db", "warehouse": "file:///data/w"})
    config = CatalogConfig.for_table(absolute.spec, environ={})
    assert config.database == Path("/data/c.db")
    assert config.pyiceberg_properties()["warehouse"] == "file:///data/w"


def test_sql_on_postgresql_with_the_password_by_reference() -> None:
    st = table_with(
        {
            "name": "lake",
            "uri": "postgresql://icefall@db.example:5432/iceberg?sslmode=require",
            "warehouse": "s3://lake/warehouse",
            "properties": {"s3.endpoint": "http://minio:9000", "s3.region": "eu-west-1"},
            "secretProperties": {
                "password": secret("password"),
                "s3.access-key-id": secret("access-key"),
                "s3.secret-access-key": secret("secret-key"),
            },
        }
    )
    environ = {
        "ICEFALL_CATALOG_PASSWORD": "p@ss:w/rd",
        "ICEFALL_CATALOG_S3_ACCESS_KEY_ID": "AKID",
        "ICEFALL_CATALOG_S3_SECRET_ACCESS_KEY": "s3cr3t",
    }
    config = CatalogConfig.for_table(st.spec, environ=environ)
    assert config.pyiceberg_properties() == {
        "type": "sql",
        "uri": "postgresql+psycopg2://icefall:p%40ss%3Aw%2Frd@db.example:5432/iceberg?sslmode=require",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://minio:9000",
        "s3.region": "eu-west-1",
        "s3.access-key-id": "AKID",
        "s3.secret-access-key": "s3cr3t",
    }
    assert spark_options(config) == {
        "catalog-impl": JDBC_CATALOG,
        "uri": "jdbc:postgresql://db.example:5432/iceberg?sslmode=require",
        "jdbc.user": "icefall",
        "jdbc.password": "p@ss:w/rd",
        "warehouse": "s3://lake/warehouse",
        "io-impl": S3_FILE_IO,
        "s3.endpoint": "http://minio:9000",
        "s3.region": "eu-west-1",
        "client.region": "eu-west-1",
        "s3.path-style-access": "true",
        "s3.access-key-id": "AKID",
        "s3.secret-access-key": "s3cr3t",
        "cache-enabled": "false",
    }


@pytest.mark.parametrize(
    ("uri", "user_property", "pyiceberg_uri", "jdbc_uri"),
    [
        ("postgres://db/iceberg", {"user": "u"}, "postgresql+psycopg2://u:pw@db/iceberg", "jdbc:postgresql://db/iceberg"),
        ("jdbc:postgresql://db:5433/iceberg", {"jdbc.user": "u"}, "postgresql+psycopg2://u:pw@db:5433/iceberg",
         "jdbc:postgresql://db:5433/iceberg"),
        ("postgresql+psycopg://u@db/iceberg", {}, "postgresql+psycopg://u:pw@db/iceberg", "jdbc:postgresql://db/iceberg"),
    ],
)  # fmt: skip
def test_postgresql_uri_spellings(
    uri: str, user_property: dict[str, str], pyiceberg_uri: str, jdbc_uri: str
) -> None:
    st = table_with(
        {
            "name": "lake",
            "uri": uri,
            "warehouse": "/w",
            "properties": user_property,
            "secretProperties": {"password": {"env": "PGPASSWORD"}},
        }
    )
    config = CatalogConfig.for_table(st.spec, environ={"PGPASSWORD": "pw"})
    props = config.pyiceberg_properties()
    assert props["uri"] == pyiceberg_uri
    assert "user" not in props and "jdbc.user" not in props and "password" not in props
    options = spark_options(config)
    assert (options["uri"], options["jdbc.user"], options["jdbc.password"]) == (jdbc_uri, "u", "pw")
    assert "user" not in options and "password" not in options


def test_rest_with_oauth2_headers_and_s3() -> None:
    st = table_with(
        {
            "name": "lake",
            "type": "rest",
            "uri": "https://catalog.example:8181/api/catalog",
            "warehouse": "s3a://lake/warehouse",
            "properties": {
                "prefix": "tenant-a",
                "scope": "PRINCIPAL_ROLE:ALL",
                "oauth2-server-uri": "https://auth.example/token",
                "header.X-Iceberg-Access-Delegation": "vended-credentials",
                "s3.endpoint": "http://minio:9000",
                "s3.path-style-access": "false",
            },
            "secretProperties": {
                "credential": {"env": "LAKE_CREDENTIAL"},
                "token": secret("token"),
            },
        }
    )
    config = CatalogConfig.for_table(
        st.spec, environ={"LAKE_CREDENTIAL": "client:secret", "ICEFALL_CATALOG_TOKEN": "t0ken"}
    )
    shared = {
        "uri": "https://catalog.example:8181/api/catalog",
        "warehouse": "s3a://lake/warehouse",
        "prefix": "tenant-a",
        "scope": "PRINCIPAL_ROLE:ALL",
        "oauth2-server-uri": "https://auth.example/token",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "s3.endpoint": "http://minio:9000",
        "s3.path-style-access": "false",
        "credential": "client:secret",
        "token": "t0ken",
    }
    assert config.pyiceberg_properties() == {
        "type": "rest",
        **shared,
        "s3.region": "us-east-1",
        "s3.force-virtual-addressing": "true",
    }
    assert spark_options(config) == {
        "type": "rest",
        **shared,
        "io-impl": S3_FILE_IO,
        "client.region": "us-east-1",
        "cache-enabled": "false",
    }


def test_rest_without_object_storage_settings_gets_no_file_io() -> None:
    st = table_with({"name": "lake", "type": "rest", "uri": "http://catalog:8181", "warehouse": "analytics"})
    config = CatalogConfig.for_table(st.spec, environ={})
    assert config.pyiceberg_properties() == {
        "type": "rest",
        "uri": "http://catalog:8181",
        "warehouse": "analytics",
    }
    assert spark_options(config) == {
        "type": "rest",
        "uri": "http://catalog:8181",
        "warehouse": "analytics",
        "cache-enabled": "false",
    }
    with pytest.raises(ValidationError, match=r"properties\.io-impl: class-valued properties are refused"):
        table_with(
            {
                "name": "lake",
                "uri": "sqlite:////c.db",
                "warehouse": "s3://b/w",
                "properties": {"io-impl": "my.I"},
            }
        )


def test_secret_key_refs_are_read_from_the_pods_variable_names() -> None:
    # "a.b" and "a-b" both slug to A_B: the pods get hashed names, and the adapter reads the same ones.
    st = table_with(
        {
            "name": "lake",
            "type": "rest",
            "uri": "http://catalog:8181",
            "secretProperties": {"header.a.b": secret("one"), "header.a-b": secret("two")},
        }
    )
    names = {env.path: env.name for env in secret_env_vars(st.spec)[1]}
    path = "spec.table.catalog.secretProperties[{}]"
    one, two = names[path.format("header.a.b")], names[path.format("header.a-b")]
    assert one != two and one.startswith("ICEFALL_CATALOG_HEADER_A_B_")
    config = CatalogConfig.for_table(st.spec, environ={one: "first", two: "second"})
    assert dict(config.secrets) == {"header.a.b": "first", "header.a-b": "second"}


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_secret_names_the_field_and_the_variable(value: str | None) -> None:
    st = table_with(
        {
            "name": "lake",
            "uri": "postgresql://icefall@db/iceberg",
            "warehouse": "s3://lake/w",
            "secretProperties": {"password": secret("pg-password", name="pg")},
        }
    )
    environ = {} if value is None else {"ICEFALL_CATALOG_PASSWORD": value}
    with pytest.raises(MissingCredentialError) as raised:
        CatalogConfig.for_table(st.spec, environ=environ)
    message = str(raised.value)
    assert message.startswith("spec.table.catalog.secretProperties[password]: environment variable ")
    assert "ICEFALL_CATALOG_PASSWORD" in message
    assert ("is not set" if value is None else "is empty") in message
    assert "'pg-password' of Secret 'pg'" in message
    token = {"token": {"env": "MY_TOKEN"}}
    env_ref = table_with({"name": "lake", "type": "rest", "uri": "http://c:8181", "secretProperties": token})
    with pytest.raises(MissingCredentialError, match=r"\[token\]: environment variable MY_TOKEN is not set"):
        CatalogConfig.for_table(env_ref.spec, environ={"ICEFALL_CATALOG_TOKEN": "not this one"})


def test_secret_values_are_masked() -> None:
    st = table_with(
        {
            "name": "lake",
            "uri": "postgresql://icefall@db/iceberg",
            "warehouse": "s3://lake/w",
            "secretProperties": {"password": secret("password"), "s3.secret-access-key": secret("key")},
        }
    )
    environ = {
        "ICEFALL_CATALOG_PASSWORD": "hunter 2/x",
        "ICEFALL_CATALOG_S3_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
    }
    config = CatalogConfig.for_table(st.spec, environ=environ)
    shown = repr(config) + str(config)
    assert "hunter" not in shown and "wJalrXUtnFEMI" not in shown
    assert "'password': '***'" in shown
    url = config.pyiceberg_properties()["uri"]
    assert "hunter%202%2Fx" in url  # the client needs it...
    leaked = f"could not connect to {url} with key wJalrXUtnFEMI (password hunter 2/x)"
    masked = config.mask(leaked)
    assert "hunter" not in masked and "wJalrXUtnFEMI" not in masked  # ...a message never shows it
    url_masked = "postgresql+psycopg2://icefall:***@db/iceberg"
    assert masked == f"could not connect to {url_masked} with key *** (password ***)"
    assert (
        config.key()
        != CatalogConfig.for_table(st.spec, environ={**environ, "ICEFALL_CATALOG_PASSWORD": "other"}).key()
    )


@pytest.mark.parametrize(
    ("catalog", "field"),
    [
        ({"properties": {"cache-enabled": "true"}}, "spec.table.catalog.properties[cache-enabled]"),
        ({"uri": "mysql://db/iceberg"}, "spec.table.catalog.uri"),
        ({"uri": "sqlite://"}, "spec.table.catalog.uri"),
    ],
)
def test_contradicting_or_unsupported_settings_name_the_field(catalog: dict[str, Any], field: str) -> None:
    st = table_with({"name": "lake", "uri": "sqlite:////c.db", "warehouse": "/w", **catalog})
    with pytest.raises(CatalogConfigError) as raised:
        CatalogConfig.for_table(st.spec, environ={})
    assert str(raised.value).startswith(field), raised.value


def test_the_documented_examples_map_as_documented() -> None:
    catalogs = (Path(__file__).resolve().parents[2] / "docs" / "catalogs.md").read_text()
    section = catalogs.split("\n## ", 1)[0]  # the catalogs, before "Cloud identities"
    blocks = [yaml.safe_load(b)["catalog"] for b in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    assert [(b["type"], b["uri"].split(":", 1)[0]) for b in blocks] == [
        ("sql", "sqlite"),
        ("sql", "postgresql"),
        ("rest", "https"),
        ("sql", "postgresql"),  # files in Azure storage (tests/unit/test_catalog_azure.py)
    ]
    options = []
    for block in blocks:
        spec = table_with(block).spec
        environ = {env.name: f"value-of-{env.key}" for env in secret_env_vars(spec)[1]}
        options.append(spark_options(CatalogConfig.for_table(spec, environ=environ)))
    sqlite, postgres, rest, _ = options
    assert sqlite["uri"] == "jdbc:sqlite:/var/lib/icefall/catalog.db"
    assert sqlite["warehouse"] == "file:///var/lib/icefall/warehouse"
    assert (postgres["uri"], postgres["jdbc.user"], postgres["jdbc.password"]) == (
        "jdbc:postgresql://postgres.data:5432/iceberg?sslmode=require",
        "icefall",
        "value-of-password",
    )
    assert (rest["type"], rest["credential"], rest["io-impl"]) == ("rest", "value-of-credential", S3_FILE_IO)
    assert postgres["io-impl"] == S3_FILE_IO
    assert postgres["client.region"] == rest["client.region"] == "eu-west-1"


def test_the_docs_say_what_the_embedded_default_is(tmp_path: Path) -> None:
    catalogs = (Path(__file__).resolve().parents[2] / "docs" / "catalogs.md").read_text()
    said = " ".join(catalogs.split("**sql on SQLite**", 1)[1].split("```", 1)[0].split())
    assert (
        "named `icefall`, in the state folder (`<state>/catalog.db`, files under `<state>/warehouse`)" in said
    )
    embedded = CatalogConfig.embedded(tmp_path)
    assert (embedded.name, embedded.type.value, embedded.database, embedded.warehouse) == (
        "icefall",
        "sql",
        tmp_path.resolve() / "catalog.db",
        (tmp_path.resolve() / "warehouse").as_uri(),
    )


def test_the_operator_never_creates_a_missing_sqlite_folder(tmp_path: Path) -> None:
    config = CatalogConfig.sqlite(tmp_path / "gone" / "catalog.db", tmp_path / "gone" / "warehouse")
    with pytest.raises(Exception, match="unable to open database file"):
        config.pyiceberg(make_folders=False)
    assert not (tmp_path / "gone").exists()


def test_sigv4_and_workload_identity_need_no_secret_properties() -> None:
    """A REST catalog behind AWS SigV4 (Glue, S3 Tables) and files in S3 with no keys at all: the signing
    settings reach both clients as they are, and no s3 key is invented (the SDKs' default chain applies)."""
    sigv4 = {"rest.sigv4-enabled": "true", "rest.signing-region": "eu-west-1", "rest.signing-name": "glue"}
    st = table_with(
        {
            "name": "lake",
            "type": "rest",
            "uri": "https://glue.eu-west-1.amazonaws.com/iceberg",
            "warehouse": "123456789012",
            "properties": {**sigv4, "s3.region": "eu-west-1"},
        }
    )
    config = CatalogConfig.for_table(st.spec, environ={})
    py, spark = config.pyiceberg_properties(), config.spark_conf()
    for key, value in sigv4.items():
        assert py[key] == value
        assert spark[f"spark.sql.catalog.lake.{key}"] == value
    assert not any("access-key" in key or "secret" in key for key in [*py, *spark])
    assert spark["spark.sql.catalog.lake.io-impl"] == S3_FILE_IO


def test_a_local_warehouse_commits_without_pyarrow(tmp_path: Path) -> None:
    """pyiceberg on the embedded catalog creates, commits and reloads a table with fsspec's FileIO, and
    never imports pyarrow's FileIO (its datasets, Parquet and compute: ~85 MiB of `icefall run`'s RSS)."""
    script = f"""
import sys
from pathlib import Path
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from icefall.catalog import CatalogConfig
catalog = CatalogConfig.embedded(Path({str(tmp_path)!r})).pyiceberg()
catalog.create_namespace("db")
table = catalog.create_table("db.t", Schema(NestedField(1, "a", LongType(), required=False)))
with table.transaction() as tx:
    tx.set_properties({{"icefall.offsets": "{{}}"}})
table = catalog.load_table("db.t")
assert table.properties["icefall.offsets"] == "{{}}", table.properties
print(type(table.io).__name__, "pyiceberg.io.pyarrow" in sys.modules, "pyarrow" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(icefall.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["FsspecFileIO", "False", "False"]
