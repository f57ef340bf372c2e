"""Scale, measured: the figures behind the 1 GiB/s model of bench/results/scale.md.

    .venv/bin/python bench/scale.py [--records N] [--warmup-records N] [--sizes small,1k]
                                    [--partitions 3,48,192] [--commits N] [--fetch-records N] [--out FILE]
    (or: make bench-scale BENCH_ARGS="...")

One Kafka broker (the devstack's), started once; this process and the broker on core 0, each system on
core 1 (`compare.bench_context`). Measures, in this order:

1. **Drain per core and as partitions grow**: `bench/compare.py --growth`'s drain measurement
   (`compare.run_growth`, its docstring says how: warm-up, then a backlog produced as fast as the client
   goes, timed to the commit that completes it, CPU of the process tree, audit by content) for Icefall
   alone (`icefall run`, embedded, `local[2]` pinned to one core), over `--sizes` x `--partitions`. MiB/s per
   core = records per CPU-second x the mean JSON value size of that event size (measured on 2,000 events).
2. **One driver's commit rate and the catalog's compare-and-swap**, on the embedded SQLite catalog and on
   the PostgreSQL JDBC catalog of the devstack (`icefall.devstack.postgres`), each through pyiceberg's
   `SqlCatalog` (what Icefall's commit protocol uses): `--commits` commits in a row on one table, each
   adding one small Parquet file (written once, `add_files` without the duplicate check: metadata only,
   as the driver's commit is once Spark has written the data files): commits/s, latency p50/p99 in the
   first and last tenth (growth with the table's history), metadata bytes added per commit (the table's
   metadata folder over the commits) and the metadata JSON's size at the end. Icefall's protocol makes
   about two such metadata commits per batch (stage on a branch, fast-forward `main`;
   `icefall.commit.protocol`). Then the compare-and-swap alone: the catalog's conditional `UPDATE
   iceberg_tables ... WHERE metadata_location = <old>` (what `SqlCatalog.commit_table` ends with), `--commits`
   times on its own row: latency p50/p99.
3. **Kafka fetch per consumer**: one confluent-kafka consumer (librdkafka; Spark's executors use the Java
   client, not measured here) reading a topic of `--fetch-records` ~1 KB events from the start, on core 0
   beside the broker: MiB/s and MiB per CPU-second of this process.

Measured elsewhere (see scale.md): Spark executors as pods, bench/executors.py; the operator at 10/100/300
tables, bench/operator_scale.py. Nothing asserts on time. One run on a shared machine: the load averages at
start and end are in the report.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import compare
import pyarrow as pa
import pyarrow.parquet as pq
from common import bench_records, load_average, machine_basics, machine_section, percentile, write_results
from confluent_kafka import Consumer, TopicPartition
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from sqlalchemy import create_engine, text

from icefall.devstack.postgres import PostgresServer

RESULTS = compare.RESULTS
SIZES = ("small", "1k")
PARTITIONS = (3, 48, 192)
MIB = 2**20


def say(line: str) -> None:
    print(f"[scale] {line}", flush=True)


def mean_value_bytes(size: str) -> float:
    """The mean JSON value size of `size` events (compare.GROWTH_SIZES), over 2,000 of them."""
    _, words, seed, _ = compare.GROWTH_SIZES[size]
    it = bench_records(seed, words)
    return sum(len(next(it)[1]) for _ in range(2000)) / 2000


# --- 2. commits -------------------------------------------------------------------------------------------


@dataclass
class Commits:
    catalog: str
    commits: int
    per_s: float
    first_p50_ms: float
    first_p99_ms: float
    last_p50_ms: float
    last_p99_ms: float
    metadata_bytes_per_commit: float
    metadata_json_bytes: int
    cas_p50_ms: float
    cas_p99_ms: float


def commit_rate(name: str, uri: str, warehouse: Path, commits: int) -> Commits:
    """`commits` metadata-only appends on one table of a SqlCatalog at `uri`, then the bare CAS."""
    catalog = SqlCatalog(name, uri=uri, warehouse=f"file://{warehouse}")
    catalog.create_namespace_if_not_exists("bench")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "note", StringType()))
    table = catalog.create_table(("bench", "commits"), schema=schema)
    data = warehouse / "one.parquet"
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64()), "note": ["x"] * 100}), data)
    metadata = Path(table.metadata_location.removeprefix("file://")).parent
    before = sum(f.stat().st_size for f in metadata.iterdir())
    latencies = []
    started = time.perf_counter()
    for _ in range(commits):
        t = time.perf_counter()
        table.add_files([f"file://{data}"], check_duplicate_files=False)
        latencies.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    after = sum(f.stat().st_size for f in metadata.iterdir())
    table = catalog.load_table(("bench", "commits"))
    meta_json = Path(table.metadata_location.removeprefix("file://")).stat().st_size
    tenth = max(commits // 10, 1)
    cas = cas_latency(uri, name, commits)
    return Commits(
        catalog=name,
        commits=commits,
        per_s=commits / elapsed,
        first_p50_ms=percentile(latencies[:tenth], 50),
        first_p99_ms=percentile(latencies[:tenth], 99),
        last_p50_ms=percentile(latencies[-tenth:], 50),
        last_p99_ms=percentile(latencies[-tenth:], 99),
        metadata_bytes_per_commit=(after - before) / commits,
        metadata_json_bytes=meta_json,
        cas_p50_ms=cas[0],
        cas_p99_ms=cas[1],
    )


def cas_latency(uri: str, catalog: str, count: int) -> tuple[float, float]:
    """p50/p99 ms of the catalog's conditional update (SqlCatalog.commit_table's compare-and-swap) on a row
    of its own, each in its own transaction."""
    engine = create_engine(uri)
    location = f"cas-{uuid.uuid4().hex}"
    insert = text(
        "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location, "
        "previous_metadata_location) VALUES (:c, 'bench', 'cas', :m, NULL)"
    )
    update = text(
        "UPDATE iceberg_tables SET metadata_location = :new, previous_metadata_location = :old "
        "WHERE catalog_name = :c AND table_namespace = 'bench' AND table_name = 'cas' "
        "AND metadata_location = :old"
    )
    latencies = []
    try:
        with engine.begin() as conn:
            conn.execute(insert, {"c": catalog, "m": location})
        for i in range(count):
            new = f"{location}-{i}"
            t = time.perf_counter()
            with engine.begin() as conn:
                swapped = conn.execute(update, {"c": catalog, "new": new, "old": location}).rowcount
            latencies.append((time.perf_counter() - t) * 1000)
            if swapped != 1:
                raise RuntimeError(f"compare-and-swap {i} on {catalog} swapped {swapped} rows, not 1")
            location = new
    finally:
        engine.dispose()
    return percentile(latencies, 50), percentile(latencies, 99)


# --- 3. Kafka fetch ---------------------------------------------------------------------------------------


@dataclass
class Fetch:
    records: int
    mib: float
    seconds: float
    cpu: float


def kafka_fetch(ctx: compare.Context, records: int) -> Fetch:
    """One consumer reading a fresh 3-partition topic of `records` ~1 KB events from the start."""
    _, words, seed, _ = compare.GROWTH_SIZES["1k"]
    topic = "scale-fetch"
    ctx.broker.create_topic(topic, partitions=3)
    compare.preload(ctx.broker.bootstrap, topic, records, words, seed)
    consumer = Consumer({
        "bootstrap.servers": ctx.broker.bootstrap, "group.id": f"scale-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "fetch.wait.max.ms": 10,
    })  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got, size = 0, 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while got < records:
            for message in consumer.consume(5000, timeout=1.0):
                if message.error() is None:
                    got += 1
                    size += len(message.value() or b"")
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        consumer.close()
    return Fetch(got, size / MIB, seconds, cpu)


# --- the report -------------------------------------------------------------------------------------------


def render(
    args: argparse.Namespace,
    facts: dict[str, str],
    *,
    grid: compare.Grid,
    sizes: dict[str, float],
    commits: list[Commits | str],
    fetch: Fetch | str,
    started: str,
) -> str:
    lines = [
        "# Scale: measured figures (bench/scale.py)",
        "",
        f"`bench/scale.py {' '.join(args.argv)}` started {started}. One run on a shared 2-core machine "
        "(see the load averages); how each figure is measured: the script's docstring.",
        "",
        "## Drain per core, and as partitions grow (Icefall, `icefall run`, one core)",
        "",
        "| events | mean value | partitions | records/s | records per CPU-s | MiB/s | MiB per CPU-s "
        "| drain s | commits | peak RSS | exactly once |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for (size, partitions), cell in grid.items():
        r = cell.get("icefall")
        label, mean = compare.GROWTH_SIZES[size][0], sizes[size]
        if isinstance(r, compare.Throughput):
            lines.append(
                f"| {label} | {mean:,.0f} B | {partitions} | {r.rate:,.0f} | {r.per_cpu:,.0f} "
                f"| {r.rate * mean / MIB:.2f} | {r.per_cpu * mean / MIB:.2f} | {r.drain_s:.1f} | {r.commits} "
                f"| {compare.mib(r.peak_rss)} | {r.audit} |"
            )
        else:
            lines.append(f"| {label} | {mean:,.0f} B | {partitions} | failed: {r} | | | | | | | |")
    lines += [
        "",
        "## One driver's commits and the catalog's compare-and-swap",
        "",
        "| catalog | commits | commits/s | latency p50 / p99, first tenth | latency p50 / p99, last tenth "
        "| metadata bytes added per commit | metadata JSON at the end | CAS p50 / p99 |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in commits:
        if isinstance(c, str):
            lines.append(f"| failed: {c} | | | | | | | |")
            continue
        lines.append(
            f"| {c.catalog} | {c.commits} | {c.per_s:.1f} | {c.first_p50_ms:.1f} / {c.first_p99_ms:.1f} ms "
            f"| {c.last_p50_ms:.1f} / {c.last_p99_ms:.1f} ms | {c.metadata_bytes_per_commit:,.0f} "
            f"| {c.metadata_json_bytes:,} | {c.cas_p50_ms:.2f} / {c.cas_p99_ms:.2f} ms |"
        )
    lines += ["", "## Kafka fetch, one consumer (confluent-kafka, core 0 beside the broker)", ""]
    if isinstance(fetch, Fetch):
        lines.append(
            f"{fetch.records:,} records of ~1 KB, {fetch.mib:.1f} MiB in {fetch.seconds:.2f} s: "
            f"**{fetch.mib / fetch.seconds:.1f} MiB/s**, {fetch.mib / fetch.cpu:.1f} MiB per CPU-s of the "
            "consumer's process."
        )
    else:
        lines.append(f"failed: {fetch}")
    lines += ["", *machine_section(facts)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="drain backlog of ~230 B events")
    parser.add_argument("--warmup-records", type=int, default=100_000)
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"of {', '.join(compare.GROWTH_SIZES)}")
    parser.add_argument("--partitions", default=",".join(map(str, PARTITIONS)))
    parser.add_argument("--commits", type=int, default=300, help="commits in a row per catalog")
    parser.add_argument("--fetch-records", type=int, default=200_000, help="~1 KB events fetched")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a drain phase")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale-measured.md")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    sizes = compare.comma_list(args.sizes)
    for size in sizes:
        if size not in compare.GROWTH_SIZES:
            parser.error(f"--sizes: unknown size {size!r}; choose from {', '.join(compare.GROWTH_SIZES)}")
    try:
        partitions = [int(p) for p in compare.comma_list(args.partitions)]
    except ValueError:
        parser.error(f"--partitions: not comma-separated integers: {args.partitions!r}")
    # compare.run_growth's options: Icefall alone, at compare's defaults otherwise.
    growth = argparse.Namespace(
        records=args.records, warmup_records=args.warmup_records, growth_sizes=sizes,
        growth_partitions=partitions, systems=["icefall"], live_systems=[], trickle=5.0,
        freshness_target=10.0, timeout=args.timeout, spark_max_offsets=0, keep=None, quick=False,
    )  # fmt: skip
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    facts = machine_basics()
    facts["Load average at start (1/5/15 min)"] = load_average()
    with compare.bench_context(growth, "icefall-scale-") as ctx:
        grid = compare.run_growth(ctx)
        try:
            fetch: Fetch | str = kafka_fetch(ctx, args.fetch_records)
        except Exception as exc:
            fetch = str(exc)
        facts.update(compare.versions(ctx))
    commits: list[Commits | str] = []
    with tempfile.TemporaryDirectory(prefix="icefall-scale-commits-") as tmp:
        root = Path(tmp)
        (root / "sqlite").mkdir()
        say(f"commits: SQLite, {args.commits} ...")
        try:
            commits.append(commit_rate("sqlite", f"sqlite:///{root}/sqlite/catalog.db", root / "sqlite",
                                       args.commits))  # fmt: skip
        except Exception as exc:
            commits.append(f"sqlite: {exc}")
        postgres = PostgresServer(root / "postgres")
        try:
            postgres.start()
            (root / "pg").mkdir()
            say(f"commits: PostgreSQL, {args.commits} ...")
            commits.append(commit_rate("postgresql", postgres.sqlalchemy_uri, root / "pg", args.commits))
        except Exception as exc:
            commits.append(f"postgresql: {exc}")
        finally:
            postgres.stop()
    facts["Load average at end (1/5/15 min)"] = load_average()
    mean = {size: mean_value_bytes(size) for size in sizes}
    report = render(args, facts, grid=grid, sizes=mean, commits=commits, fetch=fetch, started=started)
    write_results(args.out, report)
    say(json.dumps({"out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
