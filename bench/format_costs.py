"""Avro, Protobuf and keyed batches: Icefall's write beside the plain Spark one, before and after, in one
Spark session.

    .venv/bin/python bench/format_costs.py [--records N] [--batches B] [--rounds R]
                                          [--only avro|keyed|protobuf] [--out FILE]

The drain benches (bench/compare.py, bench/upsert.py) run each system alone, one after the other, and their
records per CPU-s move by 10 to 30 % between runs on a shared machine. This bench runs every variant in the
same JVM, in turn, round after round (round 0 a warm-up, not counted), on the same offsets: one Kafka broker,
one Spark session (`local[2]`, Icefall's session settings, the embedded SQLite catalog). Each round splits the
topic into `--batches` batches (the same offsets for every variant), and each batch is a new Spark plan, as
ingestion's are; each batch writes into a table of its own, made before the variant's CPU is counted (as
ingestion writes into a table that exists). CPU is user + system time (/proc) around a variant's batches of
the whole process tree that does the work: this process (the PySpark driver), the Spark JVM, and the JVM's
children (PySpark's Python workers, where the Protobuf decoders run). The Kafka broker is not counted.

**Avro** (N ~230-byte bench events as Confluent-framed Avro, `common.AVRO_EVENT_SCHEMA`, schema id 1, in 3
partitions; writes into a new day(ts)-partitioned table per batch):
- **spark from_avro**: `from_avro(substring(value, 6), schema)`, `e.*`, the fanout append (the peer of
  bench/compare.py, without its streaming machinery).
- **icefall avro, before**: `BatchWriter.write_good_rows`'s Spark work with the Avro decoder of main
  before this change (its source taken from git, `--before-ref`): decode with the writer schemas met, the
  observation, the good rows, `icefall.ingest.writer.append`.
- **icefall avro, after**: the same with this tree's decoder.

**Keyed** (N ~230-byte JSON bench events over N/4 keys, Kafka key the id as text, ~1 % tombstones; a MERGE
into a new unpartitioned merge-on-read table per batch, holding every key, as a change backlog does):
- **spark MERGE**: bench/peers/spark_streaming.py's `foreachBatch` (from_json, `row_number()` per key
  by offset, one MERGE).
- **icefall upsert, max_by**: Icefall's decoder, the observation, the good rows, the last change per key by
  `max_by(struct(...), (partition, offset))` (before this change), `icefall.ingest.writer.merge`.
- **icefall upsert, row_number**: the same with this tree's `icefall.decode.decode.last_changes`.

**Protobuf** (the same N events as Confluent-framed Protobuf, `PROTOBUF_EVENT_SCHEMA` compiled to a
descriptor set, schema id 1, message index [0]; ~105 bytes each), beside the same events as Avro and as
JSON, each format on its own topic, written as the Avro cell writes (a new day(ts)-partitioned table per
batch, Icefall's decode, observation, good rows and append):
- **icefall avro** and **icefall json**: this tree's decoders (`from_avro`; `from_json`).
- **icefall protobuf, row UDF (before)**: main's `icefall.decode.protobuf` (`--before-ref`): a Python UDF,
  each record pickled to a Python worker and its struct back, each message walked field by field.
- **icefall protobuf, row UDF, this walk**: the same row UDF around this tree's `to_json` (the effect of
  the walk alone).
- **icefall protobuf, Arrow batch (after)**: this tree's `payload`: an Arrow UDF, one call per Arrow batch.

Writes bench/results/format_costs.md (or `--out`). Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import yaml
from common import (
    AVRO_EVENT_SCHEMA,
    EVENT_SCHEMA,
    PROTOBUF_EVENT_SCHEMA,
    SMALL_NOTE_WORDS,
    avro_datum,
    bench_records,
    json_value,
    load_average,
    machine_basics,
    machine_section,
    protobuf_encoder,
    tree_cpu,
    whole_topic,
    write_results,
)
from compare import preload

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.writer import Decoders, append, merge, read_kafka
from icefall.plan.offsets import OffsetRange
from icefall.spark.session import build_spark_session

sys.path.insert(0, str(Path(__file__).parent / "peers"))
from spark_streaming import COLUMNS, EVENT_DDL, upsert_batch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "format_costs.md"
PARTITIONS = 3
SCHEMA_ID = 1
AVRO_VARIANTS = {
    "spark-avro": "Spark: from_avro, fanout append",
    "icefall-avro-before": "Icefall Avro, before",
    "icefall-avro-after": "Icefall Avro, after",
}
PROTOBUF_VARIANTS = {
    "icefall-avro": "Icefall Avro (from_avro)",
    "icefall-json": "Icefall JSON (from_json)",
    "icefall-protobuf-row-before": "Icefall Protobuf, row UDF (before)",
    "icefall-protobuf-row-walk": "Icefall Protobuf, row UDF with this walk",
    "icefall-protobuf-arrow": "Icefall Protobuf, Arrow batch UDF (after)",
}
KEYED_VARIANTS = {
    "spark-merge": "Spark: foreachBatch row_number + MERGE",
    "icefall-keyed-before": "Icefall upsert, max_by (before)",
    "icefall-keyed-after": "Icefall upsert, after",
}


def avro_records(seed: int) -> Iterator[tuple[str, bytes, int]]:
    """The bench's events as Confluent-framed Avro with schema id `SCHEMA_ID` (no registry needed)."""
    parsed = fastavro.parse_schema(AVRO_EVENT_SCHEMA)
    header = b"\x00" + struct.pack(">I", SCHEMA_ID)

    def encode(event: dict[str, object], ts_ms: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, avro_datum(event, ts_ms))
        return header + out.getvalue()

    return bench_records(seed, SMALL_NOTE_WORDS, encode=encode)


def protobuf_records(seed: int, descriptors: str) -> Iterator[tuple[str, bytes, int]]:
    """The bench's events as Confluent-framed Protobuf (schema id `SCHEMA_ID`, message index [0])."""
    return bench_records(seed, SMALL_NOTE_WORDS, encode=protobuf_encoder(descriptors, SCHEMA_ID))


def row_udf_payload(to_json: Callable[[str, int, bytes], Any]) -> Callable[[Any], Any]:
    """main's `icefall.decode.protobuf.payload` (a row UDF) around `to_json`."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.decode.framing import SCHEMA_ID_COLUMN
    from icefall.decode.protobuf import PAYLOAD_COLUMN, PAYLOAD_TYPE

    def payload(writers: Any) -> Any:
        known = {i: text for i, text in writers.items() if text is not None}

        def decode(value: bytes | None, schema_id: int | None) -> Any:
            if value is None or schema_id is None or schema_id not in known:
                return None
            return to_json(known[schema_id], schema_id, bytes(value))

        udf = F.udf(decode, PAYLOAD_TYPE, useArrow=False)
        return udf(F.col("value"), F.col(SCHEMA_ID_COLUMN)).alias(PAYLOAD_COLUMN)

    return payload


def keyed_records(seed: int, keys: int) -> Iterator[tuple[str, bytes | None, int]]:
    """JSON events over `keys` keys (the id, also the Kafka key as text); ~1 % tombstones."""
    rng = random.Random(seed)
    for _key, value, ts in bench_records(seed, SMALL_NOTE_WORDS):
        i = rng.randrange(keys)
        if rng.random() < 0.01:
            yield str(i), None, ts
            continue
        event = json.loads(value)
        event["id"], event["key"] = i, f"ord-{i:09d}"
        yield str(i), json_value(event, ts), ts


def old_module(name: str, path: str, ref: str) -> Any:
    """Module `path` of git `ref` (this repository), loaded as `name`: the code before this change."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    return module


def shipped_old_module(spark: Any, name: str, path: str, ref: str) -> Any:
    """`old_module` for code that runs in PySpark's Python workers too (a UDF): written to a file that the
    driver imports and Spark ships to the workers (`addPyFile`), so that a worker imports it once and keeps
    its module-level caches across tasks, as it does the installed module."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="icefall-bench-before-"))
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    spark.sparkContext.addPyFile(str(folder / f"{name}.py"))
    return importlib.import_module(name)


def manifest(bootstrap: str, topic: str, fmt: dict[str, Any], **spec: Any) -> Any:
    doc = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": topic},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": topic},
            "format": fmt,
            "table": {"namespace": "bench", "name": topic.replace("-", "_")},
            **spec,
        },
    }
    return load_manifest(yaml.safe_dump(doc)).spec


def batches(ranges: tuple[OffsetRange, ...], count: int) -> list[tuple[OffsetRange, ...]]:
    """`ranges` cut into `count` consecutive batches (each a slice of every partition)."""
    out = []
    for b in range(count):
        out.append(
            tuple(
                OffsetRange(r.partition, r.start + (r.end - r.start) * b // count,
                            r.start + (r.end - r.start) * (b + 1) // count)
                for r in ranges
            )
        )  # fmt: skip
    return out


class Bench:
    def __init__(self, spark: Any, bootstrap: str, before_ref: str) -> None:
        self.spark = spark
        self.bootstrap = bootstrap
        self.before_ref = before_ref
        self.tables = 0
        self.ready: dict[str, list[str]] = {}  # tables made for each variant's next batches (`precreate`)
        spark.sql("CREATE NAMESPACE IF NOT EXISTS icefall.bench")

    def table(self) -> str:
        self.tables += 1
        return f"icefall.bench.t{self.tables}"

    # -- avro -------------------------------------------------------------------------------------------

    def avro_setup(self, topic: str) -> None:
        from icefall.decode import avro as avro_now

        writer = json.dumps(AVRO_EVENT_SCHEMA)

        def lookup(ids: Any) -> dict[int, str | None]:
            return {i: writer if i == SCHEMA_ID else None for i in ids}

        fmt = {"type": "avro", "registry": {"url": "http://127.0.0.1:9"}, "schema": EVENT_SCHEMA}
        self.avro_spec = manifest(self.bootstrap, topic, fmt)
        self.avro_writers = avro_now.BatchWriters({SCHEMA_ID: writer})
        self.avro_after = Decoders(self.avro_spec, schemas=lookup)
        before = old_module(
            "icefall_bench_avro_before", "operator/src/icefall/decode/avro.py", self.before_ref
        )
        saved = avro_now.AvroDecoding
        avro_now.AvroDecoding = before.AvroDecoding  # type: ignore[misc] - Decoder imports it from here
        try:
            self.avro_before = Decoders(self.avro_spec, schemas=lookup)
        finally:
            avro_now.AvroDecoding = saved  # type: ignore[misc]
        self.avro_before_writers = before.BatchWriters({SCHEMA_ID: writer})
        self.avro_schema = writer

    def avro_rows(self, variant: str, ranges: tuple[OffsetRange, ...]) -> tuple[Any, Any]:
        """`variant`'s rows of `ranges` (a plan, not run) and its observation (None: Spark's)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)
        from pyspark.sql.avro.functions import from_avro

        source = read_kafka(self.spark, self.avro_spec, ranges, {}, group_id="bench-avro", headers=False)
        if variant == "spark-avro":
            rows = source.select(from_avro(F.expr("substring(value, 6)"), self.avro_schema).alias("e"))
            return rows.select("e.*"), None
        decoders = self.avro_before if variant == "icefall-avro-before" else self.avro_after
        writers = self.avro_before_writers if variant == "icefall-avro-before" else self.avro_writers
        observation = Observation()
        decoded = decoders.good.decode(source, writers).observe(observation, *decoders.observed)
        return decoders.good.good_rows(decoded), observation

    def precreate(self, variant: str, schema: Any, count: int) -> None:
        """`count` new day(ts)-partitioned tables with `schema` for `variant`'s next batches, made before
        its CPU is counted: ingestion writes into a table that exists (a CTAS per batch from a frame made
        in Python runs a Python worker: 0.3-0.4 CPU-s a batch that is no part of a batch's cost)."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        for _ in range(count):
            name = self.table()
            empty = self.spark.createDataFrame([], schema)
            empty.writeTo(name).using("iceberg").partitionedBy(F.days("ts")).create()
            self.ready.setdefault(variant, []).append(name)

    def avro(self, variant: str, ranges: tuple[OffsetRange, ...]) -> None:
        rows, observation = self.avro_rows(variant, ranges)
        name = self.ready[variant].pop(0)
        if variant == "spark-avro":
            tasks = self.spark.sparkContext.defaultParallelism
            rows.coalesce(tasks).writeTo(name).option("distribution-mode", "none").option(
                "fanout-enabled", "true"
            ).append()
            return
        append(rows, name, sorted_table=False)
        assert observation.get["bad"] == 0, observation.get

    # -- protobuf beside avro and json -------------------------------------------------------------------

    def formats_setup(self, topics: dict[str, str], descriptors: str) -> None:
        from icefall.decode import protobuf as protobuf_now

        before = shipped_old_module(
            self.spark,
            "icefall_bench_protobuf_before",
            "operator/src/icefall/decode/protobuf.py",
            self.before_ref,
        )
        self.payloads = {
            "icefall-protobuf-row-before": before.payload,
            "icefall-protobuf-row-walk": row_udf_payload(protobuf_now.to_json),
            "icefall-protobuf-arrow": protobuf_now.payload,
        }
        self.last_tables: dict[str, str] = {}
        writers = {"avro": json.dumps(AVRO_EVENT_SCHEMA), "protobuf": descriptors}
        self.format_specs: dict[str, Any] = {}
        self.format_decoders: dict[str, Any] = {}
        self.format_writers: dict[str, Any] = {}
        for kind, topic in topics.items():
            if kind == "json":
                fmt: dict[str, Any] = {"type": "json", "schema": EVENT_SCHEMA}
            else:
                fmt = {"type": kind, "registry": {"url": "http://127.0.0.1:9"}, "schema": EVENT_SCHEMA}
            self.format_specs[kind] = manifest(self.bootstrap, topic, fmt)
            if kind == "json":
                self.format_decoders[kind] = Decoders(self.format_specs[kind])
                continue
            text = writers[kind]

            def lookup(ids: Any, text: str = text) -> dict[int, str | None]:
                return {i: text if i == SCHEMA_ID else None for i in ids}

            self.format_decoders[kind] = Decoders(self.format_specs[kind], schemas=lookup)
        from icefall.decode import avro as avro_now

        self.format_writers = {
            "avro": avro_now.BatchWriters({SCHEMA_ID: writers["avro"]}),
            "protobuf": {SCHEMA_ID: descriptors},
        }

    def formats_rows(self, variant: str, ranges: tuple[OffsetRange, ...]) -> tuple[Any, Any]:
        """`variant`'s rows of `ranges` (a plan, not run) and its observation."""
        from pyspark.sql import Observation

        from icefall.decode import decode as decode_module

        kind = variant.split("-")[1]
        spec, decoders = self.format_specs[kind], self.format_decoders[kind]
        source = read_kafka(self.spark, spec, ranges, {}, group_id=f"bench-{kind}", headers=False)
        observation = Observation()
        saved = decode_module.payload
        decode_module.payload = self.payloads.get(variant, saved)  # the Protobuf decoder of this variant
        try:
            decoded = decoders.good.decode(source, self.format_writers.get(kind))
        finally:
            decode_module.payload = saved
        return decoders.good.good_rows(decoded.observe(observation, *decoders.observed)), observation

    def formats(self, variant: str, ranges: tuple[OffsetRange, ...]) -> None:
        rows, observation = self.formats_rows(variant, ranges)
        name = self.last_tables[variant] = self.ready[variant].pop(0)
        append(rows, name, sorted_table=False)
        assert observation.get["bad"] == 0, observation.get

    def same_rows(self) -> dict[str, str]:
        """Did every variant write the same rows? (a check of the decoders, not of time): the tables of each
        variant's last batch (the same offsets of the same events, each format on its own topic), on every
        column but `_kafka`; `ts` (the produce time) only among the Protobuf variants, which share a topic."""
        rows = {
            variant: [r.asDict(recursive=True) for r in self.spark.table(table).drop("_kafka").collect()]
            for variant, table in self.last_tables.items()
        }
        base = sorted(rows["icefall-protobuf-row-before"], key=lambda r: r["id"])
        out = {}
        for variant, got in rows.items():
            same_topic = variant.startswith("icefall-protobuf")
            drop = () if same_topic else ("ts",)
            mine = [{k: v for k, v in r.items() if k not in drop} for r in sorted(got, key=lambda r: r["id"])]
            theirs = [{k: v for k, v in r.items() if k not in drop} for r in base]
            out[variant] = (
                f"{len(got):,} rows, {'equal' if mine == theirs else 'DIFFERENT'}"
                f"{'' if same_topic else ' (ts aside)'}"
            )
        return out

    # -- keyed ------------------------------------------------------------------------------------------

    def keyed_setup(self, topic: str, keys: int) -> None:
        fields = [{**f, "required": True} if f["name"] == "id" else f for f in EVENT_SCHEMA]
        self.keyed_spec = manifest(
            self.bootstrap, topic, {"type": "json", "schema": fields}, mode="upsert", key=["id"]
        )
        self.keyed_decoders = Decoders(self.keyed_spec)
        self.keys = keys
        base = self.table()
        # Every key present, as after an initial load: each batch's MERGE replaces and deletes rows.
        self.spark.range(keys).selectExpr(
            "id", "concat('ord-', lpad(cast(id as string), 9, '0')) as key", "current_timestamp() as ts",
            "'customer-00001' as customer", "1.5d as amount", "1 as items",
            "named_struct('street', '1 Main St', 'city', 'Oslo', 'country', 'NO') as shipping",
            "array('gift') as tags", "'the order' as note",
            "named_struct('partition', 0, 'offset', 0L, 'timestamp', current_timestamp()) as _kafka",
        ).writeTo(base).using("iceberg").tableProperty("format-version", "2").tableProperty(
            "write.merge.mode", "merge-on-read"
        ).tableProperty("write.delete.mode", "merge-on-read").tableProperty(
            "write.update.mode", "merge-on-read"
        ).create()  # fmt: skip
        self.keyed_base = base

    def keyed_table(self, with_kafka: bool) -> str:
        name = self.table()
        columns = ", ".join([*COLUMNS, *(["_kafka"] if with_kafka else [])])
        self.spark.sql(
            f"CREATE TABLE {name} USING iceberg TBLPROPERTIES ('format-version'='2', "
            "'write.merge.mode'='merge-on-read', 'write.delete.mode'='merge-on-read', "
            f"'write.update.mode'='merge-on-read') AS SELECT {columns} FROM {self.keyed_base}"
        )
        return name

    def keyed(self, variant: str, ranges: tuple[OffsetRange, ...], name: str) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.decode.decode import last_changes

        source = read_kafka(self.spark, self.keyed_spec, ranges, {}, group_id="bench-keyed", headers=False)
        if variant == "spark-merge":
            batch = source.select(
                "key", "value", "offset", F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e")
            )
            upsert_batch(name, "id")(batch, 0)
            return
        decoders = self.keyed_decoders
        observation = Observation()
        decoded = decoders.good.decode(source).observe(observation, *decoders.observed)
        rows = decoders.good.good_rows(decoded)
        last = max_by_last_changes if variant == "icefall-keyed-before" else last_changes
        merge(last(rows, ["id"]), name, ["id"], view="bench_changes")
        assert observation.get["records"] > 0


def max_by_last_changes(changes: Any, key: list[str]) -> Any:
    """`icefall.decode.decode.last_changes` before this change (upsert, no sequenceBy): `max_by`."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    order = F.struct(F.col("_kafka.partition"), F.col("_kafka.offset"))
    last = changes.groupBy(*key).agg(F.max_by(F.struct(*changes.columns), order).alias("last"))
    return last.select("last.*")


def measure(
    variants: dict[str, str],
    rounds: int,
    run: Callable[[str], None],
    jvm_cpu: Callable[[], float],
    prepare: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """CPU-s of each variant per round (round 0 not kept); the variants' order turns each round.
    `prepare(variant)` runs before each of its rounds, not counted."""
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    for round_ in range(rounds + 1):
        for variant in order:
            if prepare is not None:
                prepare(variant)
            cpu0, t0 = jvm_cpu(), time.monotonic()
            run(variant)
            used = jvm_cpu() - cpu0
            print(
                f"[bench] round {round_} {variant}: {used:.2f} CPU-s, {time.monotonic() - t0:.2f} s",
                flush=True,
            )
            if round_ and used > 0:  # a process of the tree that ends takes its CPU with it: not a figure
                cpu[variant].append(used)
        order = order[1:] + order[:1]
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=4, help="batches per round (each a new plan)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (after one warm-up round)")
    parser.add_argument("--only", choices=["avro", "keyed", "protobuf"])
    parser.add_argument("--before-ref", default="main", help="git ref of the code before the change")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = datetime.now(UTC)
    load_start = load_average()
    machine = machine_basics()
    state = Path(tempfile.mkdtemp(prefix="icefall-format-costs-"))
    print("[bench] starting Kafka ...", flush=True)
    broker = KafkaBroker(state / "kafka", heap="1g").start()
    results: dict[str, dict[str, list[float]]] = {}
    same_rows: dict[str, str] = {}
    try:
        spark = build_spark_session([CatalogConfig.embedded(state)], master="local[2]")
        jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
        bench = Bench(spark, broker.bootstrap, args.before_ref)

        def jvm_cpu() -> float:
            own = resource.getrusage(resource.RUSAGE_SELF)
            return tree_cpu(jvm) + own.ru_utime + own.ru_stime

        if args.only in (None, "avro"):
            broker.create_topic("avro", partitions=PARTITIONS)
            preload(broker.bootstrap, "avro", args.records, SMALL_NOTE_WORDS, 1, records=avro_records(1))
            cut = batches(whole_topic(broker.bootstrap, "avro", PARTITIONS), args.batches)
            bench.avro_setup("avro")
            avro_schemas = {v: bench.avro_rows(v, cut[0])[0].schema for v in AVRO_VARIANTS}

            def avro_round(variant: str) -> None:
                for ranges in cut:
                    bench.avro(variant, ranges)

            def avro_tables(variant: str) -> None:
                bench.precreate(variant, avro_schemas[variant], len(cut))

            results["avro"] = measure(AVRO_VARIANTS, args.rounds, avro_round, jvm_cpu, avro_tables)
        if args.only in (None, "keyed"):
            keys = max(args.records // 4, 1)
            broker.create_topic("keyed", partitions=PARTITIONS)
            preload(
                broker.bootstrap, "keyed", args.records, SMALL_NOTE_WORDS, 2, records=keyed_records(2, keys)
            )
            cut = batches(whole_topic(broker.bootstrap, "keyed", PARTITIONS), args.batches)
            bench.keyed_setup("keyed", keys)

            def keyed_round(variant: str) -> None:
                name = bench.keyed_table(with_kafka=variant != "spark-merge")
                cpu0 = jvm_cpu()
                for ranges in cut:
                    bench.keyed(variant, ranges, name)
                print(f"[bench]   {variant} batches alone: {jvm_cpu() - cpu0:.2f} CPU-s", flush=True)

            results["keyed"] = measure(KEYED_VARIANTS, args.rounds, keyed_round, jvm_cpu)
        if args.only in (None, "protobuf"):
            from icefall.kafka.protobuf import descriptor_set_text

            descriptors = descriptor_set_text(PROTOBUF_EVENT_SCHEMA)
            topics = {"avro": "fmt-avro", "json": "fmt-json", "protobuf": "fmt-protobuf"}
            encoded = {"avro": avro_records(1), "json": None, "protobuf": protobuf_records(1, descriptors)}
            cuts = {}
            for kind, topic in topics.items():
                broker.create_topic(topic, partitions=PARTITIONS)
                preload(broker.bootstrap, topic, args.records, SMALL_NOTE_WORDS, 1, records=encoded[kind])
                cuts[kind] = batches(whole_topic(broker.bootstrap, topic, PARTITIONS), args.batches)
            bench.formats_setup(topics, descriptors)
            format_schemas = {
                v: bench.formats_rows(v, cuts[v.split("-")[1]][0])[0].schema for v in PROTOBUF_VARIANTS
            }

            def formats_round(variant: str) -> None:
                for ranges in cuts[variant.split("-")[1]]:
                    bench.formats(variant, ranges)

            def formats_tables(variant: str) -> None:
                bench.precreate(variant, format_schemas[variant], len(cuts[variant.split("-")[1]]))

            results["protobuf"] = measure(
                PROTOBUF_VARIANTS, args.rounds, formats_round, jvm_cpu, formats_tables
            )
            same_rows = bench.same_rows()
        spark.stop()
    finally:
        broker.stop()
    write_results(args.out, report(args, started, load_start, machine, results, same_rows=same_rows))
    return 0


def report(
    args: argparse.Namespace,
    started: datetime,
    load_start: str,
    machine: dict[str, str],
    results: dict[str, dict[str, list[float]]],
    *,
    same_rows: dict[str, str],
) -> str:
    lines = [
        "# Avro, Protobuf and keyed batches: Icefall beside plain Spark, before and after (one session)",
        "",
        f"`bench/format_costs.py --records {args.records} --batches {args.batches} --rounds {args.rounds}"
        f"{f' --only {args.only}' if args.only else ''}` "
        f"on {started:%Y-%m-%d %H:%M} UTC. How it is measured: the docstring of `bench/format_costs.py`.",
    ]
    for kind, labels, peer in (
        ("avro", AVRO_VARIANTS, "spark-avro"),
        ("keyed", KEYED_VARIANTS, "spark-merge"),
        ("protobuf", PROTOBUF_VARIANTS, "icefall-avro"),
    ):
        cpu = results.get(kind)
        if not cpu:
            continue
        base = statistics.median(cpu[peer])
        lines += [
            "",
            f"## {kind}",
            "",
            f"| variant | CPU-s per round, median (min) | records per CPU-s | vs {labels[peer]} "
            "(records per CPU-s) | CPU-s of each round |",
            "|---|--:|--:|--:|---|",
        ]
        for variant, label in labels.items():
            median = statistics.median(cpu[variant])
            rounds = ", ".join(f"{c:.2f}" for c in cpu[variant])
            lines.append(
                f"| {label} | {median:.2f} ({min(cpu[variant]):.2f}) | {args.records / median:,.0f} | "
                f"{base / median:.2f}x | {rounds} |"
            )
        if kind == "protobuf" and same_rows:
            lines += ["", "Same rows (the last batch of each variant, against the row UDF's):", ""]
            lines += [f"- {PROTOBUF_VARIANTS[v]}: {text}" for v, text in same_rows.items()]
    machine["Load average at start / end (1/5/15 min)"] = f"{load_start} / {load_average()}"
    return "\n".join([*lines, "", *machine_section(machine)])


if __name__ == "__main__":
    sys.exit(main())
