"""Issue #45 item 1, the faithful prototypes: a batch whose plan is not rebuilt per batch, committed by
Icefall's own protocol (staging branch, lease, epoch, compare-and-swap with the offsets).

    python bench/peers/plan_once_writer.py --design stream|rebind [--bare] --manifest events.yaml \
        --state-dir DIR [--cadence 5]

Unlike bench/peers/prototype_writer.py (the groundwork: its own Spark session, a table made by Spark,
offsets as a snapshot property appended straight to `main`), everything here that is not the batch's
plan is Icefall's own, so that the CPU figure is honest against `icefall run`:

- the Spark session of `icefall run` (`build_spark_session` with `embedded_conf`: the same JVM options,
  catalog options, `cache-enabled=false`, py4j names resolved once), the embedded SQLite catalog of
  `--state-dir`, the table and its dead-letter table made by `catalog.tables.ensure_tables`;
- the commit lease (`FileLease` in `<state-dir>/leases`, renewed by `ingest.commits.LeaseKeeper`), an
  epoch above the table's claimed in it (`commit.claim_epoch`), leftover staging branches swept;
- per batch: `commit.prepare_stage` (the writer's branch at main's head, the committed state read with
  it), the batch's start checked against the committed offsets, the topic id from Kafka
  (`kafka.admin.TopicView`), the good rows appended to the branch (`ingest.writer.append`), the lease
  checked, then `commit.commit_staged`: ONE catalog commit moves `main` to the batch's snapshot and sets
  `icefall.offsets` (the batch's end), epoch, topic id and produce time; a refusal stops the writer.

Designs:
- **stream** (a): one long-lived Structured Streaming query; Kafka source with `startingOffsets` = the
  table's committed offsets (earliest on an empty table), a fresh checkpoint per start (the table, not the
  checkpoint, says where to resume); `foreachBatch` decodes (Icefall's `Decoders`, built once) and runs
  the protocol above. A batch's end offsets are the checkpoint's offset log entry `offsets/<batchId>`
  (written before the batch runs: no extra job); its start, the previous batch's end. Trigger
  processingTime `--cadence` seconds.
- **rebind** (b): a Python loop every `--cadence` seconds (at once while a batch read to a watermark that
  has moved on): watermarks and topic id (`TopicView`), the decode columns built once (`Decoders`) over a
  new Kafka batch relation of [committed, watermark) per partition (`ingest.writer.read_kafka`, the
  writer's fixed consumer group, no headers), and the protocol above. Spark 4.1 cannot swap the offsets
  of an analysed plan (bench/results/prototypes.md): re-binding means a new relation under the same
  columns.
- `--bare`: the same, without the protocol: no lease, no branch, no `commit_staged`; the rows appended
  straight to `main` with `icefall.offsets` as a snapshot property (Iceberg's `snapshot-property.*`).
  Only to split the protocol's cost from the rest; it is not exactly once against a second writer.

Left out in every design (not CPU on the bench's clean JSON stream): dead letters (a batch with a bad
record stops the writer here, where Icefall writes them to the dead-letter table and topic first), batch
sizing while behind (`plan.batching`: every batch reads to the watermark), pipelining, retention gaps
and `onDataLoss`, schema evolution, the batch report and metrics. Prints "BATCH <records> <seconds>" per
commit. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.catalog.tables import ensure_tables
from icefall.commit import (
    Batch,
    CommitError,
    claim_epoch,
    commit_staged,
    prepare_stage,
    read_committed,
    stage_branch_name,
    sweep_stages,
)
from icefall.commit.lease import FileLease, local_process_holder
from icefall.ingest.commits import LeaseKeeper
from icefall.ingest.writer import SPARK_CONSUMER_DEFAULTS, Decoders, append, read_kafka, with_every_column
from icefall.kafka.admin import TopicView
from icefall.plan.offsets import OffsetRange
from icefall.plan.spark_conf import embedded_conf
from icefall.spark.session import build_spark_session

OFFSETS = "icefall.offsets"
WRITER = "proto"


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Writer:
    """What both designs share: the session, the table, the decoders, the lease and the commit."""

    st: StreamingTable
    spark: SparkSession
    catalog_name: str
    table: Any  # pyiceberg Table
    decoders: Decoders
    view: TopicView
    bare: bool
    epoch: int = 0
    keeper: LeaseKeeper | None = None

    @property
    def topic(self) -> str:
        return self.st.spec.source.first_topic

    def spark_name(self, branch: str | None) -> str:
        name = ".".join([self.catalog_name, *self.st.table_identifier])
        return name if branch is None else f"{name}.branch_{branch}"

    def committed(self) -> dict[int, int]:
        return dict(read_committed(self.table).offsets)

    def commit(self, source: DataFrame, start: dict[int, int], end: dict[int, int]) -> int:
        """Decode `source` (the records of [start, end)) and land it exactly once; returns its records."""
        if self.bare:
            return self._bare(source, end)
        assert self.keeper is not None
        stage = prepare_stage(self.table, stage_branch_name(WRITER, "stage"))
        held = dict(stage.base.offsets)
        if any(held.get(p, start[p]) != start[p] for p in start):
            raise CommitError(
                f"the table holds {held}, the batch starts at {start}: another writer committed"
            )
        topic_id = self.view.topic_id()
        seen = self._write(source, self.spark_name(stage.branch))
        if seen["bad"]:
            raise RuntimeError(f"{seen['bad']} bad records: dead letters are not in this prototype")
        newest: datetime | None = seen["newest"]
        batch = Batch(
            self.topic,
            start=start,
            end=end,
            max_produce_time_ms=int(newest.timestamp() * 1000) if newest else None,
            topic_id=topic_id,
        )
        self.keeper.check("prototype")
        commit_staged(self.table, stage, batch, self.epoch)
        return int(seen["records"])

    def _write(self, source: DataFrame, target: str, options: dict[str, str] | None = None) -> dict[str, Any]:
        observation = Observation()
        observed = self.decoders.good.decode(source).observe(observation, *self.decoders.observed)
        rows = with_every_column(self.decoders.good.good_rows(observed), self.table.schema())
        if options:
            tasks = rows.sparkSession.sparkContext.defaultParallelism
            writer = rows.coalesce(tasks).writeTo(target).option("distribution-mode", "none")
            writer = writer.option("fanout-enabled", "false")
            for key, value in options.items():
                writer = writer.option(key, value)
            writer.append()
        else:
            append(rows, target, sorted_table=False)
        return dict(observation.get)

    def _bare(self, source: DataFrame, end: dict[int, int]) -> int:
        offsets = json.dumps({str(p): o for p, o in sorted(end.items())})
        seen = self._write(source, self.spark_name(None), {f"snapshot-property.{OFFSETS}": offsets})
        return int(seen["records"])

    def start_protocol(self, state: Path) -> None:
        if self.bare:
            return
        lease = FileLease.in_dir(state / "leases", "prototype", local_process_holder())
        floor = read_committed(self.table).epoch
        self.epoch = lease.acquire(30, floor=floor)
        claim_epoch(self.table, self.epoch)
        sweep_stages(self.table)
        self.keeper = LeaseKeeper(lease)
        self.keeper.start()


def bare_committed(writer: Writer) -> dict[int, int]:
    """--bare: the offsets of main's newest snapshot summary ({} for none)."""
    writer.table.refresh()
    snapshot = writer.table.current_snapshot()
    summary = snapshot.summary if snapshot is not None and snapshot.summary is not None else None
    offsets = summary.get(OFFSETS) if summary is not None else None
    return {int(p): int(o) for p, o in json.loads(offsets).items()} if offsets else {}


def run_stream(writer: Writer, state: Path, cadence: float, stopping: Callable[[], bool]) -> None:
    topic = writer.topic
    held = bare_committed(writer) if writer.bare else writer.committed()
    lows = {p: low for p, (low, _) in writer.view.watermarks().items()}
    position = lows | held  # where batch 0 starts
    starting = json.dumps({topic: {str(p): o for p, o in position.items()}})
    checkpoint = state / f"checkpoint-{time.time_ns()}"  # fresh: the table says where to resume
    options = {"kafka.bootstrap.servers": writer.st.spec.source.bootstrap_servers, "includeHeaders": "false"}
    options |= {f"kafka.{k}": v for k, v in SPARK_CONSUMER_DEFAULTS.items()}  # as Icefall's reads
    reader = writer.spark.readStream.format("kafka").options(**options).option("subscribe", topic)
    source = (
        reader.option("startingOffsets", starting).option("kafka.isolation.level", "read_committed").load()
    )

    def batch(df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        log = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
        end = {int(p): int(o) for p, o in json.loads(log[-1])[topic].items()}
        start = {p: position.get(p, 0) for p in end}
        records = writer.commit(df, start, end)
        position.update(end)
        say(f"BATCH {records} {time.monotonic() - started:.2f}")

    query = (
        source.writeStream.foreachBatch(batch).trigger(processingTime=f"{cadence:g} seconds")
        .option("checkpointLocation", str(checkpoint)).start()
    )  # fmt: skip
    while not stopping() and query.isActive:
        time.sleep(0.5)
    query.stop()


def run_rebind(writer: Writer, cadence: float, stopping: Callable[[], bool]) -> None:
    group = f"icefall-{'.'.join(writer.st.table_identifier)}-{WRITER}"
    while not stopping():
        started = time.monotonic()
        held = bare_committed(writer) if writer.bare else writer.committed()
        marks = writer.view.watermarks()
        start = {p: max(held.get(p, low), low) for p, (low, _) in marks.items()}
        end = {p: high for p, (_, high) in marks.items()}
        ranges = tuple(OffsetRange(p, start[p], end[p]) for p in sorted(end) if end[p] > start[p])
        behind = False
        if ranges:
            source = read_kafka(writer.spark, writer.st.spec, ranges, {}, group_id=group, headers=False)
            records = writer.commit(source, start, end)
            say(f"BATCH {records} {time.monotonic() - started:.2f}")
            behind = any(high > end[p] for p, (_, high) in writer.view.watermarks().items())
        if not behind:
            time.sleep(max(0.0, cadence - (time.monotonic() - started)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", choices=("stream", "rebind"), required=True)
    parser.add_argument("--bare", action="store_true", help="no protocol: append to main (see the docstring)")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--cadence", type=float, default=5)
    args = parser.parse_args()
    st = load_manifest(args.manifest.read_text())
    catalog = CatalogConfig.embedded(args.state_dir)
    table, _dead_letters = ensure_tables(catalog.pyiceberg(), st)
    spark = build_spark_session([catalog], extra_conf=embedded_conf(st, master="local[2]", maintain=False))
    writer = Writer(
        st, spark, catalog.name, table, Decoders(st.spec), TopicView(st.spec.source.bootstrap_servers,
        st.spec.source.first_topic), args.bare,
    )  # fmt: skip
    writer.start_protocol(args.state_dir)
    stops: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stops.append(True))  # no py4j call inside a handler
    try:
        if args.design == "stream":
            run_stream(writer, args.state_dir, args.cadence, lambda: bool(stops))
        else:
            run_rebind(writer, args.cadence, lambda: bool(stops))
    finally:
        if writer.keeper is not None:
            writer.keeper.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
