"""Issue #45 item 1, groundwork: today's batch against two designs whose plan is not rebuilt from Python.

    .venv/bin/python bench/prototypes.py [--records 200000,1000000] [--reps 3] [--warmup-records 50000]
                                         [--designs icefall,stream,rebind] [--out FILE]

One Kafka broker (the devstack's, pinned with this process to core 0); each writer runs alone pinned to
core 1 (`taskset`), its own embedded SQLite catalog and warehouse, a fresh 3-partition topic of the
bench's ~230 B JSON events (`common.bench_records`, the generator bench/compare.py uses):

- **icefall** (0): `icefall run -f events.yaml --state-dir DIR --no-maintenance` (today's path: a plan
  built from Python per batch, the staging branch, lease, fencing, dead-letter table on).
- **stream** (a) and **rebind** (b): bench/peers/prototype_writer.py (its docstring says what they do and
  leave out).

All three at Icefall's cadence for a 10 s freshness target (a batch every 5 s once caught up; Icefall
sizes its own batches while behind). Per run: the warm-up backlog is on the topic before the writer
starts; once the table holds it (JIT and caches warm, start-up not measured) the measured backlog is
produced as fast as the client goes, and **drain** is from its first record produced to the commit (the
snapshot log's time) that completed it. CPU: user + system seconds of the writer's whole process tree
(/proc, `common.tree_cpu`; the broker and this process not counted) from the first record produced to
when that commit was seen (polled every 0.25 s). Every run's table is checked: the row count is exactly
the records produced (no duplicates, nothing missing, by count). Designs alternate order per repetition
(rotation), so a change in the machine's load lands on each alike. Median and min-max per design and
size. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from common import (
    CLOCK_TICKS,
    SMALL_NOTE_WORDS,
    load_average,
    machine_basics,
    machine_section,
    proc_stat,
    stop_group,
    tree_cpu,
    write_results,
)
from compare import preload, table_commits
from profile_drain import manifest

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tools import jar_files

ROOT = Path(__file__).resolve().parents[1]
DESIGNS = ("icefall", "stream", "rebind")
LABELS = {
    "icefall": "(0) Icefall today: `icefall run` (plan built per batch from Python)",
    "stream": "(a) one Structured Streaming query, `foreachBatch`",
    "rebind": "(b) decode built once, Kafka relation re-bound per batch",
}


def say(text: str) -> None:
    print(f"[prototypes] {time.strftime('%H:%M:%S')} {text}", flush=True)


@dataclass(frozen=True)
class Run:
    design: str
    records: int
    drain: float  # seconds, first record produced -> the commit completing the backlog
    cpu: float  # CPU-s of the writer's tree over the drain
    commits: int
    exact: bool
    load: str
    python_cpu: float = 0.0  # CPU-s of the writer's Python process alone (the driver; not its JVM)

    @property
    def per_cpu(self) -> float:
        return self.records / self.cpu

    @property
    def per_s(self) -> float:
        return self.records / self.drain


def start_writer(design: str, work: Path, pin: list[str]) -> subprocess.Popen[bytes]:
    if design == "icefall":
        argv = [str(Path(sys.executable).with_name("icefall")), "run", "-f", str(work / "events.yaml"),
                "--state-dir", str(work), "--no-maintenance"]  # fmt: skip
    else:
        jars = ",".join(str(j) for j in jar_files("ICEFALL_SPARK_JARS"))
        script = str(ROOT / "bench" / "peers" / "prototype_writer.py")
        argv = [sys.executable, script, "--design", design, "--manifest", str(work / "events.yaml"),
                "--state-dir", str(work), "--jars", jars]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator' / 'src'}:{ROOT / 'bench'}"}
    log = (work / "writer.log").open("wb")
    return subprocess.Popen(
        [*pin, *argv], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def own_cpu(pid: int) -> float:
    """utime + stime of `pid` alone (`taskset` execs the writer, so this is its Python process)."""
    stat = proc_stat(pid)
    return sum(int(x) for x in stat[11:13]) / CLOCK_TICKS if stat is not None else 0.0


def wait_total(catalog: CatalogConfig, total: int, proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Poll until main holds `total` records; returns the visible time (ms) of the commit that did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the writer exited with {proc.returncode}")
        commits = table_commits(catalog)
        if commits and commits[-1].total_records >= total:
            return next(c.visible_ms for c in commits if c.total_records >= total)
        time.sleep(0.25)
    raise RuntimeError(f"the table did not reach {total:,} records in {timeout:.0f} s")


def one_run(broker: KafkaBroker, design: str, records: int, args: argparse.Namespace, *, pin: list[str],
            tag: str, start: Callable[..., subprocess.Popen[bytes]] | None = None) -> Run:  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix=f"proto-{design}-", dir=args.state))
    topic = f"{tag}-{design}"
    broker.create_topic(topic, partitions=3)
    spec = manifest(broker.bootstrap, topic)
    (work / "events.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    preload(broker.bootstrap, topic, args.warmup_records, SMALL_NOTE_WORDS, 1)
    catalog = CatalogConfig.embedded(work)
    proc = (start or start_writer)(design, work, pin)  # bench/plan_once.py starts its own writers
    try:
        wait_total(catalog, args.warmup_records, proc, 300)
        time.sleep(2)  # settle: the warm-up's last commit done
        load = load_average()
        commits0 = len(table_commits(catalog))
        cpu0, t0, py0 = tree_cpu(proc.pid), time.time(), own_cpu(proc.pid)
        if args.trickle:  # `records` at `--trickle-rate` per second, in one produce a second
            for i in range(0, records, args.trickle_rate):
                produced = time.monotonic()
                count = min(args.trickle_rate, records - i)
                preload(broker.bootstrap, topic, count, SMALL_NOTE_WORDS, 1, start=args.warmup_records + i)
                time.sleep(max(0.0, 1 - (time.monotonic() - produced)))
        else:
            preload(broker.bootstrap, topic, records, SMALL_NOTE_WORDS, 1, start=args.warmup_records)
        visible_ms = wait_total(catalog, args.warmup_records + records, proc, 900)
        cpu1, py1 = tree_cpu(proc.pid), own_cpu(proc.pid)
        commits = table_commits(catalog)
        exact = commits[-1].total_records == args.warmup_records + records
        run = Run(
            design,
            records,
            visible_ms / 1000 - t0,
            cpu1 - cpu0,
            len(commits) - commits0,
            exact,
            load,
            py1 - py0,
        )
        say(f"{design} {records:,}: drain {run.drain:.1f} s, {run.cpu:.1f} CPU-s, "
            f"{run.per_cpu:,.0f} rec/CPU-s, {run.commits} commits, "
            f"{'exact' if exact else 'NOT EXACT'}, load {load}")  # fmt: skip
        return run
    finally:
        stop_group(proc, grace=30)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def table(runs: list[Run], records: int, designs: list[str]) -> list[str]:
    lines = [
        f"### {records:,} records",
        "",
        "| design | runs | records per CPU-s, median (min-max) | vs (0) | drain s, median (min-max) "
        "| records/s median | CPU-s median | commits | CPU-s per commit, median | by count |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    base = [r.per_cpu for r in runs if r.design == "icefall" and r.records == records]
    for design in designs:
        mine = [r for r in runs if r.design == design and r.records == records]
        if not mine:
            continue
        per_cpu = [r.per_cpu for r in mine]
        ratio = f"{statistics.median(per_cpu) / statistics.median(base):.2f}x" if base else "n/a"
        drains = [r.drain for r in mine]
        lines.append(
            f"| {LABELS[design]} | {len(mine)} | {spread(per_cpu)} | {ratio} | "
            f"{statistics.median(drains):.1f} ({min(drains):.1f}-{max(drains):.1f}) | "
            f"{statistics.median(r.per_s for r in mine):,.0f} | "
            f"{statistics.median(r.cpu for r in mine):.1f} | {'/'.join(str(r.commits) for r in mine)} | "
            f"{statistics.median(r.cpu / max(r.commits, 1) for r in mine):.2f} | "
            f"{'exact' if all(r.exact for r in mine) else 'NOT EXACT'} |"
        )
    return [*lines, ""]


def render(runs: list[Run], args: argparse.Namespace, facts: dict[str, str], started: str) -> str:
    sizes = sorted({r.records for r in runs})
    out = [
        "# Prototypes: a batch whose plan is not rebuilt from Python (issue #45, item 1)",
        "",
        f"`bench/prototypes.py` started {started} UTC. How each figure is measured: its docstring. "
        "Raw runs at the end."
        + (
            f" **Trickle**: each backlog produced at {args.trickle_rate:,} records/s." if args.trickle else ""
        ),
        "",
        *(line for n in sizes for line in table(runs, n, args.designs)),
        "## Runs (in order)",
        "",
        "| # | design | records | drain s | CPU-s | of it the Python driver | records per CPU-s | commits "
        "| load at start (1/5/15) |",
        "|--:|---|--:|--:|--:|--:|--:|--:|---|",
        *(
            f"| {i} | {r.design} | {r.records:,} | {r.drain:.1f} | {r.cpu:.1f} | {r.python_cpu:.1f} "
            f"| {r.per_cpu:,.0f} | {r.commits} | {r.load} |"
            for i, r in enumerate(runs, 1)
        ),
        "",
        *machine_section(facts),
    ]
    return "\n".join(out)


def arguments(doc: str, out: Path, designs: tuple[str, ...] = DESIGNS) -> argparse.Namespace:
    """The command line of this bench and of bench/plan_once.py (`doc`: the bench's docstring; results in
    `out` and every design of `designs` by default)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--records", default="200000", help="comma-separated backlog sizes")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup-records", type=int, default=50_000)
    parser.add_argument("--designs", default=",".join(designs))
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--keep", action="store_true", help="keep each run's folder")
    parser.add_argument(
        "--trickle",
        action="store_true",
        help="produce each backlog at --trickle-rate records/s (many small batches: fixed costs)",
    )
    parser.add_argument("--trickle-rate", type=int, default=1000)
    args = parser.parse_args()
    args.designs = args.designs.split(",")
    return args


def run_all(
    args: argparse.Namespace,
    render: Callable[[list[Run], argparse.Namespace, dict[str, str], str], str],
    *,
    prefix: str,
    start: Callable[..., subprocess.Popen[bytes]] | None = None,
) -> int:
    """Every design at every size, `args.reps` times in rotating order, one broker for all; the results
    rendered into `args.out` after each run. `prefix`: of the bench's folder and its topics' names."""
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    facts = machine_basics()  # before pinning: it reports the cores usable
    pin: list[str] = []
    if len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset"):
        os.sched_setaffinity(0, {0})
        pin = ["taskset", "-c", "1"]
    facts["Load average at start (1/5/15 min)"] = load_average()
    args.state = Path(tempfile.mkdtemp(prefix=f"icefall-{prefix}-"))
    broker = KafkaBroker(args.state / "kafka", heap="1g").start()
    runs: list[Run] = []
    try:
        for records in (int(n) for n in args.records.split(",")):
            for rep in range(args.reps):
                order = args.designs[rep % len(args.designs) :] + args.designs[: rep % len(args.designs)]
                for design in order:
                    tag = f"{prefix[0]}{records}-{rep}"
                    try:
                        runs.append(one_run(broker, design, records, args, pin=pin, tag=tag, start=start))
                    except Exception as err:  # one failed run does not end the bench
                        say(f"{design} {records:,} rep {rep} FAILED: {err}")
                    facts["Load average at end (1/5/15 min)"] = load_average()
                    write_results(args.out, render(runs, args, facts, started))
                    mine = [r.per_cpu for r in runs if r.design == design and r.records == records]
                    say(f"{design} {records:,} so far: {spread(mine) if mine else 'none'}")
    finally:
        broker.stop()
        if not args.keep:
            shutil.rmtree(args.state, ignore_errors=True)
    return 0


def main() -> int:
    args = arguments(__doc__, ROOT / "bench" / "results" / "prototypes.md")
    return run_all(args, render, prefix="prototypes")


if __name__ == "__main__":
    sys.exit(main())
