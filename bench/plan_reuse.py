"""Can Spark 4.1 re-bind a built decode plan to a new batch's offsets? Checks, and what building costs.

    .venv/bin/python bench/plan_reuse.py [--iterations 20]

One Kafka broker (the devstack's), one local Spark session as bench/peers/prototype_writer.py makes it,
Icefall's `Decoder` for the bench's JSON events, a topic of 3 x 2,000 records. Prints:

1. **view swap**: a decode DataFrame built once over a temporary view `src USING kafka OPTIONS (...)`;
   the view replaced with the next offsets; does the built DataFrame read the new range?
2. **latest**: a DataFrame built once with `endingOffsets` latest, executed again after more records
   arrive: does it see them (the range's end resolved per execution), and from which start?
3. **INSERT ... WITH**: does `INSERT INTO t WITH ('snapshot-property.k' = 'v') SELECT ...` (SPARK-49098)
   put the property on the Iceberg snapshot (one SQL call per batch, offsets in the same commit)?
4. **cost of building**: per batch, the CPU of this Python process and of the JVM to build the
   rebind design's plan from Python (Kafka relation + decode + observe + good rows) and analyse it,
   without running it.
Nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import SMALL_NOTE_WORDS, tree_cpu
from compare import preload
from peers.prototype_writer import decode, ensure_table, kafka_options, session
from profile_drain import java_pid, manifest

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tools import jar_files
from icefall.ingest.writer import Decoders


def say(text: str) -> None:
    print(f"[plan_reuse] {text}", flush=True)


def offsets(topic: str, per_partition: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in per_partition.items()}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefall-planreuse-"))
    broker = KafkaBroker(work / "kafka", heap="1g").start()
    try:
        topic = "planreuse"
        broker.create_topic(topic, partitions=3)
        preload(broker.bootstrap, topic, 6_000, SMALL_NOTE_WORDS, 1)
        st = load_manifest(yaml.safe_dump(manifest(broker.bootstrap, topic)))
        jars = ",".join(str(j) for j in jar_files("ICEFALL_SPARK_JARS"))
        CatalogConfig.embedded(work).pyiceberg()  # the catalog's tables, as the bench's polling makes them
        spark = session(work, jars)
        spark.sparkContext.setLogLevel("ERROR")
        decoders = Decoders(st.spec)
        opts = kafka_options(broker.bootstrap)
        table = "icefall.bench.events"
        ensure_table(spark, decoders, table, opts, topic)
        sql_opts = ", ".join(f"'{k}' '{v}'" for k, v in opts.items())

        def view(start: int, end: int) -> None:
            spark.sql(
                f"CREATE OR REPLACE TEMPORARY VIEW src USING kafka OPTIONS ({sql_opts}, "
                f"'subscribe' '{topic}', "
                f"'startingOffsets' '{offsets(topic, dict.fromkeys(range(3), start))}', "
                f"'endingOffsets' '{offsets(topic, dict.fromkeys(range(3), end))}')"
            )

        view(0, 100)
        built, _ = decode(decoders, spark.table("src"))
        first = built.count()
        view(100, 300)
        say(f"1. view swap: built over [0,100) x3 counts {first}; after the view is replaced by "
            f"[100,300) x3 the same DataFrame counts {built.count()} "
            f"(a new one: {spark.table('src').count()})")  # fmt: skip

        latest = (
            spark.read.format("kafka").options(**opts).option("subscribe", topic)
            .option("startingOffsets", offsets(topic, dict.fromkeys(range(3), 1_000)))
            .option("endingOffsets", "latest").load()
        )  # fmt: skip
        rows, _ = decode(decoders, latest)
        before = rows.count()
        preload(broker.bootstrap, topic, 3_000, SMALL_NOTE_WORDS, 1, start=6_000)
        say(f"2. latest: built once from offset 1000, counts {before}; after 3,000 more records the same "
            f"DataFrame counts {rows.count()} (the end resolved per execution, the start fixed)")  # fmt: skip

        good, _ = decode(decoders, spark.table("src"))
        good.createOrReplaceTempView("good")
        spark.sql(f"INSERT INTO {table} WITH ('snapshot-property.icefall.offsets' = '{{\"0\": 300}}') "
                  "SELECT * FROM good")  # fmt: skip
        summary = spark.sql(f"SELECT summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1")
        prop = summary.collect()[0].summary.get("icefall.offsets")
        say(f"3. INSERT ... WITH: the snapshot's icefall.offsets = {prop!r}")

        jvm = java_pid_of_session()
        python_plan(spark, decoders, opts, topic, 0)
        py0, jvm0, t0 = time.process_time(), tree_cpu(jvm) if jvm else 0.0, time.monotonic()
        for i in range(args.iterations):
            python_plan(spark, decoders, opts, topic, i)
        py1, jvm1, t1 = time.process_time(), tree_cpu(jvm) if jvm else 0.0, time.monotonic()
        n = args.iterations
        say(f"4. building the rebind design's plan from Python: per batch "
            f"{(t1 - t0) / n * 1000:.0f} ms wall, Python {(py1 - py0) / n * 1000:.0f} ms CPU, "
            f"JVM {(jvm1 - jvm0) / n * 1000:.0f} ms CPU "
            "(built and analysed, not run)")  # fmt: skip
        spark.stop()
    finally:
        broker.stop()
    return 0


def java_pid_of_session() -> int | None:
    try:
        return java_pid(os.getpid(), timeout=5)
    except RuntimeError:
        return None


def python_plan(spark, decoders, opts, topic, i):  # type: ignore[no-untyped-def]
    source = (
        spark.read.format("kafka").options(**opts).option("assign", json.dumps({topic: [0, 1, 2]}))
        .option("startingOffsets", offsets(topic, dict.fromkeys(range(3), i)))
        .option("endingOffsets", offsets(topic, dict.fromkeys(range(3), i + 1))).load()
    )  # fmt: skip
    rows, _ = decode(decoders, source)
    rows._jdf.queryExecution().analyzed()  # analysis only, as a write would


if __name__ == "__main__":
    sys.exit(main())
