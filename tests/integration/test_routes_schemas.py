"""Routes with their own schema and key (`spec.routes[i].schema`, `key`, `sequenceBy`): a Debezium topic per
source table into a table per source table with one StreamingTable (examples/cdc-database.yaml), against
real Kafka, Spark and the embedded catalog.

Proves: two Debezium JSON topics whose tables have different columns and keys (customers by customer_id,
orders by order_id), read as `source.topics` with `mode: cdc` and routed by `_kafka.topic`, leave in each
route table exactly the latest row per key of its own topic (creates, updates, deletes with a before image
and bare tombstones applied; each table's columns and identifier field its route's), spec.table no row
(`unrouted: DeadLetter`); a change that does not fit its route's schema (a required column missing, a
value of the wrong type) is a dead letter whose reason names its route's table, once, and the tables are
committed up to each topic's end; `icefall read --table` of a route table reads it with the changes past
its offsets decoded with its route's schema. `icefall verify` audits each keyed route table by its own key
over its own topic's changes, up to its own offsets (one table ahead of the others), and names the table
of a row deleted, changed or written twice, and a dead letter lost.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.union_read import union_read
from icefall.testing.streams import NAMESPACE, Change, drain, send_changes, started_ingestor, watermarks

pytestmark = pytest.mark.integration

MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {k8s}}}
spec:
  source:
    bootstrapServers: "{bootstrap}"
    topics: [{customers}, {orders}]
  mode: cdc
  key: [id]
  format:
    schema:
      - {{name: id, type: long, required: true}}
  table: {{namespace: it, name: {name}}}
  routes:
    - table: {{name: {name}_customers}}
      when: "_kafka.topic = '{customers}'"
      key: [customer_id]
      schema:
        - {{name: customer_id, type: long, required: true}}
        - {{name: email, type: string, required: true}}
        - {{name: vip, type: boolean}}
    - table: {{name: {name}_orders}}
      when: "_kafka.topic = '{orders}'"
      key: [order_id]
      sequenceBy: [source.lsn]
      schema:
        - {{name: order_id, type: long, required: true}}
        - {{name: purchaser, type: long}}
        - {{name: amount, type: "decimal(10,2)"}}
  unrouted: DeadLetter
  batch: {{maxRecords: 80, minIntervalSeconds: 0}}
  freshness: {{targetSeconds: 2}}
"""


def event(op: str, before: Any, after: Any, lsn: int) -> dict[str, Any]:
    return {"op": op, "before": before, "after": after, "source": {"lsn": lsn}, "ts_ms": lsn}


def customer_changes(start: int, count: int, seed: int) -> list[Change]:
    """Debezium changes of 25 customers (keyed by customer_id, so a key stays in its partition): creates,
    updates, a delete (op d with its before image) then Debezium's tombstone, one in 30 a customer without
    its required email (a dead letter)."""
    rng, rows, changes = random.Random(seed), {}, []
    for n in range(start, start + count):
        i = rng.randrange(25)
        key = {"customer_id": i}
        row = {"customer_id": i, "email": f"c{i}-{n}@example.com", "vip": n % 2 == 0}
        if n % 30 == 29:
            changes.append((None, key, event("u", rows.get(i), {"customer_id": i, "vip": True}, n)))
        elif i in rows and rng.random() < 0.2:
            changes += [(None, key, event("d", rows.pop(i), None, n)), (None, key, None)]
        else:
            changes.append((None, key, event("u" if i in rows else "c", rows.get(i), row, n)))
            rows[i] = row
    return changes


def order_changes(start: int, count: int, seed: int) -> list[Change]:
    """Debezium changes of 30 orders (the schema envelope on, keys with it too): creates, updates, deletes,
    one in 30 an amount that is not a number (a dead letter)."""
    rng, rows, changes = random.Random(seed), {}, []
    for n in range(start, start + count):
        i = 1000 + rng.randrange(30)
        key = {"schema": {"type": "struct"}, "payload": {"order_id": i}}
        row: dict[str, Any] = {"order_id": i, "purchaser": rng.randrange(25), "amount": f"{n}.25"}
        if n % 30 == 29:
            bad = {**row, "amount": "lots"}
            changes.append((None, key, {"schema": {}, "payload": event("u", rows.get(i), bad, n)}))
        elif i in rows and rng.random() < 0.2:
            changes.append((None, key, {"schema": {}, "payload": event("d", rows.pop(i), None, n)}))
        else:
            changes.append((None, key, {"schema": {}, "payload": event("c", rows.get(i), row, n)}))
            rows[i] = row
    return changes


def latest(changes: list[Change], key: str) -> dict[int, dict[str, Any]]:
    """Each key's row after `changes` (in order; a key's changes are in one partition, and each generator
    keeps its state across calls only through the table), the changes that do not fit left out: key ->
    after image."""
    rows: dict[int, dict[str, Any]] = {}
    for _, _, value in changes:
        if value is None:
            continue  # the tombstone after a delete: the d deleted the row already
        change = value.get("payload", value)
        after = change["after"]
        if change["op"] == "d":
            rows.pop(change["before"][key], None)
        elif "email" in after if key == "customer_id" else after["amount"] != "lots":
            rows[after[key]] = after
    return rows


def table_rows(config: CatalogConfig, table: str, key: str) -> dict[int, dict[str, Any]]:
    """key -> row (without `_kafka`, `_sequence`) of `it.<table>`, read by pyiceberg (deletes applied)."""
    rows = config.pyiceberg().load_table((NAMESPACE, table)).scan().to_arrow().to_pylist()
    found = {r[key]: {k: v for k, v in r.items() if not k.startswith("_")} for r in rows}
    assert len(found) == len(rows), f"{table}: a key twice"
    return found


def expected_orders(changes: list[Change]) -> dict[int, dict[str, Any]]:
    from decimal import Decimal

    return {i: {**row, "amount": Decimal(row["amount"])} for i, row in latest(changes, "order_id").items()}


def test_a_topic_per_source_table_into_a_table_each_with_its_own_schema_and_key(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    name, customers, orders = "cdc_db", "it-cdc-db.inventory.customers", "it-cdc-db.inventory.orders"
    kafka.create_topic(customers, partitions=2)
    kafka.create_topic(orders, partitions=2)
    sent_customers, sent_orders = customer_changes(0, 120, seed=1), order_changes(0, 90, seed=2)
    send_changes(kafka, customers, sent_customers)
    send_changes(kafka, orders, sent_orders)
    text = MANIFEST.format(
        k8s=name.replace("_", "-"), bootstrap=kafka.bootstrap, name=name, customers=customers, orders=orders
    )
    st = load_manifest(text)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        assert len(drain(ingestor)) >= 2  # several batches: a key's changes span them
        more_customers, more_orders = customer_changes(120, 40, seed=3), order_changes(90, 40, seed=4)
        send_changes(kafka, customers, more_customers)
        send_changes(kafka, orders, more_orders)
        drain(ingestor)
    sent_customers += more_customers
    sent_orders += more_orders

    catalog = catalog_config.pyiceberg()
    customers_table = catalog.load_table((NAMESPACE, f"{name}_customers"))
    orders_table = catalog.load_table((NAMESPACE, f"{name}_orders"))
    assert customers_table.schema().identifier_field_names() == {"customer_id"}
    assert orders_table.schema().identifier_field_names() == {"order_id"}
    assert [f.name for f in orders_table.schema().fields] == [
        "order_id",
        "purchaser",
        "amount",
        "_kafka",
        "_sequence",
    ]
    assert table_rows(catalog_config, f"{name}_customers", "customer_id") == latest(
        sent_customers, "customer_id"
    )
    assert table_rows(catalog_config, f"{name}_orders", "order_id") == expected_orders(sent_orders)
    assert table_rows(catalog_config, name, "id") == {}
    for table in (name, f"{name}_customers", f"{name}_orders"):
        held = read_committed(catalog.load_table((NAMESPACE, table))).by_topic()
        for topic in (customers, orders):
            assert dict(held[topic].offsets) == watermarks(kafka, topic), (table, topic)

    dead = catalog.load_table((NAMESPACE, f"{name}_dlq")).scan().to_arrow().to_pylist()
    reasons = {(r["topic"], r["partition"], r["offset"]): r["error"] for r in dead}
    assert len(reasons) == len(dead), "a dead letter twice"
    missing_email = [e for (t, _, _), e in reasons.items() if t == customers]
    not_a_number = [e for (t, _, _), e in reasons.items() if t == orders]
    assert len(missing_email) == 5 and len(not_a_number) == 4, reasons
    assert all(
        e.startswith("required field 'email' is missing") and f"table it.{name}_customers" in e
        for e in missing_email
    ), missing_email
    assert all(e.startswith("field 'amount'") and f"table it.{name}_orders" in e for e in not_a_number), (
        not_a_number
    )

    # `icefall read --table`: the route table plus its topic's changes past its offsets, in its columns.
    tail = order_changes(130, 30, seed=5)
    send_changes(kafka, orders, tail)
    with union_read(st, catalog_config, spark=spark, table_name=f"{NAMESPACE}.{name}_orders") as result:
        rows = result.frame.drop("_kafka", "_sequence").collect()
    assert {r["order_id"]: r.asDict() for r in rows} == expected_orders(sent_orders + tail)


APPEND_MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {k8s}}}
spec:
  source:
    bootstrapServers: "{bootstrap}"
    topics: [{users}, {clicks}]
  format:
    schema:
      - {{name: kind, type: string}}
  table: {{namespace: it, name: {name}}}
  routes:
    - table: {{name: {name}_users}}
      when: "_kafka.topic = '{users}'"
      schema:
        - {{name: user_id, type: long, required: true}}
        - {{name: name, type: string}}
    - table: {{name: {name}_clicks}}
      when: "_kafka.topic = '{clicks}'"
      schema:
        - {{name: click_id, type: long, required: true}}
        - {{name: user_id, type: long}}
        - {{name: ms, type: int}}
  batch: {{maxRecords: 50, minIntervalSeconds: 0}}
  freshness: {{targetSeconds: 2}}
"""


def test_append_routes_with_their_own_schemas_are_verified_by_content(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    from icefall.audit.routed import RoutedAuditReport
    from icefall.commands.verify import verify_table

    name, users, clicks = "own_append", "it-own-append-users", "it-own-append-clicks"
    kafka.create_topic(users, partitions=2)
    kafka.create_topic(clicks, partitions=1)
    # One in ten of each does not fit its route's schema: a user without user_id, a click's ms not an int.
    user = [{"user_id": None if n % 10 == 9 else n, "name": f"u{n}"} for n in range(60)]
    click = [{"click_id": n, "user_id": n % 7, "ms": "slow" if n % 10 == 9 else n} for n in range(70)]
    send_changes(kafka, users, [(None, str(n), value) for n, value in enumerate(user)])
    send_changes(kafka, clicks, [(None, None, value) for value in click])
    text = APPEND_MANIFEST.format(
        k8s=name.replace("_", "-"), bootstrap=kafka.bootstrap, name=name, users=users, clicks=clicks
    )
    st = load_manifest(text)
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        assert len(drain(ingestor)) >= 2
    catalog = catalog_config.pyiceberg()
    user_rows = catalog.load_table((NAMESPACE, f"{name}_users")).scan().to_arrow().to_pylist()
    click_rows = catalog.load_table((NAMESPACE, f"{name}_clicks")).scan().to_arrow().to_pylist()
    assert sorted((r["user_id"], r["name"]) for r in user_rows) == [
        (n, f"u{n}") for n in range(60) if n % 10 != 9
    ]
    assert sorted((r["click_id"], r["user_id"], r["ms"]) for r in click_rows) == [
        (n, n % 7, n) for n in range(70) if n % 10 != 9
    ]
    assert catalog.load_table((NAMESPACE, name)).scan().to_arrow().num_rows == 0
    dead = catalog.load_table((NAMESPACE, f"{name}_dlq")).scan().to_arrow().to_pylist()
    assert sorted(r["topic"] for r in dead) == [clicks] * 7 + [users] * 6
    report = verify_table(st, catalog_config, spark=spark)
    assert isinstance(report, RoutedAuditReport)
    assert report.ok and all(d.report.content_checked for d in report.destinations), report.render()


def test_keyed_routes_with_their_own_schemas_are_verified_by_key_per_table(
    kafka: KafkaBroker, spark: SparkSession, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    from pyiceberg.expressions import EqualTo

    from icefall.audit.routed import RoutedAuditReport
    from icefall.commands.verify import verify_table
    from icefall.runtime import failpoints

    name, customers, orders = (
        "cdc_verify",
        "it-cdc-verify.inventory.customers",
        "it-cdc-verify.inventory.orders",
    )
    kafka.create_topic(customers, partitions=2)
    kafka.create_topic(orders, partitions=2)
    send_changes(kafka, customers, customer_changes(0, 120, seed=11))
    send_changes(kafka, orders, order_changes(0, 90, seed=12))
    text = MANIFEST.format(
        k8s=name.replace("_", "-"), bootstrap=kafka.bootstrap, name=name, customers=customers, orders=orders
    )
    st = load_manifest(text)
    catalog = catalog_config.pyiceberg()
    with started_ingestor(st, catalog_config, spark, tmp_path / "lease.json") as ingestor:
        drain(ingestor)
        send_changes(kafka, customers, customer_changes(120, 40, seed=13))
        send_changes(kafka, orders, order_changes(90, 40, seed=14))
        with failpoints.armed("route.after-commit", "raise"), pytest.raises(failpoints.FailpointError):
            ingestor.run_batch()  # the customers table commits the batch; orders, the DLQ and the table not
    tables = {t: catalog.load_table((NAMESPACE, t)) for t in (name, f"{name}_customers", f"{name}_orders")}
    held = {t: read_committed(table).by_topic() for t, table in tables.items()}
    assert held[f"{name}_customers"] != held[name] == held[f"{name}_orders"], held

    # Each route table by key up to its own offsets: the customers table is ahead of the others.
    report = verify_table(st, catalog_config, spark=spark)
    assert isinstance(report, RoutedAuditReport)
    assert report.ok, report.render()
    main, custs, ords = (report.destination(d) for d in ("spec.table", "routes[0]", "routes[1]"))
    assert (main.table, main.rows, main.keys) == (f"{NAMESPACE}.{name}", 0, 0)
    assert custs.table == f"{NAMESPACE}.{name}_customers"
    assert custs.rows == custs.keys == len(table_rows(catalog_config, f"{name}_customers", "customer_id")) > 0
    assert ords.rows == ords.keys == len(table_rows(catalog_config, f"{name}_orders", "order_id")) > 0
    assert custs.records > ords.records == main.records  # the batch it is ahead by
    text = report.render()
    assert f"[routes[0]] table {NAMESPACE}.{name}_customers (keyed)" in text
    assert text.endswith("routed table, 3 destinations: OK"), text

    # A customer deleted and one changed, an order written twice, a dead letter lost: each under its table.
    customer_ids = sorted(table_rows(catalog_config, f"{name}_customers", "customer_id"))
    order_id = min(table_rows(catalog_config, f"{name}_orders", "order_id"))
    tables[f"{name}_customers"].delete(EqualTo("customer_id", customer_ids[0]))
    spark.sql(
        f"UPDATE {catalog_config.name}.{NAMESPACE}.{name}_customers SET email = 'tampered' "
        f"WHERE customer_id = {customer_ids[1]}"
    )
    copied = tables[f"{name}_orders"].scan(row_filter=EqualTo("order_id", order_id)).to_arrow()
    tables[f"{name}_orders"].append(copied)
    dlq = catalog.load_table((NAMESPACE, f"{name}_dlq"))
    lost = dlq.scan().to_arrow().to_pylist()[0]
    dlq.delete(
        EqualTo("offset", lost["offset"])
        & EqualTo("partition", lost["partition"])
        & EqualTo("topic", lost["topic"])
    )
    broken = verify_table(st, catalog_config, spark=spark)
    assert not broken.ok
    main, custs, ords = (broken.destination(d) for d in ("spec.table", "routes[0]", "routes[1]"))
    assert (custs.missing, custs.wrong, custs.duplicates, custs.unexpected) == (1, 1, 0, 0), broken.render()
    assert custs.examples["missing"] == (f'{{"customer_id":{customer_ids[0]}}}',)
    assert custs.examples["wrong"] == (f'{{"customer_id":{customer_ids[1]}}}',)
    assert (ords.missing, ords.wrong, ords.duplicates, ords.unexpected) == (0, 0, 1, 0), broken.render()
    assert (main.dead_letters_missing, main.dead_letters_unexpected) == (1, 0), broken.render()
    assert main.examples["dead letters missing"] == (f"{lost['topic']}/{lost['partition']}:{lost['offset']}",)
    assert broken.render().endswith("FAILED: spec.table, routes[0], routes[1]"), broken.render()
