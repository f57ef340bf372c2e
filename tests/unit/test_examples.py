"""The examples a newcomer copies are valid and mean what their comments say.

Proves: examples/cluster.yaml (a Secret and a StreamingTable in one file) loads as a StreamingTable with
`icefall run -f`'s loader; every secret it references is a key of the Secret in the same file; the pods and
`icefall run` read those secrets from the variables the file's comment names; the catalog maps to a
REST catalog with its files in S3 on both the pyiceberg and the Spark side; examples/cluster-values.yaml
gives the operator no credential (it holds none) and the Secret carries the grant label StreamingTables
need (e2e/test_user_path.py installs the chart with it); and every single-table example (json, Debezium,
Protobuf, JSON Schema) loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
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
