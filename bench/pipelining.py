"""Pipelining A/B: `icefall run` draining a preloaded backlog with `spec.batch.pipelined` on and off.

    .venv/bin/python bench/pipelining.py [--records N] [--rounds R] [--target-seconds F] [--sizes small,1k]

One devstack Kafka broker; per event size, round and mode (pipelined, then serial), a fresh 3-partition
topic is preloaded with `--records` seeded bench events (`common.bench_records`), then
`icefall run --until-caught-up --no-maintenance` (embedded catalog, `local[2]`, pinned to core 1 when the
machine has 2 cores) drains it at freshness target `F` (3 s: batches of a few seconds, so a backlog takes
several). **Drain** is from the first batch's start (its log line's time minus its duration) to the line
of the last batch; records/s and records per CPU-second (the process tree, sampled every 0.25 s) are over
the drain. Afterwards the table must hold `--records` rows and the committed offsets must be the topic's
end. Results go to bench/results/pipelining.md. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    LARGE_NOTE_WORDS,
    SMALL_NOTE_WORDS,
    TreeMonitor,
    bench_records,
    load_average,
    machine_basics,
    machine_section,
    write_results,
)
from compare import EVENT_SCHEMA
from confluent_kafka import Producer

from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker, create_topic

RESULTS = Path(__file__).parent / "results" / "pipelining.md"
SIZES = {"small": ("~230 B", SMALL_NOTE_WORDS, 1), "1k": ("~1 KB", LARGE_NOTE_WORDS, 4)}
BATCH_LINE = re.compile(r"\[run\] batch \d+: (\d+) read.* in ([0-9.]+)s .*commit (\d+) ms")


@dataclass(frozen=True)
class Drain:
    pipelined: bool
    batches: int
    seconds: float
    cpu: float
    records: int
    commit_ms_median: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def per_cpu(self) -> float:
        return self.records / self.cpu


def preload(bootstrap: str, topic: str, records: int, note_words: int) -> None:
    create_topic(bootstrap, topic, partitions=3)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    events = bench_records(seed=7, note_words=note_words)
    for _ in range(records):
        key, value, ts = next(events)
        while True:
            try:
                producer.produce(topic, key=key, value=value, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def manifest(bootstrap: str, topic: str, target: int, pipelined: bool) -> str:
    return json.dumps(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "bench-pipelining"},
            "spec": {
                "source": {"bootstrapServers": bootstrap, "topic": topic},
                "format": {"type": "json", "schema": EVENT_SCHEMA},
                "table": {
                    "namespace": "bench",
                    "name": "events",
                    "partitioning": [{"field": "ts", "transform": "day"}],
                },
                "freshness": {"targetSeconds": target},
                "batch": {"pipelined": pipelined},
            },
        }
    )


def drain(work: Path, bootstrap: str, topic: str, records: int, *, target: int, pipelined: bool) -> Drain:
    work.mkdir()
    (work / "table.yaml").write_text(manifest(bootstrap, topic, target, pipelined))
    pin = ["taskset", "-c", "1"] if len(os.sched_getaffinity(0)) >= 2 else []
    argv = [str(Path(sys.executable).with_name("icefall")), "run", "-f", str(work / "table.yaml"),
            "--state-dir", str(work), "--until-caught-up", "--no-maintenance"]  # fmt: skip
    proc = subprocess.Popen([*pin, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    monitor = TreeMonitor(proc.pid, interval=0.25).start()
    lines: list[tuple[float, int, float, int]] = []  # (time seen, records, batch seconds, commit ms)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = BATCH_LINE.search(line)
            if match:
                lines.append((time.time(), int(match[1]), float(match[2]), int(match[3])))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = proc.wait(timeout=1200)
    reader.join(10)
    monitor.stop()
    if code != 0 or not lines:
        raise RuntimeError(f"icefall run exited {code} after {len(lines)} batches (see {work})")
    started = lines[0][0] - lines[0][2]
    ended = lines[-1][0]
    read_records = sum(n for _, n, _, _ in lines)
    table = CatalogConfig.embedded(work).pyiceberg().load_table(("bench", "events"))
    snapshot = table.current_snapshot()
    rows = int(snapshot.summary.get("total-records") or 0) if snapshot and snapshot.summary else 0
    committed = sum(read_committed(table).offsets.values())
    if not rows == committed == read_records == records:
        raise RuntimeError(f"{topic}: {rows} rows, {committed} committed offsets, {read_records} read")
    return Drain(
        pipelined=pipelined,
        batches=len(lines),
        seconds=ended - started,
        cpu=monitor.cpu_at(ended) - monitor.cpu_at(started),
        records=records,
        commit_ms_median=statistics.median(ms for _, _, _, ms in lines),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600_000, help="backlog of small events")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target-seconds", type=int, default=3)
    parser.add_argument("--sizes", default="small,1k")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_at_start = load_average()
    rows: list[str] = []
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="icefall-bench-pipelining-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka").start()
        try:
            for size in args.sizes.split(","):
                label, words, divisor = SIZES[size]
                records = args.records // divisor
                drains: list[Drain] = []
                for r in range(args.rounds):
                    for pipelined in (True, False):
                        topic = f"{size}-{r}-{'pipelined' if pipelined else 'serial'}"
                        preload(broker.bootstrap, topic, records, words)
                        d = drain(Path(tmp) / topic, broker.bootstrap, topic, records,
                                  target=args.target_seconds, pipelined=pipelined)  # fmt: skip
                        drains.append(d)
                        print(f"[bench] {topic}: {d.batches} batches, drain {d.seconds:.1f}s, "
                              f"{d.rate:,.0f} rec/s, {d.per_cpu:,.0f} per CPU-s", flush=True)  # fmt: skip
                        mode = "pipelined" if pipelined else "serial"
                        rows.append(
                            f"| {label} | {r + 1} | {mode} | {d.batches} | {d.seconds:.1f} s | "
                            f"{d.rate:,.0f} | {d.per_cpu:,.0f} | {d.commit_ms_median:.0f} ms |"
                        )
                for pipelined in (True, False):
                    mine = [d for d in drains if d.pipelined == pipelined]
                    mode = "pipelined" if pipelined else "serial"
                    summary.append(
                        f"| {label} | {mode} | {statistics.mean(d.seconds for d in mine):.2f} s | "
                        f"{statistics.mean(d.rate for d in mine):,.0f} | "
                        f"{statistics.mean(d.per_cpu for d in mine):,.0f} |"
                    )
        finally:
            broker.stop()
    text = "\n".join(
        [
            "# Pipelining: a backlog drained with `spec.batch.pipelined` on and off",
            "",
            f"`bench/pipelining.py {' '.join(sys.argv[1:])}` started {started}. How it is measured: the "
            "docstring of `bench/pipelining.py`. One run on a shared machine: compare rows of the same run.",
            "",
            "## Mean of the rounds",
            "",
            "| events | mode | drain | records/s | records per CPU-s |",
            "|---|---|--:|--:|--:|",
            *summary,
            "",
            "## Each drain",
            "",
            "| events | round | mode | batches | drain | records/s | records per CPU-s | CAS median |",
            "|---|--:|---|--:|--:|--:|--:|--:|",
            *rows,
            "",
            *machine_section(
                {
                    **machine_basics(),
                    "Load average at start": load_at_start,
                    "Load average at end": load_average(),
                }
            ),
        ]
    )
    write_results(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
