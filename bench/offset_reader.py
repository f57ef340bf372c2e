"""What Spark's per-read Kafka admin client costs a batch: the offset resolution of a Kafka read, alone.

    .venv/bin/python bench/offset_reader.py [--records N] [--reads K] [--rounds R] [--out FILE]

Icefall's Python side keeps one set of librdkafka clients for a writer's life (`Ingestor.topic`, a
`TopicView` whose `sibling`s share its clients); the Kafka admin client a batch makes is Spark's: its Kafka
batch source (`KafkaRelation.buildScan`) builds a `KafkaOffsetReader` (a Java `AdminClient`) at every
physical planning of a read and closes it, even when both ends are explicit offsets. This bench prices that,
in one Spark session (`local[2]`, Icefall's session settings), the same offsets (`--records` of the bench's
~230 B events over 3 partitions: a small caught-up batch) read by `icefall.ingest.writer.read_kafka`, each
variant `--reads` times in a row per measurement, variants interleaved round after round (round 0 a warm-up,
not counted), CPU of the Spark JVM (/proc) around each measurement:

- **analyse**: `read_kafka(...)` and its optimized plan: what a batch's read costs before Spark builds
  the scan (no admin client).
- **plan**: the same, then its physical plan: adds the scan's offset resolution (one `AdminClient` made,
  its metadata, `describeTopics` for the start and the end offsets, closed) and the physical planning.
- **plan, consumer offsets**: **plan** with `spark.sql.streaming.kafka.useDeprecatedOffsetFetching=true`
  (Spark's older, consumer-based offset reader: a `KafkaConsumer` per read instead).
- **read**: `read_kafka(...)` written to Spark's `noop` sink: the whole read of the batch (planning, the
  offset resolution, the tasks that fetch the records; no decode, no write).

Admin clients made are counted with the Kafka client's own id sequence (`KafkaAdminClient`'s
`ADMIN_CLIENT_ID_SEQUENCE`, read by reflection). Writes bench/results/offset_reader.md; nothing asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from common import (
    EVENT_SCHEMA,
    SMALL_NOTE_WORDS,
    load_average,
    machine_basics,
    machine_section,
    tree_cpu,
    whole_topic,
    write_results,
)
from compare import preload

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.writer import read_kafka
from icefall.spark.session import build_spark_session

RESULTS = Path(__file__).parent / "results" / "offset_reader.md"
PARTITIONS = 3
CONSUMER_OFFSETS = "spark.sql.streaming.kafka.useDeprecatedOffsetFetching"
VARIANTS = ("analyse", "plan", "plan, consumer offsets", "read")


def admin_clients_made(spark: Any) -> int:
    """The Kafka client's count of admin clients made in this JVM so far (its client id sequence)."""
    jvm = spark.sparkContext._jvm
    # spark.jars are on Spark's class loader, not the JVM's: Spark's own lookup finds them
    cls = jvm.org.apache.spark.util.Utils.classForName(
        "org.apache.kafka.clients.admin.KafkaAdminClient", True, False
    )
    field = cls.getDeclaredField("ADMIN_CLIENT_ID_SEQUENCE")
    field.setAccessible(True)
    return int(field.get(None)) - 1  # the sequence starts at 1 (py4j passes an AtomicInteger as a number)


def one_read(spark: Any, spec: Any, ranges: Any, variant: str) -> None:
    source = read_kafka(spark, spec, ranges, {}, group_id="bench-offsets", headers=False)
    if variant == "read":
        source.select("partition", "offset", "value").write.format("noop").mode("overwrite").save()
        return
    execution = source._jdf.queryExecution()
    if variant == "analyse":
        execution.optimizedPlan()
        return
    spark.conf.set(CONSUMER_OFFSETS, str(variant == "plan, consumer offsets").lower())
    try:
        execution.executedPlan()
    finally:
        spark.conf.unset(CONSUMER_OFFSETS)


def measure(  # noqa: PLR0917 (the measured variants)
    spark: Any, spec: Any, ranges: Any, reads: int, rounds: int, jvm_cpu: Callable[[], float]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per variant: JVM CPU-s per read of each counted round; admin clients made per read."""
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    admins: dict[str, float] = dict.fromkeys(VARIANTS, 0.0)
    for round_ in range(rounds + 1):
        for variant in VARIANTS:
            made0, cpu0, t0 = admin_clients_made(spark), jvm_cpu(), time.monotonic()
            for _ in range(reads):
                one_read(spark, spec, ranges, variant)
            cpu1, t1, made1 = jvm_cpu(), time.monotonic(), admin_clients_made(spark)
            print(
                f"[bench] round {round_} {variant}: {(cpu1 - cpu0) / reads * 1000:.1f} ms CPU a read, "
                f"{(t1 - t0) / reads * 1000:.1f} ms, {(made1 - made0) / reads:.1f} admin clients a read; "
                f"load {load_average()}",
                flush=True,
            )
            if round_:
                cpu[variant].append((cpu1 - cpu0) / reads)
                admins[variant] += (made1 - made0) / reads / rounds
    return cpu, admins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--reads", type=int, default=10, help="reads per variant per round")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started, load_start = datetime.now(UTC), load_average()
    state = Path(tempfile.mkdtemp(prefix="icefall-offsets-"))
    broker = KafkaBroker(state / "kafka", heap="1g").start()
    try:
        topic = "offsets"
        broker.create_topic(topic, partitions=PARTITIONS)
        preload(broker.bootstrap, topic, args.records, SMALL_NOTE_WORDS, 1)
        ranges = whole_topic(broker.bootstrap, topic, PARTITIONS)
        manifest = {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "offsets"},
            "spec": {
                "source": {"bootstrapServers": broker.bootstrap, "topic": topic},
                "format": {"type": "json", "schema": EVENT_SCHEMA},
                "table": {"namespace": "bench", "name": "t"},
            },
        }
        spec = load_manifest(yaml.safe_dump(manifest)).spec
        spark = build_spark_session([CatalogConfig.embedded(state)], master="local[2]")
        try:
            jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
            cpu, admins = measure(spark, spec, ranges, args.reads, args.rounds, lambda: tree_cpu(jvm))
        finally:
            spark.stop()
    finally:
        broker.stop()
    plan, analyse = statistics.median(cpu["plan"]), statistics.median(cpu["analyse"])
    lines = [
        "# Spark's Kafka admin client per read: what the offset resolution of a batch's read costs",
        "",
        f"`bench/offset_reader.py --records {args.records} --reads {args.reads} --rounds {args.rounds}` on "
        f"{started:%Y-%m-%d %H:%M} UTC. Method: the docstring of `bench/offset_reader.py` (one Spark "
        "session, "
        "`local[2]`, the same offsets per variant, interleaved; JVM CPU per read, median of the rounds). "
        "**Shared machine** (load average below); the variants are interleaved, so they share the load.",
        "",
        "| variant | JVM CPU per read, ms: median (min, max) | admin clients made per read |",
        "|---|--:|--:|",
    ]
    for variant in VARIANTS:
        values = [v * 1000 for v in cpu[variant]]
        lines.append(
            f"| {variant} | {statistics.median(values):.1f} ({min(values):.1f}, {max(values):.1f}) | "
            f"{admins[variant]:.1f} |"
        )
    lines += [
        "",
        f"Offset resolution and physical planning (plan - analyse): **{(plan - analyse) * 1000:.1f} ms** of "
        "JVM CPU per read.",
    ]
    basics = machine_basics()
    basics["Load average at start / end (1/5/15 min)"] = f"{load_start} / {load_average()}"
    write_results(args.out, "\n".join([*lines, "", *machine_section(basics)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
