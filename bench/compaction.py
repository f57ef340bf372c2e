"""Compaction benchmark: files per partition, read time and commit latency over a stream of small commits.

    .venv/bin/python bench/compaction.py [--commits N] [--interval S] [--records-per-commit R]
    (or: make bench-compaction BENCH_ARGS="--commits 150 --interval 1")

The issue's setting is one hour of 5-second commits: `--commits 720 --interval 5` (the defaults). A shorter
`--interval` compresses time: the same number of commits of the same size (R records each) arrive faster,
and the snapshot-expiry age below shrinks with it; the output says which setting ran.

Starts the local Kafka broker (devstack), an embedded catalog in a temporary folder and local Spark
(`local[2]`), and runs two arms AT THE SAME TIME (so both see the same machine), each on its own topic and
table built from `examples/orders.yaml` (day partitions, ~230-byte order events of
`icefall.devstack.events` produced at R / S records/s, so every commit lands in the one hot day partition;
when a batch takes longer than S, commits come back to back and each carries more than R records: the
output shows the mean). Each arm runs the real `Ingestor` in its own thread, one `run_batch()` every S
seconds:

- **without compaction**: ingestion only; nothing else touches the table;
- **with compaction**: the same, beside the project's compaction worker as its own process, exactly as a
  compaction pod runs it: `icefall compact -f <the arm's manifest> --idle-seconds S --master local[1]`
  (its own Spark, file work Leases, the same SQLite catalog). The arm's `spec.compaction` expires
  snapshots older than 60 x S (5 minutes at S = 5) keeping the last 10; everything else is the default
  policy (compact a partition at 5 small files, rewrite manifests past 100, orphans only after an hour).

At 10 checkpoints (and at the end) of each arm, ingestion pauses (the schedule shifts by the pause) and this
is measured on `main`: data files per partition (max) and in total, snapshots, the metadata file's size,
the time Spark takes for `SELECT count(*)` and for a full scan (`SELECT sum(hash(*))` over every column),
and the time pyiceberg takes for a full scan to Arrow (`table.scan().to_arrow()`; DuckDB's Iceberg reader
would need an extension download, so DuckDB is not used). The two arms never measure at the same time.
Commit latency: "CAS" is `BatchReport.commit_seconds`, `commit_staged_outcome` alone (the
compare-and-swap of `main`, or the re-stage over maintenance), "batch"
is `BatchReport.seconds` (plan, Kafka read, Spark write to the staging branch, CAS); both compared between
the first and the last decile of the arm's commits (medians): a ratio well above 1 is drift. Also
counted: commits re-staged over maintenance, ingestion commits that failed because of it (must be 0), and
the worker's items by kind and outcome (its `icefall_maintenance_items_total`, read from its metrics port).

Results go to bench/results/compaction.md (or `--out`) and stdout, with the load average at the start and
end of each arm: the machine is shared, so compare runs only under similar load. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from common import load_average, machine_section, percentile, write_results
from ingest import machine  # bench/ingest.py: the house helpers
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.manifest import ManifestContent

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import MaintenanceConflictError, StaleHeadError
from icefall.commit.lease import FileLease
from icefall.devstack.events import EventProducer
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import BatchReport, Ingestor
from icefall.plan.names import table_leases
from icefall.runtime import metrics
from icefall.spark.session import build_spark_session

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "orders.yaml"
RESULTS = ROOT / "bench" / "results" / "compaction.md"
PARTITIONS = 3
CHECKPOINTS = 10


def say(text: str) -> None:
    print(f"[bench] {text}", flush=True)


@dataclass(frozen=True)
class Checkpoint:
    commits: int
    max_files_per_partition: int
    data_files: int
    snapshots: int
    metadata_bytes: int
    spark_count_seconds: float
    spark_scan_seconds: float
    pyiceberg_scan_seconds: float
    rows: int


@dataclass
class Arm:
    name: str
    compaction: bool
    checkpoints: list[Checkpoint] = field(default_factory=list)
    reports: list[BatchReport] = field(default_factory=list)
    cas_seconds: list[float] = field(default_factory=list)
    maintenance: Counter[str] = field(default_factory=Counter)  # the worker's "<kind> <outcome>" → count
    restaged: float = 0.0
    refused: Counter[str] = field(default_factory=Counter)  # ingestion commits refused, by cause
    seconds: float = 0.0
    load_start: str = ""
    load_end: str = ""


def manifest_for(bootstrap: str, topic: str, table: str, interval: float) -> StreamingTable:
    st = load_manifest(MANIFEST)
    spec = st.spec
    source = spec.source.model_copy(update={"bootstrap_servers": bootstrap, "topic": topic})
    table_spec = spec.table.model_copy(update={"name": table})
    batch = spec.batch.model_copy(update={"min_interval_seconds": 0})  # this benchmark paces the commits
    compaction = spec.compaction.model_copy(
        update={"max_snapshot_age_seconds": int(60 * interval), "min_snapshots_to_keep": 10}
    )
    spec = spec.model_copy(
        update={"source": source, "table": table_spec, "batch": batch, "compaction": compaction}
    )
    meta = st.metadata.model_copy(update={"name": table.replace("_", "-")})
    return st.model_copy(update={"spec": spec, "metadata": meta})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Worker:
    """`icefall compact -f` as its own process, as a compaction pod runs it."""

    process: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    @classmethod
    def start(cls, st: StreamingTable, lake: Path, interval: float) -> Worker:
        manifest = lake.parent / f"{st.metadata.name}.yaml"
        manifest.write_text(yaml.safe_dump(st.model_dump(mode="json", by_alias=True, exclude_none=True)))
        port = free_port()
        log = lake.parent / f"{st.metadata.name}-compact.log"
        command = [
            *(
                ["taskset", "-c", os.environ["BENCH_WORKER_CPUS"]]
                if os.environ.get("BENCH_WORKER_CPUS")
                else []
            ),
            str(Path(sys.executable).parent / "icefall"),
            "compact",
            "-f",
            str(manifest),
            "--state-dir",
            str(lake),
            "--idle-seconds",
            f"{interval:g}",
            "--master",
            "local[1]",
            "--metrics-port",
            str(port),
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        return cls(process, port, log)

    def items(self) -> Counter[str]:
        """The worker's `icefall_maintenance_items_total` as "<kind> <outcome>" → count."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        counts: Counter[str] = Counter()
        for family in text_string_to_metric_families(text):
            if family.name == "icefall_maintenance_items":
                for sample in family.samples:
                    if sample.name.endswith("_total") and sample.value:
                        counts[f"{sample.labels['kind']} {sample.labels['outcome']}"] += int(sample.value)
        return counts

    def stop(self) -> int:
        """SIGTERM (the item in flight finishes first), then the exit code."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(300)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def measure(spark: Any, catalog: CatalogConfig, st: StreamingTable, commits: int) -> Checkpoint:
    table = catalog.pyiceberg().load_table(st.table_identifier)
    per_partition: Counter[str] = Counter()
    snapshot = table.current_snapshot()
    for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
        if manifest.content == ManifestContent.DATA:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                per_partition[repr(entry.data_file.partition)] += 1
    metadata_bytes = (
        Path(table.metadata_location.removeprefix("file://").removeprefix("file:")).stat().st_size
    )
    name = ".".join([catalog.name, *st.table_identifier])
    started = time.monotonic()
    rows = int(spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0])
    counted = time.monotonic()
    spark.sql(f"SELECT sum(hash(*)) FROM {name}").collect()
    scanned = time.monotonic()
    arrow_rows = table.scan().to_arrow().num_rows
    pyiceberg_seconds = time.monotonic() - scanned
    if arrow_rows != rows:
        say(f"WARNING: Spark counted {rows} rows, pyiceberg scanned {arrow_rows}")
    return Checkpoint(
        commits=commits,
        max_files_per_partition=max(per_partition.values(), default=0),
        data_files=sum(per_partition.values()),
        snapshots=len(table.metadata.snapshots),
        metadata_bytes=metadata_bytes,
        spark_count_seconds=counted - started,
        spark_scan_seconds=scanned - counted,
        pyiceberg_scan_seconds=pyiceberg_seconds,
        rows=rows,
    )


def run_arm(
    args: argparse.Namespace,
    arm: Arm,
    *,
    broker: KafkaBroker,
    spark: Any,
    catalog: CatalogConfig,
    state: Path,
    measuring: threading.Lock,
    interrupted: threading.Event,
) -> None:
    topic = f"orders-{arm.name}"
    broker.create_topic(topic, partitions=PARTITIONS)
    st = manifest_for(broker.bootstrap, topic, f"orders_{arm.name}", args.interval)
    label = ".".join(st.table_identifier)
    lease = FileLease.in_dir(state / "leases", table_leases(st).commit, f"bench-{arm.name}")
    ingestor = Ingestor(st, catalog, spark, lease)
    ingestor.start(lease_timeout=30)  # creates the table before the worker looks for it
    rate = args.records_per_commit / args.interval
    producer = EventProducer(broker.bootstrap, topic, rate, seed=11)
    worker = Worker.start(st, catalog.database.parent, args.interval) if arm.compaction else None
    restaged_before = restaged_commits(label)
    every = max(args.commits // CHECKPOINTS, 1)
    arm.load_start = load_average()
    producer.start()
    time.sleep(min(args.interval, 2.0))  # the first batch has records to read
    started = next_at = time.monotonic()
    try:
        while len(arm.reports) < args.commits and not interrupted.wait(max(next_at - time.monotonic(), 0)):
            next_at += args.interval
            try:
                report = ingestor.run_batch()
            except StaleHeadError as refused:  # what Ingestor.run does: plan again
                arm.refused[
                    "because of maintenance" if isinstance(refused, MaintenanceConflictError) else "stale"
                ] += 1
                continue
            if report is None:
                continue  # nothing arrived yet: try at the next tick
            arm.reports.append(report)
            arm.cas_seconds.append(report.commit_seconds)
            if len(arm.reports) % every == 0 or len(arm.reports) == args.commits:
                paused = time.monotonic()
                with measuring:  # one arm's reads never compete with the other's
                    arm.checkpoints.append(measure(spark, catalog, st, len(arm.reports)))
                next_at += time.monotonic() - paused
                last = arm.checkpoints[-1]
                say(
                    f"{arm.name}: {last.commits} commits, "
                    f"files/partition max {last.max_files_per_partition}, "
                    f"snapshots {last.snapshots}, Spark count {last.spark_count_seconds:.2f} s, "
                    f"scan {last.spark_scan_seconds:.2f} s, pyiceberg {last.pyiceberg_scan_seconds:.2f} s"
                )
            if worker is not None and worker.process.poll() is not None:
                raise RuntimeError(
                    f"the compaction worker exited ({worker.process.returncode}): {worker.log}"
                )
    finally:
        arm.seconds = time.monotonic() - started
        producer.stop()
        if worker is not None:
            try:
                arm.maintenance = worker.items()
            except OSError as error:
                say(f"{arm.name}: could not read the worker's metrics: {error}")
            code = worker.stop()
            failures = [line for line in worker.log.read_text().splitlines() if " failed" in line]
            say(f"{arm.name}: worker exit {code}; {len(failures)} failed items in its log")
            for line in failures[-5:]:
                say(f"  {line[:300]}")
        ingestor.close()
    arm.load_end = load_average()
    arm.restaged = restaged_commits(label) - restaged_before


def restaged_commits(label: str) -> float:
    return metrics.REGISTRY.get_sample_value("icefall_ingest_commits_restaged_total", {"table": label}) or 0.0


# --- report -------------------------------------------------------------------------------------------


def decile(values: list[float], which: str) -> list[float]:
    n = max(len(values) // 10, 1)
    return values[:n] if which == "first" else values[-n:]


def drift(values: list[float], scale: float, unit: str) -> str:
    if not values:
        return "n/a"
    first, last = statistics.median(decile(values, "first")), statistics.median(decile(values, "last"))
    return f"{first * scale:,.1f} → {last * scale:,.1f} {unit} (x {last / first:.2f})"


def render(args: argparse.Namespace, facts: dict[str, str], arms: list[Arm]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    compressed = args.interval != 5.0 or args.commits != 720
    setting = (
        f"`bench/compaction.py --commits {args.commits} --interval {args.interval:g} "
        f"--records-per-commit {args.records_per_commit}`"
    )
    lines = [
        "# Compaction benchmark",
        "",
        f"{setting} on {when}: {args.commits} commits, one every {args.interval:g} s, "
        f"{args.records_per_commit} records each"
        + (
            f" — time COMPRESSED {5.0 / args.interval:g}x against the issue's one hour of 5-second commits "
            f"(720): {args.commits * args.interval / 60:.1f} minutes of commits per arm."
            if compressed
            else " — the issue's one hour of 5-second commits."
        ),
        "What is measured and how: the docstring of `bench/compaction.py`. One run on a shared 2-core "
        "machine, both arms at the same time (the load averages show what else ran); compare runs only under "
        "similar load.",
        "",
        "## Summary",
        "",
        "| | " + " | ".join(a.name for a in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]

    def row(label: str, value: Any) -> str:
        return f"| {label} | " + " | ".join(str(value(a)) for a in arms) + " |"

    def final(a: Arm) -> Checkpoint:
        return a.checkpoints[-1]

    lines += [
        row("ingestion commits (wall time)", lambda a: f"{len(a.reports)} ({a.seconds:.0f} s)"),
        row(
            "records per commit (mean)",
            lambda a: f"{statistics.mean(r.records_read for r in a.reports):,.0f}" if a.reports else "n/a",
        ),
        row("rows at the end", lambda a: f"{final(a).rows:,}"),
        row("data files per partition at the end (max)", lambda a: final(a).max_files_per_partition),
        row(
            "data files per partition, max over checkpoints",
            lambda a: max(c.max_files_per_partition for c in a.checkpoints),
        ),
        row("data files in total at the end", lambda a: final(a).data_files),
        row("snapshots at the end", lambda a: final(a).snapshots),
        row("metadata file at the end", lambda a: f"{final(a).metadata_bytes / 1024:,.0f} KiB"),
        row("Spark `count(*)` at the end", lambda a: f"{final(a).spark_count_seconds:.2f} s"),
        row("Spark full scan at the end", lambda a: f"{final(a).spark_scan_seconds:.2f} s"),
        row("pyiceberg full scan at the end", lambda a: f"{final(a).pyiceberg_scan_seconds:.2f} s"),
        row("CAS of main, first → last decile (median)", lambda a: drift(a.cas_seconds, 1000, "ms")),
        row("batch, first → last decile (median)", lambda a: drift([r.seconds for r in a.reports], 1, "s")),
        row(
            "CAS p50 / p99",
            lambda a: (
                f"{percentile(a.cas_seconds, 50) * 1000:,.0f} / "
                f"{percentile(a.cas_seconds, 99) * 1000:,.0f} ms"
            ),
        ),
        row("commits re-staged over maintenance", lambda a: f"{a.restaged:.0f}"),
        row(
            "ingestion commits failed because of maintenance / refused otherwise",
            lambda a: f"{a.refused['because of maintenance']} / {a.refused['stale']}",
        ),
        row(
            "worker items (kind outcome: n)",
            lambda a: ", ".join(f"{k}: {n}" for k, n in sorted(a.maintenance.items())) or "none",
        ),
        row("load average at start → end", lambda a: f"{a.load_start} → {a.load_end}"),
        "",
    ]
    for arm in arms:
        lines += [
            f"## Checkpoints: {arm.name}",
            "",
            "| commits | files/partition (max) | data files | snapshots | metadata | Spark count "
            "| Spark scan | pyiceberg scan | rows |",
            "|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {c.commits} | {c.max_files_per_partition} | {c.data_files} | {c.snapshots} "
                f"| {c.metadata_bytes / 1024:,.0f} KiB | {c.spark_count_seconds:.2f} s "
                f"| {c.spark_scan_seconds:.2f} s | {c.pyiceberg_scan_seconds:.2f} s | {c.rows:,} |"
                for c in arm.checkpoints
            ),
            "",
        ]
    return "\n".join([*lines, *machine_section(facts)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=720, help="ingestion commits per arm (default 720)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between commits (default 5)")
    parser.add_argument(
        "--records-per-commit", type=int, default=100, help="records per commit (default 100)"
    )
    parser.add_argument("--arms", default="without,with", help="which arms to run: without,with")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the markdown")
    args = parser.parse_args(argv)
    arms = [Arm(f"{name}_compaction", name == "with") for name in args.arms.split(",")]
    with tempfile.TemporaryDirectory(prefix="icefall-bench-compaction-") as tmp:
        state = Path(tmp)
        facts = machine()
        say("starting Kafka ...")
        broker = KafkaBroker(state / "kafka").start()
        try:
            catalog = CatalogConfig.embedded(state / "lake")
            catalog.pyiceberg()
            say("starting Spark (local[2]) ...")
            spark = build_spark_session([catalog], app_name="icefall-bench-compaction", master="local[2]")
            measuring, interrupted = threading.Lock(), threading.Event()

            def run(arm: Arm) -> None:
                say(f"arm {arm.name}: {args.commits} commits every {args.interval:g} s ...")
                try:
                    run_arm(
                        args,
                        arm,
                        broker=broker,
                        spark=spark,
                        catalog=catalog,
                        state=state,
                        measuring=measuring,
                        interrupted=interrupted,
                    )
                except Exception as error:  # the other arm goes on; this one reports what it measured
                    say(f"arm {arm.name} stopped: {error!r}")

            threads = [threading.Thread(target=run, args=(arm,), name=arm.name) for arm in arms]
            try:
                for thread in threads:
                    thread.start()
                while any(thread.is_alive() for thread in threads):
                    threads[0].join(1.0) if threads[0].is_alive() else threads[-1].join(1.0)
            except KeyboardInterrupt:  # Ctrl-C / SIGINT: report what was measured so far
                say("interrupted: finishing the current batches, then writing the results measured so far")
                interrupted.set()
                for thread in threads:
                    thread.join()
            finally:
                spark.stop()
        finally:
            broker.stop()
    arms = [arm for arm in arms if arm.checkpoints]
    text = render(args, facts, arms)
    write_results(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
