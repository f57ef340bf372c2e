"""Issue #45 item 1: today's batch against a plan built once, both committed by Icefall's protocol.

    nice -n 19 .venv/bin/python bench/plan_once.py [--records 200000,1000000] [--reps 3]
        [--warmup-records 50000] [--out FILE]
        [--designs icefall,stream,rebind,stream-bare,rebind-bare,icefall-serialgc,icefall-c1]

The harness of bench/prototypes.py (its docstring: one broker, each writer alone pinned to core 1, a fresh
3-partition topic of the bench's ~230 B JSON events, a warm-up backlog committed before measuring, then
the measured backlog produced as fast as the client goes; CPU = user + system of the writer's whole
process tree, Spark JVM and Python, over the drain; every table checked by count; designs rotated per
repetition), with the writers of bench/peers/plan_once_writer.py (its docstring says what each does and
leaves out):

- **icefall** (0): `icefall run --no-maintenance` (today: a plan built from Python per batch).
- **stream** (a): one Structured Streaming query, `foreachBatch` runs Icefall's commit protocol.
- **rebind** (b): decode columns built once, a new Kafka relation per batch, Icefall's commit protocol.
- **stream-bare**, **rebind-bare**: (a) and (b) appending straight to main (no lease, branch or
  compare-and-swap), to split the protocol's cost from the rest.
- **icefall-serialgc**, **icefall-c1** (c): (0) with one JVM flag each (`JVM_FLAGS`), what the profiles
  suggest (bench/results/profile.md: the JIT's threads 25-27 % of the JVM's CPU after warm-up).
- **icefall-serial** (c): (0) with `spec.batch.pipelined: false` (fewer, larger batches on a backlog that
  grows while it drains?). Not in the default `--designs`.

All in Icefall's own Spark session and tables. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import prototypes
import yaml
from common import machine_section
from prototypes import Run

ROOT = Path(__file__).resolve().parents[1]
DESIGNS = ("icefall", "stream", "rebind", "stream-bare", "rebind-bare", "icefall-serialgc", "icefall-c1")
prototypes.LABELS.update(
    {
        "stream": "(a) one Structured Streaming query, `foreachBatch` + Icefall's protocol",
        "rebind": "(b) decode built once, Kafka relation re-bound per batch + Icefall's protocol",
        "stream-bare": "(a) without the protocol (append to main)",
        "rebind-bare": "(b) without the protocol (append to main)",
        "icefall-serialgc": "(c) (0) with the driver JVM on `-XX:+UseSerialGC`",
        "icefall-c1": "(c) (0) with the driver JVM on `-XX:TieredStopAtLevel=1` (C1 only)",
        "icefall-serial": "(c) (0) with `spec.batch.pipelined: false`",
    }
)


def say(text: str) -> None:
    print(f"[plan_once] {time.strftime('%H:%M:%S')} {text}", flush=True)


#: (c): today's path with the driver JVM's flags the profiles point at (JIT threads 25-27 % of the JVM's
#: CPU after warm-up; G1's concurrent threads on a 1 GiB heap), through the JVM's own environment variable.
JVM_FLAGS = {"icefall-serialgc": "-XX:+UseSerialGC", "icefall-c1": "-XX:TieredStopAtLevel=1"}


def start_writer(design: str, work: Path, pin: list[str]) -> subprocess.Popen[bytes]:
    if design == "icefall":
        return prototypes.start_writer(design, work, pin)
    if design == "icefall-serial":  # (c): not pipelined, so a growing backlog is not cut at each commit
        manifest = yaml.safe_load((work / "events.yaml").read_text())
        manifest["spec"]["batch"] = {"pipelined": False}
        (work / "events.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
        return prototypes.start_writer("icefall", work, pin)
    if design in JVM_FLAGS:
        os.environ["JAVA_TOOL_OPTIONS"] = JVM_FLAGS[design]
        try:
            return prototypes.start_writer("icefall", work, pin)
        finally:
            del os.environ["JAVA_TOOL_OPTIONS"]
    name, _, bare = design.partition("-")
    script = str(ROOT / "bench" / "peers" / "plan_once_writer.py")
    argv = [sys.executable, script, "--design", name, "--manifest", str(work / "events.yaml"),
            "--state-dir", str(work), *(["--bare"] if bare else [])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator' / 'src'}:{ROOT / 'bench'}"}
    log = (work / "writer.log").open("wb")
    return subprocess.Popen(
        [*pin, *argv], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def render(runs: list[Run], args: argparse.Namespace, facts: dict[str, str], started: str) -> str:
    sizes = sorted({r.records for r in runs})
    return "\n".join(
        [
            "# Plan once: today's batch against (a), (b) and (c), runs (issue #45, item 1)",
            "",
            f"`bench/plan_once.py` started {started} UTC, niced (`nice -n 19`) beside other work. How each "
            "figure is measured: its docstring. Raw runs at the end."
            + (
                f" **Trickle**: each backlog produced at {args.trickle_rate:,} records/s."
                if args.trickle
                else ""
            ),
            "",
            *(line for n in sizes for line in prototypes.table(runs, n, args.designs)),
            "## Runs (in order)",
            "",
            "| # | design | records | drain s | CPU-s | of it the Python driver | records per CPU-s "
            "| commits | load at start (1/5/15) |",
            "|--:|---|--:|--:|--:|--:|--:|--:|---|",
            *(
                f"| {i} | {r.design} | {r.records:,} | {r.drain:.1f} | {r.cpu:.1f} | {r.python_cpu:.1f} "
                f"| {r.per_cpu:,.0f} | {r.commits} | {r.load} |"
                for i, r in enumerate(runs, 1)
            ),
            "",
            *machine_section(facts),
        ]
    )


def main() -> int:
    args = prototypes.arguments(__doc__, ROOT / "bench" / "results" / "plan-once-runs.md", DESIGNS)
    return prototypes.run_all(args, render, prefix="planonce", start=start_writer)


if __name__ == "__main__":
    sys.exit(main())
