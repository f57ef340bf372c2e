"""What reading a Delta table's log costs on S3 once it is long: LIST requests and time per commit.

    .venv/bin/python bench/delta_log_reads.py [--versions N] [--src DIR ...] [--out FILE]

One MinIO of the devstack. Per source tree given with `--src` (an `operator/src` folder; default: this
checkout's; give main's too for a before/after) and per mode (`no checkpoints`, `checkpoints` when the tree
has `icefall.commit.delta_checkpoint`), a child process builds a fresh table of N versions with Icefall's
own log writer (one `add` per commit, no data files: only the log is measured), in `checkpoints` mode with
a checkpoint and log cleanup every 10 versions (the table's default `delta.checkpointInterval`; the default
30-day log retention keeps every commit, as a real table's >= 1 h retention does), then measures:

- **writer**: 20 more commits as the driver makes them (`log.snapshot()` to plan, `commit_batch`, which reads
  the latest version again and PUTs the next): LIST requests, GETs and milliseconds per commit;
- **cold snapshot**: a new `DeltaLog(location).snapshot()` (a restarted writer, `icefall verify`, status);
- **pods' replay**: `LogFiles.read` of a new log (a compaction pod's first round).

LIST requests are counted in the process: each `list`/`list_times` call of the S3 store as one request per
1000 keys, each ListObjectsV2 of `list_after` as one. The machine's load average is written beside the
results (bench/results/delta_log_reads.md). Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = r"""
import json, statistics, sys, time
from collections import Counter
from icefall.commit import delta_storage
from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table
from icefall.commit.delta_files import LogFiles

location, versions, checkpoints = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
counts = Counter()

def counted(name, kind, pages):
    original = getattr(delta_storage.S3Storage, name)
    def wrapper(self, *args, **kwargs):
        found = original(self, *args, **kwargs)
        counts[kind] += (1 + len(found) // 1000) if pages else 1
        return found
    setattr(delta_storage.S3Storage, name, wrapper)

counted("list", "list", True)
counted("list_times", "list", True)
counted("read", "get", False)
counted("put_if_absent", "put", False)
try:
    from icefall.commit import s3_list
    original_get = s3_list._get
    def get(*args, **kwargs):
        counts["list"] += 1
        return original_get(*args, **kwargs)
    s3_list._get = get
except ImportError:
    pass

field = {"name": "id", "type": "long", "nullable": True, "metadata": {}}
schema = json.dumps({"type": "struct", "fields": [field]})

def batch(i):
    return Batch(topic="t", start={0: i}, end={0: i + 1}, topic_id="tid", max_produce_time_ms=1000 + i)

log = DeltaLog(location)
create_table(log, schema, epoch=1)
replay = LogFiles()

def upkeep():
    if not checkpoints:
        return
    from icefall.commit.delta_checkpoint import clean_up_log, write_checkpoint
    replay.advance(log)
    if replay.version % 10 == 0:
        write_checkpoint(log, replay, int(time.time() * 1000))
        clean_up_log(log, replay.configuration, int(time.time() * 1000))

for i in range(versions - 1):
    commit_batch(log, log.snapshot(), batch(i), 1, [AddFile(f"f{i}.parquet", 100, 1)])
    upkeep()

per_commit = []
for i in range(versions - 1, versions + 19):
    counts.clear()
    started = time.perf_counter()
    commit_batch(log, log.snapshot(), batch(i), 1, [AddFile(f"f{i}.parquet", 100, 1)])
    per_commit.append((time.perf_counter() - started, dict(counts)))
    upkeep()

def measured(action, repeat=5):
    seconds, used = [], []
    for _ in range(repeat):
        counts.clear()
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
        used.append(dict(counts))
    last = used[-1]
    ms = round(1000 * statistics.median(seconds), 1)
    return {"ms": ms, "list": last.get("list", 0), "get": last.get("get", 0)}

result = {
    "version": log.latest_version(),
    "log_files": len(log.storage.list("_delta_log")),
    "writer": {
        "ms": round(1000 * statistics.median(s for s, _ in per_commit), 1),
        "list": statistics.mean(c.get("list", 0) for _, c in per_commit),
        "get": statistics.mean(c.get("get", 0) for _, c in per_commit),
    },
    "cold_snapshot": measured(lambda: DeltaLog(location).snapshot()),
    "pods_replay": measured(lambda: LogFiles.read(DeltaLog(location))),
}
print("RESULT " + json.dumps(result))
"""


def run(src: Path, location: str, versions: int, checkpoints: bool, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, location, str(versions), "1" if checkpoints else "0"],
        env={**env, "PYTHONPATH": str(src)}, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{src}: {done.stderr[-3000:]}")
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    found: dict[str, object] = json.loads(line.removeprefix("RESULT "))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=200)
    parser.add_argument("--src", action="append", type=Path, help="an operator/src folder (repeatable)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "delta_log_reads.md")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "operator" / "src"))
    from icefall.devstack.objectstore import ObjectStore
    from icefall.testing.delta import aws_env

    sources = args.src or [ROOT / "operator" / "src"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="icefall-bench-") as scratch:
        store = ObjectStore(Path(scratch) / "minio").start()
        try:
            store.filesystem().create_dir("bench")
            env = {**os.environ, **aws_env(store)}
            for src in sources:
                modes = (
                    [False, True]
                    if (src / "icefall" / "commit" / "delta_checkpoint.py").exists()
                    else [False]
                )
                for checkpoints in modes:
                    location = f"s3://bench/{uuid.uuid4().hex}"
                    result = run(src, location, args.versions, checkpoints, env)
                    rows.append((str(src), "checkpoints" if checkpoints else "no checkpoints", result))
                    print(rows[-1], flush=True)
        finally:
            store.stop()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# Reading a long Delta log on S3 (bench/delta_log_reads.py)",
        "",
        f"MinIO of the devstack, {args.versions} versions; load average {load}.",
        "LIST: requests per operation (1 per 1000 keys listed); ms: median.",
        "",
        "| source | mode | version | files in _delta_log | writer: LIST / GET / ms per commit |"
        " cold snapshot: LIST / GET / ms | pods' replay: LIST / GET / ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for src, mode, r in rows:
        cells = []
        for key in ("writer", "cold_snapshot", "pods_replay"):
            m = r[key]  # type: ignore[index]
            cells.append(f"{m['list']:g} / {m['get']:g} / {m['ms']}")  # type: ignore[index]
        lines.append(f"| {src} | {mode} | {r['version']} | {r['log_files']} | " + " | ".join(cells) + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
