"""Spark Structured Streaming → Iceberg: the plain PySpark job a Spark user would write for this topic.

    python bench/peers/spark_streaming.py --bootstrap HOST:PORT --topic T --table bench.events \
        --catalog-db catalog.db --warehouse DIR --checkpoint DIR --jars 'a.jar,b.jar' [--trigger-seconds 10] \
        [--kafka-option fetch.max.wait.ms=10 ...] [--upsert-key id]
        [--format jsonschema | --format avro --avro-schema FILE]

readStream from Kafka (earliest) → from_json with the events' schema → writeStream format iceberg into an
existing table of a JDBC (SQLite) catalog named `icefall`, trigger processingTime, a checkpoint folder.
With `--format avro` the values are Confluent-framed Avro (a magic byte and a 4-byte schema id, then the
record) and the job decodes them as a Spark user does without a registry client: spark-avro's
`from_avro(expr("substring(value, 6)"), schema_json)` with the writer schema of `--avro-schema` (an .avsc
file), default mode FAILFAST. The schema id is not looked at: every record must be of that writer schema.
With `--format jsonschema` the values are Confluent-framed JSON Schema records (the header, then JSON
text) and the job reads them likewise: `from_json(expr("substring(value, 6)").cast("string"), ...)`.
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
With `--table-format delta --location DIR` (bench/delta.py) the job writes a Delta table at DIR instead
(`writeStream.format("delta")`, Delta's jars from `--delta-jars`, no catalog), each row with a `_kafka`
struct (partition, offset, timestamp) as Icefall's rows have, so both are audited the same way; with
`--available-now` it drains what the topic holds and stops, printing one `[peer] progress` JSON line per
micro-batch (its start and duration) for the bench to time the drain.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql.functions import coalesce, col, expr, from_json, row_number, struct

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
    """The event of a record's value: from_json with EVENT_DDL (of the text past the 5-byte header for
    jsonschema), or from_avro past the header."""
    if args.format == "jsonschema":
        return from_json(expr("substring(value, 6)").cast("string"), EVENT_DDL)
    if args.format == "avro":
        from pyspark.sql.avro.functions import from_avro

        return from_avro(expr("substring(value, 6)"), args.avro_schema.read_text())
    return from_json(col("value").cast("string"), EVENT_DDL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", help="namespace.name in the catalog `icefall` (format iceberg)")
    parser.add_argument("--catalog-db", type=Path)
    parser.add_argument("--warehouse", type=Path)
    parser.add_argument("--table-format", choices=("iceberg", "delta"), default="iceberg")
    parser.add_argument("--location", type=Path, help="format delta: the table's folder")
    parser.add_argument("--delta-jars", default="", help="format delta: comma-separated jar paths")
    parser.add_argument("--available-now", action="store_true", help="drain the topic, then stop")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--jars", required=True, help="comma-separated jar paths")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--trigger-seconds", type=float, default=10)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0, help="0: no limit")
    parser.add_argument("--upsert-key", help="a keyed table: MERGE each micro-batch by this column")
    parser.add_argument(
        "--format", choices=("json", "jsonschema", "avro"), default="json", help="the record values"
    )
    parser.add_argument("--avro-schema", type=Path, help="--format avro: the writer schema (.avsc)")
    parser.add_argument(
        "--kafka-option", action="append", default=[], metavar="KEY=VALUE", help="a Kafka consumer option"
    )
    args = parser.parse_args()
    if args.format == "avro" and (args.avro_schema is None or args.upsert_key):
        parser.error("--format avro needs --avro-schema and does not go with --upsert-key")
    delta = args.table_format == "delta"
    if delta and (args.location is None or args.upsert_key):
        parser.error("--table-format delta needs --location and does not go with --upsert-key")
    if not delta and None in (args.table, args.catalog_db, args.warehouse):
        parser.error("--table-format iceberg needs --table, --catalog-db and --warehouse")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(args.master)
        .appName(f"spark-structured-streaming-{args.table_format}")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
    )
    if delta:
        builder = (
            builder.config("spark.jars", ",".join(filter(None, [args.jars, args.delta_jars])))
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            # Delta 4.1.0 on Spark 4.1: read a checkpoint's schema from `_last_checkpoint` (a removed
            # Spark constructor otherwise fails the read of a table with a checkpoint).
            .config("spark.databricks.delta.checkpointSchema.useFromCheckpointMetadata", "true")
        )
    else:
        builder = (
            builder.config("spark.jars", args.jars)
            .config(
                "spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
            )
            .config("spark.sql.catalog.icefall", "org.apache.iceberg.spark.SparkCatalog")
            .config("spark.sql.catalog.icefall.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
            .config("spark.sql.catalog.icefall.uri", f"jdbc:sqlite:{args.catalog_db.resolve()}")
            .config("spark.sql.catalog.icefall.warehouse", args.warehouse.resolve().as_uri())
            .config("spark.sql.catalog.icefall.jdbc.busy_timeout", "30000")
        )
    spark = builder.getOrCreate()
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
    if delta:
        return write_delta(args, records, trigger)
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


def write_delta(args: argparse.Namespace, records: DataFrame, trigger: str) -> int:
    """The events with their `_kafka` struct into the Delta table at `--location`; with `--available-now`,
    one `[peer] progress` line per micro-batch once the topic is drained."""
    import json

    kafka = struct(col("partition"), col("offset"), col("timestamp")).alias("_kafka")
    events = records.select(decoded(args).alias("e"), kafka).select("e.*", "_kafka")
    writer = events.writeStream.format("delta").outputMode("append")
    writer = (
        writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime=trigger)
    )
    query = writer.option("checkpointLocation", str(args.checkpoint)).start(str(args.location))
    query.awaitTermination()
    for found in query.recentProgress:
        progress = found if isinstance(found, dict) else json.loads(found.json)  # pyspark 4: an object
        took = progress["durationMs"].get("triggerExecution", 0)
        line = {"start": progress["timestamp"], "ms": took, "rows": progress["numInputRows"]}
        print(f"[peer] progress {json.dumps(line)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
