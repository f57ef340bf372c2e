"""Prototype writers for issue #45 item 1: a batch whose plan is not rebuilt from Python each time.

    python bench/peers/prototype_writer.py --design stream|rebind --manifest events.yaml --state-dir DIR \
        --jars 'a.jar,b.jar' [--cadence 5]

Both designs decode with Icefall's own `Decoder` (the manifest's schema, no error text; the same observed
aggregates: records, bytes, newest, bad) and append to `icefall.<namespace>.<name>` of the embedded SQLite
catalog in `--state-dir`, created here (Icefall's good-row columns, `_kafka` included, partitioned by
day(ts)) unless it exists. Each commit carries the batch's end offsets as the snapshot property
`icefall.offsets` (JSON {"<partition>": next offset}), written by Iceberg's `snapshot-property.*` write
option, so offsets and rows land in ONE commit, as Icefall's do.

- **stream** (design a): one long-lived Structured Streaming query, Kafka source starting at the offsets
  of the table's newest snapshot (earliest without one), `foreachBatch` decoding and appending. A batch's
  end offsets come from the checkpoint's offset log (`offsets/<batchId>`, written before the batch runs),
  so no extra job. The checkpoint is a fresh folder per start: the table, not the checkpoint, says where
  to resume. Trigger processingTime `--cadence` seconds.
- **rebind** (design b): a Python loop, every `--cadence` seconds: watermarks (confluent-kafka), then the
  same decode-and-write plan over a batch read of [committed, watermark) per partition. The decode
  columns are built once (`Decoder`); the source is re-bound by building a new Kafka relation per batch
  (Spark 4.1 has no API to swap a Dataset's source options in an analyzed plan: see
  bench/results/prototypes.md).

No staging branch, no lease, no fencing, no dead letters: a prototype measures CPU, not safety. Prints
"BATCH <records> <seconds>" per commit. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from icefall.api import load_manifest
from icefall.ingest.writer import SPARK_CONSUMER_DEFAULTS, Decoders

OFFSETS = "icefall.offsets"


def session(state: Path, jars: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.master("local[2]")
        .appName("icefall-prototype")
        .config("spark.jars", jars)
        .config("spark.driver.memory", "1g")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.icefall", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.icefall.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
        .config("spark.sql.catalog.icefall.uri", f"jdbc:sqlite:{(state / 'catalog.db').resolve()}")
        .config("spark.sql.catalog.icefall.warehouse", (state / "warehouse").resolve().as_uri())
        .config("spark.sql.catalog.icefall.jdbc.busy_timeout", "30000")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )


def committed(spark: SparkSession, table: str) -> dict[int, int]:
    """The offsets of the table's newest snapshot ({} for none): where a writer resumes."""
    rows = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()
    if not rows or OFFSETS not in rows[0].summary:
        return {}
    return {int(p): int(o) for p, o in json.loads(rows[0].summary[OFFSETS]).items()}


def write(rows: DataFrame, table: str, ends: dict[int, int]) -> None:
    """Append `rows`, the batch's end offsets in the same commit (a snapshot property)."""
    offsets = json.dumps({str(p): o for p, o in sorted(ends.items())})
    tasks = rows.sparkSession.sparkContext.defaultParallelism
    writer = rows.coalesce(tasks).writeTo(table).option("distribution-mode", "none")
    writer.option("fanout-enabled", "false").option(f"snapshot-property.{OFFSETS}", offsets).append()


def decode(decoders: Decoders, source: DataFrame) -> tuple[DataFrame, Observation]:
    observation = Observation()
    decoded = decoders.good.decode(source).observe(observation, *decoders.observed)
    return decoders.good.good_rows(decoded), observation


def kafka_options(spec_source_bootstrap: str) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": spec_source_bootstrap, "includeHeaders": "false"}
    opts |= {f"kafka.{k}": v for k, v in SPARK_CONSUMER_DEFAULTS.items()}
    opts["kafka.isolation.level"] = "read_committed"
    return opts


def ensure_table(
    spark: SparkSession, decoders: Decoders, table: str, options: dict[str, str], topic: str
) -> None:
    if spark.catalog.tableExists(table):
        return
    namespace = table.rsplit(".", 1)[0]
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    empty = spark.read.format("kafka").options(**options).option("subscribe", topic).load().limit(0)
    rows, _ = decode(decoders, empty)
    rows.writeTo(table).partitionedBy(F.days("ts")).tableProperty("format-version", "2").create()


def run_stream(
    spark: SparkSession, decoders: Decoders, table: str, topic: str, args: argparse.Namespace
) -> None:
    options = kafka_options(args.bootstrap)
    start = committed(spark, table)
    starting = json.dumps({topic: {str(p): o for p, o in start.items()}}) if start else "earliest"
    checkpoint = args.state_dir / f"checkpoint-{time.time_ns()}"  # fresh: the table says where to resume
    source = (
        spark.readStream.format("kafka").options(**options).option("subscribe", topic)
        .option("startingOffsets", starting).load()
    )  # fmt: skip

    def batch(df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        log = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
        ends = {int(p): int(o) for p, o in json.loads(log[-1])[topic].items()}
        rows, observation = decode(decoders, df)
        write(rows, table, ends)
        print(f"BATCH {observation.get['records']} {time.monotonic() - started:.2f}", flush=True)

    query = (
        source.writeStream.foreachBatch(batch).trigger(processingTime=f"{args.cadence:g} seconds")
        .option("checkpointLocation", str(checkpoint)).start()
    )  # fmt: skip
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))  # no py4j call inside a handler
    while not stopping and query.isActive:
        time.sleep(0.5)
    query.stop()


def run_rebind(
    spark: SparkSession, decoders: Decoders, table: str, topic: str, args: argparse.Namespace
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    options = kafka_options(args.bootstrap) | {"kafka.group.id": f"icefall-prototype-{topic}"}
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"prototype-{topic}"})
    partitions = sorted(consumer.list_topics(topic).topics[topic].partitions)
    position = {p: 0 for p in partitions} | committed(spark, table)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    while not stopping:
        started = time.monotonic()
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 5)[1] for p in partitions}
        todo = [p for p in partitions if ends[p] > position[p]]
        if todo:
            source = (
                spark.read.format("kafka").options(**options).option("assign", json.dumps({topic: todo}))
                .option("startingOffsets", json.dumps({topic: {str(p): position[p] for p in todo}}))
                .option("endingOffsets", json.dumps({topic: {str(p): ends[p] for p in todo}})).load()
            )  # fmt: skip
            rows, observation = decode(decoders, source)
            write(rows, table, position | ends)
            position |= ends
            print(f"BATCH {observation.get['records']} {time.monotonic() - started:.2f}", flush=True)
        time.sleep(max(0.0, args.cadence - (time.monotonic() - started)))
    consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", choices=("stream", "rebind"), required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--jars", required=True)
    parser.add_argument("--cadence", type=float, default=5)
    args = parser.parse_args()
    st = load_manifest(args.manifest.read_text())
    args.bootstrap = st.spec.source.bootstrap_servers
    topic = st.spec.source.topic
    table = f"icefall.{st.spec.table.namespace}.{st.spec.table.name}"
    spark = session(args.state_dir, args.jars)
    spark.sparkContext.setLogLevel("WARN")
    decoders = Decoders(st.spec)
    ensure_table(spark, decoders, table, kafka_options(args.bootstrap), topic)
    (run_stream if args.design == "stream" else run_rebind)(spark, decoders, table, topic, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
