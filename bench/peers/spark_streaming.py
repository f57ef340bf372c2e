"""Spark Structured Streaming → Iceberg: the plain PySpark job a Spark user would write for this topic.

    python bench/peers/spark_streaming.py --bootstrap HOST:PORT --topic T --table bench.events \
        --catalog-db catalog.db --warehouse DIR --checkpoint DIR --jars 'a.jar,b.jar' [--trigger-seconds 10] \
        [--kafka-option fetch.max.wait.ms=10 ...] [--upsert-key id] [--format avro --avro-schema FILE]

readStream from Kafka (earliest) → from_json with the events' schema → writeStream format iceberg into an
existing table of a JDBC (SQLite) catalog named `icefall`, trigger processingTime, a checkpoint folder.
With `--format avro` the values are Confluent-framed Avro (a magic byte and a 4-byte schema id, then the
record) and the job decodes them as a Spark user does without a registry client: spark-avro's
`from_avro(expr("substring(value, 6)"), schema_json)` with the writer schema of `--avro-schema` (an .avsc
file), default mode FAILFAST. The schema id is not looked at: every record must be of that writer schema.
With `--upsert-key COLUMN` (bench/upsert.py) the job is the keyed one a Spark user writes instead: each
micro-batch, in `foreachBatch`, is cut to the last record per key (by Kafka offset; a key stays in one
partition), a tombstone (null value) taking its key from the Kafka key (a bare value), then applied by
one `MERGE INTO` (matched and tombstone: DELETE; matched: UPDATE; not matched and not a tombstone:
INSERT). The table's write modes say how (bench/upsert.py creates it merge-on-read). A micro-batch run
again after a crash applies the same last values again: idempotent.
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
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql.functions import coalesce, col, expr, from_json, row_number

EVENT_DDL = (
    "id BIGINT, key STRING, ts TIMESTAMP, customer STRING, amount DOUBLE, items INT, "
    "shipping STRUCT<street: STRING, city: STRING, country: STRING>, tags ARRAY<STRING>, note STRING"
)
COLUMNS = ("id", "key", "ts", "customer", "amount", "items", "shipping", "tags", "note")


def upsert_batch(table: str, key: str) -> Callable[[DataFrame, int], None]:
    """The `foreachBatch` function: the micro-batch's last record per `key`, then one MERGE into `table`."""

    def apply(batch: DataFrame, _batch_id: int) -> None:
        changes = batch.select(
            coalesce(col("e." + key), col("key").cast("string").cast("bigint")).alias("_key"),
            col("value").isNull().alias("_deleted"),
            col("offset"),
            *(col("e." + c).alias(c) for c in COLUMNS),
        )
        last = Window.partitionBy("_key").orderBy(col("offset").desc())
        changes = changes.withColumn("_n", row_number().over(last)).where("_n = 1").where("_key IS NOT NULL")
        changes.createOrReplaceTempView("changes")
        updates = ", ".join(f"t.{c} = s.{c}" for c in COLUMNS)
        batch.sparkSession.sql(
            f"MERGE INTO {table} t USING changes s ON t.{key} = s._key "
            "WHEN MATCHED AND s._deleted THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {updates} "
            f"WHEN NOT MATCHED AND NOT s._deleted THEN INSERT ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join('s.' + c for c in COLUMNS)})"
        )

    return apply


def decoded(args: argparse.Namespace) -> Column:
    """The event of a record's value: from_json with EVENT_DDL, or from_avro past the 5-byte header."""
    if args.format == "avro":
        from pyspark.sql.avro.functions import from_avro

        return from_avro(expr("substring(value, 6)"), args.avro_schema.read_text())
    return from_json(col("value").cast("string"), EVENT_DDL)


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
    parser.add_argument("--upsert-key", help="a keyed table: MERGE each micro-batch by this column")
    parser.add_argument("--format", choices=("json", "avro"), default="json", help="the record values")
    parser.add_argument("--avro-schema", type=Path, help="--format avro: the writer schema (.avsc)")
    parser.add_argument(
        "--kafka-option", action="append", default=[], metavar="KEY=VALUE", help="a Kafka consumer option"
    )
    args = parser.parse_args()
    if args.format == "avro" and (args.avro_schema is None or args.upsert_key):
        parser.error("--format avro needs --avro-schema and does not go with --upsert-key")

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
    records = reader.load()
    trigger = f"{args.trigger_seconds:g} seconds"
    if args.upsert_key:
        value = from_json(col("value").cast("string"), EVENT_DDL).alias("e")
        parsed = records.select("key", "value", "offset", value)
        query = (
            parsed.writeStream.foreachBatch(upsert_batch(f"icefall.{args.table}", args.upsert_key))
            .trigger(processingTime=trigger)
            .option("checkpointLocation", str(args.checkpoint))
            .start()
        )
        query.awaitTermination()
        return 0
    events = records.select(decoded(args).alias("e")).select("e.*")
    query = (
        events.writeStream.format("iceberg")
        .outputMode("append")
        .trigger(processingTime=trigger)
        .option("checkpointLocation", str(args.checkpoint))
        .option("fanout-enabled", "true")
        .toTable(f"icefall.{args.table}")
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
