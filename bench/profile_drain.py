"""Where an `icefall run` drain spends its CPU: JFR on the Spark JVM, py-spy on the Python driver.

    .venv/bin/python bench/profile_drain.py [--records N] [--large-records N] [--warmup-records N]
                                            [--keyed] [--systems S,...] [--out FILE] [--from RUN_DIR]
    (or: make bench-profile BENCH_ARGS="...")

One Kafka broker (the devstack's), a topic of 3 partitions, the bench's seeded events (`common.bench_records`:
~230 B, and ~1 KB with `--large-records`), `icefall run` on the embedded default as in bench/compare.py (the
same manifest: day(ts) partitioning, dead-letter table on, `local[2]`). Per event size: a warm-up backlog
is produced and committed first (JIT, caches; not profiled), then JFR is started on the Spark JVM (local
mode: driver = executor; `jcmd JFR.start settings=profile`, stack depth 256 set at JVM start through
SPARK_SUBMIT_OPTS) and py-spy records the Python driver (`--nonblocking`, 100 Hz, idle threads left out);
the backlog is produced as fast as the client goes, and both profilers stop when the table has committed
it all. With `--keyed`, the table is bench/upsert.py's keyed one (`mode: upsert`, `key: [id]`): the warm-up
inserts the keys and the profiled backlog updates them (each batch one MERGE). `--systems` profiles others
the same way, one after another: icefall-nomaint (`icefall run --no-maintenance`) and spark
(bench/compare.py's Structured Streaming peer, its table and settings; done when its table holds every
record).

The CPU of every thread of the system's processes over the drain, by kind (`common.TreeMonitor` with
`threads`, from /proc: JIT compiler and GC threads too, which JFR's execution samples leave out; JFR's
`jdk.ThreadCPULoad`, used before, averages each thread's load per second and so weighs a thread that lived
a fraction of a second, such as a batch's Kafka admin client, like one busy all along).

Aggregates (JFR `jdk.ExecutionSample`: Java threads running Java code; GC, JIT and native time are not in
it): the top self frames (leaf method), the top frames by total (inclusive, each frame counted once per
sample) and the samples by area (the innermost frame that belongs to a known area: Kafka fetch, UTF-8
cast/validation, from_json/Jackson, Parquet/Iceberg write, Spark generated code, ...). py-spy: the same for
Python functions. Also the process tree's CPU over the drain (records per CPU-s, as in compare.md) and the
load average: the machine is shared, the numbers are of one run. Writes bench/results/profile.md and keeps
the raw recordings in the run's temp folder (printed). Nothing asserts on time.

py-spy is a dev tool, not a dependency: `.venv/bin/pip install py-spy` (without it the Python side is
left out, and the report says so).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import yaml
from common import (
    EVENT_SCHEMA,
    LARGE_NOTE_WORDS,
    SMALL_NOTE_WORDS,
    TreeMonitor,
    descendants,
    load_average,
    machine_basics,
    machine_section,
    stop_group,
    thread_kind,
    tree_cpu,
    write_results,
)
from compare import TABLE, create_peer_table, preload, spark_peer_argv, table_commits
from pyiceberg.exceptions import NoSuchTableError

from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker

RESULTS = Path(__file__).parent / "results" / "profile.md"
SYSTEMS = ("icefall", "icefall-nomaint", "spark")
PARTITIONS = 3
DAY_TS = {"field": "ts", "transform": "day"}
EARLIEST = {"type": "earliest"}

# Area of a JVM sample: the innermost frame matching one of these (checked in order per frame).
JVM_AREAS: list[tuple[str, re.Pattern[str]]] = [
    (
        "UTF-8 cast/validation",
        re.compile(
            r"UTF8String\.(getIsValid|isValid|makeValid|fromBytes|fromString|isFullWidth)"
            r"|UTF8String\.numChars|Cast.*castToString|CastUtils"
        ),
    ),
    (
        "from_json/Jackson",
        re.compile(
            r"com\.fasterxml\.jackson|catalyst\.json\.|JsonToStructs|JacksonParser"
            r"|CreateJacksonParser|sun\.nio\.cs\.UTF_8|InputStreamReader"
            r"|StreamDecoder|FailureSafeParser"
        ),
    ),
    ("Kafka fetch/deserialize", re.compile(r"org\.apache\.kafka\.|sql\.kafka010\.")),
    (
        "Parquet/Iceberg write (encode, compress)",
        re.compile(
            r"org\.apache\.parquet\.|shaded\.parquet"
            r"|iceberg\.parquet\.|luben\.zstd|xerial\.snappy"
            r"|io\.airlift\.compress|iceberg\.io\."
            r"|iceberg\.spark\.source\.|SparkParquetWriters"
            r"|iceberg\.data\."
        ),
    ),
    (
        "Iceberg metadata/commit (JVM)",
        re.compile(r"org\.apache\.iceberg\.|org\.sqlite\.|org\.apache\.avro\."),
    ),
    (
        "Spark generated code / rows",
        re.compile(
            r"GeneratedClass|codegen|UnsafeRow|UnsafeProjection|BufferedRowIterator|unsafe\.Platform"
            r"|ByteArrayMethods|catalyst\."
        ),
    ),
    ("Spark scheduler/RPC/other Spark", re.compile(r"org\.apache\.spark\.|io\.netty\.|py4j\.")),
]
GENERIC = re.compile(r"^(java\.|jdk\.|sun\.|scala\.)")


def say(text: str) -> None:
    print(f"[profile] {text}", flush=True)


def manifest(bootstrap: str, topic: str, *, keyed: bool = False) -> dict[str, object]:
    """bench/compare.py's Icefall manifest (icefall_manifest), without its context object; `keyed`: made
    keyed as bench/upsert.py makes it (`mode: upsert`, `key: [id]`, id required, unpartitioned)."""
    table: dict[str, object] = {"namespace": TABLE[0], "name": TABLE[1], "partitioning": [DAY_TS]}
    spec: dict[str, object] = {
        "source": {"bootstrapServers": bootstrap, "topic": topic, "startingPosition": EARLIEST},
        "format": {"type": "json", "schema": EVENT_SCHEMA},
        "table": table,
        "freshness": {"targetSeconds": 10},
        "deadLetter": {"table": {"enabled": True}},
    }
    if keyed:
        del table["partitioning"]
        schema = [{**f, "required": True} if f["name"] == "id" else f for f in EVENT_SCHEMA]
        spec.update(mode="upsert", key=["id"], format={"type": "json", "schema": schema})
    return {"apiVersion": "icefall.dev/v1alpha1", "kind": "StreamingTable",
            "metadata": {"name": "bench-upsert" if keyed else "bench-events"}, "spec": spec}  # fmt: skip


def java_pid(root: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants(root):
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if exe.endswith("/java") and b"deploy.SparkSubmit" in cmd and b"launcher.Main" not in cmd:
                return pid
        time.sleep(0.5)
    raise RuntimeError("the Spark JVM did not appear")


def jcmd(pid: int, *command: str) -> None:
    done = subprocess.run(["jcmd", str(pid), *command], capture_output=True, text=True, check=False)
    if done.returncode or "Could not" in done.stdout:
        raise RuntimeError(f"jcmd {pid} {' '.join(command)} failed: {done.stdout} {done.stderr}")


def wait_rows(catalog: CatalogConfig, rows: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the system exited with {proc.returncode} (see its log)")
        commits = table_commits(catalog)
        if commits and commits[-1].total_records >= rows:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the table did not reach {rows:,} rows in {timeout:.0f} s")


def wait_offsets(catalog: CatalogConfig, total: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Until the table's committed Kafka offsets add up to `total` (a keyed table's row count does not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"icefall run exited with {proc.returncode} (see its log)")
        with contextlib.suppress(NoSuchTableError):  # before Icefall created it
            if sum(read_committed(catalog.pyiceberg().load_table(TABLE)).offsets.values()) >= total:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the table did not commit {total:,} offsets in {timeout:.0f} s")


def drain(  # noqa: PLR0917 (one call site, the size's parameters)
    broker: KafkaBroker,
    work: Path,
    size: str,
    records: int,
    warmup: int,
    note_words: int,
    seed: int,
    *,
    keyed: bool = False,
    system: str = "icefall",
) -> dict[str, object]:
    """Warm-up, then the profiled backlog: new events, or with `keyed` new values of the warm-up's first
    `records` keys (updates). `system`: icefall, icefall-nomaint (`--no-maintenance`) or spark (the
    Structured Streaming peer of bench/compare.py)."""
    topic = f"profile-{work.name}"
    broker.create_topic(topic, partitions=PARTITIONS)
    st = manifest(broker.bootstrap, topic, keyed=keyed)
    (work / "events.yaml").write_text(yaml.safe_dump(st, sort_keys=False))
    catalog = CatalogConfig.embedded(work)
    if system == "spark":
        ctx = SimpleNamespace(broker=broker, args=SimpleNamespace(freshness_target=10), registry=None)
        create_peer_table(ctx, catalog)  # type: ignore[arg-type]
        argv = spark_peer_argv(ctx, topic, work, catalog)  # type: ignore[arg-type]
    else:
        icefall = str(Path(sys.executable).with_name("icefall"))
        argv = [icefall, "run", "-f", str(work / "events.yaml"), "--state-dir", str(work)]
        argv += ["--no-maintenance"] if system == "icefall-nomaint" else []

    def committed(total: int, timeout: float) -> None:
        if system == "spark":
            wait_rows(catalog, total, proc, timeout)
        else:
            wait_offsets(catalog, total, proc, timeout)

    say(f"{size}: warm-up backlog of {warmup:,} events")
    preload(broker.bootstrap, topic, warmup, note_words, seed)
    # JFR from the JVM's start: starting it later (jcmd JFR.start) deoptimizes the compiled code, and the
    # drain then profiles the JIT recompiling (seen: C2 threads 32 % of the JVM's CPU, batches 5x slower).
    # The samples outside the drain are left out by their time.
    jfr = work / "drain.jfr"
    env = {
        **os.environ,
        "SPARK_SUBMIT_OPTS": "-XX:FlightRecorderOptions=stackdepth=256 "
        f"-XX:StartFlightRecording=name=drain,settings=profile,filename={jfr}",
    }
    log = (work / "system.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    spy: subprocess.Popen[bytes] | None = None
    monitor = TreeMonitor(proc.pid, threads=True).start()
    try:
        committed(warmup, 600)
        jvm = java_pid(proc.pid)  # after the launcher JVM (spark-class) is gone
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        raw = work / "drain.pyspy.txt"
        if Path(pyspy).exists():
            spy = subprocess.Popen(
                [pyspy, "record", "--pid", str(proc.pid), "--nonblocking", "--rate", "100", "--format", "raw",
                 "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=(work / "pyspy.log").open("wb"),
            )  # fmt: skip
        load_start, window_start = load_average(), datetime.now(UTC)
        cpu0, jvm0, t0, at0 = tree_cpu(proc.pid), tree_cpu(jvm), time.monotonic(), monitor.sample().at
        say(f"{size}: profiling; backlog of {records:,} events")
        if keyed:  # the same ids from 0, other values (another seed)
            preload(broker.bootstrap, topic, records, note_words, seed + 1)
        else:
            preload(broker.bootstrap, topic, records, note_words, seed, start=warmup)
        committed(warmup + records, 1200)
        cpu1, jvm1, t1, at1 = tree_cpu(proc.pid), tree_cpu(jvm), time.monotonic(), monitor.sample().at
        load_end, window_end = load_average(), datetime.now(UTC)
        jcmd(jvm, "JFR.dump", "name=drain", f"filename={jfr}")
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        say(f"{size}: {records / (t1 - t0):,.0f} records/s, {records / (cpu1 - cpu0):,.0f} records per CPU-s")
        return {
            "system": system,
            "size": size,
            "records": records,
            "threads": monitor.cpu_by_thread(at0, at1),
            "wall": t1 - t0,
            "cpu": cpu1 - cpu0,
            "jvm_cpu": jvm1 - jvm0,
            "load": f"{load_start} / {load_end}",
            "jfr": jfr,
            "window": [window_start.isoformat(), window_end.isoformat()],
            "pyspy": raw if spy is not None and raw.exists() else None,
        }
    finally:
        monitor.stop()
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait()
        stop_group(proc)
        log.close()


# --- aggregation ---------------------------------------------------------------------------------------


def in_window(block: str, window: tuple[datetime, datetime]) -> bool:
    """Whether a `jfr print` event (its startTime: the JVM's local time, UTC here) is in the drain."""
    found = re.search(r"startTime = (\d\d:\d\d:\d\d(?:\.\d+)?)(?: \((\d{4}-\d\d-\d\d)\))?", block)
    if not found:
        return False
    day = found.group(2) or f"{window[0]:%Y-%m-%d}"  # printed without the day when it is the recording's
    at = datetime.fromisoformat(f"{day}T{found.group(1)}+00:00")
    return window[0] <= at <= window[1]


def jfr_stacks(
    path: Path, window: tuple[datetime, datetime]
) -> tuple[list[list[str]], collections.Counter[str]]:
    """Stacks (leaf first, `Class.method`) of the recording's execution samples; samples per thread kind."""
    out = subprocess.run(
        ["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "256", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    stacks: list[list[str]] = []
    threads: collections.Counter[str] = collections.Counter()
    for block in out.split("jdk.ExecutionSample {")[1:]:
        if not in_window(block, window):
            continue
        thread = re.search(r'sampledThread = "([^"]*)"', block)
        name = thread.group(1) if thread else "?"
        threads[thread_kind(name)[:60]] += 1
        frames = re.findall(r"^\s+([\w$.<>/]+)\(.*\)\s+line:", block, re.M)
        stacks.append(frames)
    return stacks, threads


def area_of(stack: Iterable[str], areas: list[tuple[str, re.Pattern[str]]]) -> str:
    for frame in stack:
        for area, pattern in areas:
            if pattern.search(frame):
                return area
    return "other (JDK, Scala, unknown)"


def self_frame(stack: list[str]) -> str:
    return stack[0] if stack else "?"


def tables(stacks: list[list[str]], areas: list[tuple[str, re.Pattern[str]]], generic: re.Pattern[str],
           top_self: int = 25, top_total: int = 15) -> list[str]:  # fmt: skip
    n = len(stacks) or 1
    by_area: collections.Counter[str] = collections.Counter(area_of(s, areas) for s in stacks)
    selfs: collections.Counter[str] = collections.Counter(self_frame(s) for s in stacks)
    totals: collections.Counter[str] = collections.Counter()
    for s in stacks:
        totals.update(set(f for f in s if not generic.search(f)))

    def pct(count: int) -> str:
        return f"{100 * count / n:.1f} %"

    lines = ["By area (innermost frame of a known area):", "", "| area | samples | share |", "|---|--:|--:|"]
    lines += [f"| {a} | {c:,} | {pct(c)} |" for a, c in by_area.most_common()]
    lines += ["", f"Top {top_self} self frames:", "", "| frame | area | self | share |", "|---|---|--:|--:|"]
    lines += [f"| `{f}` | {area_of([f], areas)} | {c:,} | {pct(c)} |" for f, c in selfs.most_common(top_self)]
    lines += [
        "",
        f"Top {top_total} frames by total (inclusive; runtime frames such as Thread.run and the task "
        "runner left out):",
        "",
        "| frame | area | total | share |",
        "|---|---|--:|--:|",
    ]
    lines += [
        f"| `{f}` | {area_of([f], areas)} | {c:,} | {pct(c)} |" for f, c in totals.most_common(top_total)
    ]
    return lines


JVM_RUNTIME = re.compile(
    r"^(java\.|jdk\.|sun\.|scala\.)|Executor\$TaskRunner|scheduler\.(Result|ShuffleMap)?Task\.|"
    r"rdd\.(RDD|MapPartitionsRDD)\.|util\.Utils\$\.|TaskContext|Thread\.run"
)

PY_AREAS: list[tuple[str, re.Pattern[str]]] = [
    ("py4j calls to the JVM (waiting on Spark jobs)", re.compile(r"py4j/|java_gateway|clientserver")),
    ("pyiceberg commit/metadata", re.compile(r"pyiceberg/")),
    ("Icefall commit pipeline", re.compile(r"icefall/(commit|ingest/commits)")),
    ("Icefall compaction/maintenance", re.compile(r"icefall/compact")),
    ("Icefall ingest (plan, decode, write)", re.compile(r"icefall/")),
    ("Kafka client (confluent-kafka)", re.compile(r"confluent_kafka")),
    ("PySpark", re.compile(r"pyspark/")),
]
PY_RUNTIME = re.compile(r"threading\.py|<module>|concurrent/futures/thread")


def pyspy_stacks(path: Path) -> list[list[str]]:
    """py-spy's raw (collapsed) output as stacks, leaf first, one entry per sample."""
    stacks: list[list[str]] = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        frames.reverse()
        stacks.extend([frames] * int(count))
    return stacks


def report(args: argparse.Namespace, started: datetime, runs: list[dict[str, object]], work: Path) -> str:
    lines = [
        "# Where a drain spends its CPU (JFR on the Spark JVM, py-spy on the driver)",
        "",
        f"`bench/profile_drain.py --records {args.records} --large-records {args.large_records} "
        "--warmup-records "
        f"{args.warmup_records}` on {started:%Y-%m-%d %H:%M} UTC. Method: the docstring of "
        "`bench/profile_drain.py` "
        "(a warm-up backlog committed first, then the profilers on for one backlog drain of the bench's "
        "events; `local[2]`, embedded catalog, dead-letter table on"
        + (
            "; **keyed**: `mode: upsert`, `key: [id]`, unpartitioned, the warm-up inserts the keys and the "
            "profiled backlog updates them"
            if args.keyed
            else ""
        )
        + "). **The machine is shared with other "
        "engineers' builds and tests**: the load average is given per run; the shares below are robust "
        "to that, the records per CPU-s are of one run and not comparable to compare.md's pinned runs.",
        "",
        "| system | events | records | drain, s | CPU-s (tree) | of it Spark JVM | records per CPU-s "
        "| load avg start / end |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    for run in runs:
        cpu, wall, records = float(run["cpu"]), float(run["wall"]), int(run["records"])  # type: ignore[arg-type]
        jvm = float(run["jvm_cpu"])  # type: ignore[arg-type]
        lines.append(
            f"| {run.get('system', 'icefall')} | {run['size']} | {records:,} | {wall:.1f} | {cpu:.1f} "
            f"| {jvm:.1f} | {records / cpu:,.0f} | {run['load']} |"
        )
    for run in runs:
        name = f"{run.get('system', 'icefall')}, {run['size']} events"
        start, end = (datetime.fromisoformat(t) for t in run["window"])  # type: ignore[attr-defined]
        window = (start, end)
        stacks, threads = jfr_stacks(Path(str(run["jfr"])), window)
        lines += [
            "",
            f"## {name}: JVM (JFR, {len(stacks):,} execution samples)",
            "",
        ]
        lines += ["Samples by thread:", "", "| thread | samples |", "|---|--:|"]
        lines += [f"| {t} | {c:,} |" for t, c in threads.most_common(6)]
        by_thread: dict[str, float] = run.get("threads") or {}  # type: ignore[assignment]
        lines += [
            "",
            "CPU-s over the drain by kind of thread, every process of the system (`/proc/<pid>/task/*/stat`"
            " every 0.5 s; the kernel's names, cut at 15 characters, numbers as N; GC: `GC Thread#N` and"
            " `GN Conc#N`, or `VM Thread` under the serial GC a JVM pinned to one core picks):",
            "",
        ]
        lines += ["| thread | CPU-s | share |", "|---|--:|--:|"]
        lines += [
            f"| `{t}` | {c:.1f} | {100 * c / float(run['cpu']):.1f} % |"  # type: ignore[arg-type]
            for t, c in list(by_thread.items())[:10]
        ]
        lines += ["", *tables(stacks, JVM_AREAS, JVM_RUNTIME)]
        if run["pyspy"] is None:
            lines += ["", "Python driver: py-spy not installed or it could not attach; not profiled."]
            continue
        py = pyspy_stacks(Path(str(run["pyspy"])))
        lines += [
            "",
            f"## {name}: Python driver (py-spy, {len(py):,} samples of busy threads)",
            "",
        ]
        lines += tables(py, PY_AREAS, PY_RUNTIME, top_self=10, top_total=10)
    basics = machine_basics()
    return "\n".join([*lines, "", *machine_section(basics), "", f"Raw recordings: `{work}` (not kept)."])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="~230 B events profiled")
    parser.add_argument("--large-records", type=int, default=50_000, help="~1 KB events profiled (0: none)")
    parser.add_argument("--warmup-records", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--keyed",
        action="store_true",
        help="a keyed table (bench/upsert.py's): the profiled backlog updates the warm-up's keys",
    )
    parser.add_argument(
        "--systems",
        default="icefall",
        help="comma-separated, in this order: icefall, icefall-nomaint (--no-maintenance), spark (the "
        "Structured Streaming peer of bench/compare.py; not with --keyed)",
    )
    parser.add_argument(
        "--from", dest="again", type=Path, help="only aggregate again the recordings of a run"
    )
    args = parser.parse_args()
    if args.keyed and args.warmup_records < max(args.records, args.large_records):
        parser.error("--keyed: --warmup-records must be at least the backlog (its keys are the ones updated)")
    for system in args.systems.split(","):
        if system not in SYSTEMS or (args.keyed and system == "spark"):
            parser.error(f"--systems: {system!r}: choose from {', '.join(SYSTEMS)} (spark: not with --keyed)")
    if args.again:
        saved = json.loads((args.again / "runs.json").read_text())
        write_results(
            args.out, report(args, datetime.fromisoformat(saved["started"]), saved["runs"], args.again)
        )
        return 0
    started = datetime.now(UTC)
    work = Path(tempfile.mkdtemp(prefix="icefall-profile-"))
    say(f"recordings in {work}")
    broker = KafkaBroker(work / "kafka", heap="1g").start()
    runs = []
    try:
        sizes = [
            ("~230 B", args.records, SMALL_NOTE_WORDS, 1),
            ("~1 KB", args.large_records, LARGE_NOTE_WORDS, 2),
        ]
        for system in args.systems.split(","):
            for size, records, words, seed in sizes:
                if records:
                    folder = work / f"{system}-{'small' if words == SMALL_NOTE_WORDS else '1kb'}"
                    folder.mkdir()
                    label = f"{size}, keyed updates" if args.keyed else size
                    runs.append(
                        drain(
                            broker,
                            folder,
                            label,
                            records,
                            args.warmup_records,
                            words,
                            seed,
                            keyed=args.keyed,
                            system=system,
                        )
                    )
    finally:
        broker.stop()
    saved = {"started": started.isoformat(), "runs": runs}
    (work / "runs.json").write_text(json.dumps(saved, default=str, indent=1))
    write_results(args.out, report(args, started, runs, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
