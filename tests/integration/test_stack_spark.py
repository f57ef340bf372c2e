"""Spark with the real Iceberg runtime and pyiceberg share one SQLite catalog both ways, and Spark's Kafka
source reads an explicit offset range per partition from the real broker; the driver JVM runs with
Icefall's footprint settings (`icefall.spark.session.DRIVER_JAVA_OPTIONS`, `DRIVER_MALLOC_ARENAS`), and
its Py4J view keeps the names it resolved (`icefall.spark.jvm_names`)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.spark.session import DRIVER_JAVA_OPTIONS, DRIVER_MALLOC_ARENAS

pytestmark = pytest.mark.integration


def test_spark_writes_pyiceberg_reads(spark: SparkSession, catalog_config: CatalogConfig) -> None:
    name = catalog_config.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}.smoke")
    spark.sql(
        f"CREATE TABLE {name}.smoke.from_spark (id BIGINT, ts TIMESTAMP, tags ARRAY<STRING>, "
        "address STRUCT<city: STRING, zip: INT>) USING iceberg PARTITIONED BY (days(ts))"
    )
    spark.sql(
        f"INSERT INTO {name}.smoke.from_spark VALUES "
        "(1, TIMESTAMP '2026-01-01 10:00:00', array('a', 'b'), named_struct('city', 'Oslo', 'zip', 150)), "
        "(2, TIMESTAMP '2026-01-02 11:00:00', array(), named_struct('city', 'Bergen', 'zip', 5003))"
    )
    table = catalog_config.pyiceberg().load_table("smoke.from_spark")
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda row: row["id"])
    assert [row["id"] for row in rows] == [1, 2]
    assert rows[0]["tags"] == ["a", "b"]
    assert rows[1]["address"] == {"city": "Bergen", "zip": 5003}
    assert str(table.spec().fields[0].transform) == "day"


def test_pyiceberg_writes_spark_reads(spark: SparkSession, catalog_config: CatalogConfig) -> None:
    catalog = catalog_config.pyiceberg()
    catalog.create_namespace_if_not_exists("smoke")
    data = pa.table({"id": pa.array([10, 20, 30], pa.int64()), "name": ["x", "y", "z"]})
    table = catalog.create_table("smoke.from_pyiceberg", schema=data.schema)
    table.append(data)
    rows = spark.sql(f"SELECT id, name FROM {catalog_config.name}.smoke.from_pyiceberg ORDER BY id").collect()
    assert [(row.id, row.name) for row in rows] == [(10, "x"), (20, "y"), (30, "z")]


def test_spark_reads_kafka_by_explicit_offsets(spark: SparkSession, kafka: KafkaBroker) -> None:
    kafka.create_topic("smoke-spark", partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(20):
        producer.produce("smoke-spark", value=json.dumps({"n": i}), partition=i % 2)
    assert producer.flush(30) == 0

    starting = {"smoke-spark": {"0": 2, "1": 5}}
    ending = {"smoke-spark": {"0": 6, "1": 10}}  # exclusive
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", "smoke-spark")
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .load()
    )
    got = sorted((r.partition, r.offset, json.loads(r.value)["n"]) for r in frame.collect())
    expected = [(0, o, 2 * o) for o in range(2, 6)] + [(1, o, 2 * o + 1) for o in range(5, 10)]
    assert got == expected


def test_the_driver_jvm_runs_with_the_footprint_settings(spark: SparkSession) -> None:
    pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        argv = cmdline.read().decode().split("\0")
    assert DRIVER_JAVA_OPTIONS.split() == [arg for arg in argv if arg in DRIVER_JAVA_OPTIONS.split()]
    with open(f"/proc/{pid}/environ", "rb") as environ:
        variables = environ.read().decode().split("\0")
    assert f"MALLOC_ARENA_MAX={DRIVER_MALLOC_ARENAS}" in variables
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    flag = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    ).getVMOption("TrimNativeHeapInterval")
    assert flag.getValue() == "5000"


def test_the_driver_view_resolves_each_jvm_name_once(spark: SparkSession) -> None:
    """`icefall.spark.jvm_names`: PySpark's names (`functions` for every column expression) are found again
    without asking the JVM, and what they resolved to still works."""
    from pyspark.sql import functions

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    first = jvm.functions
    assert jvm.functions is first and jvm.org.apache.iceberg.spark is jvm.org.apache.iceberg.spark
    assert vars(jvm)["functions"] is first  # a plain attribute now: no round trip
    row = spark.range(3).select(functions.sum(functions.col("id") + 1).alias("total")).first()
    assert row is not None and row["total"] == 6
