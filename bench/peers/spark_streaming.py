"""Spark Structured Streaming → Iceberg: the plain PySpark job a Spark user would write for this topic.

    python bench/peers/spark_streaming.py --bootstrap HOST:PORT --topic T --table bench.events \
        --catalog-db catalog.db --warehouse DIR --checkpoint DIR --jars 'a.jar,b.jar' [--trigger-seconds 10] \
        [--kafka-option fetch.max.wait.ms=10 ...]

readStream from Kafka (earliest) → from_json with the events' schema → writeStream format iceberg into an
existing table of a JDBC (SQLite) catalog named `icefall`, trigger processingTime, a checkpoint folder.
Each `--kafka-option KEY=VALUE` is set on the readStream as `kafka.KEY` (bench/compare.py passes Icefall's
reader defaults: with the client's own `fetch.max.wait.ms`, 500 ms, a partition with nothing new makes each
Kafka read wait that long).
Same jars as Icefall (spark_images/pom.xml). Exactly-once comes from Spark's checkpoint (offsets and
commit log), not from the table. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, from_json

EVENT_DDL = (
    "id BIGINT, key STRING, ts TIMESTAMP, customer STRING, amount DOUBLE, items INT, "
    "shipping STRUCT<street: STRING, city: STRING, country: STRING>, tags ARRAY<STRING>, note STRING"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True, help="namespace.name in the catalog `icefall`")
    parser.add_argument("--catalog-db", type=Path, required=True)
    parser.add_argument("--warehouse", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--jars", required=True, help="comma-separated jar paths")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--trigger-seconds", type=float, default=10)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0, help="0: no limit")
    parser.add_argument(
        "--kafka-option", action="append", default=[], metavar="KEY=VALUE", help="a Kafka consumer option"
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("spark-structured-streaming-iceberg")
        .config("spark.jars", args.jars)
        .config("spark.driver.memory", "1g")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.icefall", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.icefall.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
        .config("spark.sql.catalog.icefall.uri", f"jdbc:sqlite:{args.catalog_db.resolve()}")
        .config("spark.sql.catalog.icefall.warehouse", args.warehouse.resolve().as_uri())
        .config("spark.sql.catalog.icefall.jdbc.busy_timeout", "30000")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    for option in args.kafka_option:
        key, _, value = option.partition("=")
        reader = reader.option(f"kafka.{key}", value)
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    events = reader.load().select(from_json(col("value").cast("string"), EVENT_DDL).alias("e")).select("e.*")
    query = (
        events.writeStream.format("iceberg")
        .outputMode("append")
        .trigger(processingTime=f"{args.trigger_seconds:g} seconds")
        .option("checkpointLocation", str(args.checkpoint))
        .option("fanout-enabled", "true")
        .toTable(f"icefall.{args.table}")
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
