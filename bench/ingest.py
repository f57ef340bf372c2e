"""Ingest benchmark: throughput, CPU cost, commit latency and freshness of `Ingestor` on this machine.

    .venv/bin/python bench/ingest.py [--records N] [--seconds S]        (or: make bench-ingest)

Starts the local Kafka broker (devstack), an embedded catalog in a temporary folder and local Spark
(`local[2]`), and runs the real `Ingestor` in this process on `examples/orders.yaml` (freshness target 10 s)
fed with the seeded ~230-byte order events of `icefall.devstack.events`. Two phases:

(a) Full speed. A warm-up backlog is ingested and discarded (JIT, first table commits), then N records are
    preloaded and ingested until caught up, batch after batch with no pause. Reported: records/s (wall
    time from the first batch's start to caught up), records per CPU-second of the ingesting process
    (this Python process plus the Spark JVM it started and that JVM's children, from /proc; the Kafka
    broker is not counted), and latencies per batch.
(b) Freshness. An `EventProducer` streams at half the rate measured in (a) for S seconds while the
    ingestion loop (`Ingestor.run`, with its own pacing) runs; then it catches up. Afterwards, for each
    record produced after the warm-up (the first quarter of S, at most 15 s): freshness = the time `main`
    was fast-forwarded to the snapshot that added it (the table's snapshot log: when it became visible to
    readers) minus its Kafka produce timestamp. Which snapshot added a row comes from the manifest entries
    (`table.inspect.entries`, status ADDED); the row's produce time from its `_kafka.timestamp`. The same
    figure against `snapshot.timestamp_ms` (when Spark wrote the staged snapshot, before the
    fast-forward) is shown too. The files a batch added are read from its own snapshot's manifests, so a
    compaction that rewrote them since does not change the figure.
(c) With `--maintenance` (`make bench-ingest BENCH_ARGS=--maintenance`): phase (b) twice more, with
    `icefall run`'s in-process maintenance (`embedded_maintenance`, the spec's interval) run between
    batches, then on its thread beside them; the table holds the earlier phases' many small files, so
    there is compaction to do. What maintenance costs ingestion's freshness, side by side.

Commit latency: "CAS" is `BatchReport.commit_seconds`, `commit_staged_outcome` alone (the compare-and-swap
of `main`); "batch" is `BatchReport.seconds` (watermarks, planning, read, write, commit).

Results go to bench/results/ingest.md and stdout. The numbers depend on what else runs on the machine:
the load average at the start is recorded with them. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import (
    cpu_seconds,
    descendants,
    load_average,
    machine_basics,
    machine_section,
    percentile,
    proc_stat,
    write_results,
)
from confluent_kafka import Producer, libversion

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.compact.runner import EmbeddedMaintenance, embedded_maintenance
from icefall.compact.worker import kind_of
from icefall.devstack.events import EventProducer, order_values
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tools import tool_dir
from icefall.ingest.engine import BatchReport, Ingestor
from icefall.plan.names import table_leases
from icefall.spark.session import FAIR_SCHEDULING, build_spark_session

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "orders.yaml"
RESULTS = ROOT / "bench" / "results" / "ingest.md"
TOPIC = "orders"
PARTITIONS = 3


def say(text: str) -> None:
    print(f"[bench] {text}", flush=True)


# --- measuring ---------------------------------------------------------------------------------------


class ProcessCpu:
    """CPU seconds (user + system) of this process, its reaped children, and the live Spark JVM tree."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid

    def seconds(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # only children that have exited
        total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
        for pid in descendants(self.jvm_pid):
            stat = proc_stat(pid)
            if stat is not None:  # utime, stime, and its own reaped children's cutime, cstime
                total += cpu_seconds(stat)
        return total


# --- driving -----------------------------------------------------------------------------------------


def preload(bootstrap: str, count: int, seed: int) -> None:
    """Produce `count` order events as fast as the client goes; returns once all are acknowledged."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "enable.idempotence": True}
    )
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    values = order_values(seed)
    for _ in range(count):
        while True:
            try:
                producer.produce(TOPIC, value=next(values), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60) or errors:
        raise RuntimeError(f"preloading failed: {errors[:3]}")


def spark_jobs_started(spark: Any) -> int:
    """Spark jobs started so far in this session (job ids are handed out in order, from 0)."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())  # an AtomicInteger, as a number


def until_caught_up(ingestor: Ingestor) -> list[BatchReport]:
    """Batches back to back until there is nothing left to read."""
    reports = []
    while (report := ingestor.run_batch()) is not None:
        reports.append(report)
    return reports


def describe_batches(reports: list[BatchReport]) -> str:
    sizes = [r.records_read for r in reports]
    return f"{len(sizes)} (mean {statistics.mean(sizes):,.0f} records)" if sizes else "0"


def mean_phases(reports: list[BatchReport]) -> str:
    """Mean seconds per phase of `BatchReport.phases`, in the order the batch runs them."""
    names = list(dict.fromkeys(name for r in reports for name in r.phases))
    n = max(len(reports), 1)
    means = (f"{name} {sum(r.phases.get(name, 0.0) for r in reports) / n:.2f}" for name in names)
    return ", ".join(means) + " s"


def latency_ms(values: list[float]) -> str:
    return f"{percentile(values, 50) * 1000:,.0f} / {percentile(values, 99) * 1000:,.0f} ms (n={len(values)})"


def seconds_pair(values: list[float]) -> str:
    return f"{percentile(values, 50):.2f} / {percentile(values, 99):.2f} s"


# --- freshness from the table ------------------------------------------------------------------------


@dataclass(frozen=True)
class Freshness:
    visible: list[float]  # seconds from produce to main's fast-forward, per record
    written: list[float]  # seconds from produce to the staged snapshot's timestamp, per record
    rows_after_start: int  # rows produced after the live phase began (all of them, warm-up included)


def freshness(table: Any, window_ms: tuple[int, int], phase_start_ms: int) -> Freshness:
    """Per-record freshness of the rows produced inside `window_ms`, from the committed table."""
    from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

    table.refresh()
    became_visible: dict[int, int] = {}
    for entry in table.metadata.snapshot_log:  # when main moved to each snapshot
        became_visible.setdefault(entry.snapshot_id, entry.timestamp_ms)
    visible: list[float] = []
    written: list[float] = []
    rows_after_start = 0
    # The files each batch's snapshot added, read from that snapshot's own manifests: they are still there
    # when maintenance has rewritten them since (the snapshot is not expired during a run).
    for snapshot in table.metadata.snapshots:
        added_by = snapshot.snapshot_id
        if snapshot.summary is None or snapshot.summary.operation.value != "append":
            continue  # compaction, expiry, retention
        if became_visible.get(added_by, 0) < phase_start_ms:
            continue  # files of the full-speed phase, or a snapshot main never reached
        visible_ms, written_ms = became_visible[added_by], snapshot.timestamp_ms
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != added_by:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                added = entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == added_by
                if not added or entry.data_file.content != DataFileContent.DATA:
                    continue
                with table.io.new_input(entry.data_file.file_path).open() as stream:
                    kafka = pq.read_table(stream, columns=["_kafka"]).column("_kafka").combine_chunks()
                for produced_us in pc.struct_field(kafka, "timestamp").cast("int64").to_pylist():
                    produced_ms = produced_us // 1000
                    rows_after_start += produced_ms >= phase_start_ms
                    if window_ms[0] <= produced_ms <= window_ms[1]:
                        visible.append((visible_ms - produced_ms) / 1000)
                        written.append((written_ms - produced_ms) / 1000)
    return Freshness(visible, written, rows_after_start)


# --- the machine -------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    kafka_jar = sorted(tool_dir("ICEFALL_KAFKA_JARS").glob("kafka-server-[0-9]*.jar"))
    iceberg_jar = sorted(tool_dir("ICEFALL_SPARK_JARS").glob("iceberg-spark-runtime-*.jar"))
    basics = machine_basics()
    return {
        "CPU": basics["CPU"],
        "Memory": basics["Memory"],
        "Load average at start (1/5/15 min)": load_average(),
        "OS": basics["OS"],
        "Python": basics["Python"],
        "Java": basics["Java"],
        "PySpark": version("pyspark"),
        "Iceberg Spark runtime": iceberg_jar[0].stem if iceberg_jar else "unknown",
        "pyiceberg": version("pyiceberg"),
        "Kafka broker": kafka_jar[0].stem.replace("kafka-server-", "") if kafka_jar else "unknown",
        "confluent-kafka / librdkafka": f"{version('confluent-kafka')} / {libversion()[0]}",
    }


# --- the run -----------------------------------------------------------------------------------------


def manifest_for(bootstrap: str, target_seconds: int | None = None) -> StreamingTable:
    st = load_manifest(MANIFEST)
    source = st.spec.source.model_copy(update={"bootstrap_servers": bootstrap, "topic": TOPIC})
    update: dict[str, Any] = {"source": source}
    if target_seconds is not None:
        update["freshness"] = st.spec.freshness.model_copy(update={"target_seconds": target_seconds})
    return st.model_copy(update={"spec": st.spec.model_copy(update=update)})


def run(args: argparse.Namespace, state: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    machine_facts = machine()
    say("starting Kafka ...")
    broker = KafkaBroker(state / "kafka").start()
    try:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        st = manifest_for(broker.bootstrap, args.target_seconds)
        catalog = CatalogConfig.embedded(state / "lake")
        catalog.pyiceberg()
        say("starting Spark (local[2]) ...")
        spark = build_spark_session(  # FAIR: as `icefall run` with in-process maintenance
            [catalog], app_name="icefall-bench", master="local[2]", extra_conf=FAIR_SCHEDULING
        )
        try:
            lease = FileLease.in_dir(state / "leases", table_leases(st).commit, "bench")
            ingestor = Ingestor(st, catalog, spark, lease)
            ingestor.start(lease_timeout=30)
            maintenance = (
                embedded_maintenance(st, catalog, spark, state / "leases") if args.maintenance else None
            )
            try:
                return machine_facts, phases(args, broker, spark, ingestor, maintenance)
            finally:
                ingestor.close()
        finally:
            spark.stop()
    finally:
        broker.stop()


def phases(
    args: argparse.Namespace,
    broker: KafkaBroker,
    spark: Any,
    ingestor: Ingestor,
    maintenance: EmbeddedMaintenance | None = None,
) -> list[tuple[str, str]]:
    cpu = ProcessCpu(spark.sparkContext._gateway.proc.pid)  # the spark-submit launcher, then the JVM
    rows: list[tuple[str, str]] = []

    warmup = args.warmup_records or max(args.records // 5, 10_000)
    say(f"(a) warm-up: {warmup:,} records")
    preload(broker.bootstrap, warmup, seed=1)
    until_caught_up(ingestor)

    say(f"(a) preloading {args.records:,} records ...")
    preload(broker.bootstrap, args.records, seed=2)
    say("(a) ingesting the backlog at full speed ...")
    cpu_start, wall_start, jobs_start = cpu.seconds(), time.monotonic(), spark_jobs_started(spark)
    reports = until_caught_up(ingestor)
    wall, cpu_used = time.monotonic() - wall_start, cpu.seconds() - cpu_start
    jobs = spark_jobs_started(spark) - jobs_start
    records = sum(r.records_read for r in reports)
    full_rps = records / wall
    rows += [
        ("**(a) full speed on a preloaded backlog**", f"{records:,} records, warm-up of {warmup:,} excluded"),
        ("records/s", f"{full_rps:,.0f}"),
        ("records per CPU-second (driver + Spark JVM)", f"{records / cpu_used:,.0f}"),
        ("CPU cores busy on average", f"{cpu_used / wall:.2f} (CPU {cpu_used:.1f} s over {wall:.1f} s)"),
        ("batches", describe_batches(reports)),
        ("Spark jobs per batch", f"{jobs / max(len(reports), 1):.1f} ({jobs} jobs)"),
        ("commit (CAS of main) p50 / p99", latency_ms([r.commit_seconds for r in reports])),
        ("batch p50 / p99", seconds_pair([r.seconds for r in reports])),
        ("batch phases, mean", mean_phases(reports)),
    ]
    say(f"(a) {jobs} Spark jobs in {len(reports)} batches")
    say(f"(a) {full_rps:,.0f} records/s, {records / cpu_used:,.0f} records per CPU-second")

    rate = full_rps / 2
    rows += live_phase("(b) live stream at half the full-speed rate", args, broker, ingestor, rate)
    if maintenance is not None:
        for mode in ("between batches", "on its thread"):
            label = f"(c) the same live stream, in-process maintenance {mode}"
            rows += live_phase(label, args, broker, ingestor, rate, maintenance=maintenance, mode=mode)
    return rows


def live_phase(
    label: str,
    args: argparse.Namespace,
    broker: KafkaBroker,
    ingestor: Ingestor,
    rate: float,
    *,
    maintenance: EmbeddedMaintenance | None = None,
    mode: str = "",
) -> list[tuple[str, str]]:
    """Stream `rate` records/s for `args.seconds` into `Ingestor.run` (with `maintenance` between batches or
    on its thread), catch up, and measure freshness from the table."""
    warmup_seconds = min(15.0, args.seconds / 4)
    say(f"{label}: ~{rate:,.0f} records/s for {args.seconds:.0f}s (first {warmup_seconds:.0f}s warm-up)")
    producer = EventProducer(broker.bootstrap, TOPIC, rate, seed=3)
    live: list[BatchReport] = []
    steps_before = len(maintenance.steps) if maintenance is not None else 0
    threaded = maintenance is not None and mode == "on its thread"

    def on_batch(report: BatchReport | None) -> None:
        if report is not None:
            live.append(report)
        if threaded:
            maintenance.offer(report)
        elif maintenance is not None:
            maintenance.between_batches(report)

    if threaded:
        maintenance.start()
    phase_start_ms = int(time.time() * 1000)
    producer.start()
    deadline = time.monotonic() + args.seconds
    ingestor.run(lambda: time.monotonic() > deadline, on_batch)
    producer.stop()
    stop_ms = int(time.time() * 1000)
    if threaded:
        maintenance.stop()
    say(f"{label}: producer stopped after {producer.acked:,} acknowledged records; catching up ...")
    live += until_caught_up(ingestor)
    measured_from = phase_start_ms + int(warmup_seconds * 1000)
    fresh = freshness(ingestor.table, (measured_from, stop_ms), phase_start_ms)
    if fresh.rows_after_start != producer.acked or producer.errors:
        say(
            f"WARNING: {producer.acked} records acknowledged ({producer.errors} errors) but "
            f"{fresh.rows_after_start} rows of the live phase found in the table"
        )
    rows = [
        (
            f"**{label}**",
            f"{rate:,.0f} records/s for {args.seconds:.0f} s; first {warmup_seconds:.0f} s excluded",
        ),
        ("freshness p50 / p99 (produce → main fast-forward)", seconds_pair(fresh.visible)),
        ("freshness p50 / p99 (produce → snapshot.timestamp_ms)", seconds_pair(fresh.written)),
        ("freshness max (produce → main fast-forward)", f"{max(fresh.visible, default=float('nan')):.2f} s"),
        ("records measured", f"{len(fresh.visible):,} of {producer.acked:,} produced"),
        ("batches", describe_batches(live)),
        ("commit (CAS of main) p50 / p99", latency_ms([r.commit_seconds for r in live])),
        ("batch p50 / p99", seconds_pair([r.seconds for r in live])),
        ("batch phases, mean", mean_phases(live)),
    ]
    if maintenance is not None:
        steps = maintenance.steps[steps_before:]
        kinds = Counter(kind_of(step.item) for step in steps if step.item is not None)
        seconds = sum(step.result.seconds for step in steps if step.result is not None)
        done = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())) or "none"
        rows.append(("maintenance items run", f"{len(steps)} ({done}), {seconds:.1f} s in all"))
    return rows


def render(args: argparse.Namespace, facts: dict[str, str], rows: list[tuple[str, str]]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Ingest benchmark",
        "",
        f"`bench/ingest.py --records {args.records} --seconds {args.seconds:g}"
        f"{f' --target-seconds {args.target_seconds}' if args.target_seconds else ''}"
        f"{' --maintenance' if args.maintenance else ''}` on {when}. "
        "What is measured and how: the docstring of `bench/ingest.py`. One run on a shared machine: "
        "compare runs only with similar load averages.",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
        *machine_section(facts),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="backlog for the full-speed phase")
    parser.add_argument("--seconds", type=float, default=60, help="length of the live (freshness) phase")
    parser.add_argument(
        "--warmup-records", type=int, default=0, help="warm-up backlog (default: records/5, >= 10,000)"
    )
    parser.add_argument(
        "--maintenance",
        action="store_true",
        help="also run the live phase with in-process maintenance, between batches and on its thread",
    )
    parser.add_argument("--target-seconds", type=int, help="freshness target (default: the example's, 10 s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the markdown")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="icefall-bench-") as state:
        facts, rows = run(args, Path(state))
    text = render(args, facts, rows)
    write_results(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
