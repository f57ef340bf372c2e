"""Side-by-side benchmark: Icefall against its peers on one Kafka broker, one kind of catalog.

    .venv/bin/python bench/compare.py [--records N] [--large-records N] [--seconds S] [--quick]
                                      [--systems icefall,icefall-nodlq,icefall-nomaint,icefall-serial,
                                                 spark,icefall-jsonschema,spark-jsonschema,icefall-avro,
                                                 spark-avro,icefall-protobuf,connect,floor]
                                      [--live-systems icefall,icefall-nomaint,icefall-3s,spark,connect]
    .venv/bin/python bench/compare.py --growth [--records N] [--warmup-records N] [--systems icefall,spark]
                                      [--growth-sizes small,1k,4k] [--growth-partitions 3,48] [--out FILE]
    .venv/bin/python bench/compare.py --sustained [--records N] [--large-records N] [--systems ...]
                                      [--out FILE]
    (or: make bench / make bench-growth / make bench-sustained BENCH_ARGS="...")

One Kafka broker (the devstack's) is started once. Events are the seeded ones of `common.bench_records`
(9 fields: a timestamp, a string key, a nested struct, a list, a free-text note; ~230 bytes of JSON, and a
~1 KB variant with a longer note), 3 partitions, keyed by the string key, the Kafka timestamp equal to the
event's `ts`. Each system runs alone, pinned to core 1 with the broker (and this process, which produces
and polls) on core 0 when the machine has 2 or more cores. Every peer is set for the same freshness target
`F` (`--freshness-target`, 10 s): its trigger or commit interval is Icefall's cadence once caught up,
`F/2` (`plan.batching.caught_up_interval`).

- **icefall**: `icefall run -f <manifest> --state-dir <dir>` as a subprocess (embedded default: local
  Spark `local[2]`, SQLite catalog, local warehouse, in-process compaction on its thread), target `F`.
  **icefall-nodlq**: the same without the dead-letter table (what validation costs).
  **icefall-nomaint**: the same with `--no-maintenance` (what in-process compaction and expiry cost).
  **icefall-serial**: the same with `batch.pipelined: false` (each commit before the next batch is read;
  what pipelining saves, in a backlog taken in several batches).
  **icefall-3s** (live phase only): the same at a 3 s target.
- **spark**: `bench/peers/spark_streaming.py`, a plain Structured Streaming job (Kafka → from_json →
  writeStream iceberg, processingTime trigger `F/2`, `maxOffsetsPerTrigger` unlimited unless
  `--spark-max-offsets`, a checkpoint folder), same jars. Its Kafka consumer gets Icefall's reader
  defaults (`kafka.fetch.max.wait.ms=10`, `kafka.max.poll.records=5000`: `SPARK_CONSUMER_DEFAULTS` of
  icefall.ingest.engine); with the client's 500 ms default a caught-up partition makes each read wait.
- **icefall-avro**, **spark-avro** (measures 1 to 5 only, no live phase): the same events as
  Confluent-framed Avro (`common.AVRO_EVENT_SCHEMA`: the 9 fields, `ts` a timestamp-micros, `shipping` a
  nested record, `tags` an array), encoded by confluent-kafka's `AvroSerializer`, which registers the
  writer schema in a schema registry the bench starts beside the broker (Apicurio,
  `icefall.devstack.registry`, core 0, its CPU not counted; only when a registry format runs).
  The backlog is encoded before its clock starts into a spool file in the state folder
  (`common.spooled`: memory bounded whatever the backlog), then read back and produced as fast as the
  client goes (encoding as it produces, the serializer was slower than the systems drain), so its `ts` is
  when it was encoded. Icefall:
  `spec.format.type: avro` with `registry.url` (each batch looks up its schema ids; the inline `schema`
  is the JSON table's, so the tables are the same). Spark: the peer with `--format avro`,
  `from_avro(expr("substring(value, 6)"), schema_json)` with the writer schema as JSON, as a Spark user
  writes it without a registry client.
- **icefall-jsonschema**, **spark-jsonschema** (measures 1 to 5 only, no live phase): the same JSON events
  as Confluent-framed JSON Schema records (`common.JSON_SCHEMA_EVENT_SCHEMA` registered in the bench's
  registry as `<topic>-value`, schema type JSON; each value the magic byte, that id, then the JSON text:
  `common.json_schema_encoder`, as the Kafka clients' JSON Schema serializers frame it). Icefall:
  `spec.format.type: jsonSchema` with `registry.url` (each batch checks its records' ids against the
  registry), the JSON table's inline `schema`. Spark: the peer with `--format jsonschema`,
  `from_json(expr("substring(value, 6)").cast("string"), ddl)`, as a Spark user reads such a topic.
- **icefall-protobuf** (measures 1 to 5 only; not in the default `--systems`): the same events as
  Confluent-framed Protobuf (`common.PROTOBUF_EVENT_SCHEMA`, ~105 bytes a small value): its `.proto` text
  registered in the bench's registry as `<topic>-value` (as a Java serializer registers it), each event
  framed with that id and message index [0] as it is produced (`common.protobuf_encoder`); Icefall with
  `spec.format.type: protobuf` and `registry.url`, the JSON table's inline `schema`. No Spark peer:
  spark-protobuf (`from_protobuf`) is not served by the package registry this project builds from.
- **connect**: Kafka Connect standalone with the Apache Iceberg sink connector (jars from
  hack/kafka-connect/pom.xml), commit interval `F/2`, its control topic created first.
- **floor**: `bench/peers/floor.py` on one core: confluent-kafka → json → pyarrow Parquet files, no
  table, no commits.

Every Iceberg system writes the same table (`bench.events`, the events' 9 columns, all optional,
partitioned by day(ts); Icefall adds its `_kafka` column) into its own SQLite catalog (named `icefall`)
and warehouse folder; the peers' table is created up front with pyiceberg.

Measures, per system:
1. Throughput draining a backlog (small and 1 KB events, a fresh topic per system): the system starts on
   an empty topic fed by a trickle of `--trickle` records/s (ids from TRICKLE_FIRST_ID) and makes its
   first commit ("start-up"); then a warm-up backlog (`--warmup-records`, 100,000: JIT-compiled code
   and caches, as in a system that has run for a while; not measured) is produced and committed, then
   the backlog is produced as fast as the client goes. "drain" = from
   the first backlog record produced to the commit (snapshot log: when `main` moved; the floor: when a
   file was closed) that completed the backlog; records/s = backlog / drain, whatever the number of
   commits. The trickle goes on meanwhile because the Iceberg sink (1.11.0) answers its coordinator's
   commit requests only while records arrive, so on a backlog that stops growing it never commits the
   tail (seen here; compare apache/iceberg#17811). Commit-interval systems are penalised by up to one
   interval at the end: that is their cost of visibility, not hidden.
   The CPU probe (`common.cpu_probe_seconds`, in this process) and the load averages are taken just
   before the backlog's first record and once the completing commit is seen (`common.Gauge`).
2. Exactly once by content: every backlog event in the table once, and each column but `ts` equal to
   the event produced (regenerated from its seed): "exact", or the counts of duplicates, missing and
   different rows. Rows are read a batch at a time and compared by a 64-bit digest against one per
   event (`audit_rows`), so memory stays bounded (9 bytes an event) on a backlog of millions.
3. CPU: user + system seconds of the system's whole process tree (/proc; the broker is not counted) over
   the drain -> records per CPU-second, and **CPU-s per GiB**: those CPU-seconds / GiB (2^30 bytes) of
   the backlog's Kafka record keys and values as produced (`common.Tally`, `common.cpu_per_gib`; no
   headers, timestamps or batch framing; warm-up and trickle not counted) = 2^30 / (records per CPU-s x
   mean key + value bytes of a record).
4. Peak RSS: the largest sum of resident memory of the tree, sampled every 0.5 s.
5. Data files: `total-data-files` of the final snapshot (the floor: files written).
6. Freshness at half of Icefall's drain rate (the small events): a fresh topic per system, the live
   producer and the system started together. Warm-up: until the newest commit holds every record
   acknowledged (freshness target + commit interval) seconds earlier (the start-up backlog is gone), at
   most half of `--timeout`. Then a window of `--seconds` (at least one commit interval for
   the Connect sink); each record produced in it gets freshness = when `main` first held it (snapshot log
   time of the snapshot that added its data file) - its Kafka produce timestamp (= its `ts`). p50/p99
   over those records, and per commit over time (the chart). After the window the producer falls back to
   the trickle (the Iceberg sink would not commit the tail otherwise) until everything produced by the
   window's end is committed. The floor has no commits: n/a.

Writes bench/results/compare.md and compare.png. Nothing asserts on time. One run on a shared machine:
the load averages at start and end are in the report; compare runs only at similar loads.

`--growth` (a growth table): only measure 1 (drain, exactly once by content, CPU, peak RSS), for
`--systems` (default icefall,spark), over a grid of event sizes (`--growth-sizes`: ~230 B, ~1 KB and ~4 KB,
`common.XL_NOTE_WORDS`) x partitions (`--growth-partitions`: 3 and 48). The backlog keeps its bytes about
equal: `--records` small events, a quarter as many of ~1 KB, a sixteenth of ~4 KB (200,000 / 50,000 /
12,500 by default), and the warm-up `--warmup-records` is divided the same way. In each cell the systems
run one after another on fresh topics. Writes one table (per system records/s, records per CPU-s, peak RSS,
commits while draining, the audit; Icefall/Spark in records per CPU-s) to `--out`, default
bench/results/growth.md.

`--sustained` (issue #45 item 5): only measure 1, on a long stream, where the default 200,000 records drain
in ~10 s, fixed costs weigh and cells swing by ±30 % between runs: `--records` (default 5,000,000) small
events per system, 3 partitions, a 1 KB backlog only with `--large-records`, `--systems` default
icefall,spark,icefall-jsonschema,spark-jsonschema,icefall-avro,spark-avro,icefall-protobuf, `--timeout`
3600 s per phase. The producer (~36-58k
small JSON events/s alone on core 0 here) takes ~1.5-2.5 min for 5M records and streams them (never a list
in memory); the Avro backlog is spooled to disk first (~0.6 GB for 5M). Writes the drain table (records/s,
records per CPU-s, CPU-s per GiB, ...), each drain's bytes, CPU probe and load averages at start and end,
and Icefall/Spark per format (JSON, JSON Schema, Avro) to `--out`, default bench/results/sustained.md
(compare.md is left as it is).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from common import (
    AVRO_EVENT_SCHEMA,
    EVENT_SCHEMA,
    JSON_SCHEMA_EVENT_SCHEMA,
    LARGE_NOTE_WORDS,
    PROTOBUF_EVENT_SCHEMA,
    SMALL_NOTE_WORDS,
    XL_NOTE_WORDS,
    Encode,
    Gauge,
    Tally,
    TreeMonitor,
    avro_datum,
    bench_event,
    bench_records,
    cpu_per_gib,
    json_schema_encoder,
    json_value,
    load_average,
    machine_basics,
    machine_section,
    percentile,
    protobuf_encoder,
    spooled,
    write_results,
)
from confluent_kafka import Producer, libversion
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table.snapshots import Operation

from icefall.api import load_manifest, to_iceberg_schema
from icefall.catalog import CatalogConfig
from icefall.catalog.layout import partition_spec
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.procs import ManagedProcess, free_port, tail
from icefall.devstack.registry import SchemaRegistryServer
from icefall.devstack.tools import jar_files, repo_root, tool_dir
from icefall.ingest.engine import SPARK_CONSUMER_DEFAULTS as SPARK_CONSUMER

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PEERS = ROOT / "bench" / "peers"
PARTITIONS = 3
TABLE = ("bench", "events")
# Ids of the trickle produced during the backlog phases (the backlog's ids are below it).
TRICKLE_FIRST_ID = 1_000_000_000
# Ids of the warm-up backlog (above the trickle's, so neither counts as backlog).
WARMUP_FIRST_ID = 2_000_000_000
SYSTEMS = (
    "icefall", "icefall-nodlq", "icefall-nomaint", "icefall-serial", "spark", "icefall-jsonschema",
    "spark-jsonschema", "icefall-avro", "spark-avro", "icefall-protobuf", "connect", "floor",
)  # fmt: skip
#: The default systems of a run (icefall-protobuf has no Spark peer: `--systems` adds it).
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if s != "icefall-protobuf")
#: Systems fed Confluent-framed JSON Schema records through the schema registry.
JSON_SCHEMA_SYSTEMS = ("icefall-jsonschema", "spark-jsonschema")
#: Systems fed Confluent-framed Avro through the schema registry.
AVRO_SYSTEMS = ("icefall-avro", "spark-avro")
#: Systems fed Confluent-framed Protobuf through the schema registry (the others: JSON text).
PROTOBUF_SYSTEMS = ("icefall-protobuf",)
REGISTRY_SYSTEMS = JSON_SCHEMA_SYSTEMS + AVRO_SYSTEMS + PROTOBUF_SYSTEMS
#: `--sustained`'s systems: each format's Icefall beside its Spark peer (Protobuf has none: the docstring).
SUSTAINED_SYSTEMS = (
    "icefall", "spark", "icefall-jsonschema", "spark-jsonschema", "icefall-avro", "spark-avro",
    "icefall-protobuf",
)  # fmt: skip
#: `--sustained`'s backlog unless `--records` says otherwise.
SUSTAINED_RECORDS = 5_000_000
#: Systems of the live phase; `icefall-3s` is Icefall at a 3 s freshness target (the others run at
#: `--freshness-target`).
LIVE_SYSTEMS = ("icefall", "icefall-nomaint", "icefall-3s", "spark", "connect")
#: Growth mode's event sizes: (label, note words, seed, backlog divisor). The divisor keeps the backlog's
#: bytes about equal across sizes: `--records` small events, a quarter as many of ~1 KB, a sixteenth of ~4 KB.
GROWTH_SIZES = {
    "small": ("~230 B", SMALL_NOTE_WORDS, 1, 1),
    "1k": ("~1 KB", LARGE_NOTE_WORDS, 2, 4),
    "4k": ("~4 KB", XL_NOTE_WORDS, 4, 16),
}
GROWTH_PARTITIONS = (3, 48)
GROWTH_SYSTEMS = ("icefall", "spark")
LABELS = {
    "icefall": "Icefall (icefall run, embedded)",
    "icefall-nodlq": "Icefall without its dead-letter table",
    "icefall-nomaint": "Icefall without in-process maintenance",
    "icefall-serial": "Icefall without pipelining",
    "icefall-3s": "Icefall at a 3 s freshness target",
    "spark": "Spark Structured Streaming → Iceberg",
    "icefall-jsonschema": "Icefall, JSON Schema through the registry",
    "spark-jsonschema": "Spark Structured Streaming, JSON Schema framing → Iceberg",
    "icefall-avro": "Icefall, Avro through the registry",
    "spark-avro": "Spark Structured Streaming, from_avro → Iceberg",
    "icefall-protobuf": "Icefall, Protobuf through the registry",
    "connect": "Iceberg Kafka Connect sink",
    "floor": "floor: confluent-kafka → pyarrow Parquet",
}


def say(text: str) -> None:
    print(f"[bench] {time.strftime('%H:%M:%S')} {text}", flush=True)


def now_ms() -> int:
    return int(time.time() * 1000)


# --- commits as the table shows them -----------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    visible_ms: int  # when main moved to it (snapshot log), or when the floor closed the file
    total_records: int
    total_files: int
    snapshot_id: int = 0


def table_commits(catalog: CatalogConfig) -> list[Commit]:
    """Main's history with record and file totals; [] while the table or its first snapshot is missing."""
    try:
        table = catalog.pyiceberg().load_table(TABLE)
    except Exception:  # not created yet (Icefall creates its own), or SQLite busy: try on the next poll
        return []
    out = []
    for entry in table.metadata.snapshot_log:
        snapshot = table.snapshot_by_id(entry.snapshot_id)
        if snapshot is None or snapshot.summary is None:
            continue
        summary = snapshot.summary
        out.append(
            Commit(
                entry.timestamp_ms,
                int(summary.get("total-records") or 0),
                int(summary.get("total-data-files") or 0),
                entry.snapshot_id,
            )
        )
    return out


FILE_LINE = re.compile(r"^FILE (\d+) (\d+) (\S+)$", re.M)


def floor_commits(log: Path) -> list[Commit]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [Commit(int(ms), int(total), n + 1) for n, (ms, total, _) in enumerate(FILE_LINE.findall(text))]


# --- the systems -------------------------------------------------------------------------------------


@dataclass
class Run:
    """One system running against one topic, in its own folder."""

    system: str
    topic: str
    work: Path
    proc: ManagedProcess
    monitor: TreeMonitor
    started: float  # time.time()
    catalog: CatalogConfig | None  # None: the floor

    def commits(self) -> list[Commit]:
        if self.catalog is None:
            return floor_commits(self.proc.log_path)
        return table_commits(self.catalog)

    def stop(self) -> None:
        self.monitor.sample()
        self.monitor.stop()
        self.proc.stop(grace=20)


@dataclass
class Context:
    broker: KafkaBroker
    args: argparse.Namespace
    state: Path
    pin: list[str]  # the taskset prefix for systems, [] on a 1-core machine
    settings: dict[str, dict[str, str]] = field(default_factory=dict)
    registry: SchemaRegistryServer | None = None  # running when a registry format's system is among --systems


def format_of(system: str) -> str:
    """`spec.format.type` of `system`'s records: jsonSchema, avro, protobuf or json."""
    if system in JSON_SCHEMA_SYSTEMS:
        return "jsonSchema"
    return "avro" if system in AVRO_SYSTEMS else "protobuf" if system in PROTOBUF_SYSTEMS else "json"


def cadence(ctx: Context) -> float:
    """The peers' trigger / commit interval: Icefall's batch cadence once caught up at the same target when
    its batches are cheap (`plan.batching.caught_up_interval`: half the target)."""
    return float(ctx.args.freshness_target) / 2


def target_of(ctx: Context, system: str) -> float:
    """The freshness target `system` runs at: 3 s for `icefall-3s`, `--freshness-target` for the others."""
    return 3.0 if system == "icefall-3s" else float(ctx.args.freshness_target)


def icefall_manifest(
    ctx: Context,
    topic: str,
    *,
    target: float | None = None,
    dead_letters: bool = True,
    pipelined: bool = True,
    format_type: str = "json",
) -> dict[str, Any]:
    """Icefall's StreamingTable for `topic`, at `target` seconds (default `--freshness-target`); with
    `format_type` jsonSchema, avro or protobuf, Confluent-framed records through the bench's registry into
    the same columns."""
    fmt: dict[str, Any] = {"type": "json", "schema": EVENT_SCHEMA}
    if format_type != "json":
        assert ctx.registry is not None, f"a {format_type} system runs only with the bench's schema registry"
        fmt = {"type": format_type, "registry": {"url": ctx.registry.url}, "schema": EVENT_SCHEMA}
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "bench-events"},
        "spec": {
            "source": {
                "bootstrapServers": ctx.broker.bootstrap,
                "topic": topic,
                "startingPosition": {"type": "earliest"},
            },
            "format": fmt,
            "table": {
                "namespace": TABLE[0],
                "name": TABLE[1],
                "partitioning": [{"field": "ts", "transform": "day"}],
            },
            "freshness": {"targetSeconds": int(target or ctx.args.freshness_target)},
            "deadLetter": {"table": {"enabled": dead_letters}},
            **({} if pipelined else {"batch": {"pipelined": False}}),
        },
    }


def create_peer_table(ctx: Context, catalog: CatalogConfig) -> None:
    """The table the peers write: Icefall's columns without `_kafka`, partitioned by day(ts)."""
    st = load_manifest(yaml.safe_dump(icefall_manifest(ctx, "unused")))
    schema = to_iceberg_schema(st.spec.format.schema_fields)
    pyiceberg = catalog.pyiceberg()
    pyiceberg.create_namespace_if_not_exists(TABLE[0])
    pyiceberg.create_table(TABLE, schema, partition_spec=partition_spec(st, schema),
                           properties={"format-version": "2"})  # fmt: skip


def launch_icefall(ctx: Context, system: str, topic: str, work: Path) -> tuple[ManagedProcess, CatalogConfig]:
    target = target_of(ctx, system)
    dead_letters = system != "icefall-nodlq"
    maintenance = system != "icefall-nomaint"
    manifest = work / "events.yaml"
    manifest.write_text(
        yaml.safe_dump(
            icefall_manifest(
                ctx,
                topic,
                target=target,
                dead_letters=dead_letters,
                pipelined=system != "icefall-serial",
                format_type=format_of(system),
            ),
            sort_keys=False,
        )
    )
    argv = [
        str(Path(sys.executable).with_name("icefall")),
        "run",
        "-f",
        str(manifest),
        "--state-dir",
        str(work),
        *([] if maintenance else ["--no-maintenance"]),
    ]
    ctx.settings[system] = {
        "command": "icefall run -f events.yaml --state-dir <dir> (defaults: --master local[2], "
        + ("in-process compaction on its thread)" if maintenance else "no maintenance: --no-maintenance)"),
        "freshness target": f"{target:g} s",
        "table": "partitioned by day(ts), dead-letter table "
        + ("on (default)" if dead_letters else "off (deadLetter.table.enabled: false)")
        + ("" if system != "icefall-serial" else "; batch.pipelined: false"),
    }
    if system in REGISTRY_SYSTEMS:
        ctx.settings[system]["format"] = (
            f"{format_of(system)}, registry.url: the bench's registry (writer schemas looked up by id per "
            "batch), inline schema: the JSON table's columns"
        )
    proc = ManagedProcess(system, [*ctx.pin, *argv], work / "system.log").start()
    return proc, CatalogConfig.embedded(work)


def spark_peer_argv(ctx: Context, topic: str, work: Path, catalog: CatalogConfig, *extra: str) -> list[str]:
    """bench/peers/spark_streaming.py on `topic` into `catalog`'s TABLE, its checkpoint in `work`, the
    same jars as Icefall, the trigger at Icefall's cadence, Icefall's Kafka reader defaults; then `extra`."""
    jars = ",".join(str(j) for j in jar_files("ICEFALL_SPARK_JARS"))
    return [
        sys.executable, str(PEERS / "spark_streaming.py"), "--bootstrap", ctx.broker.bootstrap,
        "--topic", topic, "--table", ".".join(TABLE), "--catalog-db", str(catalog.database),
        "--warehouse", str(work / "warehouse"), "--checkpoint", str(work / "checkpoint"), "--jars", jars,
        "--trigger-seconds", f"{cadence(ctx):g}",
        *(f"--kafka-option={k}={v}" for k, v in SPARK_CONSUMER.items()), *extra,
    ]  # fmt: skip


def launch_spark(ctx: Context, system: str, topic: str, work: Path) -> tuple[ManagedProcess, CatalogConfig]:
    catalog = CatalogConfig.embedded(work)
    create_peer_table(ctx, catalog)
    limit = str(ctx.args.spark_max_offsets)
    decode: list[str] = []
    if system in AVRO_SYSTEMS:
        (work / "event.avsc").write_text(json.dumps(AVRO_EVENT_SCHEMA))
        decode = ["--format", "avro", "--avro-schema", str(work / "event.avsc")]
    elif system in JSON_SCHEMA_SYSTEMS:
        decode = ["--format", "jsonschema"]
    argv = spark_peer_argv(ctx, topic, work, catalog, "--max-offsets-per-trigger", limit, *decode)
    ctx.settings[system] = {
        "command": "bench/peers/spark_streaming.py (master local[2], driver memory 1g)",
        "trigger": f"processingTime {cadence(ctx):g} s (Icefall's cadence at the same target)",
        "maxOffsetsPerTrigger": str(ctx.args.spark_max_offsets or "unlimited"),
        "startingOffsets": "earliest",
        "Kafka consumer": ", ".join(f"kafka.{k}={v}" for k, v in SPARK_CONSUMER.items())
        + " (Icefall's reader defaults)",
        "write": "format iceberg, append, fanout-enabled, checkpoint folder",
    }
    if system in AVRO_SYSTEMS:
        ctx.settings[system]["decode"] = (
            'from_avro(expr("substring(value, 6)"), schema_json), the writer schema given as JSON '
            "(mode FAILFAST, the default)"
        )
    elif system in JSON_SCHEMA_SYSTEMS:
        ctx.settings[system]["decode"] = 'from_json(expr("substring(value, 6)").cast("string"), ddl)'

    return ManagedProcess(system, [*ctx.pin, *argv], work / "system.log").start(), catalog


CONNECT_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = WARN
logger.parquet.name = org.apache.parquet
logger.parquet.level = WARN
"""


def connect_jars() -> Path:
    root = repo_root() or ROOT
    out = os.popen(f"'{root}/hack/fetch-jars.sh' kafka-connect").read().strip()
    if not out or not Path(out).is_dir():
        raise RuntimeError(
            "hack/fetch-jars.sh kafka-connect did not print a folder; run it by hand to see why"
        )
    return Path(out)


def launch_connect(ctx: Context, topic: str, work: Path) -> tuple[ManagedProcess, CatalogConfig]:
    interval_s = cadence(ctx)
    catalog = CatalogConfig.embedded(work)
    create_peer_table(ctx, catalog)
    control = f"control-{work.name}"
    ctx.broker.create_topic(control, partitions=1)
    name = f"iceberg-sink-{work.name}"
    props = {
        "name": name,
        "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
        "tasks.max": "1",
        "topics": topic,
        "iceberg.tables": ".".join(TABLE),
        "iceberg.catalog": catalog.name,
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "iceberg.catalog.uri": f"jdbc:sqlite:{catalog.database.resolve()}",
        "iceberg.catalog.warehouse": catalog.warehouse,
        "iceberg.catalog.jdbc.busy_timeout": "30000",
        "iceberg.control.topic": control,
        "iceberg.control.commit.interval-ms": str(int(interval_s * 1000)),
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
    }
    worker = {
        "bootstrap.servers": ctx.broker.bootstrap,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": str(work / "connect.offsets"),
        "listeners": f"http://127.0.0.1:{free_port()}",
        "plugin.discovery": "only_scan",
    }
    (work / "sink.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (work / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in worker.items()))
    (work / "log4j2.properties").write_text(CONNECT_LOG4J2)
    jars = connect_jars()
    argv = [
        shutil.which("java") or "java", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}", "-cp", f"{jars}/*",
        "org.apache.kafka.connect.cli.ConnectStandalone",
        str(work / "worker.properties"), str(work / "sink.properties"),
    ]  # fmt: skip
    ctx.settings["connect"] = {
        "command": "java -Xmx1g -cp '<jars-kafka-connect>/*' org.apache.kafka.connect.cli.ConnectStandalone",
        "sink": " ".join(f"{k}={v}" for k, v in props.items() if k.startswith("iceberg.control.commit"))
        + " (Icefall's cadence at the same target)",
        "tasks.max": "1",
        "converters": "StringConverter keys, JsonConverter values (schemas.enable=false)",
        "catalog": "JdbcCatalog on SQLite, local warehouse; control topic created (1 partition)",
    }
    return ManagedProcess("connect", [*ctx.pin, *argv], work / "system.log").start(), catalog


def launch_floor(ctx: Context, topic: str, work: Path) -> tuple[ManagedProcess, None]:
    roll = max(ctx.args.records // 4, 10_000)  # several files per backlog, so records/s is measurable
    argv = [
        sys.executable, str(PEERS / "floor.py"), "--bootstrap", ctx.broker.bootstrap, "--topic", topic,
        "--out", str(work / "files"), "--roll-seconds", f"{ctx.args.freshness_target:g}",
        "--roll-records", str(roll),
    ]  # fmt: skip
    ctx.settings["floor"] = {
        "command": "bench/peers/floor.py (one process, one core)",
        "files": f"one Parquet file (zstd) per {roll:,} records, {ctx.args.freshness_target:g} s, "
        "or when caught up",
    }
    return ManagedProcess("floor", [*ctx.pin, *argv], work / "system.log").start(), None


def launch(ctx: Context, system: str, topic: str, work: Path) -> Run:
    work.mkdir(parents=True)
    started = time.time()
    catalog: CatalogConfig | None
    if system.startswith("icefall"):
        proc, catalog = launch_icefall(ctx, system, topic, work)
    elif system.startswith("spark"):
        proc, catalog = launch_spark(ctx, system, topic, work)
    elif system == "connect":
        proc, catalog = launch_connect(ctx, topic, work)
    elif system == "floor":
        proc, catalog = launch_floor(ctx, topic, work)
    else:
        raise ValueError(f"--systems: unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
    assert proc.pid is not None
    monitor = TreeMonitor(proc.pid, threads=ctx.args.threads).start()
    return Run(system, topic, work, proc, monitor, started, catalog)


def wait_for(run: Run, done: Callable[[list[Commit]], bool], timeout: float) -> list[Commit]:
    """Poll the commits every second until `done`; fail with the system's log when it dies or times out."""
    deadline = time.monotonic() + timeout
    while True:
        commits = run.commits()
        if done(commits):
            return commits
        if not run.proc.running() or FATAL.search(run.proc.log_path.read_text(errors="replace")):
            raise RuntimeError(
                f"{run.system} exited; last log lines ({run.proc.log_path}):\n{tail(run.proc.log_path)}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{run.system}: not done after {timeout:.0f}s "
                f"(last commit: {commits[-1] if commits else None}); "
                f"last log lines ({run.proc.log_path}):\n{tail(run.proc.log_path)}"
            )
        time.sleep(1)


# A Connect task that dies leaves the worker running: its log line is the only sign.
FATAL = re.compile(r"Task threw an uncaught and unrecoverable exception")


# --- producing ---------------------------------------------------------------------------------------


def preload(
    bootstrap: str,
    topic: str,
    count: int,
    note_words: int,
    seed: int,
    *,
    start: int = 0,
    records: Iterator[tuple[str, bytes | None, int]] | None = None,
) -> float:
    """Produce `count` events (of `seed` from `start`, or the next `count` of `records`: key, value or None
    for a tombstone, timestamp ms) as fast as the client goes; returns the seconds it took."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "enable.idempotence": True,
         "compression.type": "none"}
    )  # fmt: skip
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    started = time.monotonic()
    records = records or bench_records(seed, note_words, start=start)
    for _ in range(count):
        key, value, ts = next(records)
        while True:
            try:
                producer.produce(topic, key=key, value=value, timestamp=ts, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) or errors:
        raise RuntimeError(f"preloading {topic} failed: {errors[:3]}")
    return time.monotonic() - started


@functools.cache
def protobuf_descriptors() -> str:
    """PROTOBUF_EVENT_SCHEMA compiled to a base64 FileDescriptorSet (protoc of grpcio-tools)."""
    from icefall.kafka.protobuf import descriptor_set_text

    return descriptor_set_text(PROTOBUF_EVENT_SCHEMA)


def encoder(ctx: Context, system: str, topic: str) -> Encode:
    """How `system`'s events become values on `topic`: JSON text; for an Avro system Confluent-framed
    Avro by confluent-kafka's `AvroSerializer` (which registers AVRO_EVENT_SCHEMA as `<topic>-value` in the
    bench's registry on first use); for a Protobuf system PROTOBUF_EVENT_SCHEMA's `.proto` text registered
    as `<topic>-value` (as a Java serializer registers it) and each event framed with its id and message
    index [0] (`common.protobuf_encoder`); for a JSON Schema system JSON_SCHEMA_EVENT_SCHEMA registered
    likewise and the JSON text framed with its id (`common.json_schema_encoder`). One per producing thread:
    a serializer keeps state."""
    if system not in REGISTRY_SYSTEMS:
        return json_value
    assert ctx.registry is not None, "a registry system runs only with the bench's schema registry"
    client = SchemaRegistryClient({"url": ctx.registry.url})
    if system in PROTOBUF_SYSTEMS:
        schema_id = client.register_schema(f"{topic}-value", Schema(PROTOBUF_EVENT_SCHEMA, "PROTOBUF"))
        return protobuf_encoder(protobuf_descriptors(), schema_id)
    if system in JSON_SCHEMA_SYSTEMS:
        schema = Schema(json.dumps(JSON_SCHEMA_EVENT_SCHEMA), "JSON")
        return json_schema_encoder(client.register_schema(f"{topic}-value", schema))
    serializer = AvroSerializer(client, json.dumps(AVRO_EVENT_SCHEMA))
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(event: dict[str, object], ts_ms: int) -> bytes:
        value = serializer(avro_datum(event, ts_ms), context)
        assert value is not None
        return bytes(value)

    return encode


class LiveProducer(threading.Thread):
    """Small events to `topic` at about `rate` records/s until `stop()`; counts acknowledged records."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: float,
        seed: int,
        first_id: int = 0,
        *,
        records: Iterator[tuple[str, bytes | None, int]] | None = None,
    ) -> None:
        """`records` (key, value or None for a tombstone, timestamp ms): what to produce instead of the
        small events of `seed` from `first_id`."""
        super().__init__(daemon=True, name=f"produce-{topic}")
        self.topic, self.rate = topic, rate
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self._records = records or bench_records(seed, SMALL_NOTE_WORDS, start=first_id)
        self._halt = threading.Event()
        self.acked = self.errors = 0

    def _delivered(self, err: object, _msg: object) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors += 1

    def run(self) -> None:
        due, last = 0.0, time.monotonic()
        while not self._halt.is_set():
            now = time.monotonic()
            due, last = due + (now - last) * self.rate, now  # `rate` may change while running
            while due >= 1:
                key, value, ts = next(self._records)
                self._producer.produce(
                    self.topic, key=key, value=value, timestamp=ts, on_delivery=self._delivered
                )
                due -= 1
            self._producer.poll(0.02)
        self._producer.flush(30)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


# --- the phases --------------------------------------------------------------------------------------


@dataclass
class Throughput:
    records: int
    commits: int  # commits while draining the backlog
    startup_s: float  # process start -> its first commit (of the trickle)
    drain_s: float  # backlog produce start -> the commit that completed it
    rate: float  # backlog records / drain_s
    per_cpu: float  # backlog records / CPU seconds of the system over the drain
    peak_rss: int
    files: int
    audit: str  # "exact" or what is wrong, by content
    cpu_s: float  # CPU seconds of the system's process tree over the drain
    payload_bytes: int  # the backlog's Kafka record keys + values, as produced (`common.Tally`)
    start: Gauge  # CPU probe and load average just before the backlog's first record
    end: Gauge  # the same once the commit that completed it was seen
    threads: dict[str, float] = field(default_factory=dict)  # --threads: CPU-s over the drain per kind

    @property
    def per_gib(self) -> float:
        """CPU-s per GiB of keys + values ingested (`common.cpu_per_gib`)."""
        return cpu_per_gib(self.cpu_s, self.payload_bytes)


def backlog_rows(run: Run) -> int:
    """Committed rows of the preloaded backlog (ids below TRICKLE_FIRST_ID)."""
    if run.catalog is None:
        files = sorted((run.work / "files").glob("*.parquet"))
        ids = [pq.read_table(f, columns=["id"]).column("id") for f in files]
        return sum(int(pc.sum(pc.less(i, TRICKLE_FIRST_ID)).as_py() or 0) for i in ids)
    table = run.catalog.pyiceberg().load_table(TABLE)
    scan = table.scan(row_filter=f"id < {TRICKLE_FIRST_ID}", selected_fields=("id",))
    return sum(batch.num_rows for batch in scan.to_arrow_batch_reader())  # a batch at a time


#: The columns compared by content (`ts` is the produce time, checked against nothing but itself).
CONTENT = ("id", "key", "customer", "amount", "items", "shipping", "tags", "note")


def committed_backlog(catalog: CatalogConfig) -> Iterator[dict[str, Any]]:
    """The backlog's rows in the bench table of `catalog`, `CONTENT` columns, as Python values, read a
    batch at a time (memory bounded by a batch, not by the table)."""
    table = catalog.pyiceberg().load_table(TABLE)
    scan = table.scan(row_filter=f"id < {TRICKLE_FIRST_ID}", selected_fields=CONTENT)
    for batch in scan.to_arrow_batch_reader():
        yield from batch.to_pylist()


def backlog_content(run: Run) -> Iterator[dict[str, Any]]:
    """The committed rows of the backlog, `CONTENT` columns, as Python values, a batch at a time."""
    if run.catalog is not None:
        yield from committed_backlog(run.catalog)
        return
    for file in sorted((run.work / "files").glob("*.parquet")):
        for batch in pq.ParquetFile(file).iter_batches(columns=list(CONTENT)):
            yield from (row for row in batch.to_pylist() if row["id"] < TRICKLE_FIRST_ID)


def audit_backlog(run: Run, records: int, seed: int, note_words: int) -> str:
    """`audit_rows` of the backlog `run` committed."""
    return audit_rows(backlog_content(run), records, seed, note_words)


def audit_rows(rows: Iterable[dict[str, Any]], records: int, seed: int, note_words: int) -> str:
    """Every backlog event exactly once in `rows`, each column equal to the event produced: "exact", or what
    is not.

    The events are generated again from their seed (`common.bench_event`, as `common.bench_records` made
    them); every field but `ts` (the produce time) is compared, as a `digest` of the row against the
    event's. Memory is bounded whatever the backlog: 9 bytes per event (its digest and a count), `rows`
    taken one at a time. Not guaranteed: two different rows with one digest (a 64-bit hash) pass as equal.
    """
    expected = expected_digests(records, seed, note_words)
    seen = bytearray(records)  # rows per id, saturating at 255
    wrong = 0
    for row in rows:
        i = row["id"]
        if isinstance(i, int) and 0 <= i < records:
            seen[i] = min(seen[i] + 1, 255)
            if digest(row) == expected[i]:
                continue
        wrong += 1
    duplicates = sum(n - 1 for n in seen if n > 1)
    missing = seen.count(0)
    if not (duplicates or missing or wrong):
        return "exact"
    return f"{duplicates} duplicates, {missing} missing, {wrong} differ"


def digest(row: dict[str, Any]) -> int:
    """A hash of `row`'s `CONTENT` columns as Python values (structs as sorted items, lists as tuples):
    rows equal by `==` (floats exactly) have equal digests, within this process (str hashes are salted
    per process)."""
    return hash(tuple(_frozen(row[c]) for c in CONTENT))


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


@functools.lru_cache(maxsize=2)  # every system of a run drains the same backlogs (small, 1 KB)
def expected_digests(records: int, seed: int, note_words: int) -> array[int]:
    """`digest` of backlog events 0 .. `records`-1 of `seed`, as `common.bench_records` generates them."""
    rng = random.Random(seed)
    out = array("q", bytes(8 * records))
    for i in range(records):
        out[i] = digest(bench_event(i, rng, 0, note_words))  # `ts` only takes the time: the rng is the same
    return out


def same(got: Any, want: Any) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        return got is not None and want is not None and math.isclose(got, want, rel_tol=1e-12)
    return bool(got == want)


def throughput(
    ctx: Context,
    system: str,
    records: int,
    variant: str,
    *,
    note_words: int,
    seed: int,
    partitions: int = PARTITIONS,
    warmup: int | None = None,
) -> Throughput:
    """Start `system` on an empty topic of `partitions` partitions with a trickle, wait for its first commit
    (started), ingest `warmup` records (default `--warmup-records`; warm), then produce the backlog and time
    it from the first record produced to the commit that completes it."""
    warmup = ctx.args.warmup_records if warmup is None else warmup
    topic = f"{variant}-{system}"
    ctx.broker.create_topic(topic, partitions=partitions)
    run = launch(ctx, system, topic, ctx.state / f"{system}-{variant}")
    trickle_records = bench_records(9, SMALL_NOTE_WORDS, TRICKLE_FIRST_ID, encoder(ctx, system, topic))
    trickle = LiveProducer(ctx.broker.bootstrap, topic, ctx.args.trickle, seed=9, records=trickle_records)
    encode = encoder(ctx, system, topic)  # this thread's (the warm-up and the backlog)
    trickle.start()
    say(f"{system}: started on an empty topic; waiting for its first commit ...")

    def complete(commits: list[Commit]) -> bool:
        return bool(commits) and commits[-1].total_records >= records and backlog_rows(run) >= records

    try:
        first = wait_for(run, lambda c: bool(c) and c[-1].total_records > 0, ctx.args.timeout)
        startup_s = first[-1].visible_ms / 1000 - run.started
        if warmup:
            warm = first[-1].total_records + warmup
            say(f"{system}: first commit after {startup_s:.1f}s; warm-up: {warmup:,} records")
            preload(ctx.broker.bootstrap, topic, warmup, note_words, seed + 100,
                    records=bench_records(seed + 100, note_words, WARMUP_FIRST_ID, encode))  # fmt: skip
            first = wait_for(run, lambda c: bool(c) and c[-1].total_records >= warm, ctx.args.timeout)
        events = bench_records(seed, note_words, encode=encode)
        if system in AVRO_SYSTEMS:  # encoded before the clock starts: AvroSerializer is slower than they are
            say(f"{system}: encoding {records:,} {variant} records into a spool file ...")
            events = spooled(events, records, ctx.state / f"{topic}.spool")
        backlog = Tally(events)
        start = Gauge.now()
        say(f"{system}: producing {records:,} {variant} records (CPU probe {start.probe:.2f} s, "
            f"load {start.load}) ...")  # fmt: skip
        started, cpu_start, commits_before = time.time(), run.monitor.sample().cpu, len(first)
        preload(ctx.broker.bootstrap, topic, records, note_words, seed, records=backlog)
        commits = wait_for(run, complete, ctx.args.timeout)
        end = Gauge.now()
    finally:
        trickle.stop()
        run.stop()
    last = commits[-1]
    drain = last.visible_ms / 1000 - started
    cpu = run.monitor.cpu_at(last.visible_ms / 1000) - cpu_start
    say(f"{system}: drained in {drain:.1f}s; auditing {records:,} rows by content ...")
    audit = audit_backlog(run, records, seed, note_words)
    result = Throughput(
        records=records,
        commits=len(commits) - commits_before,
        startup_s=startup_s,
        drain_s=drain,
        rate=records / drain,
        per_cpu=records / cpu if cpu > 0 else float("nan"),
        peak_rss=run.monitor.peak_rss,
        files=last.total_files,
        audit=audit,
        cpu_s=cpu,
        payload_bytes=backlog.bytes,
        start=start,
        end=end,
        threads=run.monitor.cpu_by_thread(started, last.visible_ms / 1000) if ctx.args.threads else {},
    )
    say(f"{system} ({variant}): {result.rate:,.0f} records/s, {result.per_cpu:,.0f} per CPU-s, "
        f"{result.per_gib:,.0f} CPU-s per GiB, drain {drain:.1f}s, {result.commits} commits, "
        f"audit: {audit}")  # fmt: skip
    return result


@dataclass
class Live:
    rate: float
    window_s: float
    produced: int
    rows: int
    measured: int
    p50: float
    p99: float
    max: float
    commits: list[tuple[float, float, float, int]]  # (seconds since the window start, p50, max, records)
    cpu_cores: float
    peak_rss: int
    files: int
    interval_p50: float
    warmup_s: float
    caught_up: bool


def added_ts_by_snapshot(
    catalog: CatalogConfig, operations: tuple[Operation, ...] = (Operation.APPEND,)
) -> Iterator[tuple[int, list[int]]]:
    """(snapshot id, produce ms of every row in the data files it added), for snapshots of `operations`
    only (`append`; a keyed table's MERGE is an `overwrite`).

    A row counts from the commit that first made it visible. Compaction (`replace`) writes the same rows
    again later; counting them there (as the table's live files would) charged Icefall's in-process
    compaction as latency: 14.4 s p50 where the first commits gave 4.7 s.
    """
    table = catalog.pyiceberg().load_table(TABLE)
    for snapshot in table.snapshots():
        if snapshot.summary is None or snapshot.summary.operation not in operations:
            continue
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id or manifest.content != ManifestContent.DATA:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                if entry.status != ManifestEntryStatus.ADDED:
                    continue
                with table.io.new_input(entry.data_file.file_path).open() as stream:
                    ts = pq.read_table(stream, columns=["ts"]).column("ts").combine_chunks()
                yield snapshot.snapshot_id, [us // 1000 for us in pc.cast(ts, "int64").to_pylist()]


def live(ctx: Context, system: str, rate: float) -> Live:
    topic = f"live-{system}"
    ctx.broker.create_topic(topic, partitions=PARTITIONS)
    interval = cadence(ctx) if system == "connect" else 0
    window_s = max(ctx.args.seconds, interval)
    allowance = target_of(ctx, system) + interval
    run = launch(ctx, system, topic, ctx.state / f"{system}-live")
    producer = LiveProducer(ctx.broker.bootstrap, topic, rate, seed=3)
    producer.start()
    say(f"{system}: live at {rate:,.0f} records/s; warm-up until it has caught up with its start-up ...")
    try:
        acked: list[tuple[float, int]] = []

        def caught_up(commits: list[Commit]) -> bool:
            acked.append((time.time(), producer.acked))
            target = max((n for t, n in acked if t <= time.time() - allowance), default=0)
            return bool(commits) and commits[-1].total_records > 0 and commits[-1].total_records >= target

        warmup_started = time.time()
        try:
            wait_for(run, caught_up, ctx.args.timeout / 2)
            did_catch_up = True
        except TimeoutError:
            did_catch_up = False
        warmup_s = time.time() - warmup_started
        note = "" if did_catch_up else " (did NOT catch up)"
        say(f"{system}: warm-up {warmup_s:.0f}s{note}; measuring for {window_s:.0f}s")
        start_ms = now_ms()
        time.sleep(window_s)
        end_ms = now_ms()
        cpu_start = run.monitor.cpu_at(start_ms / 1000)
        cpu_end = run.monitor.sample().cpu
        # Back to a trickle, not silence: the Iceberg sink commits only while records arrive.
        producer.rate = ctx.args.trickle
        produced = producer.acked
        say(f"{system}: window over at {produced:,} records; waiting until they are committed ...")
        commits = wait_for(run, lambda c: bool(c) and c[-1].total_records >= produced,
                           ctx.args.timeout + interval)  # fmt: skip
    finally:
        producer.stop()
        run.stop()
    assert run.catalog is not None
    visible = {c.snapshot_id: c.visible_ms for c in commits}
    per_commit: dict[int, list[float]] = {}
    for snapshot_id, produced_ms in added_ts_by_snapshot(run.catalog):
        at = visible.get(snapshot_id)
        if at is None:
            continue
        per_commit.setdefault(at, []).extend((at - p) / 1000 for p in produced_ms if start_ms <= p <= end_ms)
    latencies = [x for values in per_commit.values() for x in values]
    times = sorted(c.visible_ms for c in commits if start_ms <= c.visible_ms <= end_ms + 120_000)
    intervals = [(b - a) / 1000 for a, b in itertools.pairwise(times)]
    return Live(
        rate=rate,
        window_s=(end_ms - start_ms) / 1000,
        produced=produced,
        rows=commits[-1].total_records,
        measured=len(latencies),
        p50=percentile(latencies, 50),
        p99=percentile(latencies, 99),
        max=max(latencies, default=float("nan")),
        commits=[
            ((at - start_ms) / 1000, percentile(v, 50), max(v), len(v))
            for at, v in sorted(per_commit.items())
            if v
        ],
        cpu_cores=(cpu_end - cpu_start) / ((end_ms - start_ms) / 1000),
        peak_rss=run.monitor.peak_rss,
        files=commits[-1].total_files,
        interval_p50=percentile(intervals, 50),
        warmup_s=warmup_s,
        caught_up=did_catch_up,
    )


# --- report ------------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ",.0f", unit: str = "") -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:{spec}}{unit}"


def mib(value: int) -> str:
    return f"{value / 1024 / 1024:,.0f} MiB"


@dataclass
class Results:
    small: dict[str, Throughput | str] = field(default_factory=dict)
    large: dict[str, Throughput | str] = field(default_factory=dict)
    live: dict[str, Live | str] = field(default_factory=dict)


#: The drain tables' note on their CPU columns (the same words in every results file).
PER_GIB_NOTE = (
    "**CPU-s per GiB** = CPU-seconds (user + system) of the system's process tree over the drain / GiB "
    "(2^30 bytes) of the backlog's Kafka record keys and values as produced (no headers, timestamps or "
    "batch framing; the warm-up and the trickle not counted), = 2^30 / (records per CPU-s x mean key + "
    "value bytes of a record). Lower is better; it compares formats whose records differ in size (an Avro "
    "value is ~95 bytes where the JSON one is ~230)."
)


def throughput_table(title: str, results: dict[str, Throughput | str]) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| system | records/s (drain) | records per CPU-s (drain) | CPU-s per GiB (drain) | drain | start-up "
        "| commits while draining | data files | peak RSS | exactly once, by content |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for system, r in results.items():
        if isinstance(r, str):
            lines.append(f"| {LABELS[system]} | failed: {r.splitlines()[0][:200]} | | | | | | | | |")
            continue
        lines.append(
            f"| {LABELS[system]} | {fmt(r.rate)} | {fmt(r.per_cpu)} | {fmt(r.per_gib)} | {r.drain_s:.1f} s "
            f"| {r.startup_s:.1f} s | {r.commits} | {r.files} | {mib(r.peak_rss)} | {r.audit} |"
        )
    return [
        *lines,
        "",
        *conditions_table([(LABELS[s], r) for s, r in results.items()]),
        *threads_table(results),
    ]


#: Rows of `threads_table`: the kinds of thread that spent the most, the rest summed.
THREAD_ROWS = 14


def threads_table(results: dict[str, Throughput | str]) -> list[str]:
    """With --threads: CPU-s over the drain per kind of thread (`common.thread_kind`), a column per system;
    the tree's CPU less the threads' sum is what threads that lived between two samples spent."""
    drains = {s: r for s, r in results.items() if isinstance(r, Throughput) and r.threads}
    if not drains:
        return []
    totals: dict[str, float] = {}
    for r in drains.values():
        for kind, cpu in r.threads.items():
            totals[kind] = totals.get(kind, 0.0) + cpu
    shown = sorted(totals, key=lambda kind: -totals[kind])[:THREAD_ROWS]
    lines = [
        "CPU-s over the drain by kind of thread (`/proc/<pid>/task/*/stat` at each 0.5 s sample; the "
        "kernel's thread names, cut at 15 characters, numbers as N):",
        "",
        "| thread | " + " | ".join(LABELS[s] for s in drains) + " |",
        "|---|" + "--:|" * len(drains),
    ]
    for kind in shown:
        lines.append(
            f"| `{kind}` | " + " | ".join(f"{r.threads.get(kind, 0.0):.1f}" for r in drains.values()) + " |"
        )
    rest = [sum(c for k, c in r.threads.items() if k not in shown) for r in drains.values()]
    unseen = [r.cpu_s - sum(r.threads.values()) for r in drains.values()]
    lines.append("| every other kind | " + " | ".join(f"{c:.1f}" for c in rest) + " |")
    lines.append(
        "| threads that lived between two samples | " + " | ".join(f"{c:.1f}" for c in unseen) + " |"
    )
    lines.append("| the process tree | " + " | ".join(f"{r.cpu_s:.1f}" for r in drains.values()) + " |")
    return [*lines, ""]


def conditions_table(drains: list[tuple[str, Throughput | str]]) -> list[str]:
    """What each drain of a table ingested and the machine it ran on: the backlog's bytes, the CPU, and
    the CPU probe and load averages just before its first record and once its last commit was seen."""
    lines = [
        "| drain of | keys + values produced | bytes per record | CPU-s over the drain "
        "| CPU probe, start → end | load average 1/5/15 min, start → end |",
        "|---|--:|--:|--:|--:|---|",
    ]
    for name, r in drains:
        if isinstance(r, Throughput):
            lines.append(
                f"| {name} | {r.payload_bytes / 2**20:,.1f} MiB | {r.payload_bytes / r.records:,.0f} "
                f"| {r.cpu_s:,.1f} | {r.start.probe:.2f} → {r.end.probe:.2f} s "
                f"| {r.start.load} → {r.end.load} |"
            )
    return [*lines, ""] if len(lines) > 2 else []


def avro_note(systems: list[str]) -> list[str]:
    """The paragraphs on the registry formats' input (JSON Schema, Avro, Protobuf) whose systems ran."""
    return [line for members, text in REGISTRY_NOTES if set(members) & set(systems) for line in (text, "")]


#: (the systems of a registry format, the paragraph on their input).
REGISTRY_NOTES = (
    (
        JSON_SCHEMA_SYSTEMS,
        "The JSON Schema rows (icefall-jsonschema, spark-jsonschema) drain the same JSON events, each value "
        "framed as the Kafka clients' JSON Schema serializers frame it (a magic byte and the 4-byte id of "
        "`common.JSON_SCHEMA_EVENT_SCHEMA` in the schema registry, then the JSON text; ~5 bytes more a "
        "record), encoded as they are produced. Icefall checks each record's frame and schema id against "
        "the registry, then reads the text as its JSON format does; Spark's job reads the text past the "
        "header with `from_json` and looks at neither.",
    ),
    (
        AVRO_SYSTEMS,
        "The Avro rows (icefall-avro, spark-avro) drain the same events as Confluent-framed Avro "
        "(`common.AVRO_EVENT_SCHEMA`: `ts` a timestamp-micros, `shipping` a nested record, `tags` an array; "
        "~95 bytes a value for the small events against ~230 of JSON, ~870 against ~1,000 for the 1 KB "
        "ones), encoded with confluent-kafka's `AvroSerializer` through a schema registry on core 0 "
        "(Apicurio, its CPU not counted); Icefall looks the writer schemas up by id, Spark's `from_avro` is "
        "given the writer schema as JSON. The same table, audited the same way. Their backlog is encoded "
        "before the clock starts into a spool file, then read back and produced (the serializer encoding "
        'as it produces is slower than the systems drain: see "Producer alone, Avro" in the machine '
        "table); the JSON backlogs are encoded as they are produced.",
    ),
    (
        PROTOBUF_SYSTEMS,
        "The Protobuf row (icefall-protobuf) drains the same events as Confluent-framed Protobuf "
        "(`common.PROTOBUF_EVENT_SCHEMA`: `ts` a google.protobuf.Timestamp, `shipping` a nested message, "
        "`tags` repeated; ~105 bytes a value for the small events): the `.proto` text registered in the "
        "schema registry as `<topic>-value` (as a Java serializer registers it), each record framed with its "
        'id and message index [0], encoded as it is produced (see "Producer alone, Protobuf"). Icefall '
        "looks the schema up by id and decodes in PySpark's Python workers (`icefall.decode.protobuf`). No "
        "Spark peer: Spark's `from_protobuf` (spark-protobuf) is not served by the package registry this "
        "project builds from (bench/results/protobuf.md).",
    ),
)


def live_table(results: dict[str, Live | str]) -> list[str]:
    lines = [
        "| system | rate | warm-up | window | freshness p50 / p99 / max | records measured "
        "| commit interval p50 | CPU cores busy | data files | peak RSS "
        "| rows / produced by the window's end |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for system, r in results.items():
        if isinstance(r, str):
            lines.append(f"| {LABELS[system]} | failed: {r.splitlines()[0][:200]} | | | | | | | | | |")
            continue
        lines.append(
            f"| {LABELS[system]} | {r.rate:,.0f}/s "
            f"| {r.warmup_s:.0f} s{'' if r.caught_up else ' (not caught up)'} | {r.window_s:.0f} s "
            f"| {fmt(r.p50, '.1f')} / {fmt(r.p99, '.1f')} / {fmt(r.max, '.1f')} s | {r.measured:,} "
            f"| {fmt(r.interval_p50, '.1f', ' s')} | {r.cpu_cores:.2f} | {r.files} | {mib(r.peak_rss)} "
            f"| {r.rows:,} / {r.produced:,} |"
        )
    return [*lines, ""]


def failures(results: Results) -> list[str]:
    """A section with the full error text (and log tail) of every phase that failed; [] when none did."""
    failed = [
        (f"{system} ({phase})", text)
        for phase, phase_results in (
            ("~230 B backlog", results.small),
            ("1 KB backlog", results.large),
            ("live", results.live),
        )
        for system, text in phase_results.items()
        if isinstance(text, str)
    ]
    return failure_section(failed)


def settings_section(ctx: Context, *rows: str) -> list[str]:
    """The "## Settings" table: each system's settings, the pinning, then `rows` (already table rows)."""
    return [
        "## Settings",
        "",
        "| system | setting | value |",
        "|---|---|---|",
        *(f"| {s} | {k} | {v} |" for s, kv in ctx.settings.items() for k, v in kv.items()),
        f"| all | pinning | {' '.join(ctx.pin) or 'none (1 core)'} for the system; "
        "broker and this process on core 0 |",
        *rows,
        "",
    ]


def failure_section(failed: list[tuple[str, str]]) -> list[str]:
    """The "## Failures" section: the full error text (and log tail) of each (name, text); [] for none."""
    if not failed:
        return []
    lines = ["## Failures", ""]
    for name, text in failed:
        lines += [f"### {name}", "", "```", text.strip()[-4000:], "```", ""]
    return lines


def chart(results: Results, path: Path) -> str:
    """Three panels: records/s, records per CPU-second (small events), freshness of each commit over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed (make bench installs the `bench` extra)"
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    names = [s for s, r in results.small.items() if isinstance(r, Throughput)]
    small = [r for r in results.small.values() if isinstance(r, Throughput)]
    short = [s.replace("-", "\n") for s in names]
    for axis, values, title, color in (
        (axes[0], [r.rate for r in small], "records/s draining the backlog (~230 B events)", "#4878a8"),
        (axes[1], [r.per_cpu for r in small], "records per CPU-second (same drain)", "#6a9f58"),
    ):
        axis.bar(short, [0 if math.isnan(v) else v for v in values], color=color)
        axis.set_title(title)
    for system, r in results.live.items():
        if isinstance(r, Live) and r.commits:
            axes[2].plot([c[0] for c in r.commits], [c[2] for c in r.commits], marker="o", label=system)
    axes[2].set_title("freshness of each commit (max over its records)")
    axes[2].set_xlabel("seconds since the measuring window began")
    axes[2].set_ylabel("seconds")
    axes[2].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return f"![chart]({path.name})"


def versions(ctx: Context) -> dict[str, str]:
    kafka_jar = sorted(tool_dir("ICEFALL_KAFKA_JARS").glob("kafka-server-[0-9]*.jar"))
    iceberg_jar = sorted(tool_dir("ICEFALL_SPARK_JARS").glob("iceberg-spark-runtime-*.jar"))
    out = {
        "PySpark": version("pyspark"),
        "Iceberg Spark runtime": iceberg_jar[0].stem if iceberg_jar else "unknown",
        "pyiceberg": version("pyiceberg"),
        "pyarrow": version("pyarrow"),
        "Kafka broker": kafka_jar[0].stem.replace("kafka-server-", "") if kafka_jar else "unknown",
        "confluent-kafka / librdkafka": f"{version('confluent-kafka')} / {libversion()[0]}",
    }
    if ctx.registry is not None:
        avro_jar = sorted(tool_dir("ICEFALL_SPARK_JARS").glob("spark-avro_*.jar"))
        registry_jar = sorted(tool_dir("ICEFALL_REGISTRY_HOME").glob("apicurio-registry-app-*-runner.jar"))
        out["spark-avro"] = avro_jar[0].stem if avro_jar else "unknown"
        out["Schema registry"] = registry_jar[0].stem.removesuffix("-runner") if registry_jar else "unknown"
    if "connect" in (*ctx.args.systems, *ctx.args.live_systems):
        with contextlib.suppress(Exception):
            names = sorted(p.name for p in connect_jars().glob("*.jar"))
            out["Kafka Connect / Iceberg sink"] = ", ".join(
                n.removesuffix(".jar")
                for n in names
                if n.startswith(("connect-runtime", "iceberg-kafka-connect-1"))
            )
    return out


def render(ctx: Context, facts: dict[str, str], results: Results, chart_line: str, started: str) -> str:
    a = ctx.args
    kind = "a short run (`--quick` or reduced scale)" if a.quick or a.records < 200_000 else "a full run"
    lines = [
        "# Icefall against its peers",
        "",
        f"`bench/compare.py {' '.join(a.argv)}` started {started}; this is **{kind}**. "
        "How each figure is measured: the docstring of `bench/compare.py`. One run on a shared machine "
        "(other work ran on the same 2 cores: see the load averages); compare runs only at similar loads.",
        "",
        f"Backlogs: {a.records:,} events of ~230 bytes and {a.large_records:,} of ~1 KB, "
        f"{PARTITIONS} partitions, a fresh topic per system. Each peer at the same freshness target "
        f"({a.freshness_target:g} s): Spark's trigger and the Connect sink's commit interval at Icefall's "
        f"cadence ({a.freshness_target / 2:g} s), Spark's `maxOffsetsPerTrigger` "
        f"{a.spark_max_offsets or 'unlimited'}. Live phase: half of Icefall's records/s on the small "
        f"events, a fresh {PARTITIONS}-partition topic per system.",
        "",
        "## Throughput draining a backlog",
        "",
        "Each system starts on an empty topic and makes its first commit (start-up), then ingests a "
        f"warm-up of {a.warmup_records:,} records (not measured: JIT and caches warm, as in a system that "
        "has run a while); then the backlog is produced as fast as the client goes, and **drain** is "
        "from its first record to the commit that "
        "completed it: records/s and records per CPU-second of the system's process tree are over that "
        "drain, whatever the number of commits. The table is then checked **by content**: every backlog "
        "event exactly once, every column but `ts` equal to the event produced (regenerated from its seed). "
        f"A trickle of {a.trickle:g} records/s goes to the topic meanwhile, for every system: without new "
        "records the Iceberg sink 1.11.0 never committed the tail of a backlog here (its worker answers "
        "commit requests only while records arrive; compare apache/iceberg#17811). The floor is bounded by "
        "the producer (this process, one core).",
        "",
        PER_GIB_NOTE,
        "",
        *avro_note(a.systems),
        *throughput_table("~230-byte events", results.small),
        *throughput_table("~1 KB events", results.large),
        "## Freshness with a live producer (produce → visible in a committed snapshot of main)",
        "",
        *live_table(results.live),
        "The floor writes files but commits nothing, so it has no freshness (n/a) and no live row.",
        "",
        chart_line,
        "",
        *failures(results),
        *settings_section(
            ctx,
            f"| all | freshness target | {a.freshness_target:g} s |",
            "| all | catalog | SQLite (pyiceberg SqlCatalog / Iceberg JdbcCatalog, catalog name `icefall`), "
            "local warehouse, one per system run |",
        ),
        *machine_section(facts),
    ]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------------


def producer_alone(ctx: Context) -> dict[str, str]:
    """How fast this process produces 50,000 small events alone, as JSON, and as JSON Schema, Avro and
    Protobuf when a system of that format runs (machine table rows: name -> rate)."""
    out = {}
    for name, system, how in (
        ("Producer alone", "icefall", ""),
        ("Producer alone, JSON Schema", "icefall-jsonschema", " (common.json_schema_encoder)"),
        ("Producer alone, Avro", "icefall-avro", " (AvroSerializer)"),
        ("Producer alone, Protobuf", "icefall-protobuf", " (common.protobuf_encoder)"),
    ):
        if system != "icefall" and not {system, system.replace("icefall", "spark")} & set(ctx.args.systems):
            continue
        topic = f"events-probe-{format_of(system)}"
        ctx.broker.create_topic(topic, partitions=PARTITIONS)
        events = bench_records(1, SMALL_NOTE_WORDS, encode=encoder(ctx, system, topic))
        took = preload(ctx.broker.bootstrap, topic, 50_000, SMALL_NOTE_WORDS, 1, records=events)
        out[f"{name} (this process, core 0)"] = f"{50_000 / took:,.0f} small events/s{how}"
    return out


def run_drains(ctx: Context, results: Results) -> None:
    """The drain measurement of every system of `--systems`, one after another: `--records` small events,
    then `--large-records` ~1 KB ones (none when 0)."""
    a = ctx.args
    for system in a.systems:
        for variant, count, words, seed, into in (
            ("small", a.records, SMALL_NOTE_WORDS, 1, results.small),
            ("1kb", a.large_records, LARGE_NOTE_WORDS, 2, results.large),
        ):
            if not count:
                continue
            try:
                into[system] = throughput(ctx, system, count, variant, note_words=words, seed=seed)
            except Exception as exc:
                say(f"{system} ({variant}) FAILED: {exc}")
                into[system] = str(exc)


def run_all(ctx: Context) -> tuple[Results, dict[str, str]]:
    a = ctx.args
    results = Results()
    produced = producer_alone(ctx)
    run_drains(ctx, results)
    rate = a.rate
    small = results.small.get("icefall")
    if isinstance(small, Throughput) and not rate:
        rate = small.rate / 2
    for system in a.live_systems:
        try:
            results.live[system] = live(ctx, system, rate or 2_000)
        except Exception as exc:
            say(f"{system} (live) FAILED: {exc}")
            results.live[system] = str(exc)
    return results, produced


# --- growth mode -------------------------------------------------------------------------------------

#: (event size, partitions) -> system -> its drain, or the error text when it failed.
Grid = dict[tuple[str, int], dict[str, Throughput | str]]


def growth_counts(args: argparse.Namespace, size: str) -> tuple[int, int]:
    """(backlog, warm-up) records of `size` events: `--records` and `--warmup-records` over its divisor."""
    divisor = GROWTH_SIZES[size][3]
    return max(args.records // divisor, 1), args.warmup_records // divisor


def run_growth(ctx: Context) -> Grid:
    """The drain measurement for every (size, partitions) cell, the systems one after another in each cell
    (so a change of load on the machine falls on all of them alike)."""
    a = ctx.args
    grid: Grid = {}
    for size, partitions in itertools.product(a.growth_sizes, a.growth_partitions):
        _, words, seed, _ = GROWTH_SIZES[size]
        records, warmup = growth_counts(a, size)
        cell = grid.setdefault((size, partitions), {})
        for system in a.systems:
            variant = f"{size}-p{partitions}"
            try:
                cell[system] = throughput(ctx, system, records, variant, note_words=words, seed=seed,
                                          partitions=partitions, warmup=warmup)  # fmt: skip
            except Exception as exc:
                say(f"{system} ({variant}) FAILED: {exc}")
                cell[system] = str(exc)
    return grid


def growth_table(systems: list[str], grid: Grid) -> list[str]:
    """One row per (size, partitions): per system records/s, per CPU-s, peak RSS, commits, audit; and
    Icefall/Spark in records per CPU-s when both ran."""
    ratio = "icefall" in systems and "spark" in systems
    columns = ["records/s", "records per CPU-s", "CPU-s per GiB", "peak RSS", "commits while draining",
               "exactly once"]  # fmt: skip
    head = ["events", "partitions", *(f"{s}: {c}" for s in systems for c in columns)]
    align = ["---", "--:", *(a for _ in systems for a in ("--:", "--:", "--:", "--:", "--:", "---"))]
    if ratio:
        head.append("Icefall / Spark, records per CPU-s")
        align.append("--:")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for (size, partitions), cell in grid.items():
        row = [GROWTH_SIZES[size][0], str(partitions)]
        for system in systems:
            r = cell.get(system)
            if isinstance(r, Throughput):
                row += [fmt(r.rate), fmt(r.per_cpu), fmt(r.per_gib), mib(r.peak_rss), str(r.commits), r.audit]
            else:
                row += ["failed" if r else "not run", "", "", "", "", ""]
        if ratio:
            ice, spark = cell.get("icefall"), cell.get("spark")
            if isinstance(ice, Throughput) and isinstance(spark, Throughput):
                row.append(fmt(ice.per_cpu / spark.per_cpu, ".2f"))
            else:
                row.append("n/a")
        lines.append("| " + " | ".join(row) + " |")
    drains = [
        (f"{system}, {GROWTH_SIZES[size][0]}, {partitions} partitions", r)
        for (size, partitions), cell in grid.items()
        for system, r in cell.items()
    ]
    return [*lines, "", PER_GIB_NOTE, "", *conditions_table(drains)]


def render_growth(ctx: Context, facts: dict[str, str], grid: Grid, started: str) -> str:
    a = ctx.args
    kind = "a short run (reduced scale)" if a.quick or a.records < 200_000 else "a full run"
    counts = {size: growth_counts(a, size) for size in a.growth_sizes}
    backlogs = ", ".join(
        f"{backlog:,} of {GROWTH_SIZES[size][0]} (warm-up {warmup:,})"
        for size, (backlog, warmup) in counts.items()
    )
    failed = [
        (f"{system} ({GROWTH_SIZES[size][0]}, {partitions} partitions)", r)
        for (size, partitions), cell in grid.items()
        for system, r in cell.items()
        if isinstance(r, str)
    ]
    lines = [
        "# Growth: throughput as events and partitions grow",
        "",
        f"`bench/compare.py {' '.join(a.argv)}` started {started}; this is **{kind}**. "
        "Each cell is the drain measurement of `bench/compare.py` (its docstring says how each figure is "
        "measured): the system starts on an empty topic, ingests a warm-up, then drains a backlog produced "
        "as fast as the client goes; records/s and records per CPU-second of its process tree over the "
        "drain, then the table audited by content (every backlog event exactly once, equal to the event "
        "produced). One run on a shared machine (see the load averages); compare runs only at similar "
        "loads.",
        "",
        f"Backlogs (about equal bytes per size): {backlogs}; partitions "
        f"{', '.join(str(p) for p in a.growth_partitions)}; a fresh topic per system and cell, the systems "
        f"one after another in each cell. Each at the same freshness target ({a.freshness_target:g} s): "
        f"Spark's trigger at Icefall's cadence ({cadence(ctx):g} s), `maxOffsetsPerTrigger` "
        f"{a.spark_max_offsets or 'unlimited'}, Kafka consumer "
        + ", ".join(f"`{k}={v}`" for k, v in SPARK_CONSUMER.items())
        + f" (Icefall's reader defaults). A trickle of {a.trickle:g} records/s meanwhile.",
        "",
        "Systems: " + "; ".join(f"**{s}**: {LABELS[s]}" for s in a.systems) + ".",
        "",
        *growth_table(a.systems, grid),
        *failure_section(failed),
        *settings_section(ctx),
        *machine_section(facts),
    ]
    return "\n".join(lines)


def write_growth(ctx: Context, facts: dict[str, str], grid: Grid, started: str) -> None:
    """The growth table to `--out` (a file; a folder gets growth.md), default bench/results/growth.md."""
    out = ctx.args.out or RESULTS / "growth.md"
    out = out / "growth.md" if out.is_dir() else out
    write_results(out, render_growth(ctx, facts, grid, started))


# --- sustained mode ----------------------------------------------------------------------------------

#: Pairs compared in a sustained run's ratio table: (format, Icefall's system, its Spark peer).
PAIRS = (
    ("JSON", "icefall", "spark"),
    ("JSON Schema", "icefall-jsonschema", "spark-jsonschema"),
    ("Avro", "icefall-avro", "spark-avro"),
)


def ratio_table(results: dict[str, Throughput | str]) -> list[str]:
    """Icefall / Spark per format that has both: records per CPU-s (above 1: Icefall does more with a
    CPU-second) and CPU-s per GiB (below 1: Icefall spends less); [] when no pair ran."""
    lines = []
    for name, ice, spark in PAIRS:
        i, s = results.get(ice), results.get(spark)
        if isinstance(i, Throughput) and isinstance(s, Throughput):
            lines.append(
                f"| {name} | {fmt(i.per_cpu / s.per_cpu, '.2f')} | {fmt(i.per_gib / s.per_gib, '.2f')} "
                f"| {fmt(i.rate / s.rate, '.2f')} |"
            )
    if not lines:
        return []
    return [
        "| format | Icefall / Spark, records per CPU-s | Icefall / Spark, CPU-s per GiB "
        "| Icefall / Spark, records/s |",
        "|---|--:|--:|--:|",
        *lines,
        "",
    ]


def render_sustained(ctx: Context, facts: dict[str, str], results: Results, started: str) -> str:
    a = ctx.args
    kind = (
        "a sustained run"
        if a.records >= SUSTAINED_RECORDS
        else f"a reduced-scale run (under {SUSTAINED_RECORDS:,} records: a smoke run, not a sustained figure)"
    )
    lines = [
        "# Sustained drains: the cost of a long stream",
        "",
        f"`bench/compare.py {' '.join(a.argv)}` started {started}; this is **{kind}**. "
        "The drain measurement of `bench/compare.py` (its docstring says how each figure is measured) on a "
        f"backlog of {a.records:,} ~230-byte events per system"
        + (f" and {a.large_records:,} ~1 KB ones" if a.large_records else "")
        + ": minutes of draining, where bench/results/compare.md's 200,000 records take ~10 s and "
        "fixed costs weigh. The systems run one after another, so a change of load between them falls on "
        "some of them only: the CPU probe and load averages at the start and end of every drain are in the "
        "table below each result; compare drains only at similar probes and loads.",
        "",
        f"{PARTITIONS} partitions, a fresh topic per system; a warm-up of {a.warmup_records:,} records "
        f"before each backlog (not measured); a trickle of {a.trickle:g} records/s meanwhile. Each at the "
        f"same freshness target ({a.freshness_target:g} s): Spark's trigger at Icefall's cadence "
        f"({cadence(ctx):g} s), `maxOffsetsPerTrigger` {a.spark_max_offsets or 'unlimited'}, Kafka consumer "
        + ", ".join(f"`{k}={v}`" for k, v in SPARK_CONSUMER.items())
        + " (Icefall's reader defaults). The audit by content covers every backlog record (a digest per "
        "event, memory bounded).",
        "",
        PER_GIB_NOTE,
        "",
        *avro_note(a.systems),
        "## Drains",
        "",
        *throughput_table(f"{a.records:,} events of ~230 bytes", results.small),
        *(throughput_table(f"{a.large_records:,} events of ~1 KB", results.large) if a.large_records else []),
        "## Icefall / Spark, per format",
        "",
        *(ratio_table(results.small) or ["No format had both systems in this run.", ""]),
        *failures(results),
        *settings_section(ctx),
        *machine_section(facts),
    ]
    return "\n".join(lines)


def comma_list(text: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated option."""
    return [item.strip() for item in text.split(",") if item.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="backlog of ~230-byte events")
    parser.add_argument("--large-records", type=int, default=50_000, help="backlog of ~1 KB events")
    parser.add_argument(
        "--seconds", type=float, default=60, help="live window (Connect: at least 1 interval)"
    )
    parser.add_argument("--rate", type=float, default=0, help="live rate (default: half of Icefall's)")
    parser.add_argument(
        "--trickle",
        type=float,
        default=5,
        help="records/s added during the backlog phases (see the docstring)",
    )
    parser.add_argument("--freshness-target", type=float, default=10)
    parser.add_argument(
        "--warmup-records",
        type=int,
        default=100_000,
        help="records each system ingests after its first commit, before the measured backlog (JIT, caches)",
    )
    parser.add_argument("--spark-max-offsets", type=int, default=0, help="maxOffsetsPerTrigger (0: none)")
    parser.add_argument(
        "--systems",
        help=f"comma-separated, run in this order (default: {','.join(SYSTEMS)}; "
        f"--growth: {','.join(GROWTH_SYSTEMS)})",
    )
    parser.add_argument(
        "--live-systems", default=",".join(LIVE_SYSTEMS), help="the live phase's, comma-separated"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a phase")
    parser.add_argument(
        "--quick", action="store_true", help="a few minutes: 40,000 + 10,000 records, 30 s live"
    )
    parser.add_argument(
        "--growth",
        action="store_true",
        help="only the drain measurement, over event sizes x partitions (bench/results/growth.md)",
    )
    parser.add_argument(
        "--growth-sizes", default=",".join(GROWTH_SIZES), help="--growth's event sizes, comma-separated"
    )
    parser.add_argument(
        "--growth-partitions",
        default=",".join(str(p) for p in GROWTH_PARTITIONS),
        help="--growth's partition counts, comma-separated",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results folder (default {RESULTS}); --growth: the markdown file (default: growth.md in it)",
    )
    parser.add_argument(
        "--sustained",
        action="store_true",
        help=f"only the drain measurement, on a backlog of {SUSTAINED_RECORDS:,} small events per system "
        f"(--records), systems {','.join(SUSTAINED_SYSTEMS)}, --timeout 3600, no 1 KB backlog unless "
        "--large-records; writes bench/results/sustained.md (--out: the file)",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also the CPU of each kind of thread over every drain (JVM executors, JIT, GC, Kafka, Python; "
        "/proc per thread at each sample), in a table per drain size",
    )
    parser.add_argument("--keep", type=Path, help="keep the state (logs, tables) in this new folder")
    args = parser.parse_args(argv)
    if args.sustained:  # its scale, unless an option says otherwise
        if args.quick or args.growth:
            parser.error("--sustained: not with --quick or --growth (give --records for a smaller run)")
        parser.set_defaults(records=SUSTAINED_RECORDS, large_records=0, timeout=3_600)
        args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.quick:
        args.records, args.large_records, args.seconds, args.warmup_records = 40_000, 10_000, 30, 10_000
    default_systems = (
        GROWTH_SYSTEMS if args.growth else SUSTAINED_SYSTEMS if args.sustained else DEFAULT_SYSTEMS
    )
    args.systems = comma_list(args.systems or ",".join(default_systems))
    args.live_systems = [] if args.sustained else comma_list(args.live_systems)
    if args.growth:
        args.live_systems = []  # no live phase
        args.growth_sizes = comma_list(args.growth_sizes)
        for size in args.growth_sizes:
            if size not in GROWTH_SIZES:
                parser.error(f"--growth-sizes: unknown size {size!r}; choose from {', '.join(GROWTH_SIZES)}")
        try:
            args.growth_partitions = [int(p) for p in comma_list(args.growth_partitions)]
        except ValueError:
            parser.error(f"--growth-partitions: not comma-separated integers: {args.growth_partitions!r}")
        if not all(p > 0 for p in args.growth_partitions):
            parser.error("--growth-partitions: each must be at least 1")
    for option, chosen, known in (
        ("--systems", args.systems, SYSTEMS),
        ("--live-systems", args.live_systems, LIVE_SYSTEMS),
    ):
        for system in chosen:
            if system not in known:
                parser.error(f"{option}: unknown system {system!r}; choose from {', '.join(known)}")

    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    facts = machine_basics()
    facts["Load average at start (1/5/15 min)"] = load_average()
    with bench_context(args, "icefall-compare-") as ctx:
        if args.growth:
            grid = run_growth(ctx)
        elif args.sustained:
            produced = producer_alone(ctx)
            results = Results()
            run_drains(ctx, results)
        else:
            results, produced = run_all(ctx)
    facts.update(versions(ctx))
    facts["Load average at end (1/5/15 min)"] = load_average()
    if args.growth:
        write_growth(ctx, facts, grid, started)
        return 0
    if args.sustained:
        facts.update(produced)
        out = args.out or RESULTS / "sustained.md"
        write_results(
            out / "sustained.md" if out.is_dir() else out, render_sustained(ctx, facts, results, started)
        )
        return 0
    args.out = args.out or RESULTS
    facts.update(produced)
    args.out.mkdir(parents=True, exist_ok=True)
    chart_line = chart(results, args.out / "compare.png")
    write_results(args.out / "compare.md", render(ctx, facts, results, chart_line, started))
    say(f"chart: {args.out / 'compare.png'}")
    return 0


@contextlib.contextmanager
def bench_context(args: argparse.Namespace, prefix: str) -> Iterator[Context]:
    """The run's Context: this process (and the broker it starts) pinned to core 0 and the systems to core 1
    when there are 2 or more cores; the state in `args.keep` (a new folder) or a temporary one named
    `prefix`...; one Kafka broker, and a schema registry when a registry system is among `args.systems`, both
    stopped (and a temporary state deleted) when the block ends."""
    pin: list[str] = []
    if len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset"):
        os.sched_setaffinity(0, {0})  # this process and the broker it starts: core 0
        pin = ["taskset", "-c", "1"]
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True)
            state = Path(args.keep.resolve())
        else:
            state = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        say("starting Kafka ...")
        broker = KafkaBroker(state / "kafka", heap="1g").start()
        stack.callback(broker.stop)
        registry = None
        if any(system in REGISTRY_SYSTEMS for system in getattr(args, "systems", ())):
            say("starting the schema registry ...")
            registry = SchemaRegistryServer(state / "registry").start()
            stack.callback(registry.stop)
        yield Context(broker, args, state, pin, registry=registry)


if __name__ == "__main__":
    sys.exit(main())
