"""Per-batch fixed costs of an `icefall run` drain, counted rather than sampled.

    .venv/bin/python bench/batch_costs.py [--records N] [--warmup-records N] [--note-words N]

One Kafka broker (the devstack's), the bench's ~230 B events, `icefall run` as bench/profile_drain.py runs
it. After a warm-up backlog is committed, a second backlog is drained and these are counted over it, per
batch (the table's commits): Spark's code generator compilations (its `CodeGenerator` metrics source,
through a CSV metrics sink), the JIT's compiled methods and the classes loaded (`jstat`), the Kafka admin
clients Spark made (their thread numbers), and the CPU of the tree. Prints the numbers; nothing asserts.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import SMALL_NOTE_WORDS, load_average, tree_cpu
from compare import preload, table_commits
from profile_drain import java_pid, manifest, wait_rows

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker


def jstat(pid: int, option: str) -> list[str]:
    out = subprocess.run(["jstat", option, str(pid)], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[1].split()


def codegen(folder: Path) -> tuple[int, float]:
    """Compilations so far and their total time, ms (the newest line of the metric's CSV)."""
    files = list(folder.glob("*CodeGenerator.compilationTime.csv"))
    if not files:
        return 0, 0.0
    rows = list(csv.reader(files[0].open()))
    last = dict(zip(rows[0], rows[-1], strict=True))
    return int(last["count"]), float(last["mean"]) * int(last["count"])


def admin_clients(pid: int) -> int:
    out = subprocess.run(
        ["jcmd", str(pid), "Thread.print"], capture_output=True, text=True, check=True
    ).stdout
    numbers = [int(n) for n in re.findall(r"adminclient-(\d+)", out)]
    return max(numbers, default=0)


def counters(jvm: int, metrics: Path) -> dict[str, float]:
    compiled = jstat(jvm, "-compiler")
    classes = jstat(jvm, "-class")
    count, ms = codegen(metrics)
    return {
        "jit_compiled": int(compiled[0]),
        "jit_seconds": float(compiled[3]),
        "classes_loaded": int(classes[0]),
        "codegen_compiles": count,
        "codegen_ms": ms,
        "admin_clients": admin_clients(jvm),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--warmup-records", type=int, default=30_000)
    parser.add_argument("--note-words", type=int, default=SMALL_NOTE_WORDS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefall-batchcost-"))
    metrics = work / "metrics"
    metrics.mkdir()
    print(f"work in {work}; load {load_average()}", flush=True)
    broker = KafkaBroker(work / "kafka", heap="1g").start()
    proc = None
    try:
        topic = "batchcost"
        broker.create_topic(topic, partitions=3)
        (work / "events.yaml").write_text(yaml.safe_dump(manifest(broker.bootstrap, topic), sort_keys=False))
        preload(broker.bootstrap, topic, args.warmup_records, args.note_words, 1)
        sink = "-Dspark.metrics.conf.driver.sink.csv"
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"{sink}.class=org.apache.spark.metrics.sink.CsvSink {sink}.period=1 "
            f"{sink}.unit=seconds {sink}.directory={metrics}",
        }
        icefall = str(Path(sys.executable).with_name("icefall"))
        proc = subprocess.Popen(
            [icefall, "run", "-f", str(work / "events.yaml"), "--state-dir", str(work)],
            stdout=(work / "icefall.log").open("wb"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        catalog = CatalogConfig.embedded(work)
        wait_rows(catalog, args.warmup_records, proc, 600)
        jvm = java_pid(proc.pid)
        time.sleep(3)  # the metrics sink's next line
        before, cpu0, t0 = counters(jvm, metrics), tree_cpu(proc.pid), time.monotonic()
        commits0 = len(table_commits(catalog))
        preload(broker.bootstrap, topic, args.records, args.note_words, 1, start=args.warmup_records)
        wait_rows(catalog, args.warmup_records + args.records, proc, 1200)
        cpu1, t1 = tree_cpu(proc.pid), time.monotonic()
        time.sleep(3)
        after = counters(jvm, metrics)
        batches = len(table_commits(catalog)) - commits0
        print(f"drain: {args.records:,} records, {batches} batches, {t1 - t0:.1f} s, {cpu1 - cpu0:.1f} CPU-s "
              f"({args.records / (cpu1 - cpu0):,.0f} records per CPU-s); load {load_average()}")  # fmt: skip
        for name, value in after.items():
            delta = value - before[name]
            print(f"  {name}: {delta:,.1f} over the drain, {delta / max(batches, 1):,.1f} per batch")
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
