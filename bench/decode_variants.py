"""The decode alone, measured: Icefall's JSON decoder beside cheaper candidates, on the same Kafka rows.

    .venv/bin/python bench/decode_variants.py [--records N] [--large-records N] [--rounds R] [--out FILE]

bench/write_path.py's method (one Spark session, `local[2]`, Icefall's session settings; the same offsets
read by each variant in turn, round after round, round 0 a warm-up not counted; the CPU of the Spark JVM
and its child processes, the Python workers included, around each run), but every variant ends in Spark's
`noop` sink, so the numbers are the read and the decode without the Parquet write and no commit.

- **kafka read only**: `partition, offset, value` of the source: the floor every decoder pays.
- **icefall**: what a clean batch decodes (`Decoders.good`: the UTF-8 check, the cast, typed `from_json`,
  the bad flag, the batch's observation, the good rows with `_kafka`).
- **from_json only**: `from_json(cast(value as string))` and `_kafka`; nothing checked or observed.
- **arrow (prototype)**: `mapInArrow` over `value, partition, offset, timestamp`: the batch's values joined
  by newlines into one buffer and parsed by pyarrow's C++ JSON reader with the table's schema; a batch the
  reader rejects (or with a null value or a newline in a value) falls back to one read per record, and a
  record that fails alone comes out with every column null (a prototype: no reasons, no dead letters).
  Not Icefall's semantics (Spark's JSON reader accepts things pyarrow's does not, e.g. numeric strings
  for numbers): only its cost is measured here. mapInArrow runs the function in PySpark's Python workers
  (`python3` on PATH must have pyarrow: run with the venv's bin first on PATH).

Events: the bench's seeded ~230 B and ~1 KB events (`common.bench_records`), 3 partitions. Writes
bench/results/decode_variants.md. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from common import (
    EVENT_SCHEMA,
    LARGE_NOTE_WORDS,
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
from icefall.ingest.writer import Decoders, read_kafka
from icefall.plan.offsets import OffsetRange
from icefall.spark.session import build_spark_session

sys.path.insert(0, str(Path(__file__).parent / "peers"))
from spark_streaming import EVENT_DDL  # the peer's schema of the events (bench/peers/)

RESULTS = Path(__file__).parent / "results" / "decode_variants.md"
PARTITIONS = 3
VARIANTS = {
    "read": "kafka read only (`partition, offset, value`)",
    "icefall": "icefall: UTF-8 check + cast + typed from_json + bad flag + observation + `_kafka`",
    "icefall-no-utf8": "icefall without the UTF-8 check (is_valid_utf8 -> true)",
    "icefall-no-observe": "icefall without the batch's observation",
    "from-json": "from_json(cast(value as string)) + `_kafka`, nothing checked",
    "arrow": "arrow prototype: mapInArrow + pyarrow.json, per-record fallback + `_kafka`",
}


def arrow_decoder(ddl: str) -> Any:
    """The mapInArrow function: pyarrow's JSON reader over each batch's values, with the table's schema."""

    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    parsed = _parse_datatype_string(ddl)  # on the driver: it needs the session
    assert isinstance(parsed, StructType)
    schema = to_arrow_schema(parsed, timestamp_utc=True, prefers_large_types=False)

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        read = pj.ReadOptions(use_threads=False, block_size=64 << 20)

        def parse(buffer: Any) -> Any:
            return pj.read_json(pa.BufferReader(buffer), read_options=read, parse_options=options)

        def one_by_one(values: Any) -> Any:
            rows = []
            for value in values.to_pylist():
                try:
                    rows.append(parse(pa.py_buffer(value)).to_batches()[0].to_pylist()[0])
                except Exception:
                    rows.append({})  # every column null
            return pa.Table.from_pylist(rows, schema=schema)

        for batch in batches:
            values = batch.column("value")
            table = None
            if values.null_count == 0 and len(values):
                joined = pc.binary_join_element_wise(values, pa.scalar(b""), b"\n")
                offsets = pa.Array.from_buffers(pa.int32(), len(joined) + 1, [None, joined.buffers()[1]],
                                                offset=joined.offset)  # fmt: skip
                body = joined.buffers()[2][offsets[0].as_py() : offsets[-1].as_py()]
                newlines = pc.sum(pc.count_substring(values.cast(pa.binary()), b"\n")).as_py() or 0
                if newlines == 0:
                    try:
                        table = parse(body)
                    except Exception:
                        table = None
                    if table is not None and table.num_rows != len(values):
                        table = None
            if table is None:
                table = one_by_one(values)
            kafka = pa.StructArray.from_arrays(
                [batch.column("partition"), batch.column("offset"), batch.column("timestamp")],
                names=["partition", "offset", "timestamp"],
            )
            columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
            yield pa.RecordBatch.from_arrays([*columns, kafka], names=[*table.column_names, "_kafka"])

    return decode


class Runs:
    def __init__(self, spark: Any, bootstrap: str, topic: str, ranges: tuple[OffsetRange, ...]) -> None:
        manifest = {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "decode"},
            "spec": {
                "source": {"bootstrapServers": bootstrap, "topic": topic},
                "format": {"type": "json", "schema": EVENT_SCHEMA},
                "table": {"namespace": "bench", "name": "t"},
            },
        }
        self.spec = load_manifest(yaml.safe_dump(manifest)).spec
        self.spark = spark
        self.ranges = ranges
        self.decoders = Decoders(self.spec)
        self.no_utf8 = self._without_utf8_check()
        self.arrow = arrow_decoder(EVENT_DDL)
        self.arrow_schema = (
            f"{EVENT_DDL}, _kafka STRUCT<partition: INT, offset: BIGINT, timestamp: TIMESTAMP>"
        )

    def _without_utf8_check(self) -> Decoders:
        """Icefall's decoders with `is_valid_utf8` answering true: what the check costs (a measurement
        only: invalid UTF-8 would then be ingested with replacement characters)."""
        from icefall.decode import decode as decode_module

        functions = decode_module.F
        original = functions.is_valid_utf8
        functions.is_valid_utf8 = lambda _column: functions.lit(True)
        try:
            return Decoders(self.spec)
        finally:
            functions.is_valid_utf8 = original

    def rows(self, variant: str) -> Any:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        source = read_kafka(self.spark, self.spec, self.ranges, {}, group_id="bench-decode", headers=False)
        kafka = F.struct("partition", "offset", "timestamp").alias("_kafka")
        if variant == "read":
            return source.select("partition", "offset", "value")
        if variant == "from-json":
            return source.select(
                F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e"), kafka
            ).select("e.*", "_kafka")
        if variant == "arrow":
            # PySpark checks for pandas before any pandas_udf-based API, mapInArrow included, though
            # mapInArrow never uses it; pandas is not installed here (not a dependency): skip the check.
            import pyspark.sql.pandas.functions as pandas_functions
            import pyspark.sql.udf as spark_udf

            pandas_functions.require_minimum_pandas_version = lambda: None
            spark_udf.require_minimum_pandas_version = lambda: None  # type: ignore[attr-defined]
            return source.select("value", "partition", "offset", "timestamp").mapInArrow(
                self.arrow, self.arrow_schema
            )
        decoders = self.no_utf8 if variant == "icefall-no-utf8" else self.decoders
        decoded = decoders.good.decode(source)
        if variant != "icefall-no-observe":
            decoded = decoded.observe(Observation(), *decoders.observed)
        return decoders.good.good_rows(decoded)


def measure(
    spark: Any, broker: KafkaBroker, topic: str, rounds: int, jvm_cpu: Any
) -> tuple[int, dict[str, list[float]], dict[str, Any]]:
    ranges = whole_topic(broker.bootstrap, topic, PARTITIONS)
    records = sum(r.end - r.start for r in ranges)
    runs = Runs(spark, broker.bootstrap, topic, ranges)
    # the same rows out of each decoder (a check of the prototype, not of time)
    check = {v: runs.rows(v).where("id = 7").drop("_kafka").collect() for v in ("icefall", "arrow")}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(rounds + 1):
        for variant in VARIANTS:
            cpu0, t0 = jvm_cpu(), time.monotonic()
            runs.rows(variant).write.format("noop").mode("overwrite").save()
            cpu1, t1 = jvm_cpu(), time.monotonic()
            print(
                f"[bench] {topic} round {round_} {variant}: {cpu1 - cpu0:.2f} CPU-s, {t1 - t0:.2f} s",
                flush=True,
            )
            if round_:
                cpu[variant].append(cpu1 - cpu0)
    return records, cpu, check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--large-records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds (after one warm-up round)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = datetime.now(UTC)
    load_start = load_average()
    state = Path(tempfile.mkdtemp(prefix="icefall-decode-"))
    broker = KafkaBroker(state / "kafka", heap="1g").start()
    results: dict[str, tuple[int, dict[str, list[float]], dict[str, Any]]] = {}
    try:
        sizes = [
            ("~230 B", args.records, SMALL_NOTE_WORDS, 1),
            ("~1 KB", args.large_records, LARGE_NOTE_WORDS, 2),
        ]
        for _, records, words, seed in sizes:
            topic = f"decode-{words}"
            broker.create_topic(topic, partitions=PARTITIONS)
            preload(broker.bootstrap, topic, records, words, seed)
        spark = build_spark_session([CatalogConfig.embedded(state)], master="local[2]")
        try:
            jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]

            def jvm_cpu() -> float:
                return tree_cpu(jvm)

            for size, _, words, _ in sizes:
                results[size] = measure(spark, broker, f"decode-{words}", args.rounds, jvm_cpu)
        finally:
            spark.stop()
    finally:
        broker.stop()
    lines = [
        "# The decode alone: Icefall's JSON decoder beside cheaper candidates (noop sink)",
        "",
        f"`bench/decode_variants.py --records {args.records} --large-records {args.large_records} --rounds "
        f"{args.rounds}` on {started:%Y-%m-%d %H:%M} UTC. Method: the docstring of "
        "`bench/decode_variants.py` (one Spark session, `local[2]`, the same offsets per variant, in turn, "
        "round after round; CPU of the Spark JVM and its Python workers; round 0 not counted). **Shared "
        "machine**: other engineers' work ran meanwhile (load average below); the variants are interleaved, "
        "so they share the load.",
        "",
        "| events | variant | CPU-s, median (min) | records per CPU-s | decode CPU-s (minus read) "
        "| decode vs icefall |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for size, (records, cpu, _) in results.items():
        read = statistics.median(cpu["read"])
        base = statistics.median(cpu["icefall"]) - read
        for variant, label in VARIANTS.items():
            median = statistics.median(cpu[variant])
            decode = median - read
            ratio = f"{decode / base:.2f}x" if variant != "read" and base > 0 else ""
            lines.append(
                f"| {size} ({records:,}) | {label} | {median:.2f} ({min(cpu[variant]):.2f}) | "
                f"{records / median:,.0f} | {decode:.2f} | {ratio} |"
            )
    lines += ["", "Same rows? (the event with id 7, `_kafka` left out):", ""]
    for size, (_, _, check) in results.items():
        same = [r.asDict(recursive=True) for r in check["icefall"]] == [
            r.asDict(recursive=True) for r in check["arrow"]
        ]
        lines.append(f"- {size}: icefall and arrow {'equal' if same else 'DIFFER: ' + repr(check)}")
    basics = machine_basics()
    basics["Load average at start / end (1/5/15 min)"] = f"{load_start} / {load_average()}"
    write_results(args.out, "\n".join([*lines, "", *machine_section(basics)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
