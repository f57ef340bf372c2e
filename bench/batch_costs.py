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
import collections
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import yaml
from common import SMALL_NOTE_WORDS, load_average, stop_group, tree_cpu
from compare import preload, table_commits
from profile_drain import java_pid, jfr_stacks, manifest, wait_rows

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker

#: Caught up, a batch every half target: many small batches, whose CPU is mostly their fixed cost.
TARGET_SECONDS = 2


def say(text: str) -> None:
    print(f"[batch_costs] {text}", flush=True)


def jstat(pid: int, option: str) -> list[str]:
    out = subprocess.run(["jstat", option, str(pid)], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[1].split()


def codegen(folder: Path) -> int:
    """Spark's code generator compilations so far (the newest line of the metric's CSV)."""
    files = list(folder.glob("*CodeGenerator.compilationTime.csv"))
    if not files:
        return 0
    rows = list(csv.reader(files[0].open()))
    return int(dict(zip(rows[0], rows[-1], strict=True))["count"])


#: JFR with one event on, the threads started: a Kafka admin client's thread lives as long as the client.
THREAD_STARTS = """<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0">
  <event name="jdk.ThreadStart"><setting name="enabled">true</setting></event>
</configuration>
"""


def thread_starts(pid: int, jfr: Path) -> dict[str, int]:
    """Threads the JVM started so far, by name with the digits left out."""
    dump = ["jcmd", str(pid), "JFR.dump", "name=threads", f"filename={jfr}"]
    subprocess.run(dump, check=True, capture_output=True)
    show = ["jfr", "print", "--events", "jdk.ThreadStart", str(jfr)]
    out = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    for name in re.findall(r'thread = "([^"]*)"', out):
        kind = re.sub(r"\d+", "N", name)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def counters(jvm: int, metrics: Path, jfr: Path) -> dict[str, float]:
    compiled = jstat(jvm, "-compiler")
    classes = jstat(jvm, "-class")
    threads = thread_starts(jvm, jfr)
    return {
        "jit_compiled": int(compiled[0]),
        "classes_loaded": int(classes[0]),
        "codegen_compiles": codegen(metrics),
        "threads_started": sum(threads.values()),
        **{f"threads {k}": v for k, v in threads.items()},
    }


def top_frames(jvm: int, jfr: Path, window: tuple[datetime, datetime], top: int = 25) -> None:
    """The phase's JFR execution samples: by thread kind, and the top frames by total (inclusive)."""
    subprocess.run(["jcmd", str(jvm), "JFR.dump", "name=drain", f"filename={jfr}"], check=True,
                   capture_output=True)  # fmt: skip
    stacks, threads = jfr_stacks(jfr, window)
    say(f"  JFR: {len(stacks)} execution samples; by thread: {dict(threads.most_common(6))}")
    total: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for frames in stacks:
        total.update(set(frames))
        if frames:
            own[frames[0]] += 1
    for frame, n in total.most_common(top):
        say(f"    total {n / max(len(stacks), 1):6.1%} {frame}")
    for frame, n in own.most_common(12):
        say(f"    self  {n / max(len(stacks), 1):6.1%} {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--warmup-records", type=int, default=30_000)
    parser.add_argument("--trickle-seconds", type=int, default=40)
    parser.add_argument("--note-words", type=int, default=SMALL_NOTE_WORDS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icefall-batchcost-"))
    metrics = work / "metrics"
    metrics.mkdir()
    say(f"work in {work}; load {load_average()}")
    broker = KafkaBroker(work / "kafka", heap="1g").start()
    proc = None
    try:
        topic = "batchcost"
        broker.create_topic(topic, partitions=3)
        table = manifest(broker.bootstrap, topic)
        table["spec"]["freshness"]["targetSeconds"] = TARGET_SECONDS  # type: ignore[index]
        (work / "events.yaml").write_text(yaml.safe_dump(table, sort_keys=False))
        preload(broker.bootstrap, topic, args.warmup_records, args.note_words, 1)
        sink = "-Dspark.metrics.conf.driver.sink.csv"
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"{sink}.class=org.apache.spark.metrics.sink.CsvSink {sink}.period=1 "
            f"{sink}.unit=seconds {sink}.directory={metrics} "
            f"-XX:StartFlightRecording=name=threads,settings={work / 'threads.jfc'} "
            f"-Xlog:class+load=info:file={work / 'classes.log'}:uptime "
            f"-XX:StartFlightRecording=name=drain,settings=profile,filename={work / 'drain.jfr'}",
        }
        (work / "threads.jfc").write_text(THREAD_STARTS)
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

        def phase(name: str, produce: Callable[[], None]) -> None:
            window_start = datetime.now(UTC)
            before, t0 = counters(jvm, metrics, work / "a.jfr"), time.monotonic()
            cpu0, jvm0 = tree_cpu(proc.pid), tree_cpu(jvm)
            commits0 = len(table_commits(catalog))
            produce()
            cpu1, jvm1, t1 = tree_cpu(proc.pid), tree_cpu(jvm), time.monotonic()
            time.sleep(3)  # the metrics sink's next line
            after = counters(jvm, metrics, work / "b.jfr")
            batches = max(len(table_commits(catalog)) - commits0, 1)
            cpu, spark = (cpu1 - cpu0) / batches, (jvm1 - jvm0) / batches
            say(f"{name}: {batches} batches, {t1 - t0:.1f} s, {cpu1 - cpu0:.1f} CPU-s, "
                f"{cpu:.2f} CPU-s per batch "
                f"(Spark JVM {spark:.2f}, the rest {cpu - spark:.2f}); load {load_average()}")  # fmt: skip
            for key, value in after.items():
                if delta := value - before.get(key, 0):
                    say(f"  {key}: {delta:,.0f}, {delta / batches:,.1f} per batch")
            top_frames(jvm, work / f"{name.split(maxsplit=1)[0]}.jfr", (window_start, datetime.now(UTC)))

        def backlog() -> None:
            preload(broker.bootstrap, topic, args.records, args.note_words, 1, start=args.warmup_records)
            wait_rows(catalog, args.warmup_records + args.records, proc, 1200)

        def trickle() -> None:
            start = args.warmup_records + args.records
            for i in range(args.trickle_seconds):
                preload(broker.bootstrap, topic, 100, args.note_words, 1, start=start + 100 * i)
                time.sleep(1)
            wait_rows(catalog, start + 100 * args.trickle_seconds, proc, 600)

        time.sleep(3)
        phase(f"backlog of {args.records:,} records", backlog)
        phase(f"{args.trickle_seconds} s of 100 records/s, a {TARGET_SECONDS} s freshness target", trickle)
    finally:
        if proc is not None:
            stop_group(proc)
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
