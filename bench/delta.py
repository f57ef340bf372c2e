"""Delta Lake side by side: Icefall → Delta beside Spark Structured Streaming → Delta, in the same run.

    .venv/bin/python bench/delta.py [--records N] [--rounds R] [--target-seconds F] [--out FILE]
    (or: make bench-delta BENCH_ARGS="...")

One devstack Kafka broker. Per round and system, a fresh 3-partition topic is preloaded with `--records`
seeded small bench events (~230 B of JSON, `common.bench_records`), then drained:

- **icefall**: `icefall run --until-caught-up --no-maintenance` of a `format: delta` table (the events' 9
  columns plus `_kafka`; not partitioned: Icefall does not partition Delta tables yet), `local[2]`,
  freshness target `F`. Drain: from the first batch's start (its log line's time minus its duration) to the
  last batch's line, as bench/pipelining.py.
- **spark**: `bench/peers/spark_streaming.py --table-format delta --available-now`: `from_json` into the
  events' columns plus a `_kafka` struct, `writeStream.format("delta")`, Spark's checkpoint for exactly
  once, Icefall's Kafka reader defaults. Drain: from its first micro-batch's start to its last one's end
  (the query's progress).

Both pinned to core 1 when the machine has 2 cores (this process and the broker on core 0); CPU of the
process tree sampled every 0.25 s. Records per CPU-second over the drain, and over the whole process
(start-up and JVM included). Audit by content afterwards: Icefall's table by `icefall verify` (delta-rs
reads it, each row's digest against its record decoded again); the peer's read by delta-rs: each offset
of the topic held once, nothing else, and each row's `id` and `key` those of its record. A failed audit
stops the bench. Results go to bench/results/delta.md. Nothing here asserts on time.
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
from datetime import datetime
from pathlib import Path

from common import SMALL_NOTE_WORDS, TreeMonitor, load_average, machine_basics, machine_section, write_results
from compare import EVENT_SCHEMA
from pipelining import preload

from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tools import jar_files

RESULTS = Path(__file__).parent / "results" / "delta.md"
PEER = Path(__file__).parent / "peers" / "spark_streaming.py"
BATCH_LINE = re.compile(r"\[run\] batch \d+: (\d+) read.* in ([0-9.]+)s ")
PEER_LINE = re.compile(r"\[peer\] progress (\{.*\})")
#: Icefall's Kafka reader defaults, given to the peer (bench/compare.py's SPARK_CONSUMER).
PEER_KAFKA = {"fetch.max.wait.ms": "10", "max.poll.records": "5000"}
SYSTEMS = ("icefall", "spark")


@dataclass(frozen=True)
class Drain:
    system: str
    batches: int
    seconds: float
    cpu: float
    total_cpu: float
    records: int

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def per_cpu(self) -> float:
        return self.records / self.cpu

    @property
    def per_total_cpu(self) -> float:
        return self.records / self.total_cpu


def manifest(bootstrap: str, topic: str, location: Path, target: int) -> str:
    return json.dumps({
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "bench-delta"},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topic": topic},
            "format": {"type": "json", "schema": EVENT_SCHEMA},
            "table": {"format": "delta", "location": str(location)},
            "freshness": {"targetSeconds": target},
        },
    })  # fmt: skip


def pinned() -> list[str]:
    return ["taskset", "-c", "1"] if len(os.sched_getaffinity(0)) >= 2 else []


def run_system(
    argv: list[str], parse: re.Pattern[str], log: Path
) -> tuple[list[tuple[float, str]], float, TreeMonitor]:
    """Run `argv` to its end, its matching stdout lines with the time each was seen; its exit, its CPU."""
    proc = subprocess.Popen([*pinned(), *argv], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    monitor = TreeMonitor(proc.pid, interval=0.25).start()
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if parse.search(line):
                lines.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
        monitor.stop()
    if code != 0 or not lines:
        raise RuntimeError(f"{argv[1]} exited {code} after {len(lines)} batches (see {log})")
    return lines, time.time(), monitor


def drain_icefall(work: Path, bootstrap: str, topic: str, records: int, target: int) -> Drain:
    location = work / "table"
    (work / "table.yaml").write_text(manifest(bootstrap, topic, location, target))
    icefall = str(Path(sys.executable).with_name("icefall"))
    argv = [icefall, "run", "-f", str(work / "table.yaml"), "--state-dir", str(work), "--until-caught-up",
            "--no-maintenance"]  # fmt: skip
    lines, _, monitor = run_system(argv, BATCH_LINE, work / "icefall.log")
    batches = [(seen, BATCH_LINE.search(line)) for seen, line in lines]
    started = batches[0][0] - float(batches[0][1][2])  # type: ignore[index]
    ended = batches[-1][0]
    verified = subprocess.run(
        [icefall, "verify", "-f", str(work / "table.yaml"), "--state-dir", str(work)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if verified.returncode != 0:
        said = verified.stdout[-3000:] + verified.stderr[-3000:]
        raise RuntimeError(f"icefall verify of {location} failed:\n{said}")
    read = sum(int(m[1]) for _, m in batches if m is not None)
    if read != records:
        raise RuntimeError(f"icefall read {read} records of {records}")
    return Drain("icefall", len(batches), ended - started, monitor.cpu_at(ended) - monitor.cpu_at(started),
                 monitor.total_cpu, records)  # fmt: skip


def drain_spark(work: Path, bootstrap: str, topic: str, records: int) -> Drain:
    location = work / "table"
    jars = ",".join(str(j) for j in jar_files("ICEFALL_SPARK_JARS"))
    delta = ",".join(str(j) for j in jar_files("ICEFALL_DELTA_JARS"))
    argv = [sys.executable, str(PEER), "--bootstrap", bootstrap, "--topic", topic, "--table-format", "delta",
            "--location", str(location), "--checkpoint", str(work / "checkpoint"), "--jars", jars,
            "--delta-jars", delta, "--available-now",
            *(f"--kafka-option={k}={v}" for k, v in PEER_KAFKA.items())]  # fmt: skip
    lines, _, monitor = run_system(argv, PEER_LINE, work / "spark.log")
    progress = [json.loads(PEER_LINE.search(line)[1]) for _, line in lines]  # type: ignore[index]
    progress = [p for p in progress if p["rows"]]
    started = datetime.fromisoformat(progress[0]["start"].replace("Z", "+00:00")).timestamp()
    last = progress[-1]
    ended = datetime.fromisoformat(last["start"].replace("Z", "+00:00")).timestamp() + last["ms"] / 1000
    audit_peer(bootstrap, topic, location, records)
    return Drain("spark", len(progress), ended - started, monitor.cpu_at(ended) - monitor.cpu_at(started),
                 monitor.total_cpu, records)  # fmt: skip


def audit_peer(bootstrap: str, topic: str, location: Path, records: int) -> None:
    """The peer's table read by delta-rs against the topic: each offset once, its row's id and key the
    record's."""
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import DeltaTable

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"audit-{topic}", "enable.auto.commit": False}
    )
    want: dict[tuple[int, int], tuple[int, str]] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        while len(want) < records:
            for message in consumer.consume(5000, timeout=10):
                if message.error() is None:
                    event = json.loads(message.value())
                    want[(message.partition(), message.offset())] = (event["id"], event["key"])
    finally:
        consumer.close()
    rows = DeltaTable(str(location)).to_pyarrow_table(columns=["_kafka", "id", "key"]).to_pylist()
    held = [((r["_kafka"]["partition"], r["_kafka"]["offset"]), (r["id"], r["key"])) for r in rows]
    found = dict(held)
    if len(held) != len(found) or found != want:
        wrong = sum(1 for k, v in found.items() if want.get(k) != v)
        raise RuntimeError(f"peer table {location}: {len(held)} rows, {len(found)} offsets, {wrong} wrong")


def mean(drains: list[Drain], measure: str) -> float:
    return statistics.mean(getattr(d, measure) for d in drains)


def row(round_number: int, d: Drain) -> str:
    cells = [str(round_number), d.system, str(d.batches), f"{d.seconds:.1f} s", f"{d.rate:,.0f}",
             f"{d.per_cpu:,.0f}", f"{d.total_cpu:.1f} s", f"{d.per_total_cpu:,.0f}", "clean"]  # fmt: skip
    return f"| {' | '.join(cells)} |"


def mean_row(system: str, drains: list[Drain]) -> str:
    cells = [system, f"{mean(drains, 'seconds'):.2f} s", f"{mean(drains, 'rate'):,.0f}",
             f"{mean(drains, 'per_cpu'):,.0f}", f"{mean(drains, 'per_total_cpu'):,.0f}"]  # fmt: skip
    return f"| {' | '.join(cells)} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000, help="backlog of small events per drain")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target-seconds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_at_start = load_average()
    drains: list[Drain] = []
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="icefall-bench-delta-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka").start()
        try:
            for r in range(args.rounds):
                for system in SYSTEMS:
                    topic = f"delta-{r}-{system}"
                    work = Path(tmp) / topic
                    work.mkdir()
                    preload(broker.bootstrap, topic, args.records, SMALL_NOTE_WORDS)
                    if system == "icefall":
                        d = drain_icefall(work, broker.bootstrap, topic, args.records, args.target_seconds)
                    else:
                        d = drain_spark(work, broker.bootstrap, topic, args.records)
                    drains.append(d)
                    print(f"[bench] {topic}: {d.batches} batches, {d.per_cpu:,.0f} per CPU-s")
                    rows.append(row(r + 1, d))
        finally:
            broker.stop()
    by_system = {s: [d for d in drains if d.system == s] for s in SYSTEMS}
    summary = [mean_row(s, ds) for s, ds in by_system.items()]
    ratio = mean(by_system["icefall"], "per_cpu") / mean(by_system["spark"], "per_cpu")
    machine = {
        **machine_basics(),
        "Load average at start": load_at_start,
        "Load average at end": load_average(),
    }
    text = "\n".join([
        "# Delta Lake: Icefall beside Spark Structured Streaming",
        "",
        f"`bench/delta.py {' '.join(sys.argv[1:])}` started {started}: {args.records:,} small events (~230 B "
        "of JSON) per drain. How it is measured: the docstring of `bench/delta.py`. One run on a shared "
        "machine: compare rows of the same run.",
        "",
        f"Icefall's records per CPU-second over the drain: **{ratio:.2f}x** Spark Structured Streaming's.",
        "",
        "## Mean of the rounds",
        "",
        "| system | drain | records/s | records per CPU-s (drain) | records per CPU-s (whole process) |",
        "|---|--:|--:|--:|--:|",
        *summary,
        "",
        "## Each drain",
        "",
        "| round | system | batches | drain | records/s | per CPU-s (drain) | CPU (whole process) "
        "| per CPU-s (whole) | audit by content |",
        "|--:|---|--:|--:|--:|--:|--:|--:|---|",
        *rows,
        "",
        *machine_section(machine),
    ])  # fmt: skip
    write_results(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
