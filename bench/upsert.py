"""Upsert benchmark: Icefall's keyed tables (`spec.mode: upsert`) beside Spark Structured Streaming's MERGE.

    .venv/bin/python bench/upsert.py [--keys N] [--backlog-changes N] [--rate R] [--seconds S]
                                     [--sample-seconds S] [--systems icefall,icefall-nocompact,spark]
                                     [--quick | --sustained] [--out FILE]
    (or: make bench-upsert BENCH_ARGS="...")

The machinery is bench/compare.py's (one Kafka broker, each system alone on a fresh 3-partition topic and
its own embedded SQLite catalog named `icefall` and warehouse, pinned to core 1 with the broker and this
process on core 0, CPU of the system's process tree from /proc, the same freshness target `F` and Spark's
trigger at Icefall's cadence `F/2`).

The workload (`Workload`, seeded, the same sequence for every system): the 9-field ~230-byte events of
`common.bench_event`, keyed by `id`; the Kafka key is the id as text (so a key stays in one partition and a
tombstone names it). First an initial load of one insert per key (`--keys`, 1,000,000), then a stream of
changes: ~89 % updates of a random live key, ~10 % inserts of a new key, ~1 % tombstones (null value) of a
random live key. Every change carries the produce time in `ts`.

Systems (table `bench.events`, unpartitioned, format 2, merge-on-read for MERGE, UPDATE and DELETE: Icefall's
`KEYED_TABLE_DEFAULTS`):
- **icefall**: `icefall run` (embedded: `local[2]`, in-process compaction on its thread) on a StreamingTable
  with `mode: upsert`, `key: [id]` (id required); each batch is one MERGE on its staging branch.
- **icefall-nocompact**: the same with `--no-maintenance` (no compaction at all).
- **spark**: `bench/peers/spark_streaming.py --upsert-key id`: Structured Streaming, `foreachBatch` cutting
  the micro-batch to the last record per key, then one `MERGE INTO` (tombstones delete); `local[2]`, driver
  memory 1g, the same jars, Kafka consumer options and trigger as in bench/compare.py. Its table is
  created up front with pyiceberg: the same columns (id optional: Spark's from_json yields nullable
  columns), no `_kafka` column.

Phases, per system (measured on its own topic):
1. Start-up: the system starts on a topic holding the first `START_KEYS` keys; it is up when its table has
   consumed them (Icefall: the committed offsets in the table; Spark: its checkpoint's last committed
   micro-batch's offsets). Not measured.
2. Initial load: the remaining keys produced as fast as the client goes; drain = first record produced to
   the commit that consumed the last (snapshot log time; compaction's `replace` snapshots are not
   commits here); records/s, records per CPU-second (user + system of the process tree) and CPU-s per GiB
   (those CPU-seconds / GiB of the Kafka keys and values produced, a tombstone its key only:
   `common.cpu_per_gib`) over it; the CPU probe and load averages before the first record and once the
   last is consumed (`common.Gauge`).
3. Change backlog: `--backlog-changes` changes produced as fast as the client goes; the same figures.
4. Live: changes at `--rate` records/s for `--seconds`, the table's files sampled every
   `--sample-seconds` (data files, delete files, position deletes, records of main's head). Freshness of
   a change = when main first held its row (snapshot log time of the MERGE's snapshot that added its data
   file) - its produce time: p50/p99 over the rows written in the window. A change overwritten by a later
   one of the same micro-batch, and a tombstone, write no row: they are not measured. CPU cores busy = CPU
   seconds of the tree over the window / its length. Then the producer stops and the system drains what
   is left; then it is stopped (Icefall's log then tells how many batches were planned again because
   maintenance moved `main` under a staged MERGE: `REPLANNED`).
5. Reads, by a Spark session of this process (`local[2]`, on every core: the system is stopped) on the
   system's catalog: a full scan (`SELECT count(*), sum(amount)`) and a point lookup by key (`SELECT *
   ... WHERE id = k`), each run `READS` times, the median reported (the first run included: a cold start
   is what a reader sees).
6. Exactness: the final table against the model (the workload's last value per key, deletes removed) by
   content (every column but `ts`, compared like bench/compare.py's audit; the table read a batch at a
   time); Icefall's table also by `icefall.audit.keyed.audit_keyed` (`icefall verify`: the table against
   the topic, row by row).

`--quick` (a smoke run): 50,000 keys, 10,000 changes, 60 s live at 300/s, files sampled every 5 s; an
option given beside it wins. A full run (the defaults) streams an hour per system: over three hours in all.
`--sustained` (issue #45 item 5): the ingest phases at scale, 5,000,000 keys and 5,000,000 changes, a 60 s
live phase at 1,000/s, systems icefall,spark, `--timeout` 7200; writes bench/results/sustained-upsert.md.
Not bounded in memory: the model holds every live key's value (~450 bytes a key: ~2.5 GB at 5M keys).

Writes bench/results/upsert.md (or `--out`). Nothing asserts on time. One run on a shared machine: the load
averages at start and end are in the report; compare runs only at similar loads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from common import (
    EVENT_SCHEMA,
    SMALL_NOTE_WORDS,
    Gauge,
    Tally,
    TreeMonitor,
    bench_event,
    cpu_per_gib,
    load_average,
    machine_basics,
    machine_section,
    percentile,
    write_results,
)
from compare import (
    CONTENT,
    PER_GIB_NOTE,
    RESULTS,
    TABLE,
    Commit,
    Context,
    LiveProducer,
    Run,
    added_ts_by_snapshot,
    bench_context,
    cadence,
    comma_list,
    failure_section,
    fmt,
    icefall_manifest,
    mib,
    preload,
    same,
    say,
    settings_section,
    spark_peer_argv,
    versions,
    wait_for,
)
from confluent_kafka import Consumer, TopicPartition
from pyiceberg.table.snapshots import Operation

from icefall.api import load_manifest, to_iceberg_schema
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import KEYED_TABLE_DEFAULTS, TABLE_DEFAULTS
from icefall.commit import read_committed
from icefall.devstack.procs import ManagedProcess
from icefall.ingest.engine import SPARK_CONSUMER_DEFAULTS as SPARK_CONSUMER

PARTITIONS = 3
SYSTEMS = ("icefall", "icefall-nocompact", "spark")
LABELS = {
    "icefall": "Icefall upsert, in-process compaction",
    "icefall-nocompact": "Icefall upsert, no compaction",
    "spark": "Spark Structured Streaming, foreachBatch MERGE",
}
#: `--sustained`'s keys of the initial load and changes of the backlog (each a drain of at least 5M records).
SUSTAINED_KEYS = 5_000_000
#: Keys of the initial load produced before the system starts (its start-up, not measured).
START_KEYS = 1_000
#: What Icefall logs when maintenance moved `main` under a staged keyed batch (planned again, not re-staged).
REPLANNED = "commit refused (main moved by maintenance"
#: Runs of each read query; the median is reported.
READS = 3
#: Shares of the change stream: updates of a live key, inserts of a new key, tombstones of a live key.
UPDATE_SHARE, INSERT_SHARE, DELETE_SHARE = 0.89, 0.10, 0.01

#: What the workload counts: the initial load's inserts, then the change stream's kinds.
KINDS = ("load", "insert", "update", "delete")
Change = tuple[str, bytes | None, int]  # (Kafka key, JSON value or None for a tombstone, timestamp ms)


# --- the workload (pure) -----------------------------------------------------------------------------


@dataclass
class Workload:
    """The seeded keyed change stream and its model (the last value per live key).

    `initial()` yields one insert per key 0..keys-1; `changes()` then yields updates, inserts and tombstones
    in the shares above, forever. Each change is generated when it is asked for (`ts` = now), and the model
    follows: `model[id]` is the JSON value of the key's last change, a tombstone removes the key.
    """

    seed: int
    keys: int
    note_words: int = SMALL_NOTE_WORDS
    model: dict[int, bytes] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    _live: list[int] = field(default_factory=list)  # live keys, for a random pick
    _where: dict[int, int] = field(default_factory=dict)  # key -> its index in _live
    _next_id: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def initial(self) -> Iterator[Change]:
        while self._next_id < self.keys:
            yield self._write(self._new_key(), "load")

    def changes(self) -> Iterator[Change]:
        while True:
            pick = self._rng.random()
            if not self._live or pick >= UPDATE_SHARE + DELETE_SHARE:
                yield self._write(self._new_key(), "insert")
            elif pick < DELETE_SHARE:
                yield self._delete(self._live[self._rng.randrange(len(self._live))])
            else:
                yield self._write(self._live[self._rng.randrange(len(self._live))], "update")

    def _new_key(self) -> int:
        key = self._next_id
        self._next_id += 1
        self._where[key] = len(self._live)
        self._live.append(key)
        return key

    def _write(self, key: int, kind: str) -> Change:
        now_ms = int(time.time() * 1000)
        event = bench_event(key, self._rng, now_ms, self.note_words)
        value = json.dumps(event, separators=(",", ":")).encode()
        self.model[key] = value
        self.counts[kind] += 1
        return str(key), value, now_ms

    def _delete(self, key: int) -> Change:
        index = self._where.pop(key)
        last = self._live.pop()
        if last != key:  # move the last key into the hole
            self._live[index], self._where[last] = last, index
        del self.model[key]
        self.counts["delete"] += 1
        return str(key), None, int(time.time() * 1000)


def compare_rows(model: dict[int, bytes], rows: Iterable[dict[str, Any]]) -> str:
    """The table's `rows` (CONTENT columns) against the model by content: "exact", or what differs."""
    seen: dict[int, int] = {}
    wrong = 0
    for row in rows:
        seen[row["id"]] = seen.get(row["id"], 0) + 1
        want = model.get(row["id"])
        if want is None:
            continue  # counted as unexpected below
        event = json.loads(want)
        if any(not same(row[c], event[c]) for c in CONTENT):
            wrong += 1
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    missing = sum(1 for k in model if k not in seen)
    unexpected = sum(1 for k in seen if k not in model)
    if not (duplicates or missing or unexpected or wrong):
        return "exact"
    return f"{missing} missing, {unexpected} unexpected (deleted or never written), {wrong} differ, " \
        f"{duplicates} duplicates"  # fmt: skip


# --- the systems -------------------------------------------------------------------------------------


def keyed_manifest(ctx: Context, topic: str) -> dict[str, Any]:
    """bench/compare.py's StreamingTable made keyed: `mode: upsert`, `key: [id]` (required), unpartitioned."""
    manifest = icefall_manifest(ctx, topic)
    manifest["metadata"]["name"] = "bench-upsert"
    spec = manifest["spec"]
    spec.update(mode="upsert", key=["id"])
    spec["format"]["schema"] = [{**f, "required": True} if f["name"] == "id" else f for f in EVENT_SCHEMA]
    del spec["table"]["partitioning"]
    return manifest


def create_peer_table(ctx: Context, catalog: CatalogConfig) -> None:
    """Spark's table: Icefall's columns without `_kafka` (all optional), unpartitioned, merge-on-read."""
    st = load_manifest(yaml.safe_dump(icefall_manifest(ctx, "unused")))
    pyiceberg = catalog.pyiceberg()
    pyiceberg.create_namespace_if_not_exists(TABLE[0])
    properties = {**TABLE_DEFAULTS, **KEYED_TABLE_DEFAULTS, "format-version": "2"}
    pyiceberg.create_table(TABLE, to_iceberg_schema(st.spec.format.schema_fields), properties=properties)


def launch(ctx: Context, system: str, topic: str, work: Path) -> Run:
    work.mkdir(parents=True)
    started = time.time()
    catalog = CatalogConfig.embedded(work)
    if system.startswith("icefall"):
        manifest = work / "upsert.yaml"
        manifest.write_text(yaml.safe_dump(keyed_manifest(ctx, topic), sort_keys=False))
        no_maintenance = ["--no-maintenance"] if system == "icefall-nocompact" else []
        icefall = str(Path(sys.executable).with_name("icefall"))
        argv = [icefall, "run", "-f", str(manifest), "--state-dir", str(work), *no_maintenance]
        ctx.settings[system] = {
            "command": f"icefall run -f upsert.yaml --state-dir <dir> {' '.join(no_maintenance)}".strip()
            + " (--master local[2])",
            "StreamingTable": "mode upsert, key [id] (required), unpartitioned, freshness target "
            f"{ctx.args.freshness_target:g} s, dead-letter table on",
            "compaction": "none" if no_maintenance else "in-process, on its thread (default policy)",
        }
    else:
        create_peer_table(ctx, catalog)
        argv = spark_peer_argv(ctx, topic, work, catalog, "--upsert-key", "id")
        ctx.settings[system] = {
            "command": "bench/peers/spark_streaming.py --upsert-key id (master local[2], driver memory 1g)",
            "trigger": f"processingTime {cadence(ctx):g} s (Icefall's cadence at the same target)",
            "Kafka consumer": ", ".join(f"kafka.{k}={v}" for k, v in SPARK_CONSUMER.items()),
            "write": "foreachBatch: last record per key (row_number by offset), one MERGE INTO; "
            "checkpoint folder",
            "table": "created with pyiceberg: unpartitioned, format 2, merge-on-read (merge, update, delete)",
        }
    proc = ManagedProcess(system, [*ctx.pin, *argv], work / "system.log").start()
    assert proc.pid is not None
    return Run(system, topic, work, proc, TreeMonitor(proc.pid).start(), started, catalog)


def consumed(run: Run) -> dict[int, int]:
    """The next offset to read per partition that the system's table holds (Icefall: its committed
    state; Spark: the offsets of its checkpoint's last committed micro-batch); {} before any."""
    if run.system.startswith("icefall"):
        assert run.catalog is not None
        try:
            return dict(read_committed(run.catalog.pyiceberg().load_table(TABLE)).offsets)
        except Exception:  # not created yet, or SQLite busy: on the next poll
            return {}
    commits = [int(p.name) for p in (run.work / "checkpoint" / "commits").glob("[0-9]*")]
    if not commits:
        return {}
    offsets = (run.work / "checkpoint" / "offsets" / str(max(commits))).read_text().splitlines()
    return {int(p): int(o) for p, o in json.loads(offsets[-1])[run.topic].items()}


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-upsert-watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def until_consumed(ctx: Context, run: Run, timeout: float | None = None) -> list[Commit]:
    """Wait until the system's table holds every record of its topic now; its commits then."""
    ends = end_offsets(ctx.broker.bootstrap, run.topic)

    def done(_commits: list[Commit]) -> bool:
        got = consumed(run)
        return all(got.get(p, 0) >= end for p, end in ends.items())

    return wait_for(run, done, timeout or ctx.args.timeout)


# --- the phases --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    records: int
    seconds: float
    per_cpu: float
    commits: int
    cpu_s: float = float("nan")  # CPU seconds of the process tree over the drain
    payload_bytes: int = 0  # keys + values produced (a tombstone: its key only), `common.Tally`
    start: Gauge | None = None  # CPU probe and load average before the first record
    end: Gauge | None = None  # the same once the last record was consumed

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")

    @property
    def per_gib(self) -> float:
        """CPU-s per GiB of keys + values (`common.cpu_per_gib`)."""
        return cpu_per_gib(self.cpu_s, self.payload_bytes)


@dataclass(frozen=True)
class Files:
    at: float  # seconds since the live window began
    data: int
    deletes: int
    position_deletes: int
    records: int  # in the data files, deleted ones included until a rewrite drops them


@dataclass
class Result:
    system: str
    load: Drain | None = None
    backlog: Drain | None = None
    rate: float = 0
    window_s: float = 0
    produced: int = 0
    measured: int = 0
    p50: float = float("nan")
    p99: float = float("nan")
    cpu_cores: float = float("nan")
    peak_rss: int = 0
    files: list[Files] = field(default_factory=list)
    scan_s: float = float("nan")
    lookup_s: float = float("nan")
    rows: int = 0
    model_keys: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    exact: str = "not checked"
    audit: str = "n/a"
    replanned: str = "n/a"  # Icefall: batches planned again because maintenance moved main
    error: str = ""


def drain(ctx: Context, run: Run, records: Iterator[Change], count: int) -> Drain:
    """Produce `count` of `records` as fast as the client goes; time it to the commit that consumed all."""
    before = len(writes(run, run.commits()))
    produced = Tally(records)
    gauge = Gauge.now()
    started, cpu_start = time.time(), run.monitor.sample().cpu
    preload(ctx.broker.bootstrap, run.topic, count, SMALL_NOTE_WORDS, 0, records=produced)
    commits = writes(run, until_consumed(ctx, run))
    end = commits[-1].visible_ms / 1000 if commits else time.time()
    cpu = run.monitor.cpu_at(end) - cpu_start
    return Drain(
        count,
        end - started,
        count / cpu if cpu > 0 else float("nan"),
        len(commits) - before,
        cpu_s=cpu,
        payload_bytes=produced.bytes,
        start=gauge,
        end=Gauge.now(),
    )


def writes(run: Run, commits: list[Commit]) -> list[Commit]:
    """`commits` but compaction's (`replace`: the same rows again), so the last is the last write."""
    assert run.catalog is not None
    table = run.catalog.pyiceberg().load_table(TABLE)
    kept = []
    for commit in commits:
        snapshot = table.snapshot_by_id(commit.snapshot_id)
        if snapshot is None or snapshot.summary is None or snapshot.summary.operation != Operation.REPLACE:
            kept.append(commit)
    return kept


def files_now(catalog: CatalogConfig, since: float) -> Files | None:
    try:
        snapshot = catalog.pyiceberg().load_table(TABLE).current_snapshot()
    except Exception:  # SQLite busy: the next sample
        return None
    if snapshot is None or snapshot.summary is None:
        return None
    summary = snapshot.summary
    return Files(
        time.time() - since,
        int(summary.get("total-data-files") or 0),
        int(summary.get("total-delete-files") or 0),
        int(summary.get("total-position-deletes") or 0),
        int(summary.get("total-records") or 0),
    )


def live(ctx: Context, run: Run, workload: Workload, result: Result) -> None:
    """Changes at `--rate` for `--seconds`, files sampled meanwhile; then freshness of the rows written."""
    a = ctx.args
    assert run.catalog is not None
    producer = LiveProducer(ctx.broker.bootstrap, run.topic, a.rate, 0, records=workload.changes())
    start_ms = int(time.time() * 1000)
    cpu_start = run.monitor.sample().cpu
    producer.start()
    say(f"{run.system}: live at {a.rate:,.0f} changes/s for {a.seconds:g}s")
    deadline = time.monotonic() + a.seconds
    while (left := deadline - time.monotonic()) > 0:
        if (sample := files_now(run.catalog, start_ms / 1000)) is not None:
            result.files.append(sample)
        time.sleep(min(a.sample_seconds, max(left, 0)))
    producer.stop()
    end_ms = int(time.time() * 1000)
    result.cpu_cores = (run.monitor.sample().cpu - cpu_start) / ((end_ms - start_ms) / 1000)
    result.rate, result.window_s, result.produced = a.rate, (end_ms - start_ms) / 1000, producer.acked
    commits = until_consumed(ctx, run)
    if (sample := files_now(run.catalog, start_ms / 1000)) is not None:
        result.files.append(sample)
    visible = {c.snapshot_id: c.visible_ms for c in commits}
    writes = (Operation.APPEND, Operation.OVERWRITE)  # a MERGE that deletes or replaces rows: overwrite
    latencies = [
        (visible[snapshot_id] - ts) / 1000
        for snapshot_id, produced in added_ts_by_snapshot(run.catalog, writes)
        if snapshot_id in visible
        for ts in produced
        if start_ms <= ts <= end_ms
    ]
    result.measured = len(latencies)
    result.p50, result.p99 = percentile(latencies, 50), percentile(latencies, 99)


def reads(run: Run, workload: Workload, result: Result) -> None:
    """Read times by a Spark session of this process, the model check, and `audit_keyed` for Icefall."""
    from icefall.audit import audit_keyed
    from icefall.spark.session import build_spark_session

    assert run.catalog is not None
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the system is stopped: its core is free
    try:
        spark = build_spark_session([run.catalog], master="local[2]", app_name="bench-upsert-reads")
    finally:
        os.sched_setaffinity(0, pinned)
    try:
        name = f"{run.catalog.name}.{'.'.join(TABLE)}"
        probe = random.Random(7).choice(sorted(workload.model))

        def timed(sql: str) -> float:
            times = []
            for _ in range(READS):
                started = time.monotonic()
                spark.sql(sql).collect()
                times.append(time.monotonic() - started)
            return statistics.median(times)

        result.scan_s = timed(f"SELECT count(*), sum(amount) FROM {name}")
        result.lookup_s = timed(f"SELECT * FROM {name} WHERE id = {probe}")
        scan = run.catalog.pyiceberg().load_table(TABLE).scan(selected_fields=CONTENT)
        read = 0

        def rows() -> Iterator[dict[str, Any]]:  # a batch at a time: memory bounded by a batch, not the table
            nonlocal read
            for batch in scan.to_arrow_batch_reader():
                read += batch.num_rows
                yield from batch.to_pylist()

        result.exact = compare_rows(workload.model, rows())
        result.rows, result.model_keys = read, len(workload.model)
        if run.system.startswith("icefall"):
            st = load_manifest((run.work / "upsert.yaml").read_text())
            report = audit_keyed(spark, st, run.catalog.pyiceberg(), run.catalog.name)
            result.audit = "OK" if report.ok else report.render().replace("\n", "; ")
    finally:
        spark.stop()
        fresh_jvm_next()


def fresh_jvm_next() -> None:
    """End this process's Spark JVM, so that the next system's reads start their own: a JVM that died (an
    out-of-memory audit) would otherwise stay PySpark's gateway, and every session after it fail with
    'Connection refused'. PySpark's JVM exits when its stdin closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    SparkContext._gateway = SparkContext._jvm = None
    if gateway is not None:
        gateway.close()
        gateway.proc.stdin.close()
        gateway.proc.wait(60)


def bench_system(ctx: Context, result: Result) -> None:
    """Every phase for `result.system`, filling `result` as it goes (a failure keeps what was measured)."""
    a = ctx.args
    system = result.system
    topic = f"upsert-{system}"
    ctx.broker.create_topic(topic, partitions=PARTITIONS)
    workload = Workload(seed=a.seed, keys=a.keys)
    initial = workload.initial()
    preload(ctx.broker.bootstrap, topic, min(START_KEYS, a.keys), SMALL_NOTE_WORDS, 0, records=initial)
    run = launch(ctx, system, topic, ctx.state / system)
    try:
        say(f"{system}: started; waiting until it holds the first {min(START_KEYS, a.keys):,} keys ...")
        until_consumed(ctx, run)
        say(f"{system}: initial load of {a.keys - START_KEYS:,} keys ...")
        result.load = drain(ctx, run, initial, max(a.keys - START_KEYS, 0))
        say(f"{system}: {result.load.rate:,.0f} records/s, {result.load.per_cpu:,.0f} per CPU-s; "
            f"a backlog of {a.backlog_changes:,} changes ...")  # fmt: skip
        changes = workload.changes()
        result.backlog = drain(ctx, run, changes, a.backlog_changes)
        say(f"{system}: {result.backlog.rate:,.0f} changes/s, {result.backlog.per_cpu:,.0f} per CPU-s")
        live(ctx, run, workload, result)
        say(f"{system}: freshness p50 {result.p50:.1f}s p99 {result.p99:.1f}s")
    finally:
        run.stop()
    result.peak_rss = run.monitor.peak_rss
    if system.startswith("icefall"):
        result.replanned = str(run.proc.log_path.read_text(errors="replace").count(REPLANNED))
    result.changes = dict(workload.counts)
    reads(run, workload, result)
    say(f"{system}: scan {result.scan_s:.2f}s, lookup {result.lookup_s:.2f}s, model: {result.exact}, "
        f"audit: {result.audit}")  # fmt: skip


# --- report ------------------------------------------------------------------------------------------


def thinned(samples: list[Files], most: int) -> list[Files]:
    """At most `most` of `samples`, evenly spread, the first and the last kept."""
    if len(samples) <= most:
        return samples
    step = (len(samples) - 1) / (most - 1)
    return [samples[round(i * step)] for i in range(most)]


def drain_cells(d: Drain | None) -> list[str]:
    """A drain's column: records, per s, per CPU-s, CPU-s per GiB, the drain, bytes, probe, load."""
    if d is None:
        return ["n/a"] * 8
    gauges = (
        [f"{d.start.probe:.2f} → {d.end.probe:.2f} s", f"{d.start.load} → {d.end.load}"]
        if d.start and d.end
        else ["n/a", "n/a"]
    )
    return [
        f"{d.records:,}",
        fmt(d.rate),
        fmt(d.per_cpu),
        fmt(d.per_gib),
        f"{d.seconds:.1f} s, {d.commits} commits",
        f"{d.payload_bytes / 2**20:,.1f} MiB ({d.payload_bytes / d.records:,.0f} per record)"
        if d.records
        else "n/a",
        *gauges,
    ]


def render(ctx: Context, facts: dict[str, str], results: list[Result], started: str) -> str:
    a = ctx.args
    kind = (
        "a QUICK run (`--quick`: a smoke run at reduced scale) on a shared 2-core machine (other work ran "
        "at the same time: see the load averages), so every figure is noisy"
        if a.quick
        else "a sustained run (`--sustained`: the ingest phases at scale, a short live phase)"
        if a.sustained and a.keys >= SUSTAINED_KEYS
        else "a reduced-scale `--sustained` run (a smoke run, not a sustained figure)"
        if a.sustained
        else "a full run on a shared machine (see the load averages)"
    )
    # A system that failed after its initial load keeps its column: what was measured stands (its error is
    # under Failures, and the cells not reached say n/a or not checked).
    ok = [r for r in results if r.load is not None]
    head = "| | " + " | ".join(LABELS[r.system] for r in ok) + " |"
    rule = "|---|" + "--:|" * len(ok)

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    loads = [drain_cells(r.load) for r in ok]
    backlogs = [drain_cells(r.backlog) for r in ok]
    lines = [
        "# Upserts: Icefall's keyed tables beside Spark Structured Streaming's MERGE",
        "",
        f"`bench/upsert.py {' '.join(a.argv)}` started {started}; this is **{kind}**. How each figure is "
        "measured: the docstring of `bench/upsert.py`. The systems run one after another, so a change of "
        "load between them falls on some of them only (load averages at the start and end: under Machine).",
        "",
        f"Workload: {a.keys:,} keys (~230-byte JSON events of 9 fields, keyed by `id`, the Kafka key the "
        f"id), {PARTITIONS} partitions, a fresh topic per system; an initial load of one insert per key, "
        f"then changes: ~{UPDATE_SHARE:.0%} updates of a random live key, ~{INSERT_SHARE:.0%} inserts of "
        "new keys, "
        f"~{DELETE_SHARE:.0%} tombstones. A backlog of {a.backlog_changes:,} changes, then a live stream at "
        f"{a.rate:,.0f} changes/s for **{a.seconds:g} s** per system (the issue's one hour is "
        "`--seconds 3600`, the default of a full run). Freshness target "
        f"{a.freshness_target:g} s for every system (Spark's trigger at Icefall's cadence, "
        f"{cadence(ctx):g} s).",
        "",
        "## Ingest",
        "",
        head,
        rule,
        row("initial load: records", [c[0] for c in loads]),
        row("initial load: records/s", [c[1] for c in loads]),
        row("initial load: records per CPU-s", [c[2] for c in loads]),
        row("initial load: CPU-s per GiB", [c[3] for c in loads]),
        row("initial load: drain", [c[4] for c in loads]),
        row("initial load: keys + values produced", [c[5] for c in loads]),
        row("initial load: CPU probe, start → end", [c[6] for c in loads]),
        row("initial load: load average 1/5/15 min, start → end", [c[7] for c in loads]),
        row("change backlog: changes", [c[0] for c in backlogs]),
        row("change backlog: changes/s", [c[1] for c in backlogs]),
        row("change backlog: changes per CPU-s", [c[2] for c in backlogs]),
        row("change backlog: CPU-s per GiB", [c[3] for c in backlogs]),
        row("change backlog: drain", [c[4] for c in backlogs]),
        row("change backlog: keys + values produced", [c[5] for c in backlogs]),
        row("change backlog: CPU probe, start → end", [c[6] for c in backlogs]),
        row("change backlog: load average 1/5/15 min, start → end", [c[7] for c in backlogs]),
        row("live: changes produced in the window", [f"{r.produced:,} in {r.window_s:.0f} s" for r in ok]),
        row("live: freshness p50 / p99", [f"{fmt(r.p50, '.1f')} / {fmt(r.p99, '.1f')} s" for r in ok]),
        row("live: rows measured for freshness", [f"{r.measured:,}" for r in ok]),
        row("live: CPU cores busy", [fmt(r.cpu_cores, ".2f") for r in ok]),
        row("peak RSS of the process tree", [mib(r.peak_rss) for r in ok]),
        row("batches planned again: maintenance moved main (from its log)", [r.replanned for r in ok]),
        "",
        PER_GIB_NOTE + " A tombstone counts its key only.",
        "",
        "## After the run",
        "",
        head,
        rule,
        row(f"full scan, `count(*), sum(amount)` (median of {READS})", [f"{r.scan_s:.2f} s" for r in ok]),
        row(f"point lookup by key (median of {READS})", [f"{r.lookup_s:.2f} s" for r in ok]),
        row(
            "data files / delete files at the end",
            [f"{r.files[-1].data} / {r.files[-1].deletes}" if r.files else "n/a" for r in ok],
        ),
        row("rows / keys in the model", [f"{r.rows:,} / {r.model_keys:,}" for r in ok]),
        row(
            "records produced: initial load / inserts / updates / tombstones",
            [" / ".join(f"{r.changes.get(k, 0):,}" for k in KINDS) for r in ok],
        ),
        row("exact against the model, by content", [r.exact for r in ok]),
        row("`icefall verify` (audit_keyed)", [r.audit for r in ok]),
        "",
        f"## Files over the live window (main's head, sampled every {a.sample_seconds:g} s)",
        "",
        "From the head snapshot's summary: `total-data-files`, `total-delete-files` (position-delete files: "
        "one per MERGE that replaced or deleted rows), `total-position-deletes` and `total-records` (rows in "
        "the data files, the deleted ones included). A compaction that rewrites data files applies the "
        "deletes (records drop), while the delete files stay counted until something removes them.",
        "",
    ]
    for r in ok:
        lines += [
            f"### {LABELS[r.system]}",
            "",
            "| seconds | data files | delete files | position deletes | records in data files |",
            "|--:|--:|--:|--:|--:|",
            *(
                f"| {s.at:.0f} | {s.data} | {s.deletes} | {s.position_deletes:,} | {s.records:,} |"
                for s in thinned(r.files, 12)
            ),
            "",
        ]
    lines += [
        *failure_section([(LABELS[r.system], r.error) for r in results if r.error]),
        *settings_section(
            ctx,
            "| all | catalog | SQLite (pyiceberg SqlCatalog / Iceberg JdbcCatalog, catalog name `icefall`), "
            "local warehouse, one per system |",
            "| reads | Spark | a session of the bench process, local[2] on every core, after the system "
            "stopped |",
        ),
        *machine_section(facts),
    ]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys of the initial load")
    parser.add_argument("--backlog-changes", type=int, default=200_000, help="changes of the drained backlog")
    parser.add_argument("--rate", type=float, default=1_000, help="changes/s of the live stream")
    parser.add_argument("--seconds", type=float, default=3_600, help="the live stream's length per system")
    parser.add_argument("--sample-seconds", type=float, default=60, help="files sampled every S seconds")
    parser.add_argument("--freshness-target", type=float, default=10)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, run in this order")
    parser.add_argument("--timeout", type=float, default=1_800, help="seconds to wait for a phase")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 50,000 keys, 10,000 changes, 60 s live at 300/s"
    )
    parser.add_argument(
        "--sustained",
        action="store_true",
        help=f"the ingest phases at scale: {SUSTAINED_KEYS:,} keys, {SUSTAINED_KEYS:,} changes, 60 s live at "
        "1,000/s, systems icefall,spark, --timeout 7200, bench/results/sustained-upsert.md",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "upsert.md")
    parser.add_argument("--keep", type=Path, help="keep the state (logs, tables) in this new folder")
    args = parser.parse_args(argv)
    if args.quick and args.sustained:
        parser.error("--quick and --sustained: one or the other (give --keys for a smaller sustained run)")
    if args.quick:  # its scale, unless an option says otherwise
        parser.set_defaults(keys=50_000, backlog_changes=10_000, seconds=60, rate=300, sample_seconds=5)
        args = parser.parse_args(argv)
    if args.sustained:  # the same
        parser.set_defaults(
            keys=SUSTAINED_KEYS, backlog_changes=SUSTAINED_KEYS, seconds=60, sample_seconds=10, timeout=7_200,
            systems="icefall,spark", out=RESULTS / "sustained-upsert.md",
        )  # fmt: skip
        args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.systems = comma_list(args.systems)
    args.live_systems = []
    for system in args.systems:
        if system not in SYSTEMS:
            parser.error(f"--systems: unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
    if args.keys <= START_KEYS:
        parser.error(f"--keys: more than {START_KEYS:,} (the start-up's keys)")

    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    facts = machine_basics()
    facts["Load average at start (1/5/15 min)"] = load_average()
    results = []
    with bench_context(args, "icefall-upsert-") as ctx:
        for system in args.systems:
            results.append(Result(system))
            try:
                bench_system(ctx, results[-1])
            except Exception as exc:
                say(f"{system} FAILED: {exc}")
                results[-1].error = str(exc)
    facts.update(versions(ctx))
    facts["Load average at end (1/5/15 min)"] = load_average()
    write_results(args.out, render(ctx, facts, results, started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
