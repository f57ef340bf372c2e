"""Fresh reads benchmark: a union read (`icefall.ingest.union_read`) beside a plain scan of the table.

    .venv/bin/python bench/union_read.py [--seconds S] [--rate R] [--interval I] [--target-seconds F]
                                         [--out FILE]

One Kafka broker and the embedded catalog in a temporary folder, one Spark session (`local[2]`) shared by
ingestion (an Ingestor on its thread, freshness target F, so it commits every F/2 or so) and the reads. A
producer writes R records/s (JSON `{id, ts, note}`) to a 3-partition topic for S seconds; every I seconds
the reader runs, one after the other:

- **plain scan**: `SELECT count(*), max(_kafka.timestamp) FROM <table>` (main's head);
- **union read**: `union_read(st, catalog)` and the same aggregate over its frame.

For each: latency (query start to result) and staleness = when the result came - the newest Kafka
(produce) timestamp in it: how far behind the topic the answer is when it arrives; for the union read also
how old that newest record was when the cut was taken. Medians and p90 are reported, and the
union read's tail size (records read from Kafka past the snapshot). Writes bench/results/union_read.md (or
`--out`). Nothing asserts on time; one run on a shared machine (load averages in the report).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from common import load_average, machine_basics, machine_section, percentile, write_results
from confluent_kafka import Producer

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.ingest.union_read import union_read
from icefall.spark.session import build_spark_session

RESULTS = Path(__file__).parent / "results" / "union_read.md"
TOPIC = "bench-fresh"
PARTITIONS = 3
MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: fresh}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}
  format:
    schema:
      - {{name: id, type: long, required: true}}
      - {{name: ts, type: timestamptz, required: true}}
      - {{name: note, type: string}}
  table: {{namespace: bench, name: fresh}}
  freshness: {{targetSeconds: {target}}}
"""


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)
    staleness: list[float] = field(default_factory=list)
    tail: list[float] = field(default_factory=list)
    bad: int = 0
    at_cut: list[float] = field(default_factory=list)  # union read: the cut's time - newest produce time


def say(text: str) -> None:
    print(f"[bench] {time.strftime('%H:%M:%S')} {text}", flush=True)


def produce(bootstrap: str, rate: float, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n, started = 0, time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while n < due:
            value = {"id": n, "ts": datetime.now(UTC).isoformat(), "note": f"record {n}"}
            producer.produce(TOPIC, key=str(n), value=json.dumps(value))
            n += 1
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)


def measure(args: argparse.Namespace, state: Path) -> tuple[Samples, Samples, int]:
    say("starting Kafka ...")
    broker = KafkaBroker(state / "kafka").start()
    try:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        st: StreamingTable = load_manifest(
            MANIFEST.format(bootstrap=broker.bootstrap, topic=TOPIC, target=args.target_seconds)
        )
        catalog = CatalogConfig.embedded(state / "lake")
        catalog.pyiceberg()
        say("starting Spark (local[2]) ...")
        spark = build_spark_session([catalog], app_name="icefall-bench-fresh", master="local[2]")
        stop = threading.Event()
        commits = [0]
        ingestor = Ingestor(st, catalog, spark, FileLease(state / "lease", "bench"))
        ingestor.start(lease_timeout=30)
        threads = [
            threading.Thread(target=produce, args=(broker.bootstrap, args.rate, stop), daemon=True),
            threading.Thread(
                target=ingestor.run,
                args=(stop.is_set, lambda r: commits.__setitem__(0, commits[0] + (r is not None))),
                daemon=True,
            ),
        ]
        for thread in threads:
            thread.start()
        plain, union = Samples(), Samples()
        name = f"{catalog.name}.bench.fresh"
        query = "count(*) AS n, max(_kafka.timestamp) AS newest"
        try:
            time.sleep(args.target_seconds)  # the table exists and has a first commit
            ends = time.monotonic() + args.seconds
            while time.monotonic() < ends:
                started = time.time()
                row = spark.sql(f"SELECT {query} FROM {name}").first()
                answered = time.time()
                plain.latency.append(answered - started)
                if row is not None and row["newest"] is not None:
                    plain.staleness.append(answered - row["newest"].timestamp())
                started = time.time()
                with union_read(st, catalog, spark=spark) as fresh:
                    row = fresh.frame.selectExpr(*query.split(", ")).first()
                    answered = time.time()
                    union.latency.append(answered - started)
                    union.tail.append(fresh.cut.tail_records)
                    union.bad += fresh.cut.bad_records
                if row is not None and row["newest"] is not None:
                    newest = row["newest"].timestamp()
                    union.staleness.append(answered - newest)
                    union.at_cut.append(fresh.cut.taken_at_ms / 1000 - newest)
                time.sleep(args.interval)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
            ingestor.close()
            spark.stop()
        return plain, union, commits[0]
    finally:
        broker.stop()


def render(args: argparse.Namespace, plain: Samples, union: Samples, commits: int, load: str) -> str:
    def cells(values: list[float], unit: str = "s") -> str:
        if not values:
            return "- | -"
        return f"{percentile(values, 50):.2f} {unit} | {percentile(values, 90):.2f} {unit}"

    lines = [
        "# Fresh reads: union read vs plain table scan",
        "",
        f"`python bench/union_read.py --seconds {args.seconds:g} --rate {args.rate:g} --interval "
        f"{args.interval:g} --target-seconds {args.target_seconds}`: {PARTITIONS} partitions, "
        f"{args.rate:g} records/s, ingestion (freshness target {args.target_seconds} s) committed {commits} "
        f"times while {len(plain.latency)} pairs of reads ran ({union.bad} records left out as bad by the "
        "union reads). Staleness = when the answer came - the newest produce time in it.",
        "",
        "| read | latency p50 | latency p90 | staleness p50 | staleness p90 |",
        "|---|---|---|---|---|",
        f"| plain scan (main's head) | {cells(plain.latency)} | {cells(plain.staleness)} |",
        f"| union read (head + tail to the cut) | {cells(union.latency)} | {cells(union.staleness)} |",
        "",
        f"Union read tail, records read from Kafka past the snapshot: p50 {percentile(union.tail, 50):.0f}, "
        f"p90 {percentile(union.tail, 90):.0f}; the newest record in the answer was produced "
        f"{percentile(union.at_cut, 50):.2f} s (p50) / {percentile(union.at_cut, 90):.2f} s (p90) before the "
        "cut was taken."
        if union.tail
        else "",
        "",
        *machine_section({**machine_basics(), "load average (start / end)": load}),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="how long reads are measured")
    parser.add_argument("--rate", type=float, default=200, help="records/s produced")
    parser.add_argument("--interval", type=float, default=2, help="pause between pairs of reads")
    parser.add_argument("--target-seconds", type=int, default=10, help="ingestion's freshness target")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="icefall-bench-") as state:
        plain, union, commits = measure(args, Path(state))
    write_results(args.out, render(args, plain, union, commits, f"{load} / {load_average()}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
