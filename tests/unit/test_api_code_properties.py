"""A StreamingTable cannot name code for Icefall to load (`icefall.api.code_properties`).

Proves, through the validation the operator and `icefall run` share (`streaming_table_from_object`):
- every class- or module-valued catalog property of pyiceberg, Iceberg Java, the JDBC drivers and Hadoop
  (`py-io-impl`, `io-impl`, `*-impl`, `*.class`, `client.factory`, credential providers, `hadoop.*`,
  pgjdbc's socket factory and callbacks, `rest.auth.type` naming a class, ...) is refused in `properties`
  and in `secretProperties`, each with its field and the reason; Iceberg's location-provider classes are
  refused in the table properties;
- properties that only look alike are accepted (`rest.auth.type: oauth2`, `s3.write.storage-class`,
  `header.*`, docs/catalogs.md's S3 and SigV4 settings);
- `spec.source.properties` is an allow-list: tuning settings pass, settings that load code (config
  providers, `*.class`, `partition.assignment.strategy`, ...) are refused as such, anything else as not on
  the allow-list; Icefall's own and security settings keep their own messages;
- a `CatalogConfig` built without the models refuses the same keys.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.api import CatalogType, ManifestError, streaming_table_from_object
from icefall.api.code_properties import ALLOWED_CONSUMER_PROPERTIES
from icefall.catalog import CatalogConfig, CatalogConfigError

pytestmark = pytest.mark.unit

REASON = "class-valued properties are refused: Icefall never loads code a table names"


def manifest(
    catalog: dict[str, Any] | None = None,
    table_properties: dict[str, str] | None = None,
    consumer: dict[str, str] | None = None,
) -> dict[str, Any]:
    table: dict[str, Any] = {"namespace": "shop", "properties": table_properties or {}}
    if catalog is not None:
        table["catalog"] = {"name": "lake", "type": "rest", "uri": "https://catalog:8181", **catalog}
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "orders"},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders", "properties": consumer or {}},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": table,
        },
    }


def problems(obj: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as raised:
        streaming_table_from_object(obj)
    return [str(p) for p in raised.value.problems]


CODE_KEYS = [
    "py-io-impl",
    "io-impl",
    "catalog-impl",
    "py-catalog-impl",
    "lock-impl",
    "metrics-reporter-impl",
    "encryption.kms-impl",
    "encryption.table-metadata.manager-impl",
    "client.factory",
    "client.factory-impl",
    "client.credentials-provider",
    "client.credentials-provider.role-arn",
    "s3.client-factory-impl",
    "s3.retry-strategy-impl",
    "adls.token-credential-provider",
    "rest.client.tls.configurer-impl",
    "auth.impl",
    "my.provider.class",
    "jdbc.socketFactory",
    "jdbc.sslfactory",
    "jdbc.sslhostnameverifier",
    "jdbc.sslpasswordcallback",
    "jdbc.authenticationPluginClassName",
    "jdbc.loggerFile",
    "jdbc.enable_load_extension",
    "jdbc.queryInterceptors",
    "jdbc.autoDeserialize",
]


@pytest.mark.parametrize("key", CODE_KEYS)
def test_a_class_valued_catalog_property_is_refused_with_field_and_reason(key: str) -> None:
    found = problems(manifest({"properties": {key: "com.example.Evil"}}))
    field = (
        f"spec.table.catalog.properties.{key}"
        if "." not in key
        else f"spec.table.catalog.properties['{key}']"
    )
    assert [p for p in found if p.startswith(f"{field}: {REASON}")], found


@pytest.mark.parametrize("key", ["py-io-impl", "client.credentials-provider", "jdbc.sslpasswordcallback"])
def test_a_class_valued_secret_property_is_refused_too(key: str) -> None:
    found = problems(manifest({"secretProperties": {key: {"env": "X"}}}))
    assert [p for p in found if "secretProperties" in p and key in p and REASON in p], found


@pytest.mark.parametrize("key", ["hadoop.fs.s3a.impl", "hadoop.security.group.mapping"])
def test_hadoop_configuration_is_refused(key: str) -> None:
    found = problems(manifest({"properties": {key: "org.example.Mapping"}}))
    assert [p for p in found if key in p and "Hadoop configuration is refused" in p], found


def test_rest_auth_type_may_name_a_scheme_not_a_class() -> None:
    streaming_table_from_object(manifest({"properties": {"rest.auth.type": "oauth2"}}))
    found = problems(manifest({"properties": {"rest.auth.type": "com.example.StealTokens"}}))
    assert [p for p in found if "rest.auth.type" in p and "names an authentication class" in p], found
    found = problems(manifest({"secretProperties": {"rest.auth.type": {"env": "AUTH"}}}))
    assert [p for p in found if "rest.auth.type" in p and REASON in p], found


def test_look_alikes_are_accepted() -> None:
    props = {
        "s3.write.storage-class": "STANDARD_IA",
        "header.X-Class-Of-Service": "gold",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "s3.endpoint": "http://minio:9000",
        "rest.sigv4-enabled": "true",
        "rest.signing-region": "eu-west-1",
        "scope": "PRINCIPAL_ROLE:ALL",
    }
    st = streaming_table_from_object(manifest({"properties": props}))
    assert st.spec.table.catalog is not None and dict(st.spec.table.catalog.properties) == props


@pytest.mark.parametrize("key", ["write.location-provider.impl", "write.py-location-provider.impl"])
def test_a_location_provider_class_is_refused_in_the_table_properties(key: str) -> None:
    found = problems(manifest(table_properties={key: "com.example.Where"}))
    assert found == [f"spec.table.properties['{key}']: {REASON} (see docs/security.md); remove it"]
    streaming_table_from_object(manifest(table_properties={"write.target-file-size-bytes": "134217728"}))


def test_the_allowed_consumer_properties_pass() -> None:
    allowed = {key: "1" for key in sorted(ALLOWED_CONSUMER_PROPERTIES)}
    st = streaming_table_from_object(manifest(consumer=allowed))
    assert dict(st.spec.source.properties) == allowed


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("config.providers", "config.providers names classes or configuration providers to load"),
        ("config.providers.file.class", "names classes or configuration providers to load"),
        ("partition.assignment.strategy", "names classes or configuration providers to load"),
        ("metric.reporters", "names classes or configuration providers to load"),
        ("security.providers", "names classes or configuration providers to load"),
        ("auto.commit.interval.ms", "auto.commit.interval.ms is not on the allow-list of Kafka consumer"),
        ("allow.auto.create.topics", "is not on the allow-list"),
        ("sasl.login.callback.handler.class", "spec.source.security"),
        ("key.deserializer", "is set by Icefall"),
        ("interceptor.classes", "is set by Icefall"),
        ("ssl.engine.factory.class", "spec.source.security"),
    ],
)
def test_a_consumer_property_off_the_allow_list_is_refused(key: str, message: str) -> None:
    found = problems(manifest(consumer={key: "x"}))
    assert [p for p in found if p.startswith(f"spec.source.properties['{key}']:") and message in p], found


def test_a_catalog_config_built_without_the_models_refuses_them_too() -> None:
    code = {"py-io-impl": "a.B"}
    with pytest.raises(CatalogConfigError, match=r"catalog\.properties\[py-io-impl\]: class-valued"):
        CatalogConfig(name="lake", type=CatalogType.REST, uri="http://catalog:8181", properties=code)
    with pytest.raises(CatalogConfigError, match=r"catalog\.secretProperties\[py-io-impl\]: class-valued"):
        CatalogConfig(name="lake", type=CatalogType.REST, uri="http://catalog:8181", secrets=code)
    with pytest.raises(CatalogConfigError, match=r"\[catalog-impl\]: set spec\.table\.catalog\.type"):
        CatalogConfig(
            name="lake", type=CatalogType.REST, uri="http://c:8181", properties={"catalog-impl": "a"}
        )
