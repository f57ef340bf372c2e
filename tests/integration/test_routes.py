"""Static routes (`spec.routes`): one topic into several tables, against real Kafka, Spark and the embedded
catalog, audited by content (each record's value, read back from Kafka, says which table it belongs in).

Proves: records split by their value (`customer`) and their Kafka key into two route tables, the rest into the
table, malformed ones into the dead-letter table, each exactly once, and every table's committed offsets at
the topic's end (a route whose condition kept nothing of a batch commits its range too); a route table keeps
its own partitioning; an unsorted route table's rows are written from the driver, a bucketed one's by Spark,
and every one's by Spark with `spec.batch.maxCollectBytes: 0`; a batch that fails after the routes' rows were
staged drops their branches (a branch left by a failed drop is swept at the next start) and the batch is
written again once; conditions see the key, the headers and the topic, and a wrong one fails naming its route;
with `unrouted: DeadLetter` the records no route takes are dead letters with the reason and the table gets no
rows; a topic deleted and created again stops the writer, and `icefall reset-offsets` resets every route table
with the table, each then taking the new topic's records; `icefall run` killed between the destinations'
commits (after the first route, after both, after the dead letters) then run to the end leaves each table
exactly its records, the tables ahead skipping what they hold.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table.snapshots import ancestors_of
from pyspark.sql import SparkSession

from icefall import cli
from icefall.api import UNROUTED_REASON, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import SourceChangedError
from icefall.runtime import failpoints
from icefall.testing.live_run import killed_at_each, run_until_caught_up
from icefall.testing.streams import (
    NAMESPACE,
    drain,
    kafka_source_frame,
    manifest_text,
    produce,
    recreate_topic,
    started_ingestor,
    watermarks,
)

pytestmark = pytest.mark.integration

ROUTES = """  routes:
    - table: {{name: {name}_vip, partitioning: [{{field: id, transform: "bucket[2]"}}]}}
      when: "customer IN ('c0', 'c1')"
    - table: {{name: {name}_even}}
      when: "CAST(_kafka.key AS BIGINT) % 2 = 0"
"""


def routed_manifest(
    name: str, topic: str, kafka: KafkaBroker, *, unrouted: str = "Table", collect: int | None = None
) -> str:
    batch = {"maxRecords": 60, "minIntervalSeconds": 0}
    if collect is not None:
        batch["maxCollectBytes"] = collect
    text = manifest_text(name, topic, kafka.bootstrap, batch=batch)
    return text + ROUTES.format(name=name) + f"  unrouted: {unrouted}\n"


def destination(value: bytes | None, name: str, unrouted: str) -> str:
    """The table a record belongs in, from its content: the first route whose condition holds."""
    try:
        record = json.loads(value or b"")
    except ValueError:
        return f"{name}_dlq"
    if record["customer"] in ("c0", "c1"):
        return f"{name}_vip"
    if record["id"] % 2 == 0:  # the key is str(id)
        return f"{name}_even"
    return name if unrouted == "Table" else f"{name}_dlq"


def source_records(kafka: KafkaBroker, topic: str) -> dict[tuple[int, int], bytes | None]:
    from confluent_kafka import Consumer

    total = sum(watermarks(kafka, topic).values())
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": f"content-{topic}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"}
    )  # fmt: skip
    records: dict[tuple[int, int], bytes | None] = {}
    try:
        consumer.subscribe([topic])
        while len(records) < total:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topic}: {len(records)} of {total}"
            records[message.partition(), message.offset()] = message.value()
    finally:
        consumer.close()
    return records


def rows_of(config: CatalogConfig, table: str) -> Counter[tuple[int, int, Any]]:
    """(partition, offset, id or error) of each row of `it.<table>`, counted."""
    loaded = config.pyiceberg().load_table((NAMESPACE, table))
    if table.endswith("_dlq"):
        rows = loaded.scan(selected_fields=("partition", "offset", "error")).to_arrow().to_pylist()
        return Counter((r["partition"], r["offset"], r["error"]) for r in rows)
    rows = loaded.scan(selected_fields=("id", "_kafka")).to_arrow().to_pylist()
    return Counter((r["_kafka"]["partition"], r["_kafka"]["offset"], r["id"]) for r in rows)


def writers(config: CatalogConfig, table: str) -> list[str]:
    """Who wrote each snapshot with rows on `main` of `it.<table>`, oldest first: Spark (its summary names
    its application) or the driver (`arrow_append`, pyiceberg)."""
    loaded = config.pyiceberg().load_table((NAMESPACE, table))
    # A pyiceberg Summary answers `in` for any key: look at its properties as a dict.
    found = [
        s.summary.additional_properties if s.summary else {}
        for s in ancestors_of(loaded.current_snapshot(), loaded.metadata)
    ]
    written = [summary for summary in reversed(found) if summary.get("added-records", "0") != "0"]
    return ["spark" if "spark.app.id" in summary else "driver" for summary in written]


def assert_routed(config: CatalogConfig, name: str, kafka: KafkaBroker, topic: str, unrouted: str) -> None:
    """Every record of `topic` in exactly the table its content names, once, with its own id (dead letters:
    the unrouted ones with `UNROUTED_REASON`); every table committed up to the topic's end."""
    expected: dict[str, set[tuple[int, int, Any]]] = {}
    for (p, o), value in source_records(kafka, topic).items():
        table = destination(value, name, unrouted)
        bad = table.endswith("_dlq")
        unrouted_letter = bad and value is not None and value.startswith(b'{"')
        key = UNROUTED_REASON if unrouted_letter else None if bad else json.loads(value or b"")["id"]
        expected.setdefault(table, set()).add((p, o, key))
    high = watermarks(kafka, topic)
    for table in (name, f"{name}_vip", f"{name}_even", f"{name}_dlq"):
        rows = rows_of(config, table)
        assert max(rows.values(), default=1) == 1, (
            f"{table}: duplicates {[k for k, n in rows.items() if n > 1][:5]}"
        )
        want = expected.get(table, set())
        if table.endswith("_dlq"):  # a malformed record's error is the decoder's: checked by position only
            got = {(p, o, e if e == UNROUTED_REASON else None) for p, o, e in rows}
        else:
            got = set(rows)
        assert got == want, f"{table}: extra {sorted(got - want)[:5]}, missing {sorted(want - got)[:5]}"
        if not table.endswith("_dlq"):
            assert read_committed(config.pyiceberg().load_table((NAMESPACE, table))).offsets == high, table


def test_records_split_by_content_into_their_tables_exactly_once(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_split", "it-routes-split"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 150, bad_every=10)
    st = load_manifest(routed_manifest(name, topic, kafka))
    failpoints.reset_hits()
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = drain(ingestor)
        assert sum(r.records_written for r in reports) == 135  # every table's rows: 150 less 15 malformed
        started = ("route.after-create", "route.after-genesis", "route.after-claim", "route.after-prepare")
        assert all(failpoints.hits(point) == 2 for point in started[:3]), failpoints.hit_counts()
        assert failpoints.hits("route.before-commit") == failpoints.hits("route.after-commit") >= 6
        assert_routed(catalog_config, name, kafka, topic, "Table")
        vip = catalog_config.pyiceberg().load_table((NAMESPACE, f"{name}_vip"))
        assert [f.name for f in vip.spec().fields] == ["id_bucket"]
        # Small batches: the unsorted, identity-partitioned route's rows are written from the driver; the
        # bucketed one's by Spark (pyiceberg's bucket is not written as Spark's).
        assert set(writers(catalog_config, f"{name}_vip")) == {"spark"}
        even = writers(catalog_config, f"{name}_even")
        assert set(even) == {"driver"}

        # A batch failing once its routes' rows are staged: their branches go, it is written again.
        high = watermarks(kafka, topic)
        produce(kafka, topic, 150, 40, bad_every=10)
        with (
            failpoints.armed("route.after-stage", "raise"),
            failpoints.armed("route.before-abandon", "raise"),  # dropping a branch fails: it is left over
            pytest.raises(failpoints.FailpointError),
        ):
            ingestor.run_batch()
        assert failpoints.hits("route.before-abandon") >= 1
        assert read_committed(vip.refresh()).offsets == high, "nothing of the failed batch landed"
    # Written again with maxCollectBytes 0: the batch is never collected to the driver, Spark appends.
    again = load_manifest(routed_manifest(name, topic, kafka, collect=0))
    with started_ingestor(again, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        assert failpoints.hits("route.before-sweep") >= 1  # the branches the last writer left
        drain(ingestor)
    assert_routed(catalog_config, name, kafka, topic, "Table")
    later = writers(catalog_config, f"{name}_even")[len(even) :]
    assert later and set(later) == {"spark"}, later


def test_conditions_see_the_key_the_headers_and_the_topic(spark: SparkSession) -> None:
    from icefall.decode.decode import decode
    from icefall.ingest.routes import ROUTE_COLUMN, Routing

    text = manifest_text("routes_context", "orders", "k:9092")
    routes = """  routes:
    - {table: {name: a}, when: "_kafka.headers['trace'] = 't-1'"}
    - {table: {name: b}, when: "_kafka.key = 'k2' AND _kafka.topic = 'orders' AND _kafka.offset = 2"}
    - {table: {name: c}, when: "id > 3"}
"""
    st = load_manifest(text + routes)
    value = {"customer": "c", "amount": 1, "ts": "2026-11-22T10:00:00Z"}
    values = [{"id": i, **value} for i in range(6)]
    frame = kafka_source_frame(spark, values, produced=datetime.now(UTC))
    routing = Routing(st, lambda identifier, branch: ".".join((*identifier, branch)))
    rows = routing.routed(decode(frame, st.spec)).select("offset", ROUTE_COLUMN).collect()
    assert {r["offset"]: r[ROUTE_COLUMN] for r in rows} == {0: None, 1: 0, 2: 1, 3: None, 4: 2, 5: 2}
    wrong = load_manifest(text + routes.replace("id > 3", "nope > 3"))
    with pytest.raises(ValueError, match=r"spec.routes\[2\].when: Spark cannot evaluate 'nope > 3'"):
        Routing(wrong, routing.spark_name).check(decode(frame.limit(0), st.spec))


def test_unrouted_records_are_dead_letters_with_the_reason(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_unrouted", "it-routes-unrouted"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 100, bad_every=9)
    st = load_manifest(routed_manifest(name, topic, kafka, unrouted="DeadLetter"))
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        reports = drain(ingestor)
    assert sum(r.records_dead_lettered for r in reports) == sum(
        destination(v, name, "DeadLetter").endswith("_dlq") for v in source_records(kafka, topic).values()
    )
    assert not rows_of(catalog_config, name), "the table gets no rows"
    assert_routed(catalog_config, name, kafka, topic, "DeadLetter")


def test_a_recreated_topic_is_reset_in_every_route_table(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, topic = "routes_reset", "it-routes-reset"
    kafka.create_topic(topic, partitions=1)
    produce(kafka, topic, 0, 30)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(routed_manifest(name, topic, kafka))
    st = load_manifest(manifest.read_text())
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        recreate_topic(kafka, topic)
        produce(kafka, topic, 100, 20)
        with pytest.raises(SourceChangedError):
            ingestor.run_batch()
        state_dir = str(catalog_config.database.parent)
        assert cli.main(["reset-offsets", "-f", str(manifest), "--state-dir", state_dir]) == 0
        drain(ingestor)
    catalog = catalog_config.pyiceberg()
    for table in (f"{name}_vip", f"{name}_even", name):
        loaded = catalog.load_table((NAMESPACE, table))
        assert read_committed(loaded).offsets == {0: 20}, table
        assert len(json.loads(loaded.properties["icefall.offset-resets"])) == 1, table
    records = {o: json.loads(v or b"")["id"] for (_, o), v in source_records(kafka, topic).items()}
    after = {
        row[1]: row[2]
        for table in (f"{name}_vip", f"{name}_even", name)
        for row in rows_of(catalog_config, table)
        if row[2] >= 100
    }
    assert after == records, "the new topic's records, each once, in the tables their content names"


@pytest.mark.timeout(3600)  # four `icefall run` processes, each starting Spark: minutes on a loaded machine
def test_kills_between_the_destinations_commits_leave_each_table_exactly_its_records(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    name, topic = "routes_kills", "it-routes-kills"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 200, bad_every=10)
    manifest, state = tmp_path / "table.yaml", tmp_path / "state"
    manifest.write_text(routed_manifest(name, topic, kafka))

    logs = killed_at_each(
        manifest,
        state,
        (
            "route.after-commit=exit",  # the first route committed its batch, the second and the table not
            "route.after-commit=exit@3",  # the first route skips what it holds; then two more route commits
            "dlq.after-commit=exit",  # both routes and the dead letters ahead of the table
        ),
    )
    assert "holds the whole batch already" in logs[1], "the route ahead skipped the batch it held"
    finished = run_until_caught_up(manifest, state)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_routed(CatalogConfig.embedded(state), name, kafka, topic, "Table")
