"""The examples a newcomer copies are valid and mean what their comments say.

Proves: examples/cluster.yaml (a Secret and a StreamingTable in one file) loads as a StreamingTable with
`icefall run -f`'s loader; every secret it references is a key of the Secret in the same file; the pods and
`icefall run` read those secrets from the variables the file's comment names; the catalog maps to a
REST catalog with its files in S3 on both the pyiceberg and the Spark side; examples/cluster-values.yaml
gives the operator no credential (it holds none) and the Secret carries the grant label StreamingTables
need (e2e/test_user_path.py installs the chart with it); and every single-table example (json, Debezium,
Protobuf, JSON Schema) loads. The examples of what users run (PostgreSQL and REST catalogs; S3, GCS and
Azure storage; Kafka SASL over TLS; a dead-letter topic; transforms; retention; keyed Avro; routes with
unrouted records as dead letters) exist, pass `icefall validate` (`--cluster` for those that name a
catalog: tests/unit/test_cli_validate.py), and say what their comments say: each Secret reference names a
key of the granted Secret in the same file, and the catalog maps to the file IO of its warehouse's store on
the Spark side.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from icefall.api import StreamingTableSpec, Unrouted, load_manifest
from icefall.catalog import CatalogConfig
from icefall.catalog.azure import ADLS_FILE_IO
from icefall.catalog.config import GCS_FILE_IO, S3_FILE_IO
from icefall.plan.env import secret_env_vars
from icefall.plan.grants import granted

pytestmark = pytest.mark.unit

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"
VALUES = CLUSTER.with_name("cluster-values.yaml")


def test_the_cluster_example_is_a_rest_catalog_in_s3_with_its_secrets_in_its_secret() -> None:
    text = CLUSTER.read_text()
    st = load_manifest(CLUSTER)
    (secret,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "Secret"]
    _, catalog_env, problems = secret_env_vars(st.spec)
    assert problems == []
    assert {env.secret for env in catalog_env} == {secret["metadata"]["name"]}
    assert {env.key for env in catalog_env} <= set(secret["stringData"])
    for env in catalog_env:
        assert env.name in text, f"the comment should name {env.name}"

    config = CatalogConfig.for_table(st.spec, environ={env.name: "x" for env in catalog_env})
    spark = config.spark_conf()
    assert spark["spark.sql.catalog.lake.type"] == "rest"
    assert spark["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert config.pyiceberg_properties()["type"] == "rest"


def test_the_cluster_values_give_the_operator_no_credential_and_the_secret_is_granted() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert not [env for env in values.get("extraEnv") or [] if "valueFrom" in env]  # the operator holds none
    (secret,) = [d for d in yaml.safe_load_all(CLUSTER.read_text()) if d["kind"] == "Secret"]
    assert granted(secret["metadata"].get("labels"))  # or the table would run no pod (SecretNotAllowed)


def test_every_streaming_table_example_is_valid() -> None:
    examples = sorted(CLUSTER.parent.glob("*.yaml"))
    tables = [
        p
        for p in examples
        if any(d and d.get("kind") == "StreamingTable" for d in yaml.safe_load_all(p.read_text()))
    ]
    for name in ("avro-orders", "protobuf-orders", "jsonschema-orders", "debezium-orders"):
        assert CLUSTER.with_name(f"{name}.yaml") in tables
    for path in tables:
        load_manifest(path)  # raises, naming the field, when an example drifts from the API


#: Example -> (the store its files are in: Spark's file IO, or None without a catalog), for what users run.
USER_EXAMPLES = {
    "catalog-postgres": S3_FILE_IO,
    "catalog-rest": S3_FILE_IO,
    "storage-gcs": GCS_FILE_IO,
    "storage-azure": ADLS_FILE_IO,
    "kafka-sasl-tls": S3_FILE_IO,
    "dead-letter-topic": None,
    "transforms": None,
    "retention": None,
    "keyed-avro": None,
}


@pytest.mark.parametrize("name", sorted(USER_EXAMPLES))
def test_each_user_example_references_only_its_granted_secret_and_maps_its_store(name: str) -> None:
    path = CLUSTER.with_name(f"{name}.yaml")
    st = load_manifest(path)
    kafka_env, catalog_env, problems = secret_env_vars(st.spec)
    assert problems == []
    secrets = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Secret"]
    references = [*kafka_env, *catalog_env]
    if references:
        (secret,) = secrets
        assert granted(secret["metadata"].get("labels"))
        assert {env.secret for env in references} == {secret["metadata"]["name"]}
        assert {env.key for env in references} <= set(secret["stringData"]), name
    io = USER_EXAMPLES[name]
    assert (st.spec.table.catalog is None) == (io is None)
    if io is not None:
        config = CatalogConfig.for_table(st.spec, environ={env.name: "x" for env in catalog_env})
        assert config.spark_conf()["spark.sql.catalog.lake.io-impl"] == io


def test_the_user_examples_show_what_their_names_say() -> None:
    def spec(name: str) -> StreamingTableSpec:
        return load_manifest(CLUSTER.with_name(f"{name}.yaml")).spec

    postgres, rest = spec("catalog-postgres").table.catalog, spec("catalog-rest").table.catalog
    assert postgres is not None and postgres.uri.startswith("postgresql://")
    assert rest is not None and rest.type == "rest"
    security = spec("kafka-sasl-tls").source.security
    assert security.protocol == "SASL_SSL" and security.ca_cert is not None
    dead_letter = spec("dead-letter-topic").dead_letter
    assert dead_letter.topic and dead_letter.table.enabled
    transforms = spec("transforms").transforms
    assert transforms.select and transforms.filter
    retention = spec("retention").retention
    assert retention is not None and retention.max_age_seconds == 90 * 86400
    keyed = spec("keyed-avro")
    assert (keyed.mode, keyed.key, keyed.format.type) == ("upsert", ["id"], "avro")
    routed = spec("routed-events")
    assert [r.table.name for r in routed.routes] == ["orders", "payments", "shipments", "audit"]
    assert routed.unrouted is Unrouted.DEAD_LETTER and routed.dead_letter.enabled
