"""Helpers shared by the benchmarks: percentiles, CPU and memory of a process tree, the machine, events.

Pure or /proc-reading helpers only; nothing here starts a component. Not guaranteed: CPU and RSS come
from sampling /proc, so a process that starts and exits between two samples is missed (its CPU is still
counted if its parent reaps it, through the parent's cutime/cstime), and RSS peaks between samples are
missed.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from icefall.plan.offsets import OffsetRange

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# --- /proc -------------------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None when the process is gone."""
    named = _named_stat(Path(f"/proc/{pid}/stat"))
    return named[1] if named is not None else None


def _named_stat(path: Path) -> tuple[str, list[str]] | None:
    """A process's or thread's stat file: its name and fields 3.. (state first); None when it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    end = text.rindex(")")  # the name may hold spaces and parentheses
    return text[text.index("(") + 1 : end], text[end + 2 :].split()


def descendants(root: int) -> list[int]:
    """`root` and every live process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None:
            parents.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def cpu_seconds(stat: list[str]) -> float:
    """utime + stime + cutime + cstime (its own and its reaped children's) of one stat line."""
    return sum(int(x) for x in stat[11:15]) / CLOCK_TICKS


def tree_cpu(root: int) -> float:
    """CPU-s of `root` and every live process below it, each counted once (`descendants` holds `root`).

    A child's CPU moves into its parent's cutime/cstime when the parent reaps it, as it leaves the list of
    live processes, so a sum over the live tree counts it once, before and after (a sum that listed `root`
    again beside `descendants(root)`, as some bench scripts did, counted the root twice: in
    bench/results/profile.md the JVM's own CPU came out twice its value, above the tree's)."""
    return sum(cpu_seconds(stat) for pid in descendants(root) if (stat := proc_stat(pid)) is not None)


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of process `pid`: its name (the kernel's, cut at 15 characters) and its CPU-s
    (utime + stime)."""
    found: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        named = _named_stat(Path(f"/proc/{pid}/task/{tid}/stat"))
        if named is not None:  # (None: it ended between the listing and the read)
            name, fields = named
            found[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return found


def thread_kind(name: str) -> str:
    """A thread's name with its numbers as N: the threads of one pool count together."""
    return re.sub(r"\d+", "N", name)


def rss_bytes(stat: list[str]) -> int:
    return int(stat[21]) * PAGE_BYTES


@dataclass(frozen=True)
class TreeSample:
    at: float  # time.time()
    cpu: float  # seconds, cumulative
    rss: int  # bytes, the tree's sum now


@dataclass
class TreeMonitor:
    """Samples CPU (user + system) and RSS of a process tree every `interval` seconds in a thread.

    A child that exits is reaped by its parent in the tree, whose cutime/cstime then hold its CPU, so the
    cumulative sum stays right; a child reaped by something outside the tree would be lost.

    With `threads`, each sample also reads every thread's CPU (`thread_cpu`), for `cpu_by_thread`.
    """

    root: int
    interval: float = 0.5
    threads: bool = False
    samples: list[TreeSample] = field(default_factory=list)
    thread_samples: list[tuple[float, dict[tuple[int, int], tuple[str, float]]]] = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> TreeSample:
        cpu, rss = 0.0, 0
        for pid in descendants(self.root):
            stat = proc_stat(pid)
            if stat is not None:
                cpu += cpu_seconds(stat)
                rss += rss_bytes(stat)
        sample = TreeSample(time.time(), cpu, rss)
        self.samples.append(sample)
        if self.threads:
            by_thread = {
                (pid, tid): seen for pid in descendants(self.root) for tid, seen in thread_cpu(pid).items()
            }
            self.thread_samples.append((sample.at, by_thread))
        return sample

    def start(self) -> TreeMonitor:
        def loop() -> None:
            while not self._halt.wait(self.interval):
                self.sample()

        self.sample()
        self._thread = threading.Thread(target=loop, daemon=True, name=f"monitor-{self.root}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def peak_rss(self) -> int:
        return max((s.rss for s in self.samples), default=0)

    @property
    def total_cpu(self) -> float:
        return max((s.cpu for s in self.samples), default=0.0)

    def cpu_by_thread(self, start: float, end: float) -> dict[str, float]:
        """CPU-s between the samples last taken at or before `start` and `end` (time.time()), per kind of
        thread (`thread_kind`), most first. A thread counts up to its last sample: what one that ended
        did after it is missed (a thread that lives less than `interval` is missed whole); the process
        tree's CPU over the same time less the sum tells how much that was."""

        def at(when: float) -> dict[tuple[int, int], tuple[str, float]]:
            taken = [seen for t, seen in self.thread_samples if t <= when]
            return taken[-1] if taken else {}

        before, after = at(start), {}
        for t, seen in self.thread_samples:
            if start < t <= end:
                after.update(seen)  # a thread's latest sample, also of one that ended since
        kinds: dict[str, float] = {}
        for key, (name, cpu) in after.items():
            spent = cpu - before.get(key, (name, 0.0))[1]
            kinds[thread_kind(name)] = kinds.get(thread_kind(name), 0.0) + spent
        return dict(sorted(kinds.items(), key=lambda kind: -kind[1]))

    def cpu_at(self, when: float) -> float:
        """Cumulative CPU at `when` (time.time()), linear between the two nearest samples."""
        before = [s for s in self.samples if s.at <= when]
        after = [s for s in self.samples if s.at >= when]
        if not before:
            return self.samples[0].cpu if self.samples else 0.0
        if not after:
            return before[-1].cpu
        a, b = before[-1], after[0]
        if b.at == a.at:
            return a.cpu
        return a.cpu + (b.cpu - a.cpu) * (when - a.at) / (b.at - a.at)


def whole_topic(bootstrap: str, topic: str, partitions: int) -> tuple[OffsetRange, ...]:
    """Every offset of `topic`, as one `OffsetRange` per partition (what a bench's batch reads)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in range(partitions)]
    finally:
        consumer.close()
    return tuple(OffsetRange(p, 0, end) for p, end in enumerate(ends))


def write_results(path: Path, text: str) -> None:
    """Write a results file (its folder made first), print it, then say where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text, flush=True)
    print(f"[bench] {time.strftime('%H:%M:%S')} written to {path}", flush=True)


# --- the machine -------------------------------------------------------------------------------------


def machine_section(facts: dict[str, str]) -> list[str]:
    """The results' closing "## Machine" table, as markdown lines."""
    return ["## Machine", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts.items()), ""]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_basics() -> dict[str, str]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown",
    )  # fmt: skip
    mem_kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
                 .split()[1])  # fmt: skip
    java = subprocess.run(
        [shutil.which("java") or "java", "-version"], capture_output=True, text=True, check=False
    ).stderr.splitlines()
    return {
        "CPU": f"{cpu}; nproc {os.cpu_count()}, usable by this process {len(os.sched_getaffinity(0))}",
        "Memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "Java": java[0] if java else "unknown",
        "CPU probe (10M pure-Python additions)": f"{cpu_probe_seconds():.2f} CPU-s",
    }


def cpu_probe_seconds() -> float:
    """CPU-seconds of a fixed pure-Python loop: machines that report the same model name ("AMD EPYC") differ
    several-fold in speed, so results of two runs are comparable only when their probes are close. The
    calling thread's CPU time only (a bench's producer and monitor threads run beside it)."""
    started, total = time.thread_time(), 0
    for i in range(10_000_000):
        total += i
    return time.thread_time() - started


@dataclass(frozen=True)
class Gauge:
    """How fast and how busy the machine was at one moment: `cpu_probe_seconds` and `load_average`."""

    probe: float  # CPU-s of the probe, in this process (on core 0 when the bench pins itself there)
    load: str  # "1 5 15" minutes

    @classmethod
    def now(cls) -> Gauge:
        return cls(cpu_probe_seconds(), load_average())


# --- bytes and CPU ---------------------------------------------------------------------------------------

GIB = 1024**3


def cpu_per_gib(cpu_seconds: float, payload_bytes: int) -> float:
    """CPU-seconds per GiB: `cpu_seconds` over `payload_bytes` / 2**30; NaN when either is not positive.

    What the drain tables call "CPU-s per GiB": the system's process-tree CPU over the drain divided by the
    GiB of the backlog's Kafka record keys and values as produced (`Tally`: the bytes handed to the
    producer; no headers, timestamps or batch framing, no trickle or warm-up records). It is
    2**30 / (records per CPU-s x mean key + value bytes of a record)."""
    if cpu_seconds <= 0 or payload_bytes <= 0:
        return float("nan")
    return cpu_seconds / (payload_bytes / GIB)


#: A record as the benches produce it: (key, value or None for a tombstone, timestamp ms).
Record = tuple[str, bytes | None, int]


class Tally:
    """An iterator over `records` that counts what it hands out: records, key bytes (UTF-8, as the producer
    sends a str key) and value bytes (0 for a tombstone)."""

    def __init__(self, records: Iterator[Record]) -> None:
        self._records = records
        self.records = self.key_bytes = self.value_bytes = 0

    def __iter__(self) -> Tally:
        return self

    def __next__(self) -> Record:
        key, value, ts = next(self._records)
        self.records += 1
        self.key_bytes += len(key.encode())
        self.value_bytes += len(value) if value is not None else 0
        return key, value, ts

    @property
    def bytes(self) -> int:
        """Keys and values."""
        return self.key_bytes + self.value_bytes


_SPOOLED = struct.Struct(">IiQ")  # key length, value length (-1: a tombstone), timestamp ms


def spooled(records: Iterator[Record], count: int, path: Path) -> Iterator[Record]:
    """The next `count` of `records`, encoded now into the file `path`, then read back one by one.

    For a backlog whose encoder is slower than a system drains (confluent-kafka's AvroSerializer): encoded
    before a drain's clock starts, as a list in memory was, but with memory bounded whatever `count` (a
    5,000,000-record backlog of ~100-byte values is ~0.6 GB on disk). The file is deleted when read to its
    end."""
    with path.open("wb") as out:
        for _ in range(count):
            key, value, ts = next(records)
            raw = key.encode()
            out.write(_SPOOLED.pack(len(raw), -1 if value is None else len(value), ts))
            out.write(raw)
            if value is not None:
                out.write(value)
    return _read_spool(path)


def _read_spool(path: Path) -> Iterator[Record]:
    with path.open("rb", buffering=1 << 20) as spool:
        while head := spool.read(_SPOOLED.size):
            key_len, value_len, ts = _SPOOLED.unpack(head)
            key = spool.read(key_len).decode()
            yield key, (None if value_len < 0 else spool.read(value_len)), ts
    path.unlink()


# --- events ------------------------------------------------------------------------------------------

CITIES = ["Oslo", "Bergen", "Lisbon", "Porto", "Lyon", "Turin", "Ghent", "Graz"]
TAGS = ["gift", "express", "fragile", "bulk", "promo", "repeat"]
WORDS = [
    "the",
    "order",
    "left",
    "the",
    "warehouse",
    "on",
    "time",
    "and",
    "the",
    "parcel",
    "was",
    "handed",
    "over",
    "to",
    "the",
    "courier",
    "at",
]

# The 9 fields of a bench event, as a StreamingTable `spec.format.schema` (the one schema all systems use).
# All optional: a plain Spark job's from_json yields nullable columns, which Iceberg refuses for required
# ones.
EVENT_SCHEMA: list[dict[str, object]] = [
    {"name": "id", "type": "long"},
    {"name": "key", "type": "string"},
    {"name": "ts", "type": "timestamptz"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "items", "type": "int"},
    {
        "name": "shipping",
        "type": "struct",
        "fields": [
            {"name": "street", "type": "string"},
            {"name": "city", "type": "string"},
            {"name": "country", "type": "string"},
        ],
    },
    {"name": "tags", "type": "list", "element": {"type": "string"}},
    {"name": "note", "type": "string"},
]


# The same 9 fields as an Avro record schema (`spec.format.type: avro`, bench/compare.py's Avro systems): the
# writer schema a producer registers. Plain (non-union) types, as an Avro producer of these events would
# declare them; `ts` is a timestamp-micros (the produce time). The table stays EVENT_SCHEMA's.
AVRO_EVENT_SCHEMA: dict[str, object] = {
    "type": "record",
    "name": "BenchEvent",
    "namespace": "dev.icefall.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "key", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "items", "type": "int"},
        {
            "name": "shipping",
            "type": {
                "type": "record",
                "name": "Shipping",
                "fields": [
                    {"name": "street", "type": "string"},
                    {"name": "city", "type": "string"},
                    {"name": "country", "type": "string"},
                ],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": "string"},
    ],
}

#: The bench event (`EVENT_SCHEMA`) as a Protobuf message, as a producer of these events writes it (the
#: `.proto` text a registry holds; bench/compare.py's icefall-protobuf, bench/format_costs.py).
PROTOBUF_EVENT_SCHEMA = """syntax = "proto3";
package dev.icefall.bench;

import "google/protobuf/timestamp.proto";

message BenchEvent {
  message Shipping {
    string street = 1;
    string city = 2;
    string country = 3;
  }
  int64 id = 1;
  string key = 2;
  google.protobuf.Timestamp ts = 3;
  string customer = 4;
  double amount = 5;
  int32 items = 6;
  Shipping shipping = 7;
  repeated string tags = 8;
  string note = 9;
}
"""

#: The bench event (`EVENT_SCHEMA`) as a JSON Schema, as a producer of these events registers it (the
#: schema type JSON of a registry; bench/compare.py's icefall-jsonschema and spark-jsonschema). `ts` is the
#: produce time as RFC 3339 text, as in the JSON events.
JSON_SCHEMA_EVENT_SCHEMA: dict[str, object] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "BenchEvent",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "key": {"type": "string"},
        "ts": {"type": "string", "format": "date-time"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "items": {"type": "integer"},
        "shipping": {
            "type": "object",
            "properties": {name: {"type": "string"} for name in ("street", "city", "country")},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": "string"},
    },
}

#: How an event becomes a record value: (the event, its produce time in ms) -> bytes.
Encode = Callable[[dict[str, object], int], bytes]


def json_value(event: dict[str, object], _ts_ms: int) -> bytes:
    """The event as compact JSON text (its `ts` already the ISO produce time)."""
    return json.dumps(event, separators=(",", ":")).encode()


def avro_datum(event: dict[str, object], ts_ms: int) -> dict[str, object]:
    """The event as a datum of AVRO_EVENT_SCHEMA: `ts` as microseconds since the epoch."""
    return {**event, "ts": ts_ms * 1000}


def json_schema_encoder(schema_id: int) -> Encode:
    """Events as Confluent-framed JSON Schema records: magic byte, `schema_id`, then the event's JSON text
    (`json_value`), as confluent-kafka's `JSONSerializer` frames them (without its per-record validation,
    which would make the producer slower than the systems drain)."""
    header = b"\x00" + struct.pack(">I", schema_id)

    def encode(event: dict[str, object], ts_ms: int) -> bytes:
        return header + json_value(event, ts_ms)

    return encode


def protobuf_encoder(descriptors: str, schema_id: int) -> Encode:
    """Events as Confluent-framed Protobuf: magic byte, `schema_id`, message index [0] (the single byte 0),
    then `dev.icefall.bench.BenchEvent` of `descriptors` (a base64 FileDescriptorSet of
    PROTOBUF_EVENT_SCHEMA, `icefall.kafka.protobuf.descriptor_set_text`); `ts` the produce time."""
    from icefall.decode.protobuf import _message_class

    event_class = _message_class(descriptors, "dev.icefall.bench.BenchEvent")
    header = b"\x00" + struct.pack(">I", schema_id) + b"\x00"

    def encode(event: dict[str, Any], ts_ms: int) -> bytes:
        message = event_class(**{k: v for k, v in event.items() if k not in ("ts", "shipping")})
        message.ts.FromMilliseconds(ts_ms)
        message.shipping.street = event["shipping"]["street"]
        message.shipping.city = event["shipping"]["city"]
        message.shipping.country = event["shipping"]["country"]
        return header + bytes(message.SerializeToString())

    return encode


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def bench_event(i: int, rng: random.Random, now_ms: int, note_words: int) -> dict[str, object]:
    """Event number `i`: 9 fields (a timestamp, a string key, a nested struct, a list); `note_words`
    words of free text set the size (2 words: ~230 bytes of JSON; 156 words: ~1 KB; 747 words: ~4 KB)."""
    return {
        "id": i,
        "key": f"ord-{i:09d}",
        "ts": iso_ms(now_ms),
        "customer": f"customer-{rng.randrange(10_000):05d}",
        "amount": round(rng.uniform(1, 5_000), 2),
        "items": rng.randrange(1, 13),
        "shipping": {
            "street": f"{rng.randrange(1, 300)} {rng.choice(['Main', 'Harbour', 'Mill', 'Station'])} St",
            "city": rng.choice(CITIES),
            "country": rng.choice(["NO", "PT", "FR", "IT", "BE", "AT"]),
        },
        "tags": rng.sample(TAGS, rng.randrange(0, 3)),
        "note": " ".join(rng.choice(WORDS) for _ in range(note_words)),
    }


SMALL_NOTE_WORDS = 2
LARGE_NOTE_WORDS = 156
XL_NOTE_WORDS = 747


def bench_records(
    seed: int, note_words: int, start: int = 0, encode: Encode = json_value
) -> Iterator[tuple[str, bytes, int]]:
    """(key, value, timestamp ms) forever; the event's `ts` is the Kafka timestamp given to produce(). The
    value is JSON text, or what `encode` makes of the event (the same events whatever the encoding)."""
    rng = random.Random(seed)
    i = start
    while True:
        now_ms = int(time.time() * 1000)
        event = bench_event(i, rng, now_ms, note_words)
        yield str(event["key"]), encode(event, now_ms), now_ms
        i += 1


def stop_group(proc: subprocess.Popen[bytes], grace: float = 60) -> None:
    """End a process started in its own group (`start_new_session`): SIGTERM, then SIGKILL after `grace`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
