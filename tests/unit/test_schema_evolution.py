"""Which schema changes a table follows, and which it refuses with the field named (`catalog.evolution`).

Proves: new optional fields are added (top level, inside structs, inside list elements and map values),
int→long, float→double and decimal precision are widened, required→optional is relaxed; a narrower
writer type changes nothing; a changed type, a map key change, a new required spec field and a dropped
required field are refused with messages naming the field and the fix; writer schemas add required
fields as optional; a cdc table follows the row record of each Debezium envelope. Also `fields_from_iceberg`
round-trips the spec's fields.
"""

from __future__ import annotations

import pytest

from icefall.api import SchemaField, fields_from_iceberg, to_iceberg_schema
from icefall.catalog.evolution import AddField, MakeOptional, WidenType, plan_evolution

pytestmark = pytest.mark.unit


def schema(*fields: dict):  # type: ignore[no-untyped-def]
    return to_iceberg_schema([SchemaField.model_validate(f) for f in fields])


BASE = [
    {"name": "id", "type": "long", "required": True},
    {"name": "qty", "type": "int"},
    {"name": "price", "type": "decimal(10,2)"},
    {"name": "ratio", "type": "float", "required": True},
    {
        "name": "customer",
        "type": "struct",
        "fields": [{"name": "name", "type": "string"}],
    },
    {
        "name": "items",
        "type": "list",
        "element": {"type": "struct", "fields": [{"name": "sku", "type": "string"}]},
        "elementRequired": True,
    },
    {"name": "attrs", "type": "map", "key": {"type": "string"}, "value": {"type": "int"}},
]


def evolve(wanted: list[dict], *, relax: bool = False):  # type: ignore[no-untyped-def]
    return plan_evolution(schema(*BASE), schema(*wanted), source="spec.format.schema", relax_required=relax)


def test_the_same_schema_changes_nothing() -> None:
    assert evolve(BASE) == plan_evolution(schema(*BASE), schema(*BASE), source="x", relax_required=True)
    assert not evolve(BASE).changes and not evolve(BASE).refused


def test_new_optional_fields_are_added_at_every_depth() -> None:
    wanted = [dict(f) for f in BASE]
    wanted[4] = {**wanted[4], "fields": [*wanted[4]["fields"], {"name": "email", "type": "string"}]}
    wanted[5] = {
        **wanted[5],
        "element": {
            "type": "struct",
            "fields": [{"name": "sku", "type": "string"}, {"name": "n", "type": "int"}],
        },
    }
    wanted.append({"name": "note", "type": "string", "doc": "Free text."})
    result = evolve(wanted)
    assert not result.refused
    added = {c.path: c for c in result.changes if isinstance(c, AddField)}
    assert set(added) == {("customer", "email"), ("items", "element", "n"), ("note",)}
    assert added[("note",)].doc == "Free text."
    assert "add optional field 'note' string" in result.describe()


def test_widening_and_relaxing() -> None:
    wanted = [dict(f) for f in BASE]
    wanted[1] = {"name": "qty", "type": "long"}
    wanted[2] = {"name": "price", "type": "decimal(18,2)"}
    wanted[3] = {"name": "ratio", "type": "double"}  # optional now too
    wanted[5] = {**wanted[5], "elementRequired": False}
    result = evolve(wanted)
    assert not result.refused
    widened = {c.path: str(c.new) for c in result.changes if isinstance(c, WidenType)}
    assert widened == {("qty",): "long", ("price",): "decimal(18, 2)", ("ratio",): "double"}
    optional = {c.path for c in result.changes if isinstance(c, MakeOptional)}
    assert optional == {("ratio",), ("items", "element")}


def test_a_narrower_type_fits_the_column_as_it_is() -> None:
    wanted = [dict(f) for f in BASE]
    wanted[0] = {"name": "id", "type": "int", "required": True}
    wanted[2] = {"name": "price", "type": "decimal(5,2)"}
    result = evolve(wanted)
    assert result.changes == () and result.refused == ()


def test_what_iceberg_cannot_do_is_refused_with_the_field_and_the_fix() -> None:
    wanted = [dict(f) for f in BASE]
    wanted[1] = {"name": "qty", "type": "string"}
    wanted[2] = {"name": "price", "type": "decimal(12,3)"}
    wanted[6] = {"name": "attrs", "type": "map", "key": {"type": "int"}, "value": {"type": "int"}}
    wanted[4] = {"name": "customer", "type": "string"}
    wanted.append({"name": "region", "type": "string", "required": True})
    refused = evolve(wanted).refused
    assert len(refused) == 5, refused
    assert refused[0].startswith(
        "field 'qty': the table has int, spec.format.schema has string; Iceberg cannot"
    )
    assert "widens only int to long" in refused[0]
    assert refused[1].startswith(
        "field 'price': the table has decimal(10,2), spec.format.schema has decimal(12,3)"
    )
    assert "between struct, list, map and a value" in refused[2]
    assert "a map's key type cannot change" in refused[3]
    assert "field 'region' is new in spec.format.schema and required" in refused[4]
    assert "make it optional (required: false)" in refused[4]


def test_a_required_field_the_spec_dropped_is_refused_an_optional_one_stays() -> None:
    without_id = [f for f in BASE if f["name"] not in ("id", "qty")]
    refused = evolve(without_id).refused
    assert refused == (
        "field 'id' is required in the table and spec.format.schema no longer has it: no new row could be "
        "written; add it back, or make the column optional (Spark: ALTER TABLE ... ALTER COLUMN ... DROP NOT "
        "NULL)",
    )


def test_writer_schemas_add_required_fields_as_optional_and_may_omit_fields() -> None:
    wanted = [
        {"name": "id", "type": "long", "required": True},
        {"name": "region", "type": "string", "required": True},
    ]
    result = plan_evolution(schema(*BASE), schema(*wanted), source="writer schema id 7", relax_required=True)
    assert result.refused == ()
    assert [str(c) for c in result.changes] == ["add optional field 'region' string"]


def test_fields_from_iceberg_round_trips_the_spec() -> None:
    fields = [
        SchemaField.model_validate(f) for f in [*BASE, {"name": "h", "type": "fixed[16]", "doc": "Hash."}]
    ]
    back = fields_from_iceberg(to_iceberg_schema(fields).as_struct())
    assert [f.model_dump() for f in back] == [f.model_dump() for f in fields]


def test_a_cdc_table_follows_the_row_record_of_each_debezium_envelope() -> None:
    """mode cdc: a writer schema is the Debezium envelope; the table follows its row record (a new field
    of the row is added), never the envelope's own fields (before, after, source, op)."""
    import json

    from icefall.api import parse_manifest
    from icefall.decode.schemas import SchemaFollower

    st = parse_manifest(
        """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "kafka:9092", topic: orders}
  format:
    type: avro
    registry: {url: "http://registry:8081"}
    schema: [{name: id, type: long, required: true}]
  table: {name: orders, namespace: shop}
  mode: cdc
  key: [id]
"""
    )
    row = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "long"}]}
    row["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
    envelope = {
        "type": "record",
        "name": "Envelope",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "op", "type": "string"},
        ],
    }
    expected = schema({"name": "id", "type": "long", "required": True})
    follower = SchemaFollower(st.spec, expected, "shop.orders")
    plan = follower.plan(expected, {7: json.dumps(envelope)})
    assert [str(c) for c in plan.changes] == ["add optional field 'note' string"]
    assert plan.refused == ()


def test_the_follower_reports_what_each_batch_needs_even_when_remembered() -> None:
    from icefall.api import load_manifest
    from icefall.decode.schemas import SchemaFollower

    st = load_manifest(
        """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "k:9092", topic: orders}
  format: {type: avro, registry: {url: "http://registry:8081"}}
  table: {namespace: shop, name: orders}
"""
    )
    table = schema({"name": "id", "type": "long", "required": True})
    follower = SchemaFollower(st.spec, table, "shop.orders")
    long_id = '{"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}]}'
    text_id = '{"type": "record", "name": "O", "fields": [{"name": "id", "type": "string"}]}'
    assert follower.plan(table, {3: text_id}).refused and follower.refused
    assert not follower.plan(table, {2: long_id}).changes and follower.refused == ()
    follower.plan(table, {3: text_id})  # remembered, and reported again
    assert len(follower.refused) == 1 and "writer schema id 3 has string" in follower.refused[0]
