"""A route's own schema, key and sequenceBy (`spec.routes[i].schema`, `key`, `sequenceBy`): the spec.

Proves: a route with its own schema and key is accepted (keyed routes over several topics too, a table per
topic), and `StreamingTableSpec.route_spec` is its table's plain spec (its schema, key, sequenceBy; spec's
where it gives none; no routes), None for a route that gives none; its table is laid out on its own
columns. Refused naming the field and the fix: a route key field its schema lacks, spec.key missing from a
route's schema, a key or sequenceBy in mode append, a route schema with a registry format or with
spec.transforms, a route schema that is not one, a partition column its schema lacks.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import StreamingTable, load_manifest, problems_from_validation_error
from icefall.catalog.layout import expected_schema
from icefall.catalog.tables import route_table

pytestmark = pytest.mark.unit

CUSTOMERS = [
    {"name": "customer_id", "type": "long", "required": True},
    {"name": "email", "type": "string"},
]
ORDERS = [{"name": "order_id", "type": "long", "required": True}, {"name": "day", "type": "date"}]


def st(routes: list[dict[str, Any]], **spec: Any) -> StreamingTable:
    base: dict[str, Any] = {
        "source": {"topics": ["db.customers", "db.orders"], "bootstrapServers": "k:9092"},
        "mode": "cdc",
        "key": ["id"],
        "format": {"schema": [{"name": "id", "type": "long", "required": True}]},
        "table": {"namespace": "inv", "name": "changes"},
        "routes": routes,
    }
    return StreamingTable.model_validate({"metadata": {"name": "inv"}, "spec": {**base, **spec}})


def route(name: str, schema: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:
    own = {"schema": schema} if schema is not None else {}
    return {"table": {"name": name}, "when": f"_kafka.topic = 'db.{name}'", **own, **more}


def refused(routes: list[dict[str, Any]], **spec: Any) -> str:
    """Each problem as `icefall validate` says it: its dotted path, then what to do."""
    with pytest.raises(ValidationError) as error:
        st(routes, **spec)
    return "\n".join(str(problem) for problem in problems_from_validation_error(error.value))


def test_a_route_with_its_own_schema_and_key_is_its_tables_plain_spec() -> None:
    table = st([
        route("customers", CUSTOMERS, key=["customer_id"]),
        route("orders", ORDERS, key=["order_id"], sequenceBy=["source.lsn"]),
        route("other", None),
    ])  # fmt: skip
    customers = table.spec.route_spec(0)
    assert customers is not None and customers.key == ["customer_id"] and customers.sequence_by is None
    assert [f.name for f in customers.format.schema_fields] == ["customer_id", "email"]
    assert not customers.routes and customers.dynamic_route is None and customers.unrouted is None
    orders = table.spec.route_spec(1)
    assert orders is not None and orders.sequence_by == ["source.lsn"]
    assert table.spec.route_spec(2) is None  # decodes as spec.table does
    laid_out, override = route_table(table, 1)
    schema = expected_schema(laid_out)
    assert override is None and schema.identifier_field_names() == {"order_id"}
    assert [f.name for f in schema.fields] == ["order_id", "day", "_kafka", "_sequence"]


def test_a_route_key_alone_keys_spec_schema_otherwise() -> None:
    schema = [
        {"name": "id", "type": "long", "required": True},
        {"name": "n", "type": "long", "required": True},
    ]
    table = st([route("customers", key=["n"])], format={"schema": schema})
    own = table.spec.route_spec(0)
    assert (
        own is not None and own.key == ["n"] and own.format.schema_fields == table.spec.format.schema_fields
    )


def test_the_example_of_a_database_loads_with_a_table_per_source_table() -> None:
    example = load_manifest("examples/cdc-database.yaml")
    assert example.spec.source.by_topic and example.spec.key == ["id"]
    keys = [spec.key for spec in (example.spec.route_spec(i) for i in range(2)) if spec is not None]
    assert keys == [["customer_id"], ["order_id"]]


@pytest.mark.parametrize(
    ("routes", "spec", "words"),
    [
        ([route("customers", CUSTOMERS, key=["customer_idd"])], {},
         ["spec.routes[0].key[0]", "'customer_idd' is not a top-level field of this route's schema",
          "did you mean 'customer_id'"]),
        ([route("customers", CUSTOMERS)], {},
         ["spec.routes[0].schema", "spec.key: 'id' is not a top-level field of this route's schema",
          "or set key here"]),
        ([route("customers", CUSTOMERS, key=["email"])], {},
         ["spec.routes[0].key[0]", "'email' may be null", "required: true"]),
        ([route("customers", CUSTOMERS, key=["customer_id"])],
         {"mode": "append", "key": None, "source": {"topic": "db.customers", "bootstrapServers": "k:9092"}},
         ["spec.routes[0].key", "a key applies to mode upsert or cdc"]),
        ([route("customers", CUSTOMERS, key=["customer_id"], sequenceBy=["after.x"])], {},
         ["spec.routes[0].sequenceBy[0]", "not a position"]),
        ([route("customers", CUSTOMERS, key=["customer_id"])],
         {"mode": "append", "key": None, "source": {"topic": "t", "bootstrapServers": "k:9092"},
          "format": {"type": "avro", "registry": {"url": "http://r:8081"}}},
         ["spec.routes[0].schema", "json records for now", "format avro"]),
        ([route("customers", CUSTOMERS, key=["customer_id"])], {"transforms": {"filter": "true"}},
         ["spec.routes[0].schema", "spec.transforms apply to spec.format.schema's columns"]),
        ([route("customers", [{"name": "x", "type": "integer"}], key=["x"])], {},
         ["spec.routes[0].schema[0].type", "did you mean 'int'"]),
        ([{**route("customers", CUSTOMERS, key=["customer_id"]),
           "table": {"name": "customers", "partitioning": [{"field": "id", "transform": "identity"}]}}], {},
         ["spec.routes[0].table.partitioning[0].field", "no column 'id'", "customer_id, email"]),
    ],
)  # fmt: skip
def test_what_a_routes_own_schema_refuses_names_the_field_and_the_fix(
    routes: list[dict[str, Any]], spec: dict[str, Any], words: list[str]
) -> None:
    message = refused(routes, **spec)
    for word in words:
        assert word in message, message
