"""`make demo` (`python -m icefall.devstack.demo`): the main job end to end on the embedded default, with
nothing but this machine.

A local Kafka broker, a producer streaming order events (a few malformed on purpose), `icefall run`'s
ingestion on local Spark into the embedded SQLite catalog, a fresh read (`icefall read`: the table plus
the records past its last commit) while the producer still writes, then the table, its dead letters, and
the record-by-record audit. Each run starts from a clean state folder. With an Avro manifest
(`-f examples/avro-orders.yaml`) a local schema registry starts too, and the producer moves to a schema
with one more field (`coupon`) halfway: the table follows it in the batch that first carries it.

A development command, not part of the `icefall` CLI: it starts the test stack's Kafka broker and
producer (`icefall.devstack`), which need a checkout and are not in the wheel or the image.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit.lease import FileLease
from icefall.devstack.events import EventProducer
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tools import tool_dir
from icefall.ingest.engine import BatchReport, Ingestor
from icefall.plan.names import table_leases
from icefall.spark.session import build_spark_session


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def run_demo(manifest: Path, state: Path, *, seconds: float, rate: float) -> int:
    if state.exists():
        shutil.rmtree(state)
    started = time.monotonic()
    stop_later: list[Callable[[], None]] = []
    say("starting a local Kafka broker (KRaft) ...")
    broker = KafkaBroker(state / "kafka").start()
    producer: EventProducer | None = None
    try:
        st = load_manifest(manifest)
        st = st.model_copy(
            update={"spec": st.spec.model_copy(update={"source": st.spec.source.model_copy(
                update={"bootstrap_servers": broker.bootstrap})})}
        )  # fmt: skip
        st, producer = _producer(st, broker, state, seconds=seconds, rate=rate, stop_later=stop_later)

        catalog = CatalogConfig.embedded(state / "lake")
        catalog.pyiceberg()
        tool_dir("ICEFALL_SPARK_JARS")  # resolves the jars of spark_images/pom.xml when make has not
        say("starting local Spark with the Iceberg runtime and the embedded SQLite catalog ...")
        spark = build_spark_session([catalog], app_name="icefall-demo")
        lease = FileLease.in_dir(state / "leases", table_leases(st).commit, "demo")
        ingestor = Ingestor(st, catalog, spark, lease)
        ingestor.start(lease_timeout=30)
        table_name = ".".join(st.table_identifier)
        target = st.spec.freshness.target_seconds
        say(f"ingesting into {table_name} for {seconds:.0f}s (freshness target {target}s)")

        phase_end = time.monotonic() + seconds
        ingestor.run(lambda: time.monotonic() > phase_end, _progress)
        _fresh_read(st, catalog, spark)
        producer.stop()
        say(f"producer stopped after {producer.acked} acknowledged records; catching up ...")
        caught_up = [False]

        def until_idle(report: BatchReport | None) -> None:
            _progress(report)
            caught_up[0] = report is None

        ingestor.run(lambda: caught_up[0], until_idle)
        ingestor.close()
        _show(catalog, st)

        from icefall.commands.verify import verify_table

        report = verify_table(st, catalog, spark=spark)
        spark.stop()
        say("audit of the table against the topic, record by record and by content:")
        print(report.render(), flush=True)
        say(f"done in {time.monotonic() - started:.0f}s; state is in {state}")
        return 0 if report.ok else 1
    finally:
        if producer is not None and producer.is_alive():
            producer.stop()
        for stop in reversed(stop_later):
            stop()
        broker.stop()


def _producer(
    st: Any,
    broker: KafkaBroker,
    state: Path,
    *,
    seconds: float,
    rate: float,
    stop_later: list[Callable[[], None]],
) -> tuple[Any, EventProducer]:
    """The demo's topic and its running producer (and `st` as the producer's registry, if any, needs)."""
    topic = st.spec.source.topic
    broker.create_topic(topic, partitions=3)
    say(f"Kafka is up at {broker.bootstrap}; topic '{topic}' has 3 partitions")
    values = None
    if st.spec.format.registry is not None:
        st, values = _with_registry(st, state, seconds, rate, stop_later)
    producer = EventProducer(broker.bootstrap, topic, rate, malformed_every=400, values=values)
    producer.start()
    say(f"producing ~{rate:.0f} order events/s, 1 in 400 malformed on purpose")
    return st, producer


def _with_registry(
    st: Any, state: Path, seconds: float, rate: float, stop_later: list[Callable[[], None]]
) -> tuple[Any, Iterator[bytes]]:
    """An Avro manifest: a local schema registry for it, and Avro events that add a field halfway."""
    from icefall.devstack.events import avro_order_values
    from icefall.devstack.registry import SchemaRegistryServer

    say("starting a local schema registry (Apicurio, Confluent-compatible API) ...")
    registry = SchemaRegistryServer(state / "registry").start()
    stop_later.append(registry.stop)
    fmt = st.spec.format
    spec = st.spec.model_copy(
        update={
            "format": fmt.model_copy(
                update={"registry": fmt.registry.model_copy(update={"url": registry.url})}
            )
        }
    )
    half = int(seconds * rate / 2)
    say(f"the producer registers its schema, and a second one with a new field `coupon` after {half} events")
    values = avro_order_values(registry.url, st.spec.source.topic, malformed_every=400, evolve_after=half)
    # Registers the first schema now: a table made without an inline schema starts from it.
    first = next(values)
    return st.model_copy(update={"spec": spec}), itertools.chain([first], values)


def _progress(report: BatchReport | None) -> None:
    if report is None:
        return
    rate = report.records_read / report.seconds if report.seconds else 0.0
    say(
        f"commit: {report.records_read:>6} read, {report.records_written:>6} written, "
        f"{report.records_dead_lettered:>3} dead-lettered in {report.seconds:4.1f}s ({rate:,.0f} rec/s) "
        f"| lag {report.lag} | freshness {report.freshness_seconds:.1f}s"
    )


def _fresh_read(st: Any, catalog: CatalogConfig, spark: Any) -> None:
    """`icefall read` while the producer still writes: the table plus the records past its last commit."""
    from icefall.ingest.union_read import union_read

    say("a fresh read (`icefall read`): the table at its last commit plus the topic up to a cut taken now")
    with union_read(st, catalog, spark=spark) as fresh:
        rows = fresh.frame.count()
    for line in fresh.cut.render():
        print(f"    {line}", flush=True)
    say(f"{rows} rows, {fresh.cut.tail_rows} of them from Kafka past the commit")


def _show(catalog: CatalogConfig, st: Any) -> None:
    lake = catalog.pyiceberg()
    table = lake.load_table(st.table_identifier)
    rows = table.scan().to_arrow()
    files = len(table.inspect.files())
    say(f"{'.'.join(st.table_identifier)} holds {rows.num_rows} rows in {files} data files")
    sample = rows.drop_columns(["_kafka"]).slice(0, 3).to_pylist()
    for row in sample:
        print(f"    {row}", flush=True)
    if st.dead_letter_identifier:
        dead = lake.load_table(st.dead_letter_identifier).scan(selected_fields=("error",)).to_arrow()
        say(f"dead-letter table {'.'.join(st.dead_letter_identifier)} holds {dead.num_rows} rows:")
        # Group by the kind of problem: the quoted values differ record by record.
        kinds = Counter(re.sub(r"(: )'.*?'(\.\.\.)?", r"\1'…'", e) for e in dead.column("error").to_pylist())
        for reason, count in kinds.most_common(6):
            print(f"    {count:>4} x {reason}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m icefall.devstack.demo",
        description="local Kafka + a producer + ingestion + audit, end to end (what `make demo` runs)",
    )
    parser.add_argument("-f", "--file", default="examples/orders.yaml", help="the StreamingTable manifest")
    parser.add_argument("--state-dir", default=".icefall/demo", help="where the demo keeps its state")
    parser.add_argument("--seconds", type=float, default=30, help="how long to stream before catching up")
    parser.add_argument("--rate", type=float, default=2000, help="events per second to produce")
    args = parser.parse_args(argv)
    return run_demo(Path(args.file), Path(args.state_dir).resolve(), seconds=args.seconds, rate=args.rate)


if __name__ == "__main__":
    sys.exit(main())
