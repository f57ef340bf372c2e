"""`spec.spark.conf`: a table's own Spark settings, allow-listed (`icefall.api.spark`).

Proves: settings that tune speed and memory are accepted as written; Icefall's wiring (master, jars, SQL
extensions, catalogs, time zone, Kubernetes, executors, Kafka), what would skip data (ignoreCorruptFiles,
speculation) and anything that looks like a credential are refused, each with an error naming the field
(`spec.spark.conf[<key>]`) and the fix, and without repeating a secret value; unknown keys are refused
too (an allow-list), with what is allowed; a `spark.network.timeout` under a minute (which stops Spark's
driver at start) is refused; the default leaves the spec as it was.
"""

from __future__ import annotations

import pytest

from icefall.api import ManifestError, SparkSpec, parse_manifest
from icefall.api.spark import ALLOWED_KEYS, spark_conf_problems

pytestmark = pytest.mark.unit

MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "kafka:9092", topic: orders}}
  format: {{schema: [{{name: id, type: long}}]}}
  table: {{namespace: shop}}
  spark: {{conf: {conf}}}
"""


def errors(conf: str) -> str:
    with pytest.raises(ManifestError) as raised:
        parse_manifest(MANIFEST.format(conf=conf))
    return str(raised.value)


def test_speed_and_memory_settings_are_accepted() -> None:
    conf = {
        "spark.sql.shuffle.partitions": "64",
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.sql.files.maxPartitionBytes": "64m",
        "spark.memory.fraction": "0.5",
    }
    st = parse_manifest(MANIFEST.format(conf=conf))
    assert st.spec.spark.conf == conf
    assert spark_conf_problems({**dict.fromkeys(ALLOWED_KEYS, "1"), "spark.network.timeout": "60"}) == []


@pytest.mark.parametrize("value", ["30s", "59", "5000ms", "0"])
def test_a_network_timeout_shorter_than_sparks_heartbeat_check_is_refused(value: str) -> None:
    """Below `spark.network.timeoutInterval` (60 s) the driver failed at start (seen in
    tests/integration/test_resource_faults.py); between 60 s and the default 120 s, executors cut off
    from the driver are found sooner."""
    refused = errors(f"{{spark.network.timeout: '{value}'}}")
    assert "spec.spark.conf['spark.network.timeout']: at least 60s" in refused


@pytest.mark.parametrize("value", ["60s", "2min", "120", "1h"])
def test_a_network_timeout_of_a_minute_or_more_is_accepted(value: str) -> None:
    assert spark_conf_problems({"spark.network.timeout": value}) == []


def test_a_network_timeout_spark_cannot_read_is_refused() -> None:
    assert "not a duration Spark reads" in errors("{spark.network.timeout: soon}")


@pytest.mark.parametrize(
    ("key", "fix"),
    [
        ("spark.master", "annotation"),
        ("spark.jars.packages", "ICEFALL_SPARK_JARS"),
        ("spark.sql.extensions", "Iceberg's SQL extensions"),
        ("spark.sql.catalog.lake.uri", "spec.table.catalog"),
        ("spark.sql.session.timeZone", "UTC"),
        ("spark.sql.files.ignoreCorruptFiles", "exactly once"),
        ("spark.sql.files.ignoreMissingFiles", "exactly once"),
        ("spark.speculation", "speculative"),
        ("spark.kafka.consumer.cache.capacity", "read_committed"),
        ("spark.kubernetes.executor.request.cores", "spec.pods"),
        ("spark.executor.memory", "spec.pods.executor.resources"),
        ("spark.dynamicAllocation.maxExecutors", "operator's settings"),
    ],
)
def test_icefalls_wiring_and_what_breaks_exactly_once_are_refused_with_the_fix(key: str, fix: str) -> None:
    message = errors(f'{{"{key}": "x"}}')
    assert f"spec.spark.conf['{key}']" in message, message
    assert fix in message and "remove it" in message, message


def test_credentials_are_refused_without_repeating_the_value() -> None:
    message = errors('{"spark.hadoop.fs.s3a.secret.key": "SENTINEL-7f3a", "spark.ssl.keyPassword": "pw1"}')
    assert "spark.hadoop.fs.s3a.secret.key" in message and "spark.ssl.keyPassword" in message
    assert "SENTINEL-7f3a" not in message and "pw1" not in message
    assert "reference a Secret" in message


def test_unknown_keys_are_refused_naming_what_is_allowed() -> None:
    message = errors('{"spark.sql.sources.partitionOverwriteMode": "dynamic"}')
    assert "not a setting a table may change" in message
    assert "spark.sql.shuffle.partitions" in message and "spark.sql.adaptive.*" in message


def test_the_default_is_empty_and_leaves_the_spec_unchanged() -> None:
    assert SparkSpec().conf == {}
    st = parse_manifest(MANIFEST.replace("  spark: {{conf: {conf}}}\n", "").format())
    assert st.spec.spark.conf == {}
    assert "spark" not in st.spec.model_dump(by_alias=True, exclude_defaults=True)
