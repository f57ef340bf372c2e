"""The floor: the least work that turns the topic into Parquet files — no table, no commits, one core.

    python bench/peers/floor.py --bootstrap HOST:PORT --topic T --out DIR
                                [--roll-records N] [--roll-seconds S]

One confluent-kafka consumer (no consumer group commits: offsets are not stored anywhere), `json.loads`
per record, `pyarrow.Table.from_pylist` with the bench schema, one Parquet file (zstd) per roll: every
`--roll-records` records, or `--roll-seconds` seconds, or as soon as it has caught up with the topic,
whichever comes first. After each file it prints
`FILE <epoch ms> <records so far> <path>` on stdout; the benchmark reads those lines like another
system's commits. Nothing is exactly-once and nothing is readable as a table: this is the floor of what
any Kafka → Parquet system must spend, not a peer.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("key", pa.string()),
        ("ts", pa.string()),  # parsed to timestamp[us, UTC] per file, vectorised
        ("customer", pa.string()),
        ("amount", pa.float64()),
        ("items", pa.int32()),
        ("shipping", pa.struct([("street", pa.string()), ("city", pa.string()), ("country", pa.string())])),
        ("tags", pa.list_(pa.string())),
        ("note", pa.string()),
    ]
)


def write(rows: list[Any], out: Path, number: int) -> Path:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    ts = pc.cast(table.column("ts"), pa.timestamp("us", tz="UTC"))  # ISO 8601 with offset, vectorised
    table = table.set_column(2, pa.field("ts", pa.timestamp("us", tz="UTC")), ts)
    path = out / f"part-{number:05d}.parquet"
    pq.write_table(table, path, compression="zstd")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--roll-records", type=int, default=50_000)
    parser.add_argument("--roll-seconds", type=float, default=10.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": "floor",  # needed by the client; offsets are never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    partitions = consumer.list_topics(args.topic, timeout=30).topics[args.topic].partitions
    consumer.assign([TopicPartition(args.topic, p, 0) for p in partitions])  # from the first offset
    rows: list[Any] = []
    total, files, rolled_at = 0, 0, time.monotonic()
    loads = json.loads
    while not stop[0]:
        messages = consumer.consume(10_000, timeout=0.2)
        for message in messages:
            if message.error() is None and (value := message.value()) is not None:
                rows.append(loads(value))
        caught_up = len(messages) < 100  # a trickle, not a backlog: write what we have
        due = time.monotonic() - rolled_at >= args.roll_seconds
        if rows and (len(rows) >= args.roll_records or caught_up or due):
            path = write(rows, args.out, files)
            total += len(rows)
            files += 1
            rows = []
            rolled_at = time.monotonic()
            print(f"FILE {int(time.time() * 1000)} {total} {path}", flush=True)
        elif not rows:
            rolled_at = time.monotonic()
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
