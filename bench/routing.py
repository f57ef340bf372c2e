"""Routing (#43): one topic of 20 event types into 20 tables, three ways, same records, one run.

    .venv/bin/python bench/routing.py [--types 20] [--records N] [--parallel P] [--rate R] [--seconds S]

Forms, each `icefall run` (embedded catalog, `local[2]`, one state folder per process):
- **routed**: ONE StreamingTable with `--types` static routes (`when: "type = 'tNN'"`) into one table per
  type, `unrouted: DeadLetter`;
- **filtered**: `--types` StreamingTables, each reading the whole topic with `spec.transforms.filter:
  "type = 'tNN'"` into its own table (the only way to split a topic before routes); `--parallel` of them run
  at a time in the drain, all of them at once live (only when `--live-forms` names `filtered`);
- **one table**: one plain StreamingTable of the whole topic, the baseline the issue's target names
  (routed ≤ 1.3x its CPU).

Drain: a 3-partition topic preloaded with `--records` seeded bench events (`common.bench_event`, ~230 B)
plus a `type` field (uniform over `--types`), drained by each form with `--until-caught-up
--no-maintenance`. Records per CPU-second: the topic's records over the CPU (user + system, from /proc) of
every process of the form, (1) over each process's drain only (its first batch's start to its last batch's
line) and (2) over each process's whole life (Spark's start included: what N drivers pay N times). Every
table is then audited by content before a number is reported: each record of the topic, read back from
Kafka, is in its type's table exactly once (partition, offset, id), no other table holds it, and no dead
letters. Live: each form in turn (a fresh topic each) while a producer writes `--rate` records/s; the
window of `--seconds` opens once every process of the form has committed a batch and `--warmup` more
seconds passed; CPU over the window, and freshness per record: the time its snapshot became `main`'s head
(the table's snapshot log) minus its produce time (`ts`), p50/p99 over the records produced in the window,
all of the form's tables pooled. The live tables are audited the same way. Nothing here asserts on time.
`BENCH_ROUTING_CPROFILE=DIR` runs each driver under cProfile (its main thread's Python only; the figures
then include the profiler's overhead), writing `DIR/<process>.prof` (`routed.prof`, `all.prof`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    EVENT_SCHEMA,
    SMALL_NOTE_WORDS,
    TreeMonitor,
    bench_event,
    iso_ms,
    load_average,
    machine_basics,
    machine_section,
    percentile,
    stop_group,
    write_results,
)
from confluent_kafka import Consumer, Producer, TopicPartition

from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker, create_topic

RESULTS = Path(__file__).parent / "results" / "routing.md"
PARTITIONS = 3
NAMESPACE = "bench"
SCHEMA = [*EVENT_SCHEMA, {"name": "type", "type": "string"}]
BATCH_LINE = re.compile(r"\[run\] batch \d+: (\d+) read.* in ([0-9.]+)s ")
PHASE = re.compile(r" \| ([a-z_]+) ([0-9.]+)s")


def type_name(n: int) -> str:
    return f"t{n:02d}"


# --- records -----------------------------------------------------------------------------------------


def events(seed: int, types: int, start: int) -> Iterator[tuple[str, bytes, int]]:
    """(key, JSON value, produce ms) forever: bench events with a `type` uniform over `types`."""
    rng = random.Random(seed)
    i = start
    while True:
        now_ms = int(time.time() * 1000)
        event = bench_event(i, rng, now_ms, SMALL_NOTE_WORDS)
        event["ts"] = iso_ms(now_ms)
        event["type"] = type_name(rng.randrange(types))
        yield str(event["key"]), json.dumps(event, separators=(",", ":")).encode(), now_ms
        i += 1


def send(producer: Producer, topic: str, record: tuple[str, bytes, int]) -> None:
    key, value, ts = record
    while True:
        try:
            producer.produce(topic, key=key, value=value, timestamp=ts)
            return
        except BufferError:
            producer.poll(0.1)


def preload(bootstrap: str, topic: str, records: int, types: int) -> None:
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    source = events(seed=7, types=types, start=0)
    for _ in range(records):
        send(producer, topic, next(source))
    assert producer.flush(60) == 0


class LiveProducer(threading.Thread):
    """Produces `rate` records/s (in 10 ms slices) until stopped; `sent` counts them."""

    def __init__(self, bootstrap: str, topic: str, rate: float, types: int) -> None:
        super().__init__(daemon=True, name="live-producer")
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.topic, self.rate, self.types = topic, rate, types
        self.sent = 0
        self.halt = threading.Event()

    def run(self) -> None:
        source = events(seed=11, types=self.types, start=10_000_000)
        started = time.monotonic()
        while not self.halt.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                send(self.producer, self.topic, next(source))
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        assert self.producer.flush(60) == 0

    def stop(self) -> None:
        self.halt.set()
        self.join(90)


def topic_content(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple[int, str]]:
    """(partition, offset) -> (id, type) of every record of `topic`, read back from Kafka."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    try:
        total = sum(consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in range(PARTITIONS))
        consumer.subscribe([topic])
        records: dict[tuple[int, int], tuple[int, str]] = {}
        while len(records) < total:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topic}: {len(records)} of {total}"
            value = json.loads(message.value())
            records[message.partition(), message.offset()] = (value["id"], value["type"])
    finally:
        consumer.close()
    return records


# --- the forms ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """One `icefall run` process: its manifest, state folder and the (type, table) pairs it writes."""

    name: str
    work: Path
    manifest: dict[str, Any]
    tables: tuple[tuple[str | None, str], ...]  # (type or None for every type, table name)


def manifest(name: str, bootstrap: str, topic: str, table: str, batch: int, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": name},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": topic},
            "format": {"type": "json", "schema": SCHEMA},
            "table": {"namespace": NAMESPACE, "name": table},
            "freshness": {"targetSeconds": 5},
            "batch": {"maxRecords": batch},
            **extra,
        },
    }


def form_processes(
    form: str, phase: str, work: Path, topic: str, args: argparse.Namespace
) -> list[Destination]:
    """The processes of `form` (`phase`: the tables' prefix), each with its manifest and tables."""
    names = [type_name(n) for n in range(args.types)]

    def spec(name: str, table: str, **extra: Any) -> dict[str, Any]:
        return manifest(name, args.bootstrap, topic, table, args.batch_records, **extra)

    if form == "one table":
        table = f"{phase}_all"
        return [Destination("all", work / "all", spec("bench-all", table), ((None, table),))]
    if form == "routed":
        routes = [{"table": {"name": f"{phase}_routed_{t}"}, "when": f"type = '{t}'"} for t in names]
        routed = spec("bench-routed", f"{phase}_routed", routes=routes, unrouted="DeadLetter")
        return [
            Destination("routed", work / "routed", routed, tuple((t, f"{phase}_routed_{t}") for t in names))
        ]
    return [
        Destination(
            t,
            work / f"filtered-{t}",
            spec(f"bench-{t}", f"{phase}_filtered_{t}", transforms={"filter": f"type = '{t}'"}),
            ((t, f"{phase}_filtered_{t}"),),
        )
        for t in names
    ]


@dataclass
class Driver:
    """A running `icefall run`: its process group, CPU monitor and the batch lines it printed."""

    destination: Destination
    proc: subprocess.Popen[str]
    monitor: TreeMonitor
    started: float
    batches: list[tuple[float, int, float]] = field(default_factory=list)  # (line time, records, seconds)
    phases: Counter[str] = field(default_factory=Counter)  # wall seconds per batch phase, summed
    ended: float = 0.0

    @classmethod
    def launch(cls, destination: Destination, *extra: str) -> Driver:
        destination.work.mkdir(parents=True, exist_ok=True)
        (destination.work / "table.yaml").write_text(json.dumps(destination.manifest))
        argv = [sys.executable, "-m", "icefall.cli", "run", "-f", str(destination.work / "table.yaml"),
                "--state-dir", str(destination.work), "--no-maintenance", *extra]  # fmt: skip
        if profiles := os.environ.get("BENCH_ROUTING_CPROFILE"):  # the driver's Python, by hand (DIR)
            out = Path(profiles) / f"{destination.name.replace(' ', '-')}.prof"
            argv[1:3] = ["-m", "cProfile", "-o", str(out), "-m", "icefall.cli"]
        with open(destination.work / "stderr.log", "w") as stderr:  # the child keeps its own copy
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
            )
        driver = cls(destination, proc, TreeMonitor(proc.pid, interval=0.25).start(), time.time())
        threading.Thread(target=driver._read, daemon=True).start()
        return driver

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.destination.work / "stdout.log", "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                if match := BATCH_LINE.search(line):
                    self.batches.append((time.time(), int(match[1]), float(match[2])))
                    self.phases.update({k: float(v) for k, v in PHASE.findall(line.split("| snapshot")[-1])})

    def wait(self, timeout: float) -> None:
        code = self.proc.wait(timeout=timeout)
        self.ended = time.time()
        self.monitor.stop()
        if code != 0:
            raise RuntimeError(
                f"{self.destination.name}: icefall run exited {code} (see {self.destination.work})"
            )

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            stop_group(self.proc)  # type: ignore[arg-type]
        self.ended = self.ended or time.time()
        self.monitor.stop()

    def steady_cpu_per_record(self) -> float | None:
        """CPU-s per record read after the first batch (whose JIT and first-write costs it leaves out), from
        the batch lines' arrival times; None under 3 batches (two lines may arrive together)."""
        if len(self.batches) < 3:
            return None
        cpu = self.monitor.cpu_at(self.batches[-1][0]) - self.monitor.cpu_at(self.batches[0][0])
        return cpu / sum(n for _, n, _ in self.batches[1:])

    def drain_cpu(self) -> tuple[float, float]:
        """(CPU-s, seconds) from the first batch's start to the last batch's line."""
        if not self.batches:
            raise RuntimeError(f"{self.destination.name}: no batch (see {self.destination.work})")
        start = self.batches[0][0] - self.batches[0][2]
        end = self.batches[-1][0]
        return self.monitor.cpu_at(end) - self.monitor.cpu_at(start), end - start


def audit(destinations: list[Destination], content: dict[tuple[int, int], tuple[int, str]]) -> int:
    """Every record in its type's table exactly once and nowhere else; returns the rows checked."""
    checked = 0
    for destination in destinations:
        catalog = CatalogConfig.embedded(destination.work).pyiceberg()
        for wanted_type, table in destination.tables:
            loaded = catalog.load_table((NAMESPACE, table))
            rows = loaded.scan(selected_fields=("id", "type", "_kafka")).to_arrow().to_pylist()
            got = Counter((r["_kafka"]["partition"], r["_kafka"]["offset"], r["id"], r["type"]) for r in rows)
            want = {(p, o, i, t) for (p, o), (i, t) in content.items() if wanted_type in (None, t)}
            twice = [k for k, n in got.items() if n > 1]
            if twice or set(got) != want:
                raise RuntimeError(f"{table}: {len(twice)} duplicated, extra {sorted(set(got) - want)[:3]}, "
                                   f"missing {sorted(want - set(got))[:3]}")  # fmt: skip
            checked += len(rows)
        for leftover in {t.rsplit("_", 1)[0] for _, t in destination.tables if "_routed_" in t}:
            for table in (leftover, f"{leftover}_dlq"):  # the default table and the dead letters: empty
                try:
                    extra = catalog.load_table((NAMESPACE, table)).scan().to_arrow().num_rows
                except Exception:  # never created: nothing in it
                    extra = 0
                if extra:
                    raise RuntimeError(f"{table}: {extra} rows, expected none")
    if checked != len(content):
        raise RuntimeError(f"{checked} rows audited, {len(content)} records in the topic")
    return checked


# --- drain and live ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    form: str
    processes: int
    tables: int
    records: int
    batches: int
    wall: float  # the first process's start to the last one's exit
    drain_cpu: float  # summed over the processes' drains
    life_cpu: float  # summed over the processes' whole lives
    steady_cpu: float | None  # summed: each process's CPU per record after its first batch x the records
    phases: Counter[str]  # wall seconds per batch phase, summed over batches and processes
    audited: int


def drain(
    form: str, args: argparse.Namespace, work: Path, content: dict[tuple[int, int], tuple[int, str]]
) -> Drain:
    destinations = form_processes(form, "drain", work, "events", args)
    pending, running, done = list(destinations), [], []
    started = time.time()
    try:
        while pending or running:
            while pending and len(running) < args.parallel:
                running.append(Driver.launch(pending.pop(0), "--until-caught-up"))
            time.sleep(0.5)
            for driver in [d for d in running if d.proc.poll() is not None]:
                driver.wait(10)
                running.remove(driver)
                done.append(driver)
                cpu = driver.drain_cpu()[0]
                name, life = driver.destination.name, driver.monitor.total_cpu
                print(f"[bench] drain {form}/{name}: {len(driver.batches)} batches, "
                      f"{cpu:.1f} CPU-s draining, {life:.1f} in all", flush=True)  # fmt: skip
            if any(time.time() - d.started > args.timeout for d in running):
                raise RuntimeError(f"drain {form}: a process ran over {args.timeout} s (see {work})")
    finally:
        for driver in running:
            driver.stop()
    audited = audit(destinations, content)
    steady = [d.steady_cpu_per_record() for d in done]
    return Drain(
        form=form,
        processes=len(done),
        tables=sum(len(d.tables) for d in destinations),
        records=len(content),
        batches=sum(len(d.batches) for d in done),
        wall=max(d.ended for d in done) - started,
        drain_cpu=sum(d.drain_cpu()[0] for d in done),
        life_cpu=sum(d.monitor.total_cpu for d in done),
        phases=sum((d.phases for d in done), Counter()),
        steady_cpu=None if None in steady else sum(x * len(content) for x in steady if x is not None),
        audited=audited,
    )


@dataclass(frozen=True)
class Live:
    form: str
    processes: int
    window: float
    records: int  # produced in the window
    cpu: float  # every process of the form, over the window
    latencies: list[float]  # seconds from produce to visible in main, records produced in the window
    audited: int


def visible_latencies(work: Path, table: str, start_ms: float, end_ms: float) -> list[float]:
    """For each row produced in [start_ms, end_ms]: when the snapshot that added it became `main`'s head
    (the snapshot log) minus its produce time (`ts`), in seconds."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation

    loaded = CatalogConfig.embedded(work).pyiceberg().load_table((NAMESPACE, table))
    visible: dict[int, int] = {}
    for entry in loaded.metadata.snapshot_log:
        visible.setdefault(entry.snapshot_id, entry.timestamp_ms)
    out: list[float] = []
    for snapshot in loaded.snapshots():
        if snapshot.summary is None or snapshot.summary.operation != Operation.APPEND:
            continue
        at = visible.get(snapshot.snapshot_id, snapshot.timestamp_ms)
        for manifest_file in snapshot.manifests(loaded.io):
            if (
                manifest_file.added_snapshot_id != snapshot.snapshot_id
                or manifest_file.content != ManifestContent.DATA
            ):
                continue
            for entry in manifest_file.fetch_manifest_entry(loaded.io, discard_deleted=False):
                if entry.status != ManifestEntryStatus.ADDED:
                    continue
                with loaded.io.new_input(entry.data_file.file_path).open() as stream:
                    ts = pq.read_table(stream, columns=["ts"]).column("ts").combine_chunks()
                produced = [us / 1000 for us in pc.cast(ts, "int64").to_pylist()]
                out.extend((at - p) / 1000 for p in produced if start_ms <= p <= end_ms)
    return out


def committed_everywhere(destinations: list[Destination], total: int) -> bool:
    for destination in destinations:
        catalog = CatalogConfig.embedded(destination.work).pyiceberg()
        for _, table in destination.tables:
            try:
                offsets = read_committed(catalog.load_table((NAMESPACE, table))).offsets
            except Exception:  # not created yet
                return False
            if sum(offsets.values()) < total:
                return False
    return True


def live(form: str, args: argparse.Namespace, work: Path) -> Live:
    bootstrap = args.bootstrap
    topic = f"live-{form.replace(' ', '-')}"
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    destinations = form_processes(form, "live", work, topic, args)
    drivers = [Driver.launch(d) for d in destinations]
    producer = LiveProducer(bootstrap, topic, args.rate, args.types)
    producer.start()
    try:
        deadline = time.time() + args.timeout
        while not all(d.batches for d in drivers):
            if time.time() > deadline or any(d.proc.poll() is not None for d in drivers):
                raise RuntimeError(f"live {form}: not every process committed a batch (see {work})")
            time.sleep(1)
        print(f"[bench] live {form}: every process committed; warm-up {args.warmup} s, "
              f"window {args.seconds} s", flush=True)  # fmt: skip
        time.sleep(args.warmup)
        start, sent_at_start = time.time(), producer.sent
        time.sleep(args.seconds)
        end, sent_at_end = time.time(), producer.sent
        cpu = sum(d.monitor.sample().cpu - d.monitor.cpu_at(start) for d in drivers)
        producer.stop()
        while not committed_everywhere(destinations, producer.sent):
            if time.time() > deadline + args.timeout:
                raise RuntimeError(f"live {form}: the tables did not reach the topic's end (see {work})")
            time.sleep(2)
    finally:
        producer.stop()
        for driver in drivers:
            driver.stop()
    audited = audit(destinations, topic_content(bootstrap, topic))
    latencies = [
        x
        for d in destinations
        for _, table in d.tables
        for x in visible_latencies(d.work, table, start * 1000, end * 1000)
    ]
    return Live(form, len(drivers), end - start, sent_at_end - sent_at_start, cpu, latencies, audited)


# --- report ------------------------------------------------------------------------------------------


def drain_rows(drains: dict[str, Drain]) -> list[str]:
    base = drains["one table"]
    rows = []
    for d in drains.values():
        if d.steady_cpu is not None and base.steady_cpu is not None:
            steady = f"{d.records / d.steady_cpu:,.0f} | {d.steady_cpu / base.steady_cpu:.2f}x"
        else:
            steady = "- | -"
        rows.append(
            f"| {d.form} | {d.processes} | {d.tables} | {d.batches} | {d.wall:.0f} s | {d.drain_cpu:.1f} | "
            f"{d.records / d.drain_cpu:,.0f} | **{d.drain_cpu / base.drain_cpu:.2f}x** | {steady} | "
            f"{d.life_cpu:.1f} | {d.records / d.life_cpu:,.0f} | {d.life_cpu / base.life_cpu:.2f}x | "
            f"{d.audited:,} |"
        )
    return rows


def live_rows(lives: dict[str, Live | str], rate: float) -> list[str]:
    base = lives.get("one table")
    base = base if isinstance(base, Live) else None
    rows = []
    for form, x in lives.items():
        if isinstance(x, str):
            rows.append(f"| {form} | failed: {x} |" + " |" * 11)
            continue
        ratio = f"{x.cpu / base.cpu:.2f}x" if base else "-"
        rows.append(
            f"| {x.form} | {x.processes} | {rate:,.0f}/s | {x.window:.0f} s | {x.records:,} | {x.cpu:.1f} | "
            f"{x.cpu / x.window:.2f} | {x.records / x.cpu:,.0f} | {ratio} | "
            f"{percentile(x.latencies, 50):.1f} s | **{percentile(x.latencies, 99):.1f} s** | "
            f"{len(x.latencies):,} | {x.audited:,} |"
        )
    return rows


def report(args: argparse.Namespace, started: str, uptimes: list[str],
           drains: dict[str, Drain], lives: dict[str, Live | str]) -> str:  # fmt: skip
    ratio = drains["routed"].drain_cpu / drains["one table"].drain_cpu
    verdict = "meets" if ratio <= 1.3 else "misses"
    filtered = (
        f"The {args.types} filtered StreamingTables cost "
        f"{drains['filtered'].drain_cpu / drains['routed'].drain_cpu:.1f}x the routed form."
        if "filtered" in drains
        else "The filtered form was not drained (`--drain-forms`)."
    )
    return "\n".join(
        [
            f"# Routing: one topic of {args.types} event types into {args.types} tables",
            "",
            f"`python bench/routing.py {' '.join(sys.argv[1:])}` (`make bench-routing`), started {started}. "
            "How it is measured: the docstring of `bench/routing.py`. One run on a shared, loaded machine: "
            "compare rows of this run, not figures of other files.",
            "",
            f"**Verdict** (drain CPU): the routed form costs **{ratio:.2f}x** the CPU of one plain "
            f"StreamingTable over the same topic: it {verdict} the target of issue #43 (<= 1.3x). {filtered}",
            "",
            f"## Drain: {args.records:,} records preloaded, each form drains them (`--until-caught-up`)",
            "",
            "Every table audited by content first (each record in its type's table exactly once, nowhere "
            "else). Records per CPU-s: the topic's records over the CPU of every process of the form.",
            "",
            "| form | processes | tables | batches | wall | CPU-s draining | records per CPU-s | "
            "x one table | after the 1st batch: records per CPU-s | x one table | CPU-s whole lives | "
            "records per CPU-s | x one table | rows audited |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            *drain_rows(drains),
            "",
            "Where the batches' wall time went (the `[run] batch` lines' phases, seconds summed over "
            "batches and processes):",
            "",
            *(
                f"- {d.form}: " + ", ".join(f"{k} {v:.1f}" for k, v in d.phases.most_common())
                for d in drains.values()
            ),
            "",
            f"## Live: {args.rate:,.0f} records/s, each form in turn",
            "",
            "Freshness per record: its snapshot's time in `main`'s snapshot log minus its produce time, all "
            "the form's tables pooled. Audited by content as above.",
            "",
            "| form | processes | rate | window | records in window | CPU-s | cores | records per CPU-s | "
            "x one table | freshness p50 | p99 | records measured | rows audited |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            *live_rows(lives, args.rate),
            "",
            "## Load (`uptime`)",
            "",
            *(f"    {u}" for u in uptimes),
            "",
            *machine_section({**machine_basics(), "Load average at end": load_average()}),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", type=int, default=20, help="event types = routes = filtered tables")
    parser.add_argument("--records", type=int, default=30_000, help="the drain's preloaded records")
    parser.add_argument("--batch-records", type=int, default=6_000, help="spec.batch.maxRecords")
    parser.add_argument("--parallel", type=int, default=4, help="filtered processes at once in the drain")
    parser.add_argument("--rate", type=float, default=200, help="live records/s")
    parser.add_argument("--seconds", type=int, default=60, help="live window")
    parser.add_argument("--warmup", type=int, default=10, help="live seconds after every process committed")
    parser.add_argument(
        "--live-forms",
        default="one table,routed",
        help="forms measured live ('' for none; 'filtered' starts --types Spark drivers at once: ~16 GB)",
    )
    parser.add_argument(
        "--drain-forms",
        default="one table,routed,filtered",
        help="forms drained ('one table' and 'routed' always; 'filtered' runs --types Spark drivers)",
    )
    parser.add_argument("--timeout", type=int, default=900, help="per process / per live warm-up")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    uptimes = [subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()]
    drains: dict[str, Drain] = {}
    lives: dict[str, Live | str] = {}
    with tempfile.TemporaryDirectory(prefix="icefall-bench-routing-") as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka").start()
        try:
            args.bootstrap = broker.bootstrap
            preload(broker.bootstrap, "events", args.records, args.types)
            content = topic_content(broker.bootstrap, "events")
            for form in ("one table", "routed", "filtered"):
                if form == "filtered" and form not in args.drain_forms.split(","):
                    continue
                drains[form] = drain(form, args, work / "drain", content)
            for form in [f for f in ("one table", "routed", "filtered") if f in args.live_forms.split(",")]:
                try:  # the drain's figures are reported whatever happens live
                    measured = live(form, args, work / f"live-{form.replace(' ', '-')}")
                except RuntimeError as error:
                    lives[form] = str(error)
                    print(f"[bench] live {form} failed: {error}", flush=True)
                    continue
                lives[form] = measured
                print(f"[bench] live {form}: p99 {percentile(measured.latencies, 99):.1f} s", flush=True)
        finally:
            broker.stop()
    uptimes.append(subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip())
    write_results(args.out, report(args, started, uptimes, drains, lives))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
