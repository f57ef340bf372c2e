"""Where a batch's CPU goes: Icefall's write path beside the plain Spark write, in one Spark session.

    .venv/bin/python bench/write_path.py [--records N] [--rounds R] [--out FILE]   (or: make bench-write-path)

The drain benches (bench/compare.py) compare whole systems, one after the other; their records per
CPU-second move by 10 % or more between runs on the same machine, which hides differences of a few per
cent. This bench removes everything but the write: one Kafka broker, N of the ~230-byte bench events in 3
partitions (`common.bench_records`), one Spark session (`local[2]`, Icefall's session settings, the
embedded SQLite catalog), and the same offsets read and written by each variant in turn, round after round
(round 0 is a warm-up, not counted). Each write goes to a new table partitioned by day(ts).

- **icefall**: what a clean batch of an unsorted table does (`BatchWriter.write_good_rows`): Icefall's
  decoder without error text, the batch's observation (records, bytes, newest, bad), the good rows with
  `_kafka`, appended by `icefall.ingest.writer.append` (read tasks coalesced to Spark's parallelism,
  a local sort by partition, no shuffle).
- **icefall, hash distribution**: the same rows with Iceberg's hash distribution (a shuffle, then a sort):
  what ingestion did before, and still does for a table with a sort order.
- **icefall, fanout writer**: the same rows coalesced, written by the fanout writer (no sort).
- **no validation**: `from_json` of the events plus the `_kafka` column, nothing checked or observed, the
  fanout writer: what validation and the observation cost.
- **plain Spark**: `from_json` and the fanout writer, no `_kafka` (the write of
  bench/peers/spark_streaming.py, without its streaming machinery).

With `--validation`, also Icefall's write with one part of its validation left out at a time (each
variant's gap to **icefall** is what that part costs; the bench swaps the part in a `Decoder` it built,
reaching into its columns, which no production code does):

- **without the UTF-8 check**: the value's text without `is_valid_utf8` and the size limit;
- **without the corrupt-record column**: the typed parse without `columnNameOfCorruptRecord` (Spark then
  passes each parsed row on instead of copying it field by field), the bad flag without its test;
- **without the value checks**: the bad flag is the parse's only (no required fields, timestamps' years,
  uuids, fixed lengths, nested checks);
- **observing the count only**: the batch's observation holds `count(1)` alone.

CPU is the Spark JVM's user + system time (/proc) around each write; the median of the rounds is reported
with the min, records per CPU-second and the ratio to plain Spark. Writes bench/results/write_path.md.
Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
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
from icefall.ingest.writer import Decoders, append, read_kafka
from icefall.plan.offsets import OffsetRange
from icefall.spark.session import build_spark_session

sys.path.insert(0, str(Path(__file__).parent / "peers"))
from spark_streaming import EVENT_DDL  # the peer's schema of the events (bench/peers/)

RESULTS = Path(__file__).parent / "results" / "write_path.md"
TOPIC = "bench-write-path"
DAY_TS = {"field": "ts", "transform": "day"}
PARTITIONS = 3
VARIANTS = {
    "icefall": "Icefall (decode, observe, `_kafka`; coalesced, local sort, no shuffle)",
    "icefall-hash": "Icefall, hash distribution (shuffle + sort; before this change)",
    "icefall-fanout": "Icefall, fanout writer (coalesced, no sort)",
    "no-validation": "no validation: from_json + `_kafka`, fanout",
    "plain-spark": "plain Spark: from_json, fanout",
}
#: `--validation`: Icefall's write (as **icefall**) with one part of its validation left out.
VALIDATION_VARIANTS = {
    "no-utf8-check": "Icefall without the UTF-8 check (and size limit) of the value",
    "no-corrupt-column": "Icefall without the corrupt-record column (nor its test)",
    "no-value-checks": "Icefall without the value checks (required fields, years, ...)",
    "count-only": "Icefall observing the count only",
}


class Writes:
    """The variants' writes over one set of offsets, each into a new table of the embedded catalog."""

    def __init__(self, spark: Any, bootstrap: str, ranges: tuple[OffsetRange, ...]) -> None:
        manifest = {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "write-path"},
            "spec": {
                "source": {"bootstrapServers": bootstrap, "topic": TOPIC},
                "format": {"type": "json", "schema": EVENT_SCHEMA},
                "table": {
                    "namespace": "bench",
                    "name": "t",
                    "partitioning": [{"field": "ts", "transform": "day"}],
                },
            },
        }
        self.spec = load_manifest(yaml.safe_dump(manifest)).spec
        self.spark = spark
        self.ranges = ranges
        self.decoders = Decoders(self.spec)
        self.tables = 0
        spark.sql("CREATE NAMESPACE IF NOT EXISTS icefall.bench")

    def run(self, variant: str) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        self.tables += 1
        name = f"icefall.bench.t{self.tables}"
        source = read_kafka(
            self.spark, self.spec, self.ranges, {}, group_id="bench-write-path", headers=False
        )
        event = F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e")
        if variant in ("plain-spark", "no-validation"):
            kafka = (
                [F.struct("partition", "offset", "timestamp").alias("_kafka")]
                if variant != "plain-spark"
                else []
            )
            rows = source.select(event, *kafka).select("e.*", *(["_kafka"] if kafka else []))
        else:
            decoder = trimmed(self.spec, variant) if variant in VALIDATION_VARIANTS else self.decoders.good
            observed = [F.count(F.lit(1))] if variant == "count-only" else self.decoders.observed
            decoded = decoder.decode(source).observe(Observation(), *observed)
            rows = decoder.good_rows(decoded)
        rows.limit(0).writeTo(name).using("iceberg").partitionedBy(F.days("ts")).create()
        if variant == "icefall" or variant in VALIDATION_VARIANTS:
            append(rows, name, sorted_table=False)
        elif variant == "icefall-hash":
            append(rows, name, sorted_table=True)  # what a sorted table gets: hash distribution
        else:
            tasks = self.spark.sparkContext.defaultParallelism
            rows.coalesce(tasks).writeTo(name).option("distribution-mode", "none").option(
                "fanout-enabled", "true"
            ).append()


def trimmed(spec: Any, variant: str) -> Any:
    """Icefall's JSON `Decoder` of `spec` (without error texts) with the part `variant` names left out."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)
    from pyspark.sql.types import StructType

    from icefall.api import to_spark_schema_json
    from icefall.decode.columns import BAD_COLUMN, CORRUPT_COLUMN, TEXT_COLUMN, TYPED_COLUMN
    from icefall.decode.decode import Decoder
    from icefall.decode.reasons import value_checks

    decoder = Decoder(spec, errors=False)
    typed, fields = F.col(TYPED_COLUMN), spec.format.schema_fields
    if variant == "no-utf8-check":
        value = F.col("value")
        decoder._text = F.when(value.isNotNull(), value.cast("string")).alias(TEXT_COLUMN)
    elif variant == "no-corrupt-column":
        checks = [c for f in fields for c, _ in value_checks(f, typed[f.name], f.name, quotable=True)]
        checks += [typed[f.name].isNull() for f in fields if f.required]
        plain = StructType.fromJson(to_spark_schema_json(fields))
        decoder._typed = F.from_json(F.col(TEXT_COLUMN), plain).alias(TYPED_COLUMN)
        decoder._bad = _any([typed.isNull(), *checks]).alias(BAD_COLUMN)
    elif variant == "no-value-checks":
        decoder._bad = _any([typed.isNull(), typed[CORRUPT_COLUMN].isNotNull()]).alias(BAD_COLUMN)
    return decoder


def _any(conditions: list[Any]) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    found = F.lit(False)
    for condition in conditions:
        found = found | F.coalesce(condition, F.lit(False))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--validation",
        action="store_true",
        help="also Icefall's write with one part of its validation left out at a time",
    )
    args = parser.parse_args()
    variants = {**VARIANTS, **(VALIDATION_VARIANTS if args.validation else {})}
    started = datetime.now(UTC)
    load_start = load_average()
    state = Path(tempfile.mkdtemp(prefix="icefall-write-path-"))
    print("[bench] starting Kafka ...", flush=True)
    broker = KafkaBroker(state / "kafka", heap="1g").start()
    try:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        print(f"[bench] producing {args.records:,} events ...", flush=True)
        preload(broker.bootstrap, TOPIC, args.records, SMALL_NOTE_WORDS, seed=1)
        ranges = whole_topic(broker.bootstrap, TOPIC, PARTITIONS)
        records = sum(r.end - r.start for r in ranges)
        spark = build_spark_session([CatalogConfig.embedded(state)], master="local[2]")
        jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]

        def jvm_cpu() -> float:
            return tree_cpu(jvm)

        writes = Writes(spark, broker.bootstrap, ranges)
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        wall: dict[str, list[float]] = {v: [] for v in variants}
        for round_ in range(args.rounds + 1):
            for variant in variants:
                cpu0, t0 = jvm_cpu(), time.monotonic()
                writes.run(variant)
                cpu1, t1 = jvm_cpu(), time.monotonic()
                print(
                    f"[bench] round {round_} {variant}: {cpu1 - cpu0:.2f} CPU-s, {t1 - t0:.2f} s", flush=True
                )
                if round_:
                    cpu[variant].append(cpu1 - cpu0)
                    wall[variant].append(t1 - t0)
        spark.stop()
    finally:
        broker.stop()
    write_results(args.out, report(args, started, load_start=load_start, records=records, cpu=cpu, wall=wall))
    return 0


def report(
    args: argparse.Namespace,
    started: datetime,
    *,
    load_start: str,
    records: int,
    cpu: dict[str, list[float]],
    wall: dict[str, list[float]],
) -> str:
    plain = statistics.median(cpu["plain-spark"])
    lines = [
        "# Where a batch's CPU goes: Icefall's write path beside the plain Spark write",
        "",
        f"`bench/write_path.py --records {args.records} --rounds {args.rounds}"
        f"{' --validation' if args.validation else ''}` on "
        f"{started:%Y-%m-%d %H:%M} UTC. How it is measured: the docstring of `bench/write_path.py` (one "
        f"Spark session, {records:,} ~230-byte events in {PARTITIONS} partitions, every variant writing the "
        "same offsets to a new day(ts)-partitioned table, in turn, round after round; the Spark JVM's CPU "
        "around each write; round 0 not counted).",
        "",
        "| write | CPU-s, median (min) | records per CPU-s | CPU vs plain Spark | wall, median |",
        "|---|--:|--:|--:|--:|",
    ]
    for variant, label in {**VARIANTS, **VALIDATION_VARIANTS}.items():
        if variant not in cpu:
            continue
        median = statistics.median(cpu[variant])
        lines.append(
            f"| {label} | {median:.2f} ({min(cpu[variant]):.2f}) | {records / median:,.0f} | "
            f"{median / plain:.2f}x | {statistics.median(wall[variant]):.2f} s |"
        )
    basics = machine_basics()
    basics["Load average at start / end (1/5/15 min)"] = f"{load_start} / {load_average()}"
    return "\n".join([*lines, "", *machine_section(basics)])


if __name__ == "__main__":
    sys.exit(main())
